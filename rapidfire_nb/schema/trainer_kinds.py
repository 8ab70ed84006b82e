"""What each supported TRL trainer kind is, in one table (torch-free: names and flags, no class imported).

Every layer above reads a kind's facts here: the schema (its TRL config class, :func:`rapidfire_nb.schema.
trainer_config_class`), the run spec (which model-level fields a kind takes: ``reward_funcs``,
``ref_model_name``/``ref_model_kwargs``), the generation-metric checks (``compute_metrics`` reaches the TRL
trainer only where it takes one) and the training kinds (``rapidfire_nb.training.kinds``: how a kind trains).

Adding a trainer kind (e.g. ORPO) starts with one line in ``TRAINER_KINDS`` below; the training adapter
(``rapidfire_nb/training/kinds/``) and the user's wrapper (``rapidfire_nb/automl/configs.py``) follow
(``tests/rapidfire_nb/schema/test_trainer_kinds.py`` checks the table against the installed TRL).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rapidfire_nb.errors import ConfigError

__all__ = ["TRAINER_KINDS", "TRAINER_TYPES", "TrainerKindFacts", "trainer_kind"]


@dataclass(frozen=True)
class TrainerKindFacts:
    """One TRL trainer kind.

    Attributes:
        name: the trainer type as ``LeafConfig.trainer_type`` spells it (``"SFT"``).
        config_class_name: its TRL config class's name in ``trl`` (``"SFTConfig"``).
        trainer_class_name: its TRL trainer class's name in ``trl`` (``"SFTTrainer"``).
        takes_reward_funcs: the trainer takes ``reward_funcs`` (and needs at least one): a run spec of this
            kind must set them, one of any other kind must not.
        has_reference_model: the kind trains against a reference model (DPO's implicit reward; GRPO's KL term
            when ``beta > 0``): the run spec accepts ``ref_model_name``/``ref_model_kwargs`` (the GRPO kind then
            refuses them before training, naming why: its TRL trainer builds the reference model itself).
        takes_compute_metrics: the TRL trainer takes ``compute_metrics`` (GRPO's does not: it logs its rewards).
    """

    name: str
    config_class_name: str
    trainer_class_name: str
    takes_reward_funcs: bool = False
    has_reference_model: bool = False
    takes_compute_metrics: bool = True


_KINDS: tuple[TrainerKindFacts, ...] = (
    TrainerKindFacts("SFT", "SFTConfig", "SFTTrainer"),
    TrainerKindFacts("DPO", "DPOConfig", "DPOTrainer", has_reference_model=True),
    TrainerKindFacts(
        "GRPO",
        "GRPOConfig",
        "GRPOTrainer",
        takes_reward_funcs=True,
        has_reference_model=True,
        takes_compute_metrics=False,
    ),
)

TRAINER_KINDS: Mapping[str, TrainerKindFacts] = {kind.name: kind for kind in _KINDS}
"""The supported trainer kinds by name, in the order messages list them (``"SFT"``, ``"DPO"``, ``"GRPO"``)."""

TRAINER_TYPES: tuple[str, ...] = tuple(TRAINER_KINDS)
"""The supported trainer types: ``("SFT", "DPO", "GRPO")``."""


def trainer_kind(trainer_type: object) -> TrainerKindFacts:
    """The facts of one trainer type.

    Args:
        trainer_type: ``"SFT"``, ``"DPO"`` or ``"GRPO"``, any case, surrounding spaces ignored.

    Returns:
        Its :class:`TrainerKindFacts`.

    Raises:
        ConfigError: anything else (the message lists the supported types).
    """
    if isinstance(trainer_type, str) and trainer_type.strip().upper() in TRAINER_KINDS:
        return TRAINER_KINDS[trainer_type.strip().upper()]
    names = ", ".join(repr(t) for t in TRAINER_TYPES)
    raise ConfigError(f"trainer_type must be one of {names}, got {trainer_type!r}")
