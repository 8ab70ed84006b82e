"""The public API's plain arguments, checked before they are used: run ids, flags, ``wait``'s limits.

A run id (stop, resume, delete, clone_modify, load_model, submit_op) is an ``int`` (numpy integers too), never a
``bool``, a float or a string that looks like a number. A flag (``warm_start``, ``background``, ``quiet``) is a
``bool``: ``warm_start="no"`` would otherwise be true. ``wait(timeout, chunks)`` takes seconds >= 0 and a chunk
count >= 1.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any

__all__ = ["check_flag", "check_run_id", "check_run_ids", "check_wait_args"]

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


def check_flag(value: Any, name: str, allow_none: bool = False) -> Any:
    """``value`` if it is a ``bool`` (or None with ``allow_none``).

    Raises:
        TypeError: anything else (e.g. ``"no"``, which would be true), naming ``name``.
    """
    if isinstance(value, bool) or (allow_none and value is None):
        return value
    allowed = "True, False or None" if allow_none else "True or False"
    raise TypeError(f"{name} must be {allowed}, got {type(value).__name__} {value!r}")


def check_wait_args(timeout: Any, chunks: Any) -> None:
    """``wait``'s arguments: ``timeout`` seconds (a number >= 0) or None, ``chunks`` an int >= 1 or None.

    Raises:
        TypeError: a value of another type (a string, a bool).
        ValueError: a negative timeout, or fewer than 1 chunk.
    """
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
            raise TypeError(
                f"timeout must be seconds (a number) or None, got {type(timeout).__name__} {timeout!r}"
            )
        if not timeout >= 0:  # also refuses NaN
            raise ValueError(
                f"timeout must be >= 0 seconds (or None to wait as long as needed), got {timeout!r}"
            )
    if chunks is not None:
        if isinstance(chunks, bool) or not isinstance(chunks, numbers.Integral):
            raise TypeError(
                f"chunks must be an int (chunks each active run has done, over all epochs) or None, got "
                f"{type(chunks).__name__} {chunks!r}"
            )
        if chunks < 1:
            raise ValueError(
                f"chunks must be >= 1 (or None to wait until no run is left to train), got {chunks}"
            )
