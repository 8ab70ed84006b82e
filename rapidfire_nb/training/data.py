"""Dataset preparation: apply the user's ``formatting_func`` once and check the rows the trainer will read.

The checks follow the run's config (e.g. SFT's ``dataset_text_field``) and the formats TRL accepts
(:mod:`.formats`): the columns of the format the trainer will pick, and the shape of their values — on every row
``formatting_func`` returns (while mapping), or on the first row of a dataset used as it is.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from rapidfire_nb.errors import ConfigError

from .formats import FROM_VALUE, IDS, RowFormat, row_problem

__all__ = ["ColumnRules", "note_dropped_rows", "prepare_dataset", "rows_dropped"]


class ColumnRules(Protocol):
    """What a trainer kind says about its rows (``rapidfire_nb.training.kinds.TrainerKind`` has it all)."""

    @property
    def name(self) -> str: ...  # "SFT" | "DPO" | "GRPO" (for messages and the cache key)

    @property
    def keep_extra_columns(self) -> bool: ...  # keep the columns formatting_func did not produce

    def row_formats(self, spec: Any = None) -> Sequence[RowFormat]: ...  # in the order the trainer tries them


_CACHE: dict[tuple[Any, ...], Any] = {}


def _fn_key(fn: Callable | None) -> Any:
    return (
        None
        if fn is None
        else (getattr(fn, "__module__", None), getattr(fn, "__qualname__", repr(fn)), id(fn))
    )


def _fn_name(fn: Callable) -> str:
    return str(getattr(fn, "__qualname__", repr(fn)))


def prepare_dataset(
    ds: Any,
    formatting_func: Callable[[dict], dict] | None,
    kind: ColumnRules,
    what: str,
    spec: Any = None,
) -> Any:
    """Return ``ds`` mapped through ``formatting_func`` (row -> dict of new columns), cached per (ds, fn, formats).

    Args:
        ds: A ``datasets.Dataset`` (rows before ``formatting_func``).
        formatting_func: ``row -> dict`` of columns, or ``None``.
        kind: The trainer kind (its row formats; whether extra columns are kept).
        what: The dataset's name for messages (``"train_dataset"``).
        spec: The run spec whose config the formats follow (e.g. ``dataset_text_field``); ``None``: TRL's defaults.

    Returns:
        The mapped dataset (``ds`` itself without ``formatting_func``).

    Raises:
        ConfigError: empty dataset, a ``formatting_func`` that raises or does not return a dict, rows missing the
            columns ``kind`` needs, or a value of the wrong shape (the row index, the column and the expected
            shape named).
    """
    if ds is None or len(ds) == 0:
        raise ConfigError(f"{what} is empty: pass a datasets.Dataset with at least one row")
    if not hasattr(ds, "column_names") or not hasattr(ds, "map"):
        raise ConfigError(
            f"{what} must be a datasets.Dataset, got {type(ds).__name__}; e.g. "
            "datasets.Dataset.from_list(rows)"
        )
    formats = tuple(kind.row_formats(spec))
    key = (id(ds), _fn_key(formatting_func), kind.name, formats)
    hit = _CACHE.get(key)
    if hit is not None and hit[0]() is ds:
        return hit[1]
    out = ds if formatting_func is None else _formatted(ds, formatting_func, kind, formats, what)
    _check_columns(out, kind, formats, what)
    if formatting_func is None:
        _check_row(dict(out[0]), 0, formats, kind, what, None)
        _check_missing(out, formats, kind, what)
    try:
        _CACHE[key] = (weakref.ref(ds), out)
    except TypeError:
        pass
    return out


def _formatted(
    ds: Any,
    formatting_func: Callable[[dict], dict],
    kind: ColumnRules,
    formats: tuple[RowFormat, ...],
    what: str,
) -> Any:
    """``ds.map(formatting_func)``, every returned row checked against the formats (row index in the error)."""
    produced = _first_row_columns(ds, formatting_func, what)
    remove = [] if kind.keep_extra_columns else [c for c in ds.column_names if c not in produced]
    name = _fn_name(formatting_func)

    def checked(row: dict, idx: int) -> dict:
        try:
            out = formatting_func(row)
        except Exception as exc:
            raise ConfigError(
                f"formatting_func {name!r} raised {type(exc).__name__}: {exc} on row {idx} of "
                f"{what}; fix the function or the data"
            ) from exc
        if isinstance(out, dict):
            _check_row({**row, **out} if kind.keep_extra_columns else out, idx, formats, kind, what, name)
        return out

    try:
        return ds.map(checked, with_indices=True, remove_columns=remove)
    except ConfigError:
        raise
    except Exception as exc:  # datasets wraps errors raised inside map
        cause = exc.__cause__ if isinstance(exc.__cause__, ConfigError) else None
        if cause is not None:
            raise cause from None
        raise ConfigError(
            f"applying formatting_func {name!r} to {what} failed: {type(exc).__name__}: {exc}"
        ) from exc


def _first_row_columns(ds: Any, formatting_func: Callable[[dict], dict], what: str) -> set[str]:
    """The columns ``formatting_func`` produces, tried on the first row (a clear error when it fails)."""
    first = ds[0]
    try:
        sample = formatting_func(dict(first))
    except Exception as exc:
        raise ConfigError(
            f"formatting_func {_fn_name(formatting_func)!r} raised "
            f"{type(exc).__name__}: {exc} on the first row of {what} (columns {sorted(first)}); fix the "
            "function or the data"
        ) from exc
    if not isinstance(sample, dict):
        raise ConfigError(
            f"formatting_func must return a dict of columns (e.g. {{'prompt': [...], 'completion': [...]}}), "
            f"got {type(sample).__name__}"
        )
    return set(sample)


def _check_row(
    row: dict, idx: int, formats: tuple[RowFormat, ...], kind: ColumnRules, what: str, fn_name: str | None
) -> None:
    problem = row_problem(row, formats)
    if problem is None or problem == "no format":  # no format at all: _check_columns names the columns
        return
    if fn_name is not None:
        raise ConfigError(
            f"formatting_func {fn_name!r} returned a row {kind.name} cannot train (row {idx} of {what}): {problem}. "
            "Fix the function"
        )
    raise ConfigError(
        f"{what} row {idx} cannot be trained by {kind.name}: {problem}. Fix the data, or add a formatting_func to "
        "RFModelConfig that returns it"
    )


def _check_missing(rows: Any, formats: tuple[RowFormat, ...], kind: ColumnRules, what: str) -> None:
    """A missing value (None) in a column the trainer reads, in any row of a dataset used as it is."""
    cols = set(rows.column_names)
    fmt = next((f for f in formats if f.columns[0] in cols), None)
    if fmt is None:
        return
    for col in fmt.columns:
        if col not in cols:
            continue
        idx = next((i for i, value in enumerate(rows[col]) if value is None), None)
        if idx is not None:
            raise ConfigError(
                f"{what} row {idx} cannot be trained by {kind.name}: column {col!r} is None (a missing value); "
                f"expected {fmt.expected()}. Fix or drop that row, e.g. "
                f"{what}.filter(lambda row: row[{col!r}] is not None)"
            )


def _check_columns(rows: Any, kind: ColumnRules, formats: tuple[RowFormat, ...], what: str) -> None:
    cols = set(rows.column_names)
    if not any(fmt.columns[0] in cols for fmt in formats):
        need = " or ".join("/".join(f.columns) for f in formats if f.shape not in (IDS, FROM_VALUE))
        raise ConfigError(
            f"{what} rows need the columns {need} for {kind.name} (after formatting_func); they have "
            f"{sorted(cols)}. Add a formatting_func to RFModelConfig that returns them"
        )


def rows_dropped(what: str, given: Any, kept: Any, args: Any) -> str | None:
    """Compare the rows a trainer kept after tokenizing with the rows it was given.

    TRL's SFT and DPO trainers drop the rows whose prompt alone fills ``max_length`` (with
    ``truncation_mode="keep_start"`` no completion token would be left to learn from); when every row goes, the
    run could only fail later with "the training set is empty".

    Args:
        what: ``"train_dataset"`` or ``"eval_dataset"``.
        given: the rows passed to the trainer (after ``formatting_func``), or ``None``.
        kept: the trainer's own dataset after its preparation, or ``None``.
        args: the run's TRL config.

    Returns:
        A note when some rows were dropped, else ``None``.

    Raises:
        ConfigError: every row was dropped (``max_length`` named, with the fix).
    """
    if given is None or kept is None or isinstance(kept, Mapping) or getattr(args, "packing", False):
        return None  # several eval sets, or packed sequences (not one per row): nothing to compare
    n, left = len(given), len(kept)
    if left >= n:
        return None
    limit = getattr(args, "max_length", None)
    why = (
        f"their prompt alone fills max_length={limit} tokens, so no completion token is left to learn from "
        f"(truncation_mode={getattr(args, 'truncation_mode', 'keep_start')!r})"
    )
    if left == 0:
        raise ConfigError(
            f"{what}: the trainer dropped all {n} rows after tokenizing them: {why}; raise max_length, or use "
            "truncation_mode='keep_end'"
        )
    return f"{what}: the trainer dropped {n - left} of {n} rows after tokenizing them: {why}"


def note_dropped_rows(
    trainer: Any, train_ds: Any, eval_ds: Any, args: Any, note: Callable[[str], None]
) -> None:
    """Say :func:`rows_dropped`'s note for a built trainer's train rows, then its eval rows (TRL drops the rows
    whose prompt fills ``max_length``).

    Args:
        trainer: the run's built TRL trainer (its ``train_dataset``/``eval_dataset`` as it prepared them).
        train_ds: the training rows it was given (after ``formatting_func``).
        eval_ds: the eval rows it was given, or None.
        args: the run's TRL config.
        note: gets each note (a line for the user).

    Raises:
        ConfigError: every row of one dataset was dropped.
    """
    for what, given, kept in (
        ("train_dataset", train_ds, trainer.train_dataset),
        ("eval_dataset", eval_ds, trainer.eval_dataset),
    ):
        text = rows_dropped(what, given, kept, args)
        if text:
            note(text)
