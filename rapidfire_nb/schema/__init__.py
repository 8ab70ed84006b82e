"""The TRL/PEFT field schema: what TRL's and PEFT's config classes accept (names, defaults, checks, renames).

The bottom layer after ``errors``: the run spec (``rapidfire_nb.spec``), ``rapidfire_nb.automl`` and
``rapidfire_nb.training`` read it; it imports none of them. ``rapidfire_nb.automl`` checks the user's arguments
against these lists when a config is written, without building any TRL/PEFT object. Importing this module
is cheap: ``trl``/``peft`` (and with them torch) are imported on the first call that needs a class, and every
answer is cached per class.

The one table of renamed/deprecated argument names lives here (``RENAMES``). A rename applies only when the
installed library really lacks the old name and has the new one, so the table stays correct across the
versions ``pyproject.toml`` allows. What each trainer kind is (its TRL config and trainer classes, which
model-level fields it takes) is one table in :mod:`rapidfire_nb.schema.trainer_kinds`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib.metadata
import math
import numbers
import os
import sys
import types
import typing
import warnings
from collections.abc import Callable
from typing import Any

from rapidfire_nb.errors import ConfigError
from rapidfire_nb.redact import REDACTED, is_secret_key

from .trainer_kinds import TRAINER_TYPES, trainer_kind

__all__ = [
    "MAX_EPOCHS",
    "MAX_GENERATIONS",
    "MAX_ROWS",
    "MAX_SEED",
    "MAX_STEPS",
    "MAX_TOKENS",
    "MODEL_KWARGS_RENAMES",
    "RENAMES",
    "TRAINER_TYPES",
    "Rename",
    "check_value",
    "field_default",
    "field_names",
    "find_model_kwargs_rename",
    "find_rename",
    "lora_config_class",
    "none_means",
    "normalize_trainer_type",
    "trainer_config_class",
    "value_bound",
    "warn_user",
]


def normalize_trainer_type(trainer_type: object) -> str:
    """Return ``trainer_type`` upper-cased after checking it names a supported trainer.

    Args:
        trainer_type: ``"SFT"``, ``"DPO"`` or ``"GRPO"``, any case.

    Returns:
        ``"SFT"``, ``"DPO"`` or ``"GRPO"``.

    Raises:
        ConfigError: Anything else (:func:`~rapidfire_nb.schema.trainer_kinds.trainer_kind`).
    """
    return trainer_kind(trainer_type).name


def trainer_config_class(trainer_type: str) -> type:
    """Return TRL's config class for a trainer type (imports ``trl`` on first use).

    Args:
        trainer_type: ``"SFT"``, ``"DPO"`` or ``"GRPO"`` (any case).

    Returns:
        ``trl.SFTConfig``, ``trl.DPOConfig`` or ``trl.GRPOConfig``.

    Raises:
        ConfigError: Unknown trainer type.
    """
    import trl

    return getattr(trl, trainer_kind(trainer_type).config_class_name)  # type: ignore[no-any-return]


def lora_config_class() -> type:
    """Return ``peft.LoraConfig`` (imports ``peft`` on first use)."""
    from peft import LoraConfig

    return typing.cast(type, LoraConfig)  # typed or not, depending on peft's version


@functools.cache
def field_names(cls: type) -> frozenset[str]:
    """Names the dataclass ``cls`` accepts as constructor keywords (its ``init=True`` fields).

    Args:
        cls: A dataclass such as ``trl.SFTConfig`` or ``peft.LoraConfig``.

    Returns:
        The field names, cached per class.
    """
    return frozenset(f.name for f in dataclasses.fields(cls) if f.init)


@functools.cache
def _fields_by_name(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def field_default(cls: type, name: str) -> Any:
    """Return the declared default of field ``name`` of ``cls`` (a fresh copy for mutable defaults).

    This is the dataclass default, before the class's ``__post_init__`` derives anything (TRL's
    ``bf16`` default is ``None``, which ``SFTConfig`` later turns into ``not fp16``).

    Args:
        cls: A dataclass such as ``trl.SFTConfig``.
        name: One of ``field_names(cls)``.

    Returns:
        The default value, or ``None`` when the field declares none.

    Raises:
        KeyError: ``name`` is not a field of ``cls``.
    """
    field = _fields_by_name(cls)[name]
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


# ----------------------------------------------------------------------------------------------
# Value checks. TRL's config classes do not check types (``learning_rate="abc"`` is accepted and
# fails inside the optimizer), and PEFT checks ``r`` only when the adapter is created. We check the
# scalar part of each field's annotation, and leave containers and library classes to the library.
# ----------------------------------------------------------------------------------------------


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except (NameError, TypeError, AttributeError):  # unresolvable forward reference: no type checks
        return {}


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or type(value).__name__ == "bool_"


def _matches(value: Any, tp: Any) -> bool:
    """Whether ``value`` fits annotation ``tp``; unknown kinds of annotation accept anything."""
    if tp is Any or tp is object:
        return True
    if tp is type(None) or tp is None:
        return value is None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        return any(_matches(value, arg) for arg in args)
    if origin is typing.Literal:
        return any(type(value) is type(arg) and value == arg for arg in args) or (
            isinstance(value, enum.Enum) and value.value in args
        )
    if tp is bool:
        return _is_bool(value)
    if tp is int:
        return isinstance(value, numbers.Integral) and not _is_bool(value)
    if tp is float:
        return isinstance(value, numbers.Real) and not _is_bool(value)
    if tp is str:
        return isinstance(value, str)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return isinstance(value, (tp, str))
    if origin is list or tp is list:
        if isinstance(value, (list, tuple)):
            return not args or all(_matches(item, args[0]) for item in value)
        # TRL wraps a single value itself (DPOConfig(loss_type="sigmoid") -> ["sigmoid"]).
        return bool(args) and not isinstance(value, (dict, set)) and _matches(value, args[0])
    if origin is dict or tp is dict:
        return isinstance(value, dict)
    if origin is tuple or tp is tuple:
        return isinstance(value, (list, tuple))
    return True


def _type_text(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join(_type_text(arg) for arg in typing.get_args(tp))
    if origin is typing.Literal:
        return " | ".join(repr(arg) for arg in typing.get_args(tp))
    if tp is type(None):
        return "None"
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _positive(value: Any) -> bool:
    return bool(value > 0)


def _non_negative(value: Any) -> bool:
    return bool(value >= 0)


def _unit_interval(value: Any) -> bool:
    return bool(0 <= value <= 1)


# (library, field) -> (rule, message). Library messages are quoted where the library has one.
_VALUE_RULES: dict[tuple[str, str], tuple[Callable[[Any], bool], str]] = {
    ("peft", "r"): (_positive, "`r` should be a positive integer value but the value passed is {value!r}"),
    ("peft", "lora_dropout"): (_unit_interval, "lora_dropout must be within [0, 1], got {value!r}"),
    ("trl", "learning_rate"): (_non_negative, "Invalid learning rate: {value!r}"),
    ("trl", "per_device_train_batch_size"): (
        _positive,
        "per_device_train_batch_size must be a positive integer, got {value!r}",
    ),
    ("trl", "gradient_accumulation_steps"): (
        _positive,
        "gradient_accumulation_steps must be a positive integer, got {value!r}",
    ),
}

MAX_STEPS = 10**9
"""The most optimizer steps a run may make (``max_steps``, or epochs x steps per epoch): ~12 days at 1 ms a step."""
MAX_EPOCHS = 10**6
"""The largest ``num_train_epochs``."""
MAX_ROWS = 2**20
"""The largest batch, generation batch or accumulation count (1,048,576 rows or micro-batches)."""
MAX_TOKENS = 2**20
"""The largest sequence, prompt or completion length (1,048,576 tokens)."""
MAX_GENERATIONS = 2**16
"""The largest ``num_generations`` / ``num_iterations`` (GRPO)."""
MAX_SEED = 2**32 - 1
"""The largest seed numpy (hence ``transformers.set_seed``) accepts."""

_STEPS = (0, MAX_STEPS, "optimizer steps")
_ROWS = (1, MAX_ROWS, "rows")
_TOKENS = (1, MAX_TOKENS, "tokens")

# (library, field) -> (lowest, highest, unit): what a config or a clone may set, so that an absurd number (a typo,
# or a POSTed clone) is refused at once instead of planning, allocating or generating for days. Optional fields
# keep None. The highest values are far above what one machine trains; they only guard against nonsense.
_BOUNDS: dict[tuple[str, str], tuple[float, float, str]] = {
    ("trl", "max_steps"): (-1, MAX_STEPS, "optimizer steps; -1: use num_train_epochs"),
    ("trl", "num_train_epochs"): (0, MAX_EPOCHS, "epochs"),
    ("trl", "warmup_steps"): _STEPS,
    ("trl", "per_device_train_batch_size"): _ROWS,
    ("trl", "per_device_eval_batch_size"): _ROWS,
    ("trl", "generation_batch_size"): _ROWS,
    ("trl", "gradient_accumulation_steps"): (1, MAX_ROWS, "micro-batches"),
    ("trl", "eval_accumulation_steps"): (1, MAX_ROWS, "micro-batches"),
    ("trl", "steps_per_generation"): (1, MAX_ROWS, "micro-batches"),
    ("trl", "max_length"): _TOKENS,
    ("trl", "max_prompt_length"): _TOKENS,
    ("trl", "max_completion_length"): _TOKENS,
    ("trl", "num_generations"): (1, MAX_GENERATIONS, "completions per prompt"),
    ("trl", "num_generations_eval"): (1, MAX_GENERATIONS, "completions per prompt"),
    ("trl", "num_iterations"): (1, MAX_GENERATIONS, "iterations per generation"),
    ("trl", "seed"): (0, MAX_SEED, "numpy's seed range"),
    ("trl", "data_seed"): (0, MAX_SEED, "numpy's seed range"),
    ("trl", "dataloader_num_workers"): (0, 256, "worker processes"),
    ("trl", "dataloader_prefetch_factor"): (1, 1024, "batches per worker"),
    ("trl", "learning_rate"): (0, math.inf, "a finite learning rate"),
    ("peft", "r"): (1, MAX_GENERATIONS, "the LoRA rank"),
}


def value_bound(cls: type, name: str) -> tuple[float, float, str] | None:
    """The range rapidfire_nb accepts for a numeric field, if it bounds it.

    Args:
        cls: The wrapped dataclass (``trl.SFTConfig``, ``peft.LoraConfig``, ...).
        name: A field of ``cls``.

    Returns:
        ``(lowest, highest, unit)`` (inclusive; ``highest`` may be ``inf`` for "any finite number"), or ``None``.
    """
    return _BOUNDS.get((_library(cls), name))


def _out_of_bounds(cls: type, name: str, value: Any) -> str | None:
    bound = value_bound(cls, name)
    if bound is None or not isinstance(value, numbers.Real) or _is_bool(value):
        return None
    lo, hi, unit = bound
    if isinstance(value, numbers.Integral):
        if lo <= int(value) <= hi:  # ints compared exactly (10**400 does not fit a float)
            return None
    elif math.isfinite(float(value)) and lo <= float(value) <= hi:
        return None
    if math.isinf(hi):
        return f"{cls.__name__}.{name}={value!r} is not allowed: give {unit} >= {lo:g}"
    return (
        f"{cls.__name__}.{name}={value!r} is out of range: rapidfire_nb accepts {lo:,} to {hi:,} ({unit}); "
        f"give a value in that range"
    )


_NONE_MEANS: dict[tuple[str, str], tuple[Any, str]] = {
    # transformers 4 read max_grad_norm=None as "do not clip"; transformers 5 compares it with 0 at the first
    # step (TypeError: '>' not supported between NoneType and int), although the config accepts it
    ("trl", "max_grad_norm"): (0.0, "no gradient clipping, as transformers 4 read None"),
}


def none_means(cls: type, name: str) -> tuple[Any, str] | None:
    """For a field typed without ``None`` whose ``None`` had a meaning: ``(the value meaning it, the meaning)``.

    ``check_value`` accepts ``None`` for such a field and ``rapidfire_nb.spec.build`` passes the value instead,
    with a note. Fields whose annotation accepts ``None`` keep it (and are not listed).

    Args:
        cls: The wrapped dataclass.
        name: A field of ``cls``.

    Returns:
        ``(value, meaning)``, or ``None`` when ``None`` needs no translation for this field.
    """
    entry = _NONE_MEANS.get((_library(cls), name))
    tp = _type_hints(cls).get(name)
    if entry is None or name not in field_names(cls) or (tp is not None and _matches(None, tp)):
        return None
    return entry


def _library(cls: type) -> str:
    return "peft" if cls.__module__.split(".")[0] == "peft" else "trl"


def check_value(cls: type, name: str, value: Any) -> str | None:
    """Check one concrete value for field ``name`` of ``cls`` before any library object is built.

    Checks the scalar part of the field's annotation (``bool``, ``int``, ``float``, ``str``, ``None``,
    ``Literal``, enums, ``list[...]`` of those) and a few value rules the libraries only enforce later
    (LoRA ``r > 0``, ``0 <= lora_dropout <= 1``, ``learning_rate >= 0``, positive batch size and
    gradient accumulation), and the ranges of ``value_bound`` (steps, epochs, batch sizes, lengths, generations,
    seeds: an absurd number is refused here, before anything plans or allocates for it). Fields annotated with
    library classes are left to the library.

    Args:
        cls: The wrapped dataclass (``trl.SFTConfig``, ``peft.LoraConfig``, ...).
        name: A field of ``cls``.
        value: A concrete value (no ``List``/``Range``).

    Returns:
        ``None`` when the value is acceptable, else a message naming the field, the expected type
        and the value.
    """
    tp = _type_hints(cls).get(name)
    if value is None and none_means(cls, name) is not None:
        return None  # what None meant before the library typed the field (build_training_args maps it)
    if tp is not None and not _matches(value, tp):
        shown = REDACTED if is_secret_key(name) else repr(value)  # a mistyped hub_token is still a secret
        return f"{cls.__name__}.{name} expects {_type_text(tp)}, got {shown} ({type(value).__name__})"
    rule = _VALUE_RULES.get((_library(cls), name))
    if rule is not None and isinstance(value, numbers.Real) and not _is_bool(value):
        check, message = rule
        if (isinstance(value, float) and math.isnan(value)) or not check(value):
            return f"{cls.__name__}.{name}: " + message.format(value=value)
    return _out_of_bounds(cls, name, value)


# ----------------------------------------------------------------------------------------------
# Renamed / removed names seen in notebooks written for older TRL and transformers.
# ----------------------------------------------------------------------------------------------


def _warmup_ratio_to_steps(value: Any) -> Any:
    if not isinstance(value, numbers.Real) or _is_bool(value) or not 0 <= value < 1:  # type: ignore[operator]
        raise ConfigError(
            f"warmup_ratio={value!r} cannot be carried over: transformers 5 has no warmup_ratio, and "
            "warmup_steps reads a float in [0, 1) as a fraction of the training steps and a value >= 1 "
            "as a step count; give warmup_steps=<fraction below 1 or a number of steps>"
        )
    return float(value)


@dataclasses.dataclass(frozen=True)
class Rename:
    """One renamed argument.

    Attributes:
        old: The name older notebooks use.
        new: The name the installed library uses.
        scope: ``"trainer"`` (any TRL config class) or ``"model_kwargs"`` (``from_pretrained`` keywords).
        library: The distribution that made the change (``"transformers"`` or ``"trl"``), for the message.
        convert: Turns one old concrete value into the new field's value (raises ``ConfigError``
            when impossible); ``None`` keeps the value.
        meaning: Extra words on how the value carries over, for the message.
    """

    old: str
    new: str
    scope: str
    library: str
    convert: Callable[[Any], Any] | None = None
    meaning: str = ""

    def message(self, value: Any) -> str:
        """The FutureWarning text shown to the user for ``old=value``."""
        try:
            version = importlib.metadata.version(self.library)
        except importlib.metadata.PackageNotFoundError:  # pragma: no cover - installed with rapidfire_nb
            version = ""
        state = "is deprecated" if self.scope == "model_kwargs" else "no longer exists"
        return (
            f"`{self.old}` {state} in {self.library} {version}".rstrip()
            + f": using `{self.new}={value!r}` instead{self.meaning}. Write `{self.new}` to silence this warning."
        )


RENAMES: tuple[Rename, ...] = (
    Rename(
        "warmup_ratio",
        "warmup_steps",
        "trainer",
        "transformers",
        _warmup_ratio_to_steps,
        " (a warmup_steps value below 1 is a fraction of the training steps, as warmup_ratio was)",
    ),
    Rename("evaluation_strategy", "eval_strategy", "trainer", "transformers"),
    Rename("max_seq_length", "max_length", "trainer", "trl"),
    Rename("no_cuda", "use_cpu", "trainer", "transformers"),
    Rename("per_gpu_train_batch_size", "per_device_train_batch_size", "trainer", "transformers"),
    Rename("per_gpu_eval_batch_size", "per_device_eval_batch_size", "trainer", "transformers"),
)
"""Renamed trainer-config arguments (applied only where the old name is gone and the new one exists)."""

MODEL_KWARGS_RENAMES: tuple[Rename, ...] = (
    # Still accepted by transformers 5's from_pretrained, with only a logged "deprecated" line; mapped so the
    # user sees a visible warning and runs on one base model compare equal whichever spelling they used.
    Rename("torch_dtype", "dtype", "model_kwargs", "transformers"),
)
"""Renamed ``from_pretrained`` keywords inside ``RFModelConfig.model_kwargs``/``ref_model_kwargs``."""


def find_rename(cls: type, name: str) -> Rename | None:
    """Return the rename for argument ``name`` of trainer config ``cls``, if one applies here.

    Args:
        cls: The wrapped TRL config class.
        name: The argument name the user wrote.

    Returns:
        The ``Rename`` when ``name`` is a known old name that ``cls`` no longer has and whose new name
        it has; otherwise ``None``.
    """
    names = field_names(cls)
    if name in names or _library(cls) != "trl":
        return None
    for rename in RENAMES:
        if rename.old == name and rename.new in names:
            return rename
    return None


def find_model_kwargs_rename(key: str) -> Rename | None:
    """Return the rename for a ``model_kwargs`` key (e.g. ``torch_dtype`` -> ``dtype``), else ``None``."""
    for rename in MODEL_KWARGS_RENAMES:
        if rename.old == key:
            return rename
    return None


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the rapidfire_nb folder


def warn_user(message: str, category: type[Warning] = FutureWarning) -> None:
    """Emit a warning attributed to the first caller outside ``rapidfire_nb`` (the user's cell).

    Args:
        message: The warning text.
        category: ``FutureWarning`` by default (shown in notebooks, unlike ``DeprecationWarning``).
    """
    level = 1
    frame = sys._getframe(0)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR + os.sep):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    warnings.warn(message, category, stacklevel=level)
