"""Config wrappers that record the user's arguments: RFModelConfig, RFLoraConfig, RFSFTConfig, RFDPOConfig, RFGRPOConfig.

They are drop-in replacements for ``rapidfireai.automl``'s classes. Each wrapper accepts every field of the
class it wraps (``peft.LoraConfig``, ``trl.SFTConfig``, ...), checks names and values as they are written, and
keeps the arguments exactly as given (values may be ``List``/``Range`` knobs). No TRL/PEFT object is built
here: that happens per expanded run in ``rapidfire_nb.spec.build``, after adapting the config to the
machine (TRL's defaults fail at construction on a CPU-only machine).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, ClassVar

from rapidfire_nb import schema
from rapidfire_nb.errors import ConfigError, closest_name
from rapidfire_nb.spec.names import check_run_name, check_tags, template_fields
from rapidfire_nb.spec.values import MODEL_VALUE_CHECKS

from .knobs import List, Range

__all__ = [
    "MODEL_FIELDS",
    "RFDPOConfig",
    "RFGRPOConfig",
    "RFLoraConfig",
    "RFModelConfig",
    "RFSFTConfig",
    "RFWrappedConfig",
]


def _map_alternatives(value: Any, fn: Callable[[Any], Any], where: str, allow_range: bool = False) -> Any:
    """Apply ``fn`` to ``value``, or to each alternative of a ``List`` (recursively); keep knobs."""
    if isinstance(value, List):
        return List([_map_alternatives(v, fn, where, allow_range) for v in value.values])
    if isinstance(value, Range) and not allow_range:
        raise ConfigError(f"{where} cannot be a Range; give the alternatives as List([...])")
    return fn(value)


def _convert_knob(value: Any, convert: Callable[[Any], Any] | None) -> Any:
    """Apply a rename's value conversion to a concrete value, each List alternative, or a Range's bounds."""
    if convert is None:
        return value
    if isinstance(value, List):
        return List([_convert_knob(v, convert) for v in value.values])
    if isinstance(value, Range):
        convert(value.start)
        convert(value.end)
        return value
    return convert(value)


class RFWrappedConfig:
    """Base of the wrappers: records keyword arguments for one TRL/PEFT config dataclass.

    Reading an attribute returns the recorded value, or the wrapped class's declared default for a field
    left unset. Setting an attribute (``cfg.learning_rate = 1e-4``) is checked like a constructor argument
    and recorded. ``del cfg.learning_rate`` forgets it (back to the default).
    """

    _trainer_type: ClassVar[str | None] = None

    @classmethod
    def wrapped_class(cls) -> type:
        """The TRL/PEFT class this wrapper records arguments for (imports trl/peft on first use)."""
        if cls._trainer_type is None:
            return schema.lora_config_class()
        return schema.trainer_config_class(cls._trainer_type)

    def __init__(self, **kwargs: Any) -> None:
        object.__setattr__(self, "_kwargs", {})
        written: dict[str, str] = {}
        for name, value in kwargs.items():
            recorded = self._record(name, value)
            if recorded in written and written[recorded] != name:
                raise ConfigError(
                    f"{type(self).__name__}: both `{written[recorded]}` and `{name}` set `{recorded}`; keep one"
                )
            written[recorded] = name

    @classmethod
    def _from_recorded(cls, kwargs: dict[str, Any]) -> RFWrappedConfig:
        """A wrapper holding already-checked arguments (used by the expansion; no checks, no warnings)."""
        new = cls.__new__(cls)
        object.__setattr__(new, "_kwargs", dict(kwargs))
        return new

    def _record(self, name: str, value: Any) -> str:
        target = self.wrapped_class()
        owner = type(self).__name__
        if name not in schema.field_names(target):
            rename = schema.find_rename(target, name)
            if rename is None:
                raise ConfigError(self._unknown_message(name))
            value = _convert_knob(value, rename.convert)
            schema.warn_user(f"{owner}: " + rename.message(value))
            name = rename.new
        if name == "run_name":  # TRL's field: the run's name (moved to LeafConfig.run_name at the expansion)
            value = _check_name(value, f"{owner}.run_name")
        _check_field(target, owner, name, value)
        self._kwargs[name] = value
        return name

    def _unknown_message(self, name: str) -> str:
        target = self.wrapped_class()
        hint = closest_name(name, schema.field_names(target))
        suggestion = f"; did you mean `{hint}`?" if hint else ""
        return (
            f"{type(self).__name__}: unknown argument `{name}` "
            f"(not a field of {target.__module__.split('.')[0]}.{target.__name__}){suggestion}"
        )

    @property
    def kwargs(self) -> dict[str, Any]:
        """The recorded arguments, in the order written (a shallow copy; values may be knobs)."""
        return dict(self._kwargs)

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails, i.e. for schema.
        if name.startswith("__") or name == "_kwargs":
            raise AttributeError(name)
        recorded = self.__dict__.get("_kwargs", {})
        if name in recorded:
            return recorded[name]
        target = self.wrapped_class()
        if name in schema.field_names(target):
            return schema.field_default(target, name)
        raise AttributeError(self._unknown_message(name))

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            self._record(name, value)

    def __delattr__(self, name: str) -> None:
        if name in self._kwargs:
            del self._kwargs[name]
        else:
            object.__delattr__(self, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | schema.field_names(self.wrapped_class()))

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._kwargs == self._kwargs  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._kwargs.items())
        return f"{type(self).__name__}({args})"

    def copy(self) -> RFWrappedConfig:
        """A deep copy (knobs and values copied; functions shared)."""
        return type(self)._from_recorded(copy.deepcopy(self._kwargs))


def _check_field(target: type, owner: str, name: str, value: Any) -> None:
    """Check a recorded value (concrete, a List of values, or a Range) for field ``name`` of ``target``."""
    if isinstance(value, List):
        for alternative in value.values:
            _check_field(target, owner, name, alternative)
        return
    if isinstance(value, Range):
        for bound in (value.start, value.end):
            problem = schema.check_value(target, name, bound)
            if problem:
                raise ConfigError(f"{owner}({name}={value!r}): {problem}")
        return
    problem = schema.check_value(target, name, value)
    if problem:
        raise ConfigError(f"{owner}: {problem}")


class RFLoraConfig(RFWrappedConfig):
    """Records ``peft.LoraConfig`` arguments; any field may be a ``List``/``Range`` knob.

    Args:
        **kwargs: Any ``peft.LoraConfig`` field (``r``, ``lora_alpha``, ``lora_dropout``, ``target_modules``,
            ``bias``, ``task_type``, ...). ``task_type`` defaults to ``"CAUSAL_LM"`` when the run is built.

    Raises:
        ConfigError: Unknown field (the message names the closest valid one), or a value of the wrong type
            or out of range (e.g. ``r <= 0``).
    """


class RFSFTConfig(RFWrappedConfig):
    """Records ``trl.SFTConfig`` arguments; any field may be a ``List``/``Range`` knob.

    Args:
        **kwargs: Any ``trl.SFTConfig`` field (``learning_rate``, ``per_device_train_batch_size``,
            ``max_steps``, ``max_length``, ``fp16``, ...). Names removed from older TRL/transformers
            (``warmup_ratio``, ``evaluation_strategy``, ``max_seq_length``, ...) are mapped to their
            new names with a ``FutureWarning``.

    Raises:
        ConfigError: Unknown field (the message names the closest valid one), or a value of the wrong type.
    """

    _trainer_type = "SFT"


class RFDPOConfig(RFWrappedConfig):
    """Records ``trl.DPOConfig`` arguments (``beta``, ``loss_type``, ``max_length``, ...); see ``RFSFTConfig``."""

    _trainer_type = "DPO"


class RFGRPOConfig(RFWrappedConfig):
    """Records ``trl.GRPOConfig`` arguments (``num_generations``, ``max_completion_length``, ...); see ``RFSFTConfig``."""

    _trainer_type = "GRPO"


TRAINER_CONFIG_CLASSES: dict[str, type[RFWrappedConfig]] = {  # one line per trainer type
    "SFT": RFSFTConfig,
    "DPO": RFDPOConfig,
    "GRPO": RFGRPOConfig,
}

# ------------------------------------------------------------------------------------------ RFModelConfig

MODEL_FIELDS: tuple[str, ...] = (
    "model_name",
    "tokenizer",
    "tokenizer_kwargs",
    "formatting_func",
    "compute_metrics",
    "peft_config",
    "training_args",
    "model_type",
    "model_kwargs",
    "ref_model_name",
    "ref_model_kwargs",
    "reward_funcs",
    "generation_config",
    "num_gpus",
    "run_name",
    "tags",
)
"""``RFModelConfig``'s fields in declaration order (the grid search varies the last one fastest; ``run_name`` and
``tags`` are labels, never knobs)."""


def _check_name(value: Any, where: str) -> str | None:
    """A run name or name template (never a knob: one name per config, filled per run)."""
    if isinstance(value, (List, Range)):
        raise ConfigError(
            f"{where} cannot be a {type(value).__name__}: a name is not a hyperparameter to search. Give one name; "
            'a template such as "lr{learning_rate}-r{lora.r}" names each run of a sweep by its values'
        )
    name = check_run_name(value, where)
    if name is not None:
        template_fields(
            name, where
        )  # the braces parse (each field is checked against a run at the expansion)
    return name


def _check_tags(value: Any) -> tuple[str, ...]:
    if isinstance(value, (List, Range)):
        raise ConfigError("RFModelConfig.tags cannot be a knob: give a list of str, e.g. tags=['baseline']")
    return check_tags(value, "RFModelConfig.tags")


def _check_peft(value: Any) -> Any:
    if value is None or isinstance(value, RFLoraConfig):
        return value
    hint = ""
    if type(value).__name__ == "LoraConfig":
        hint = "; wrap the arguments instead: RFLoraConfig(r=..., lora_alpha=..., ...)"
    raise ConfigError(
        f"RFModelConfig.peft_config must be an RFLoraConfig, a List of them, or None, got {type(value).__name__}{hint}"
    )


def _check_training(value: Any) -> Any:
    wrappers = tuple(TRAINER_CONFIG_CLASSES.values())
    if value is None or isinstance(value, wrappers):
        return value
    hint = ""
    if type(value).__name__ in {w.__name__.removeprefix("RF") for w in wrappers}:
        hint = f"; wrap the arguments instead: RF{type(value).__name__}(learning_rate=..., ...)"
    names = [w.__name__ for w in wrappers]
    raise ConfigError(
        f"RFModelConfig.training_args must be an {', '.join(names[:-1])} or {names[-1]}, a List of them, "
        f"or None, got {type(value).__name__}{hint}"
    )


_MODEL_FIELD_CHECKS: dict[str, Callable[[Any], Any]] = {
    **MODEL_VALUE_CHECKS,  # the concrete model-level fields, checked as the run spec checks them
    "peft_config": _check_peft,
    "training_args": _check_training,
    "run_name": lambda value: _check_name(value, "RFModelConfig.run_name"),
    "tags": _check_tags,
}


def normalize_model_field(name: str, value: Any) -> Any:
    """Check and normalise one ``RFModelConfig`` field value (each alternative of a ``List``).

    Args:
        name: One of ``MODEL_FIELDS``.
        value: The value as the user wrote it.

    Returns:
        The value to record: dicts copied with renamed keys mapped, ``reward_funcs`` as a tuple, a plain
        list of ``RFLoraConfig`` turned into a ``List`` (alternatives, as in ``rapidfireai``).

    Raises:
        ConfigError: A value of the wrong kind; the message names the field.
    """
    if name == "peft_config" and isinstance(value, (list, tuple)):
        value = List(value)
    if name in ("run_name", "tags"):  # labels: never alternatives
        return _MODEL_FIELD_CHECKS[name](value)
    return _map_alternatives(value, _MODEL_FIELD_CHECKS[name], f"RFModelConfig.{name}")


_REQUIRED: Any = object()  # marks an argument that has no default (checked in the body for a clear error)


class RFModelConfig:
    """One model + trainer configuration; any argument may be a ``List`` of alternatives.

    Knobs may also sit inside ``peft_config``/``training_args`` fields and inside ``model_kwargs``,
    ``ref_model_kwargs``, ``tokenizer_kwargs`` and ``generation_config`` values.

    Args:
        model_name: Model id or path, passed to ``create_model_fn`` as ``model_config["model_name"]``.
        tokenizer: Tokenizer id or path when it differs from ``model_name``.
        tokenizer_kwargs: Keyword arguments for loading the tokenizer (passed through).
        formatting_func: ``row -> dict`` applied to every dataset row before training.
        compute_metrics: ``EvalPrediction -> dict[str, float]`` given to the trainer.
        peft_config: ``RFLoraConfig`` for LoRA training, ``None`` for full fine-tuning. A plain list of
            ``RFLoraConfig`` means alternatives, like ``List``.
        training_args: ``RFSFTConfig``/``RFDPOConfig``/``RFGRPOConfig``, matching the search's
            ``trainer_type``; ``None`` means TRL's defaults.
        model_type: ``"causal_lm"`` (passed to ``create_model_fn``).
        model_kwargs: ``from_pretrained`` keywords (``dtype``, ``device_map``, ...); ``torch_dtype`` is
            mapped to ``dtype`` with a ``FutureWarning``.
        ref_model_name: Reference model for DPO/GRPO when it differs from the trained one.
        ref_model_kwargs: ``from_pretrained`` keywords of the reference model.
        reward_funcs: GRPO reward functions: one function or a list of functions (a plain list is one
            set of rewards, not alternatives); ``List([[f, g], [f]])`` for alternatives.
        generation_config: Generation settings (a dict or a ``GenerationConfig``), passed through.
        num_gpus: Devices each run of this config trains on at once (an int >= 1; ``rapidfireai``'s field): k > 1
            shards the run over a gang of k devices with PyTorch FSDP2 when its ``training_args`` set ``fsdp``
            (``fsdp_config`` as in Hugging Face's ``TrainingArguments``), else data-parallel (DDP). None: as
            ``run_fit(num_gpus=...)``, or one device. On a CPU machine the devices are ``run_fit(devices=k)``'s
            CPU workers.
        run_name: The runs' name, shown next to the run id in the panel, the ``/rapidfire/`` page,
            ``get_runs_info()``, TensorBoard and the trackers (the MLflow/Trackio/W&B run name); a label, never a
            key (not part of the config's fingerprint). A template ``"lr{learning_rate}-r{lora.r}"`` is filled per
            run from its hyperparameters (``hparams()`` names, TRL's default for a trainer field left unset; format
            specs as in ``str.format``: ``"{learning_rate:.0e}"``); runs of an ``RFGridSearch``/``RFRandomSearch`` still
            sharing a name get the hyperparameters they differ in appended (``"base (learning_rate=0.0001, r=8)"``;
            ``RFOptuna`` asks its trials one at a time: give it a template). TRL's own
            ``RFSFTConfig(run_name=...)`` works the same; set it in one place. A clone is named ``"<name>
            (clone)"`` unless its changes give ``run_name``. At most 128 characters, one line.
        tags: Free labels of the runs (a list of str, each at most 64 characters): the trackers' tags, a
            ``tags`` column of ``get_runs_info()``. Not part of the fingerprint.

    Raises:
        ConfigError: A value of the wrong kind (the message names the field): a ``run_name`` that is not a str,
            is empty, longer than 128 characters, multi-line, a ``List`` or an unparsable template; a template field
            that is not a hyperparameter of a run is reported by the expansion (``run_fit``, before training).
            Setting an attribute after construction is checked the same way; an unknown attribute name is rejected
            with the closest valid name.
    """

    def __init__(
        self,
        model_name: Any = _REQUIRED,
        tokenizer: Any = None,
        tokenizer_kwargs: Any = None,
        formatting_func: Any = None,
        compute_metrics: Any = None,
        peft_config: Any = None,
        training_args: Any = None,
        model_type: Any = "causal_lm",
        model_kwargs: Any = None,
        ref_model_name: Any = None,
        ref_model_kwargs: Any = None,
        reward_funcs: Any = None,
        generation_config: Any = None,
        num_gpus: Any = None,
        run_name: Any = None,
        tags: Any = None,
        **unknown: Any,
    ) -> None:
        values = locals()
        for name in unknown:  # a misspelt keyword: the same message as a misspelt attribute
            self.__setattr__(name, unknown[name])
        if model_name is _REQUIRED:
            raise ConfigError(
                "RFModelConfig needs `model_name` (a model id or path passed to create_model_fn), "
                'e.g. RFModelConfig(model_name="HuggingFaceTB/SmolLM2-135M-Instruct", ...)'
            )
        for name in MODEL_FIELDS:
            setattr(self, name, values[name])

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in MODEL_FIELDS:
            hint = closest_name(name, MODEL_FIELDS)
            raise ConfigError(
                f"RFModelConfig has no field `{name}`"
                + (f"; did you mean `{hint}`?" if hint else "")
                + f" (fields: {', '.join(MODEL_FIELDS)})"
            )
        object.__setattr__(self, name, normalize_model_field(name, value))

    def __repr__(self) -> str:
        args = ", ".join(
            f"{name}={getattr(self, name)!r}"
            for name in MODEL_FIELDS
            if getattr(self, name) is not None
            and not (name == "model_type" and self.model_type == "causal_lm")
            and not (name == "tags" and not self.tags)
        )
        return f"RFModelConfig({args})"

    def copy(self) -> RFModelConfig:
        """A deep copy (wrappers and knobs copied; functions shared)."""
        return copy.deepcopy(self)
