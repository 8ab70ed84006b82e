"""Background threads yield the CPU to training: a lower scheduling priority for the calling thread (stdlib only)."""

from __future__ import annotations

import os
import threading

__all__ = ["BACKGROUND_NICE", "lower_thread_priority"]

BACKGROUND_NICE = 10
"""How much nicer than the process the checkpoint writer and the recorder run (Linux ``nice`` steps)."""


def lower_thread_priority(steps: int = BACKGROUND_NICE) -> bool:
    """Make the calling thread ``steps`` nicer (Linux schedules threads one by one; elsewhere a no-op).

    Returns:
        True when the priority was changed.
    """
    setpriority = getattr(os, "setpriority", None)
    if setpriority is None or not hasattr(threading, "get_native_id"):
        return False
    tid = threading.get_native_id()
    try:
        setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + steps))
    except OSError:
        return False
    return True
