"""The panel's wire format and JSON helpers, shared by the panel (kernel side) and the server extension.

Standard library only: the server extension imports this module and the store, nothing else of rapidfire_nb.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any

__all__ = ["clean_json", "decode_points", "encode_points", "json_type_name"]


def json_type_name(v: Any) -> str:
    """The JSON type name of a hyperparameter value, as stored in the kernel's ``editable_fields`` meta."""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "str"
    if isinstance(v, (list, tuple)):
        return "list"
    if v is None:
        return "null"
    return "other"


def clean_json(value: Any) -> Any:
    """Make ``value`` strict-JSON-able (what ``json.dumps(..., allow_nan=False)`` and jupyter_client accept).

    Non-finite floats become None, enums their values, tuples lists, mapping keys strings, numpy/torch scalars
    Python numbers, and any other object its ``str``. Used for every panel message and every server reply.
    """
    if isinstance(value, Enum):
        return clean_json(value.value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, Mapping):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    if hasattr(value, "item"):  # numpy / torch scalars
        try:
            return clean_json(value.item())
        except (TypeError, ValueError):
            pass
    return str(value)


def encode_points(points: Iterable[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Columnar encoding of metric points; keeps the order of ``points``.

    Returns:
        ``{"names": [metric names], "run", "step", "samples", "name" (index into names), "value", "wall"}``:
        one list entry per point; ``wall`` is the point's ``wall_time`` (unix s) or null.
    """
    names: list[str] = []
    index: dict[str, int] = {}
    out: dict[str, list[Any]] = {
        "names": names,
        "run": [],
        "step": [],
        "samples": [],
        "name": [],
        "value": [],
        "wall": [],
    }
    for p in points:
        name = str(p["name"])
        i = index.get(name)
        if i is None:
            i = index[name] = len(names)
            names.append(name)
        out["run"].append(clean_json(p["run_id"]))
        out["step"].append(clean_json(p.get("step")))
        out["samples"].append(clean_json(p.get("samples_seen")))
        out["name"].append(i)
        out["value"].append(clean_json(p.get("value")))
        wall = p.get("wall_time")
        out["wall"].append(clean_json(wall) if isinstance(wall, (int, float)) else None)
    return out


def decode_points(encoded: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    """Inverse of :func:`encode_points` (used by tests and tools); ``wall_time`` only where it was encoded."""
    names = encoded["names"]
    walls = encoded.get("wall") or [None] * len(encoded["run"])
    out = []
    for r, s, x, n, v, w in zip(
        encoded["run"],
        encoded["step"],
        encoded["samples"],
        encoded["name"],
        encoded["value"],
        walls,
        strict=True,
    ):
        point = {"run_id": r, "step": s, "samples_seen": x, "name": names[n], "value": v}
        if w is not None:
            point["wall_time"] = w
        out.append(point)
    return out
