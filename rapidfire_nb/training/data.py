"""Dataset preparation: apply the user's ``formatting_func`` once and check the columns the trainer needs."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from rapidfire_nb.errors import ConfigError

from .trainers import TrainerKind

__all__ = ["prepare_dataset"]

_CACHE: dict[tuple[int, Any, str], Any] = {}


def _fn_key(fn: Callable | None) -> Any:
    return None if fn is None else (getattr(fn, "__module__", None), getattr(fn, "__qualname__", repr(fn)), id(fn))


def prepare_dataset(ds: Any, formatting_func: Callable[[dict], dict] | None, kind: TrainerKind, what: str) -> Any:
    """Return ``ds`` mapped through ``formatting_func`` (row -> dict of new columns), cached per (ds, fn).

    Raises:
        ConfigError: empty dataset, a ``formatting_func`` that raises on the first row or does not return a
            dict, or rows missing the columns ``kind`` needs.
    """
    if ds is None or len(ds) == 0:
        raise ConfigError(f"{what} is empty: pass a datasets.Dataset with at least one row")
    if not hasattr(ds, "column_names") or not hasattr(ds, "map"):
        raise ConfigError(f"{what} must be a datasets.Dataset, got {type(ds).__name__}; e.g. "
                          "datasets.Dataset.from_list(rows)")
    key = (id(ds), _fn_key(formatting_func), kind.name)
    hit = _CACHE.get(key)
    if hit is not None and hit[0]() is ds:
        return hit[1]
    out = ds
    if formatting_func is not None:
        first = ds[0]
        try:
            sample = formatting_func(dict(first))
        except Exception as exc:
            raise ConfigError(
                f"formatting_func {getattr(formatting_func, '__qualname__', formatting_func)!r} raised "
                f"{type(exc).__name__}: {exc} on the first row of {what} (columns {sorted(first)}); fix the "
                "function or the data"
            ) from exc
        if not isinstance(sample, dict):
            raise ConfigError(
                f"formatting_func must return a dict of columns (e.g. {{'prompt': [...], 'completion': [...]}}), "
                f"got {type(sample).__name__}"
            )
        produced = set(sample)
        remove = [] if kind.keep_extra_columns else [c for c in ds.column_names if c not in produced]
        name = getattr(formatting_func, "__qualname__", repr(formatting_func))

        def checked(row: dict, idx: int) -> dict:
            try:
                return formatting_func(row)
            except Exception as exc:
                raise ConfigError(f"formatting_func {name!r} raised {type(exc).__name__}: {exc} on row {idx} of "
                                  f"{what}; fix the function or the data") from exc

        try:
            out = ds.map(checked, with_indices=True, remove_columns=remove)
        except ConfigError:
            raise
        except Exception as exc:  # datasets wraps errors raised inside map
            cause = exc.__cause__ if isinstance(exc.__cause__, ConfigError) else None
            if cause is not None:
                raise cause from None
            raise ConfigError(f"applying formatting_func {name!r} to {what} failed: {type(exc).__name__}: {exc}") \
                from exc
    cols = set(out.column_names)
    if not any(set(req) <= cols for req in kind.required_columns):
        need = " or ".join("/".join(r) for r in kind.required_columns)
        raise ConfigError(
            f"{what} rows need the columns {need} for {kind.name} (after formatting_func); they have "
            f"{sorted(cols)}. Add a formatting_func to RFModelConfig that returns them"
        )
    try:
        _CACHE[key] = (weakref.ref(ds), out)
    except TypeError:
        pass
    return out
