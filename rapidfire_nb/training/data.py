"""Dataset preparation: apply the user's ``formatting_func`` once and check the columns the trainer needs."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Protocol

from rapidfire_nb.errors import ConfigError

__all__ = ["ColumnRules", "prepare_dataset"]


class ColumnRules(Protocol):
    """What a trainer kind says about its rows (``rapidfire_nb.training.kinds.TrainerKind`` has it all)."""

    @property
    def name(self) -> str: ...  # "SFT" | "DPO" | "GRPO" (for messages and the cache key)

    @property
    def required_columns(self) -> tuple[tuple[str, ...], ...]: ...  # any one of these column sets

    @property
    def keep_extra_columns(self) -> bool: ...  # keep the columns formatting_func did not produce


_CACHE: dict[tuple[int, Any, str], Any] = {}


def _fn_key(fn: Callable | None) -> Any:
    return (
        None
        if fn is None
        else (getattr(fn, "__module__", None), getattr(fn, "__qualname__", repr(fn)), id(fn))
    )


def prepare_dataset(
    ds: Any, formatting_func: Callable[[dict], dict] | None, kind: ColumnRules, what: str
) -> Any:
    """Return ``ds`` mapped through ``formatting_func`` (row -> dict of new columns), cached per (ds, fn).

    Args:
        ds: A ``datasets.Dataset`` (rows before ``formatting_func``).
        formatting_func: ``row -> dict`` of columns, or ``None``.
        kind: The trainer kind (its required columns; whether extra columns are kept).
        what: The dataset's name for messages (``"train_dataset"``).

    Returns:
        The mapped dataset (``ds`` itself without ``formatting_func``).

    Raises:
        ConfigError: empty dataset, a ``formatting_func`` that raises on the first row or does not return a
            dict, or rows missing the columns ``kind`` needs.
    """
    if ds is None or len(ds) == 0:
        raise ConfigError(f"{what} is empty: pass a datasets.Dataset with at least one row")
    if not hasattr(ds, "column_names") or not hasattr(ds, "map"):
        raise ConfigError(
            f"{what} must be a datasets.Dataset, got {type(ds).__name__}; e.g. "
            "datasets.Dataset.from_list(rows)"
        )
    key = (id(ds), _fn_key(formatting_func), kind.name)
    hit = _CACHE.get(key)
    if hit is not None and hit[0]() is ds:
        return hit[1]
    out = ds
    if formatting_func is not None:
        produced = _first_row_columns(ds, formatting_func, what)
        remove = [] if kind.keep_extra_columns else [c for c in ds.column_names if c not in produced]
        name = getattr(formatting_func, "__qualname__", repr(formatting_func))

        def checked(row: dict, idx: int) -> dict:
            try:
                return formatting_func(row)
            except Exception as exc:
                raise ConfigError(
                    f"formatting_func {name!r} raised {type(exc).__name__}: {exc} on row {idx} of "
                    f"{what}; fix the function or the data"
                ) from exc

        try:
            out = ds.map(checked, with_indices=True, remove_columns=remove)
        except ConfigError:
            raise
        except Exception as exc:  # datasets wraps errors raised inside map
            cause = exc.__cause__ if isinstance(exc.__cause__, ConfigError) else None
            if cause is not None:
                raise cause from None
            raise ConfigError(
                f"applying formatting_func {name!r} to {what} failed: {type(exc).__name__}: {exc}"
            ) from exc
    _check_columns(out, kind, what)
    try:
        _CACHE[key] = (weakref.ref(ds), out)
    except TypeError:
        pass
    return out


def _first_row_columns(ds: Any, formatting_func: Callable[[dict], dict], what: str) -> set[str]:
    """The columns ``formatting_func`` produces, tried on the first row (a clear error when it fails)."""
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
    return set(sample)


def _check_columns(rows: Any, kind: ColumnRules, what: str) -> None:
    cols = set(rows.column_names)
    if not any(set(req) <= cols for req in kind.required_columns):
        need = " or ".join("/".join(r) for r in kind.required_columns)
        raise ConfigError(
            f"{what} rows need the columns {need} for {kind.name} (after formatting_func); they have "
            f"{sorted(cols)}. Add a formatting_func to RFModelConfig that returns them"
        )
