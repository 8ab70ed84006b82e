"""A store's meta values checked against the JSON types their readers expect (standard library only).

A store is a file on disk: an older version, a hand edit or another tool may leave a meta value of the wrong JSON
type (``hparam_columns`` a number, ``ended_at`` a string). Every reader of the server and the page goes through
:func:`checked_meta`, which drops such a value (as if it were absent) and says which key it dropped and why, so a
malformed value costs one warning line, never an ``Unhandled error`` reply.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from rapidfire_nb import meta_keys

__all__ = ["META_SHAPES", "UNKNOWN_END", "checked_meta", "meta_value"]


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _text(v: Any) -> bool:
    return isinstance(v, str)


def _names(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(n, str) for n in v)


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _object(v: Any) -> bool:
    return isinstance(v, dict)


def _clock(v: Any) -> bool:
    return (
        isinstance(v, dict)
        and _number(v.get("busy_s", 0))
        and (v.get("busy_since") is None or _number(v["busy_since"]))
    )


def _devices(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(d, str) for d in v.values())


def _packs(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(p, int) and not isinstance(p, bool) for p in v.values())


def _editable(v: Any) -> bool:
    return isinstance(v, dict) and all(
        isinstance(f, dict) and all(isinstance(t, str) for t in f.values()) for f in v.values()
    )


def _panel_metrics(v: Any) -> bool:
    return (
        isinstance(v, dict)
        and (v.get("plots") is None or _names(v["plots"]))
        and (v.get("best_by") is None or isinstance(v["best_by"], str))
    )


META_SHAPES: Mapping[str, tuple[str, Callable[[Any], bool]]] = {
    meta_keys.NAME: ("a string", _text),
    meta_keys.CREATED_AT: ("a number (unix seconds)", _number),
    meta_keys.ENDED_AT: ("a number (unix seconds)", _number),
    meta_keys.TRAINER_TYPE: ("a string", _text),
    meta_keys.HPARAM_COLUMNS: ("a list of names", _names),
    meta_keys.NUM_CHUNKS: ("a positive integer", _positive_int),
    meta_keys.METRIC_NAMES: ("a list of names", _names),
    meta_keys.EVAL_METRIC_NAMES: ("a list of names", _names),
    meta_keys.PANEL_METRICS: ('{"plots": [names] | null, "best_by": name | null}', _panel_metrics),
    meta_keys.EDITABLE_FIELDS: ("an object: run id -> {field: JSON type name}", _editable),
    meta_keys.DEVICES: ("an object: run id -> device name", _devices),
    meta_keys.PACKS: ("an object: run id -> pack id", _packs),
    meta_keys.CLOCK: ('{"busy_s": seconds, "busy_since": unix seconds | null}', _clock),
    meta_keys.EARLY_STOPPING: ("an object (the policy's progress)", _object),
}
"""Meta key -> (what its value must be, in words; the check). A stored null always passes (it reads as absent)."""

UNKNOWN_END = 0.0
"""What a malformed ``ended_at`` reads as: ended, at an unknown time. The store refuses ops while ``ended_at`` is
not null (:meth:`rapidfire_nb.store.Store.post_inbox_op`), so the page must not offer them either."""

_READ_AS = {meta_keys.ENDED_AT: (UNKNOWN_END, "read as ended at an unknown time")}


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list" if not value or not _names(value) else "a list of names"
    return "an object of another shape" if isinstance(value, dict) else type(value).__name__


def meta_value(key: str, value: Any) -> Any:
    """``value`` when it has the shape meta ``key`` needs (or ``key`` has no known shape), else None
    (``ended_at``: :data:`UNKNOWN_END`)."""
    shape = META_SHAPES.get(key)
    if value is None or shape is None or shape[1](value):
        return value
    return _READ_AS.get(key, (None, ""))[0]


def checked_meta(meta: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``meta`` without its malformed values, and one warning per value dropped.

    Returns:
        ``(meta, warnings)``: a copy of ``meta`` where each value of :data:`META_SHAPES`'s keys that has the
        wrong shape is removed (``ended_at``: set to :data:`UNKNOWN_END`), and ``["meta 'hparam_columns' holds a number, not a list of names; ignored", ...]``.
    """
    out = dict(meta)
    warnings = []
    for key, value in meta.items():
        if value is None or meta_value(key, value) is value:
            continue
        replacement, how = _READ_AS.get(key, (None, "ignored"))
        if replacement is None:
            del out[key]
        else:
            out[key] = replacement
        warnings.append(f"meta {key!r} holds {_kind(value)}, not {META_SHAPES[key][0]}; {how}")
    return out, warnings
