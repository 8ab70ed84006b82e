"""LeafConfig: one fully resolved run configuration (no knobs left), as the expansion produces it."""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import json
import numbers
import os
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

from rapidfire_nb.errors import ConfigError, closest_name
from rapidfire_nb.training import fields

from .configs import TRAINER_CONFIG_CLASSES, RFLoraConfig, normalize_model_field
from .knobs import is_knob

__all__ = ["FUNCTION_KEYS", "LeafConfig", "jsonable", "make_leaf"]

FUNCTION_KEYS: tuple[str, ...] = ("formatting_func", "compute_metrics", "reward_funcs")
"""``with_changes`` keys whose values are functions (accepted only with ``allow_functions=True``)."""

_MODEL_LEVEL_KEYS: tuple[str, ...] = (
    "model_name",
    "tokenizer",
    "formatting_func",
    "compute_metrics",
    "model_type",
    "ref_model_name",
    "reward_funcs",
    "generation_config",
)
# Prefixed hparam keys -> LeafConfig attribute holding the dict.
_DICT_PREFIXES: dict[str, str] = {
    "lora.": "lora",
    "model_kwargs.": "model_kwargs",
    "ref_model_kwargs.": "ref_model_kwargs",
    "tokenizer_kwargs.": "tokenizer_kwargs",
    "generation_config.": "generation_config",
}


def _qualified_name(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or type(obj).__module__
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return f"{module}.{name}"


def jsonable(value: Any) -> Any:
    """Turn a config value into plain JSON data, deterministically.

    Functions and classes become ``"module.qualname"``; enums their value; tuples/sets lists; objects with
    ``to_dict()`` (``GenerationConfig``, ``BitsAndBytesConfig``) a dict with ``"__class__"``; anything else its
    ``repr`` (or its type's name when the repr holds a memory address).

    Args:
        value: Any value found in a ``LeafConfig``.

    Returns:
        ``None``, ``bool``, ``int``, ``float``, ``str``, ``list`` or ``dict`` data.
    """
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((jsonable(v) for v in value), key=repr)
    if isinstance(value, functools.partial):
        return {
            "partial": jsonable(value.func),
            "args": jsonable(value.args),
            "kwargs": jsonable(value.keywords),
        }
    if isinstance(value, type) or (callable(value) and hasattr(value, "__qualname__")):
        return _qualified_name(value)
    if isinstance(value, numbers.Integral) and type(value).__name__ != "bool_":
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if type(value).__name__ == "bool_":
        return bool(value)
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        try:
            data = to_dict()
        except (TypeError, ValueError, AttributeError, RuntimeError):
            data = None
        if isinstance(data, Mapping):
            return {"__class__": _qualified_name(type(value)), **jsonable(data)}
    text = repr(value)
    return _qualified_name(type(value)) if " at 0x" in text else text


def _find_knob(value: Any, path: str) -> str | None:
    if is_knob(value):
        return path
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = _find_knob(item, f"{path}.{key}")
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = _find_knob(item, f"{path}[{i}]")
            if found:
                return found
    return None


@dataclasses.dataclass(frozen=True)
class LeafConfig:
    """One run's resolved configuration, as produced by ``RFGridSearch.expand``/``RFRandomSearch.expand``.

    Frozen; the dicts inside must not be mutated (use ``with_changes``). Equality compares fields;
    ``fingerprint()`` compares configurations across processes.

    Attributes:
        trainer_type: ``"SFT"``, ``"DPO"`` or ``"GRPO"``.
        model_name: Model id or path.
        tokenizer: Tokenizer id or path, or ``None``.
        tokenizer_kwargs: Tokenizer loading keywords, or ``None``.
        formatting_func: Row formatting function, or ``None``.
        compute_metrics: Trainer ``compute_metrics``, or ``None``.
        lora: ``peft.LoraConfig`` keyword arguments as the user set them, or ``None`` (full fine-tuning).
        training: Trainer-config keyword arguments as the user set them (after renamed names are mapped);
            TRL's defaults fill the rest when ``rapidfire_nb.training.build`` builds the real config.
        model_type: ``"causal_lm"``.
        model_kwargs: ``from_pretrained`` keywords (``{}`` when none).
        ref_model_name: Reference model id (DPO/GRPO), or ``None``.
        ref_model_kwargs: Reference model ``from_pretrained`` keywords, or ``None``.
        reward_funcs: GRPO reward functions (or reward model ids), or ``None``.
        generation_config: Generation settings, or ``None``.

    Raises:
        ConfigError: At construction, when a knob is left, the trainer type is unknown, GRPO has no
            ``reward_funcs``, or a field is used by a trainer that ignores it.
    """

    trainer_type: str
    model_name: str
    tokenizer: str | None = None
    tokenizer_kwargs: dict[str, Any] | None = None
    formatting_func: Callable[..., Any] | None = None
    compute_metrics: Callable[..., Any] | None = None
    lora: dict[str, Any] | None = None
    training: dict[str, Any] = dataclasses.field(default_factory=dict)
    model_type: str = "causal_lm"
    model_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    ref_model_name: str | None = None
    ref_model_kwargs: dict[str, Any] | None = None
    reward_funcs: tuple[Any, ...] | None = None
    generation_config: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "trainer_type", fields.normalize_trainer_type(self.trainer_type))
        if self.model_kwargs is None:
            object.__setattr__(self, "model_kwargs", {})
        if self.reward_funcs is not None and not isinstance(self.reward_funcs, tuple):
            object.__setattr__(self, "reward_funcs", tuple(self.reward_funcs))
        for f in dataclasses.fields(self):
            found = _find_knob(getattr(self, f.name), f.name)
            if found:
                raise ConfigError(f"{found} is still a List/Range: a LeafConfig holds concrete values only")
        if self.trainer_type == "GRPO" and not self.reward_funcs:
            raise ConfigError(
                "GRPO needs reward functions: set RFModelConfig(reward_funcs=[my_reward, ...]) "
                "(each reward_func(prompts, completions, **kwargs) -> list[float])"
            )
        if self.trainer_type != "GRPO" and self.reward_funcs:
            raise ConfigError(
                f"reward_funcs is used only by GRPO, but trainer_type is {self.trainer_type!r}; remove it"
            )
        if self.trainer_type == "SFT" and (self.ref_model_name is not None or self.ref_model_kwargs):
            raise ConfigError(
                "ref_model_name/ref_model_kwargs are used only by DPO and GRPO; remove them for SFT"
            )

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    # ------------------------------------------------------------------ views
    def to_json(self) -> dict[str, Any]:
        """Every field as JSON data (functions as ``"module.qualname"``).

        Returns:
            A dict with one key per field.
        """
        return {f.name: jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def fingerprint(self) -> str:
        """A stable text identifying this configuration: canonical JSON of ``to_json()``.

        Two expansions of the same config group give equal fingerprints, in any process, as long as the
        functions keep their module and qualified name (a function's body is not part of it).

        Returns:
            Compact JSON with sorted keys.
        """
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    def hparams(self) -> dict[str, Any]:
        """Flat hyperparameters, in the one naming scheme used by the panel, the store and ``with_changes``.

        Keys: ``model_name``; trainer fields bare (``learning_rate``), only those the user set; LoRA fields
        ``lora.<field>``; ``model_kwargs.<key>``; and, when set, ``tokenizer``, ``tokenizer_kwargs.<key>``,
        ``formatting_func``, ``compute_metrics``, ``model_type``, ``ref_model_name``,
        ``ref_model_kwargs.<key>``, ``reward_funcs`` and ``generation_config.<key>``.

        Returns:
            ``{key: JSON value}``; functions appear as ``"module.qualname"``.
        """
        out: dict[str, Any] = {"model_name": self.model_name}
        out.update({k: jsonable(v) for k, v in self.training.items()})
        for attr, prefix in (("lora", "lora."), ("model_kwargs", "model_kwargs.")):
            out.update({prefix + k: jsonable(v) for k, v in (getattr(self, attr) or {}).items()})
        for key in (
            "tokenizer",
            "formatting_func",
            "compute_metrics",
            "model_type",
            "ref_model_name",
            "reward_funcs",
        ):
            value = getattr(self, key)
            if value is not None:
                out[key] = jsonable(value)
        for attr in ("tokenizer_kwargs", "ref_model_kwargs"):
            out.update({f"{attr}.{k}": jsonable(v) for k, v in (getattr(self, attr) or {}).items()})
        if isinstance(self.generation_config, Mapping):
            out.update({f"generation_config.{k}": jsonable(v) for k, v in self.generation_config.items()})
        elif self.generation_config is not None:
            out["generation_config"] = jsonable(self.generation_config)
        return out

    def model_config_dict(self) -> dict[str, Any]:
        """What ``create_model_fn(model_config)`` receives, as in ``rapidfireai``.

        Returns:
            A fresh dict with keys ``model_name``, ``model_kwargs`` (a copy), ``tokenizer``,
            ``tokenizer_kwargs``, ``model_type``, ``peft_config`` (the LoRA kwargs dict or ``None``),
            ``training_args`` (the trainer kwargs dict), ``ref_model_name``, ``ref_model_kwargs``,
            ``formatting_func``, ``compute_metrics``, ``reward_funcs`` (a list or ``None``) and
            ``generation_config``.
        """
        return {
            "model_name": self.model_name,
            "model_kwargs": _copy(self.model_kwargs),
            "tokenizer": self.tokenizer,
            "tokenizer_kwargs": _copy(self.tokenizer_kwargs),
            "model_type": self.model_type,
            "peft_config": _copy(self.lora),
            "training_args": _copy(self.training),
            "ref_model_name": self.ref_model_name,
            "ref_model_kwargs": _copy(self.ref_model_kwargs),
            "formatting_func": self.formatting_func,
            "compute_metrics": self.compute_metrics,
            "reward_funcs": list(self.reward_funcs) if self.reward_funcs is not None else None,
            "generation_config": _copy(self.generation_config),
        }

    # ------------------------------------------------------------------ checks and changes
    def validate(self) -> list[str]:
        """Build the real TRL config and ``peft.LoraConfig`` for this machine, to surface invalid values.

        Imports torch/trl/peft (through ``rapidfire_nb.training.build``). Nothing is written to disk.

        Returns:
            The adaptation notes ``build_training_args`` gives (e.g. fp16 switched off on CPU).

        Raises:
            ConfigError: TRL or PEFT rejects a value; the message names the field and quotes the library.
        """
        from rapidfire_nb.training.build import build_lora_config, build_training_args

        _, notes = build_training_args(
            self, output_dir=os.path.join(tempfile.gettempdir(), "rapidfire_nb-validate"), default_seed=0
        )
        build_lora_config(self)
        return notes

    def with_changes(self, changes: Mapping[str, Any], *, allow_functions: bool = False) -> LeafConfig:
        """A copy with some hyperparameters changed (clone-modify), checked by building the real configs.

        Args:
            changes: ``{key: concrete value}`` in the ``hparams()`` naming scheme: trainer fields bare
                (``learning_rate``; renamed old names are mapped with a ``FutureWarning``), ``lora.<field>``,
                ``model_kwargs.<key>``, ``ref_model_kwargs.<key>``, ``tokenizer_kwargs.<key>``,
                ``generation_config.<key>``, and ``model_name``, ``tokenizer``, ``model_type``,
                ``ref_model_name``, ``generation_config``, ``formatting_func``, ``compute_metrics``,
                ``reward_funcs``.
            allow_functions: Accept the function-valued keys (``formatting_func``, ``compute_metrics``,
                ``reward_funcs``); they cannot come from the panel or the REST API.

        Returns:
            A new ``LeafConfig``; ``self`` is unchanged.

        Raises:
            ConfigError: Unknown key (with the closest valid one), a function-valued key without
                ``allow_functions``, a ``List``/``Range`` value, ``lora.*`` on a run without LoRA, or a value
                TRL/PEFT rejects (the message names the field and quotes the library).
        """
        if not isinstance(changes, Mapping):
            raise ConfigError(f"changes must be a dict of {{name: value}}, got {type(changes).__name__}")
        trainer_cls = fields.trainer_config_class(self.trainer_type)
        updates: dict[str, Any] = {}
        dicts: dict[str, dict[str, Any] | None] = {
            attr: (dict(getattr(self, attr)) if isinstance(getattr(self, attr), Mapping) else None)
            for attr in set(_DICT_PREFIXES.values())
        }
        dicts["training"] = dict(self.training)
        touched: set[str] = set()
        for key, value in changes.items():
            if not isinstance(key, str):
                raise ConfigError(f"change keys must be strings, got {key!r}")
            found = _find_knob(value, key)
            if found:
                raise ConfigError(f"{found}: with_changes takes concrete values, not List/Range knobs")
            if key in _MODEL_LEVEL_KEYS:
                if key in FUNCTION_KEYS and not allow_functions:
                    raise ConfigError(
                        f"{key} holds a function and cannot be changed from the panel or the REST API; "
                        "clone from code with allow_functions=True"
                    )
                updates[key] = normalize_model_field(key, value)
                continue
            prefix = next((p for p in _DICT_PREFIXES if key.startswith(p)), None)
            if prefix is not None:
                attr, sub = _DICT_PREFIXES[prefix], key[len(prefix) :]
                self._change_dict_entry(attr, sub, value, dicts)
                touched.add(attr)
                continue
            name, value = self._trainer_field(trainer_cls, key, value)
            problem = fields.check_value(trainer_cls, name, value)
            if problem:
                raise ConfigError(problem)
            dicts["training"][name] = value  # type: ignore[index]
            touched.add("training")
        for attr in touched:
            if attr in updates:
                raise ConfigError(f"`{attr}` and `{attr}.<key>` both given; change one or the other")
            updates[attr] = dicts[attr]
        new = dataclasses.replace(self, **updates)
        new.validate()
        return new

    def _trainer_field(self, trainer_cls: type, key: str, value: Any) -> tuple[str, Any]:
        if key in fields.field_names(trainer_cls):
            return key, value
        rename = fields.find_rename(trainer_cls, key)
        if rename is not None:
            if rename.convert is not None:
                value = rename.convert(value)
            fields.warn_user(rename.message(value))
            return rename.new, value
        candidates = list(fields.field_names(trainer_cls)) + list(_MODEL_LEVEL_KEYS)
        if self.lora is not None:
            candidates += ["lora." + n for n in fields.field_names(fields.lora_config_class())]
        candidates += ["model_kwargs." + k for k in self.model_kwargs]
        hint = closest_name(key, candidates)
        raise ConfigError(
            f"unknown hyperparameter `{key}` for a {self.trainer_type} run"
            + (f"; did you mean `{hint}`?" if hint else "")
            + " (trainer fields are bare, e.g. learning_rate; LoRA fields lora.<field>; model kwargs model_kwargs.<key>)"
        )

    def _change_dict_entry(
        self, attr: str, sub: str, value: Any, dicts: dict[str, dict[str, Any] | None]
    ) -> None:
        if not sub:
            raise ConfigError(f"`{attr}.` needs a key after the dot, e.g. {attr}.name")
        if attr == "lora":
            if dicts["lora"] is None:
                raise ConfigError(
                    f"lora.{sub}: this run trains without LoRA (peft_config=None); nothing to change"
                )
            lora_cls = fields.lora_config_class()
            if sub not in fields.field_names(lora_cls):
                hint = closest_name(sub, fields.field_names(lora_cls))
                raise ConfigError(
                    f"unknown LoRA field `lora.{sub}`" + (f"; did you mean `lora.{hint}`?" if hint else "")
                )
            problem = fields.check_value(lora_cls, sub, value)
            if problem:
                raise ConfigError(problem.replace(f"{lora_cls.__name__}.{sub}", f"lora.{sub}", 1))
            dicts["lora"][sub] = value  # type: ignore[index]
            return
        if (
            attr == "generation_config"
            and self.generation_config is not None
            and not isinstance(self.generation_config, Mapping)
        ):
            raise ConfigError(
                "generation_config.<key>: this run's generation_config is not a dict; set generation_config"
            )
        if attr in ("model_kwargs", "ref_model_kwargs"):
            rename = fields.find_model_kwargs_rename(sub)
            if rename is not None:
                fields.warn_user(f"{attr}: " + rename.message(value))
                sub = rename.new
        data = dicts[attr] if dicts[attr] is not None else {}
        data[sub] = value
        dicts[attr] = data


def _copy(value: Any) -> Any:
    try:
        return copy.deepcopy(value)
    except (TypeError, AttributeError, copy.Error):  # an object that refuses deep copies: share it
        return copy.copy(value)


def make_leaf(trainer_type: str, resolved: Mapping[str, Any], where: str = "config") -> LeafConfig:
    """Turn one knob-free assignment of ``RFModelConfig`` fields into a ``LeafConfig``.

    Args:
        trainer_type: ``"SFT"``, ``"DPO"`` or ``"GRPO"`` (already normalised).
        resolved: ``{field: value}`` for every ``RFModelConfig`` field, knobs already chosen;
            ``peft_config``/``training_args`` are wrapper instances or ``None``.
        where: Where the config sits in the user's group (for messages), e.g. ``"configs[1]"``.

    Returns:
        The leaf (values deep-copied, so leaves share no mutable state).

    Raises:
        ConfigError: ``training_args`` of the wrong trainer type, or a trainer requirement not met.
    """
    training_args = resolved.get("training_args")
    expected = TRAINER_CONFIG_CLASSES[trainer_type]
    if training_args is not None and not isinstance(training_args, expected):
        raise ConfigError(
            f"{where}.training_args is {type(training_args).__name__} but trainer_type is {trainer_type!r}: "
            f"use {expected.__name__}"
        )
    peft_config = resolved.get("peft_config")
    if peft_config is not None and not isinstance(peft_config, RFLoraConfig):
        raise ConfigError(
            f"{where}.peft_config must be an RFLoraConfig or None, got {type(peft_config).__name__}"
        )
    try:
        return LeafConfig(
            trainer_type=trainer_type,
            model_name=resolved["model_name"],
            tokenizer=resolved.get("tokenizer"),
            tokenizer_kwargs=_copy(resolved.get("tokenizer_kwargs")),
            formatting_func=resolved.get("formatting_func"),
            compute_metrics=resolved.get("compute_metrics"),
            lora=_copy(peft_config.kwargs) if peft_config is not None else None,
            training=_copy(training_args.kwargs) if training_args is not None else {},
            model_type=resolved.get("model_type") or "causal_lm",
            model_kwargs=_copy(resolved.get("model_kwargs")) or {},
            ref_model_name=resolved.get("ref_model_name"),
            ref_model_kwargs=_copy(resolved.get("ref_model_kwargs")),
            reward_funcs=resolved.get("reward_funcs"),
            generation_config=_copy(resolved.get("generation_config")),
        )
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
