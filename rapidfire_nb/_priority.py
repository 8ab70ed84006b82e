"""Background threads yield the CPU to training: a lower scheduling priority for the calling thread (stdlib only).

Linux schedules threads one by one, so one thread of the process can be made to give way. The recorder, the
trackers' thread and the checkpoint writer run at ``nice`` +10: they still get their share of a busy machine, so
the store, the panel and the trackers keep up with training (a lag of about a second) and a checkpoint is on disk
soon after its chunk boundary.

Why not lower (measured 2026-12-04, ``benchmarks/checkpoint_interference.py``, SmolLM2 LoRA training with a
checkpoint written every 0.5 s): on a machine otherwise quiet, the writer at ``SCHED_IDLE`` slowed training a
little less than at nice +10 (1.041-1.048x against 1.056-1.074x; nice +19 1.055-1.061x), but with two other
busy processes on the 2 CPUs it was never better than nice +10 (1.45x against 1.34x; 3.4x against 1.2-2.2x in
another pass) and one ~65 ms write took 16.5-24 s: a thread that gets almost no CPU while it holds the
interpreter lock (or a lock in torch) makes the training thread wait for it, and its checkpoints lag. The crash
test's writes then came after the runs had ended.
"""

from __future__ import annotations

import os
import threading

__all__ = ["BACKGROUND_NICE", "lower_thread_priority"]

BACKGROUND_NICE = 10
"""How much nicer than the process the background threads run (Linux ``nice`` steps)."""


def lower_thread_priority(steps: int = BACKGROUND_NICE) -> bool:
    """Make the calling thread ``steps`` nicer (Linux; elsewhere a no-op).

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
