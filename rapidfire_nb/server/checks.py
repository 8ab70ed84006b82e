"""What an op request may hold, checked before anything is read or written: its bytes, its JSON, its fields.

:func:`parse_op_body` turns a POST body into JSON (size, UTF-8, nesting depth, no NaN/Infinity) and
:func:`parse_op` into ``(op_id, kind, run_id, changes, warm_start)``, :func:`parse_reason` reads a stop's own
``reason``; :func:`check_change` checks one changed field
against the JSON type the kernel stored for it. The op kinds and which of them take ``changes`` and ``warm_start``
are :data:`kernel_scheduler.op_kinds.OP_KINDS`'s. Every refusal is an :class:`ApiError` with an HTTP status and a
message meant for the user. Standard library + :mod:`kernel_scheduler` + :mod:`rapidfire_nb.redact` only.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from typing import Any

from kernel_scheduler import OP_KINDS as KIND_INFO
from kernel_scheduler import OpKind
from kernel_scheduler.ops import OP_ID_PATTERN, OP_ID_RULE

from ..redact import is_secret_key

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_JSON_DEPTH",
    "OP_KINDS",
    "ApiError",
    "check_change",
    "check_value",
    "describe",
    "int_param",
    "json_depth",
    "json_text_depth",
    "parse_op",
    "parse_op_body",
    "parse_reason",
]

MAX_BODY_BYTES = 64 * 1024
"""Largest op request accepted."""

OP_KINDS = tuple(k.value for k in OpKind)
"""Op kinds accepted over HTTP (the kernel's ``OpKind`` values: stop, resume, delete, clone)."""

_WITH_CHANGES = tuple(info.name for info in KIND_INFO.values() if info.takes_changes)

_FIELD_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,199}")
_MAX_STR = 10_000
_MAX_LIST = 1_000
_MAX_CHANGES = 100
MAX_REASON_CHARS = 200
"""Longest stop ``reason`` (the kernel's limit for one sent over the comm: ``FitSession.submit``)."""
_INT_MAX = 2**63 - 1

MAX_JSON_DEPTH = 16
"""Deepest nesting of arrays/objects accepted in an op request (a valid op needs 3: body, changes, a list)."""

_TOO_DEEP = (
    f"the request body is nested too deeply (more than {MAX_JSON_DEPTH} levels of arrays/objects); "
    "an op is {op_id, kind, run_id, changes?, warm_start?, reason?}"
)


class ApiError(Exception):
    """A request the server refuses: ``status`` is the HTTP status, ``message`` says why (shown to the user)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


_JSON_TOKENS = re.compile(r'"(?:[^"\\]+|\\.)*"?|[\[\]{}]', re.DOTALL)


def json_text_depth(text: str) -> int:
    """Deepest nesting of ``[``/``{`` in JSON text, brackets inside strings not counted; never recurses.

    Checked before ``json.loads``, whose decoder recurses once per level (thousands of ``[`` raise
    RecursionError). For text json would reject anyway the count may be too high, never too low.
    """
    depth = deepest = 0
    for match in _JSON_TOKENS.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in ("]", "}"):
            depth -= 1
    return deepest


def json_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """Nesting depth of lists/dicts in a decoded JSON value (a scalar is 0); stops counting past ``limit``.

    Iterative, so a value nested deeper than Python's recursion limit is measured without RecursionError.
    """
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if deepest > limit:
            break
        stack.extend((child, level + 1) for child in children)
    return deepest


def _is_scalar(v: Any) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, int) and not isinstance(v, bool):
        return abs(v) <= _INT_MAX
    if isinstance(v, str):
        return len(v) <= _MAX_STR
    return v is None or isinstance(v, bool)


def check_value(field: str, type_name: str, value: Any) -> None:
    """Raise ApiError(400) unless ``value`` is a JSON value of the field's type."""
    ok: bool
    if type_name == "bool":
        ok = isinstance(value, bool)
        want = "true or false"
    elif type_name == "int":
        ok = isinstance(value, int) and not isinstance(value, bool) and abs(value) <= _INT_MAX
        want = "an integer"
    elif type_name == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and _is_scalar(value)
        want = "a number"
    elif type_name == "str":
        ok = isinstance(value, str) and len(value) <= _MAX_STR
        want = f"a string (at most {_MAX_STR} characters)"
    elif type_name == "list":
        ok = isinstance(value, list) and len(value) <= _MAX_LIST and all(_is_scalar(v) for v in value)
        want = "a list of numbers, strings, booleans or nulls"
    elif type_name == "null":  # currently unset: any plain JSON value; the kernel checks it when applied
        ok = _is_scalar(value) or (
            isinstance(value, list) and len(value) <= _MAX_LIST and all(_is_scalar(v) for v in value)
        )
        want = "a number, string, boolean, null or a list of those"
    else:
        raise ApiError(
            400,
            f"{field} cannot be changed from here (its value is not plain JSON); "
            "use experiment.clone_modify(...) in the notebook",
        )
    if not ok:
        raise ApiError(400, f"{field} must be {want}, got {describe(value)}")


def describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def int_param(name: str, value: Any, *, minimum: int, maximum: int = _INT_MAX) -> int:
    """A query/body integer: a JSON int (not a bool) or a string of decimal digits."""
    if isinstance(value, bool):
        raise ApiError(400, f"{name} must be an integer, got {describe(value)}")
    if isinstance(value, str):
        if not re.fullmatch(r"-?[0-9]{1,19}", value.strip()):
            raise ApiError(400, f"{name} must be an integer, got {describe(value)}")
        value = int(value.strip())
    if not isinstance(value, int):
        raise ApiError(400, f"{name} must be an integer, got {describe(value)}")
    if not minimum <= value <= maximum:
        raise ApiError(400, f"{name} must be between {minimum} and {maximum}, got {value}")
    return value


def parse_op(body: Any) -> tuple[str, str, int, dict[str, Any], bool]:
    """An op request's ``(op_id, kind, run_id, changes, warm_start)``, checked field by field.

    Raises:
        ApiError: 400 for anything but ``{"op_id"?, "kind", "run_id", "changes"?, "warm_start"?, "reason"?}``
            with valid values (only a clone takes ``changes`` and ``warm_start``; a stop's ``reason`` is read by
            :func:`parse_reason`).
    """
    if not isinstance(body, dict):
        raise ApiError(
            400,
            "the request body must be a JSON object {op_id, kind, run_id, changes?, warm_start?, reason?}",
        )
    if json_depth(body) > MAX_JSON_DEPTH:
        raise ApiError(400, _TOO_DEEP)
    unknown = sorted(set(body) - {"op_id", "kind", "run_id", "changes", "warm_start", "reason"})
    if unknown:
        raise ApiError(
            400,
            f"unknown key(s) {', '.join(map(repr, unknown))}; an op has op_id, kind, "
            "run_id, changes, warm_start, reason",
        )
    op_id = body.get("op_id")
    if op_id is None:
        op_id = uuid.uuid4().hex
    if not isinstance(op_id, str) or not OP_ID_PATTERN.fullmatch(op_id):
        raise ApiError(400, OP_ID_RULE)
    kind = body.get("kind")
    if kind not in OP_KINDS:
        raise ApiError(400, f"kind must be one of {', '.join(OP_KINDS)}, got {describe(kind)}")
    if "run_id" not in body:
        raise ApiError(400, "run_id is missing")
    run_id = body["run_id"]
    if isinstance(run_id, bool) or not isinstance(run_id, int) or not 1 <= run_id <= _INT_MAX:
        raise ApiError(400, f"run_id must be a positive integer, got {describe(run_id)}")
    return op_id, kind, run_id, *_clone_fields(kind, body)


def parse_reason(kind: str, body: Any) -> str | None:
    """A stop's own ``reason`` in an op request (the panel's "stop all but best 2 by eval_loss"), checked as the
    kernel checks one sent over the comm (``FitSession.submit``): only a stop names one, a string of at most
    :data:`MAX_REASON_CHARS` characters. None when the body has none (or an empty one): the stop is recorded as
    the user's.

    Raises:
        ApiError: 400 for a reason that is not a string, is longer, or goes with another kind than stop.
    """
    reason = body.get("reason") if isinstance(body, dict) else None
    if reason is None or reason == "":
        return None
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
        raise ApiError(
            400, f"reason must be a text of at most {MAX_REASON_CHARS} characters, got {describe(reason)}"
        )
    if kind != OpKind.STOP.value:
        raise ApiError(400, f"a {kind} op takes no reason (only stop names one)")
    return reason


def _clone_fields(kind: str, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """``(changes, warm_start)`` of an op request (``({}, False)`` for a kind that takes no changes: not a clone)."""
    changes = body.get("changes")
    warm = body.get("warm_start", False)
    if not isinstance(warm, bool):
        raise ApiError(400, f"warm_start must be true or false, got {describe(warm)}")
    if not KIND_INFO[OpKind(kind)].takes_changes:
        if changes not in (None, {}) or warm:
            only = " or ".join(_WITH_CHANGES)
            raise ApiError(400, f"a {kind} op takes no changes and no warm_start (only {only} does)")
        return {}, False
    if changes is None:
        return {}, warm
    if not isinstance(changes, dict):
        raise ApiError(400, "changes must be a JSON object {field: value}")
    if len(changes) > _MAX_CHANGES:
        raise ApiError(400, f"at most {_MAX_CHANGES} changes per clone")
    return changes, warm


def parse_op_body(raw: bytes) -> Any:
    """The JSON value of an op request's body, read with care: at most :data:`MAX_BODY_BYTES`, UTF-8, nested at
    most :data:`MAX_JSON_DEPTH` deep (counted before ``json.loads``, which recurses per level), no ``NaN`` or
    ``Infinity``.

    Raises:
        ApiError: 413 for a body over the size, 400 for one that is not UTF-8 JSON or nests too deeply.
    """
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError(413, f"op requests are at most {MAX_BODY_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    if json_text_depth(text) > MAX_JSON_DEPTH:  # json.loads recurses per level: RecursionError
        raise ApiError(400, _TOO_DEEP)
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ApiError(400, _TOO_DEEP) from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def check_change(key: Any, value: Any, fields: dict[str, str], run_id: int) -> None:
    """One changed field of a clone request: a plain field name, not a secret, editable for run ``run_id``
    (``fields``: name -> stored JSON type) and its value of that type.

    Raises:
        ApiError: 400 naming the field and why.
    """
    if not isinstance(key, str) or not _FIELD_RE.fullmatch(key):
        raise ApiError(400, f"bad field name {describe(key)}")
    if is_secret_key(key):  # never sent to the kernel or stored in the inbox
        raise ApiError(
            400,
            f"{key} is a secret: it is kept in the kernel's memory only and cannot be changed from here "
            "(or in a clone); set it in the notebook's config group",
        )
    if key not in fields:
        known = ", ".join(sorted(fields)) or "none"
        raise ApiError(400, f"{key} is not an editable field of run {run_id} (editable: {known})")
    check_value(key, fields[key], value)
