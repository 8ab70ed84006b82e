"""One adapter per TRL trainer kind (after TRL's config/trainer pairs), and their registry.

``get_kind("SFT")`` returns the :class:`TrainerKind` the executor asks about columns, prechecks, extra trainer
keyword arguments, build/activation hooks, step geometry and chunk plan. Importing this package does not
import torch, transformers, trl or peft, so the experiment layer reads the warm-start rules
(``WARM_FORBIDDEN``, ``warm_start_violations``) on the caller thread before any torch import.

Adding a trainer kind (e.g. ORPO):

1. ``orpo.py`` here: a ``TrainerKind`` subclass with ``name``, ``trainer_class_name``, ``required_columns`` and
   only the hooks that differ from SFT's (``precheck``, ``trainer_kwargs``, ``building``, ``step_geometry``,
   ``plan_chunks``, ``warm_forbidden``), and its instance in ``_KINDS`` below;
2. its facts, one ``TrainerKindFacts`` line in ``rapidfire_nb/schema/trainer_kinds.py`` (TRL config and trainer
   class names, reward functions, reference model, ``compute_metrics``): the schema, the spec and the generation
   checks read them there;
3. the user's wrapper, ``class RFORPOConfig(RFWrappedConfig): _trainer_type = "ORPO"`` and its line in
   ``rapidfire_nb.automl.configs.TRAINER_CONFIG_CLASSES`` (and the ``rapidfire_nb.automl`` export).

``tests/rapidfire_nb/training/test_kinds.py`` checks the registry and the schema name the same kinds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rapidfire_nb.errors import ConfigError

from .base import COMMON_WARM_FORBIDDEN, StepGeometry, TrainerKind
from .dpo import DPOKind
from .grpo import GRPOKind
from .sft import SFTKind

__all__ = [
    "COMMON_WARM_FORBIDDEN",
    "KINDS",
    "WARM_FORBIDDEN",
    "StepGeometry",
    "TrainerKind",
    "get_kind",
    "warm_start_violations",
]

_KINDS: tuple[TrainerKind, ...] = (SFTKind(), DPOKind(), GRPOKind())

KINDS: Mapping[str, TrainerKind] = {kind.name: kind for kind in _KINDS}
"""The registered trainer kinds by name (``"SFT"``, ``"DPO"``, ``"GRPO"``)."""

WARM_FORBIDDEN: tuple[str, ...] = tuple(dict.fromkeys(f for kind in _KINDS for f in kind.warm_forbidden))
"""Fields a warm clone may not change, over all kinds (each kind's ``warm_forbidden``); with the
``model_kwargs.`` prefix, what ``warm_start_violations`` checks."""


def get_kind(name: str) -> TrainerKind:
    """The adapter of one trainer type.

    Args:
        name: ``"SFT"``, ``"DPO"`` or ``"GRPO"``, any case.

    Returns:
        Its ``TrainerKind`` (one shared, stateless instance).

    Raises:
        ConfigError: An unknown trainer type.
    """
    try:
        return KINDS[name.upper()]
    except KeyError:
        names = ", ".join(repr(n) for n in KINDS)
        raise ConfigError(f"trainer_type={name!r} is not supported; use one of {names}") from None


def warm_start_violations(changes: Mapping[str, Any], trainer_type: str | None = None) -> list[str]:
    """The changed hparams a warm clone may not change, in the order given.

    Args:
        changes: ``{hparam name: value}`` of a clone (``learning_rate``, ``lora.r``, ``model_kwargs.dtype``).
        trainer_type: The parent's trainer type, to apply only its kind's rules; ``None`` applies every
            kind's (``WARM_FORBIDDEN``), as ``Experiment`` does.

    Returns:
        The offending names (empty when a warm start may go ahead).
    """
    if trainer_type is not None:
        return get_kind(trainer_type).warm_start_violations(changes)
    prefixes = tuple(dict.fromkeys(p for kind in _KINDS for p in kind.warm_forbidden_prefixes))
    return [k for k in changes if k in WARM_FORBIDDEN or k.startswith(prefixes)]
