"""What a run id is, checked where the public API takes one (stop, resume, delete, clone_modify, load_model,
submit_op): an ``int`` (numpy integers too), never a ``bool``, a float or a string that looks like a number."""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any

__all__ = ["check_run_id", "check_run_ids"]

_WHAT = "a run id is an int, the number shown in get_runs_info() and the panel (1, 2, ...)"


def check_run_id(value: Any, name: str = "run_id") -> int:
    """``value`` as a run id.

    Args:
        value: what the caller passed.
        name: the argument's name, for the message.

    Returns:
        The run id as a plain ``int``.

    Raises:
        TypeError: not an int (a bool, a float such as ``1.7``, a string such as ``"2"`` or ``"two"``, None).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a run id, got {type(value).__name__} {value!r}: {_WHAT}")
    return int(value)


def check_run_ids(value: Any, name: str = "run_id") -> int | list[int]:
    """One run id, or a list of them for any iterable of run ids (each checked before any is used).

    Raises:
        TypeError: ``value`` or one of its items is not a run id (the message names which).
    """
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
        items = list(value)
        return [check_run_id(v, f"{name}[{i}]") for i, v in enumerate(items)]
    return check_run_id(value, name)
