"""Plain values of a run spec: the knob marker, JSON conversion, copies and the model-level field checks.

Standard library only (and ``rapidfire_nb.schema`` for renamed ``model_kwargs`` keys).
"""

from __future__ import annotations

import copy
import enum
import functools
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from rapidfire_nb import schema
from rapidfire_nb.errors import ConfigError

__all__ = ["MODEL_VALUE_CHECKS", "Knob", "check_model_field", "deep_copy", "find_knob", "jsonable"]


class Knob:
    """Marker base of search-space values (``rapidfire_nb.automl.List``/``Range``).

    A run spec holds concrete values only: ``LeafConfig`` rejects any ``Knob`` left inside it. The marker lives
    here, below ``automl``, so the spec can recognise knobs without importing the search layer.
    """

    __slots__ = ()


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


def find_knob(value: Any, path: str) -> str | None:
    """The path of the first knob inside ``value`` (dicts, lists and tuples are searched), else ``None``.

    Args:
        value: A config value.
        path: Its name, the prefix of the path returned (e.g. ``"training"``).

    Returns:
        e.g. ``"training.learning_rate"`` or ``"lora.target_modules[1]"``; ``None`` when ``value`` is concrete.
    """
    if isinstance(value, Knob):
        return path
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = find_knob(item, f"{path}.{key}")
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = find_knob(item, f"{path}[{i}]")
            if found:
                return found
    return None


def deep_copy(value: Any) -> Any:
    """A deep copy of ``value``; an object that refuses deep copies is copied shallowly (and shared inside)."""
    try:
        return copy.deepcopy(value)
    except (TypeError, AttributeError, copy.Error):  # an object that refuses deep copies: share it
        return copy.copy(value)


# ---------------------------------------------------------------------------------------- model-level fields
def _check_str(name: str, optional: bool) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value:
            raise ConfigError(
                f"RFModelConfig.{name} must be a {'string or None' if optional else 'non-empty string'}, got {value!r}"
            )
        return value

    return check


def _check_callable(name: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value is not None and not callable(value):
            raise ConfigError(
                f"RFModelConfig.{name} must be a function or None, got {type(value).__name__} {value!r}"
            )
        return value

    return check


def _check_dict(name: str, renames: bool = False) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ConfigError(
                f"RFModelConfig.{name} must be a dict or None, got {type(value).__name__} {value!r}"
            )
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(f"RFModelConfig.{name} keys must be strings, got {key!r}")
            rename = schema.find_model_kwargs_rename(key) if renames else None
            if rename is not None:
                if rename.new in value:
                    raise ConfigError(
                        f"RFModelConfig.{name}: both `{key}` and `{rename.new}` given; keep `{rename.new}`"
                    )
                schema.warn_user(f"RFModelConfig.{name}: " + rename.message(item))
                key = rename.new
            out[key] = item
        return out

    return check


def _check_reward_funcs(value: Any) -> Any:
    if value is None:
        return None
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise ConfigError("RFModelConfig.reward_funcs is empty; give one or more reward functions, or None")
    for item in items:
        if not (callable(item) or isinstance(item, str)):
            raise ConfigError(
                "RFModelConfig.reward_funcs must be a reward function, a reward model id, or a list of them "
                f"(List([...]) of such lists for alternatives), got {type(item).__name__} {item!r}"
            )
    return tuple(items)


def _check_generation_config(value: Any) -> Any:
    if value is None or isinstance(value, dict) or hasattr(value, "to_dict"):
        return dict(value) if isinstance(value, dict) else value
    raise ConfigError(
        f"RFModelConfig.generation_config must be a dict, a GenerationConfig or None, got {type(value).__name__}"
    )


def _check_num_gpus(value: Any) -> Any:
    """``num_gpus``: None (the run's devices follow ``run_fit``) or the number of devices one run trains on (>= 1)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"RFModelConfig.num_gpus must be a positive int (the devices one run trains on: GPUs, or CPU workers "
            f"with run_fit(devices=k)) or None, got {type(value).__name__} {value!r}"
        )
    return value


MODEL_VALUE_CHECKS: dict[str, Callable[[Any], Any]] = {
    "model_name": _check_str("model_name", optional=False),
    "tokenizer": _check_str("tokenizer", optional=True),
    "tokenizer_kwargs": _check_dict("tokenizer_kwargs"),
    "formatting_func": _check_callable("formatting_func"),
    "compute_metrics": _check_callable("compute_metrics"),
    "model_type": _check_str("model_type", optional=False),
    "model_kwargs": _check_dict("model_kwargs", renames=True),
    "ref_model_name": _check_str("ref_model_name", optional=True),
    "ref_model_kwargs": _check_dict("ref_model_kwargs", renames=True),
    "reward_funcs": _check_reward_funcs,
    "generation_config": _check_generation_config,
    "num_gpus": _check_num_gpus,
}
"""One check per concrete ``RFModelConfig`` field other than ``peft_config``/``training_args`` (the wrappers)."""


def check_model_field(name: str, value: Any) -> Any:
    """Check and normalise one concrete model-level value (not a knob).

    Args:
        name: A key of ``MODEL_VALUE_CHECKS`` (``model_name``, ``tokenizer``, ``model_kwargs``, ...).
        value: The value as the user wrote it.

    Returns:
        The value to record: dicts copied with renamed ``model_kwargs`` keys mapped (``torch_dtype`` ->
        ``dtype``, with a ``FutureWarning``), ``reward_funcs`` as a tuple, others unchanged.

    Raises:
        ConfigError: A value of the wrong kind; the message names the field (``RFModelConfig.<name>``).
    """
    return MODEL_VALUE_CHECKS[name](value)
