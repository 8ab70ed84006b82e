"""Background threads yield the CPU to training: a lower scheduling priority for the calling thread (stdlib only).

Linux schedules threads one by one, so one thread of the process can be made to give way. Two strengths:

* :func:`lower_thread_priority` (the recorder, the trackers' thread): ``nice`` +10. They still get their share of
  a busy machine, so the store, the panel and the trackers keep up with training (a lag of about a second).
* :func:`idle_thread_priority` (the checkpoint writer): ``SCHED_IDLE``. The thread runs when a CPU has nothing else
  to do (on a 2-core machine the training thread's OpenMP team leaves ~6-14% of one CPU idle, between its parallel
  regions) and never preempts a normal thread when it wakes up. At nice +10 the writer's wake-ups (the disk, the
  interpreter lock) still preempted the training threads: measured on SmolLM2 with a boundary checkpoint every
  ~0.6 s (``benchmarks/checkpoint_interference.py``), training took 1.063x as long with the writer at nice +10
  and 1.018x with it idle. Under a machine busy with other work the writes wait for idle time (Linux still gives
  an idle thread a sliver of a CPU, so they are never stuck); a checkpoint is then older when a crash comes,
  and a resume from it is still exact.
"""

from __future__ import annotations

import os
import threading

__all__ = ["BACKGROUND_NICE", "idle_thread_priority", "lower_thread_priority"]

BACKGROUND_NICE = 10
"""How much nicer than the process the recorder and the trackers' thread run (Linux ``nice`` steps)."""


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


def idle_thread_priority() -> str:
    """Run the calling thread only on CPU time nothing else wants (Linux ``SCHED_IDLE``).

    Where ``SCHED_IDLE`` is missing or refused (other systems, a sandbox that filters ``sched_setscheduler``),
    the thread is made as nice as it can be instead (+19).

    Returns:
        ``"idle"``, ``"nice"`` (the fallback worked) or ``""`` (neither: the thread runs as it did).
    """
    setscheduler = getattr(os, "sched_setscheduler", None)
    policy = getattr(os, "SCHED_IDLE", None)
    if setscheduler is not None and policy is not None and hasattr(threading, "get_native_id"):
        try:
            setscheduler(threading.get_native_id(), policy, os.sched_param(0))
            return "idle"
        except OSError:
            pass
    return "nice" if lower_thread_priority(19) else ""
