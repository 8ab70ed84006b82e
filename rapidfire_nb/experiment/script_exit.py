"""A plain script that ends, or raises, while its runs train in the background: park them before Python exits.

Every thread of a session is a daemon thread, so Python does not wait for them at exit: it finalizes the
interpreter while the device thread is inside a torch op, and the C++ runtime aborts the process ("terminate
called without an active exception", exit status 134, the store's last writes possibly lost). So a session that
trains in the background of a script is watched here: at exit (an ``atexit`` handler, which runs before the
interpreter is finalized and after the script's last line or its traceback) every active run is stopped at the
end of its current chunk, as a first Ctrl-C does, the store, trackers and checkpoints are written, the session
is closed (each parked ``train()`` unwound, the device thread ended), and one line says what was left and how to
continue. The script's own exit status is kept (1 after an uncaught exception, 0 after its last line).

A kernel is not watched here: its shutdown is handled with the kernel (``frontend.on_kernel_shutdown``). A
session already closed (``wait()`` + ``end()``, or a blocking ``run_fit``) has nothing left to do. Torch-free.
"""

from __future__ import annotations

import atexit
import weakref
from typing import Any

from kernel_scheduler import Op, OpKind, RunStatus

__all__ = ["park_at_exit", "watch"]

_WATCHED: list[weakref.ref[Any]] = []  # the background sessions of this process (FitSession), held weakly
_REGISTERED = False
_REASON = "the script ended while it trained in the background"  # the runs' stop_reason


def watch(session: Any) -> None:
    """Park ``session``'s active runs if the script exits while they train (see the module docstring).

    Args:
        session: a started :class:`~rapidfire_nb.experiment.session.FitSession`; held weakly.
    """
    global _REGISTERED
    _WATCHED[:] = [ref for ref in _WATCHED if ref() is not None]
    _WATCHED.append(weakref.ref(session))
    if not _REGISTERED:
        atexit.register(_at_exit)  # registered after torch's and the workers' handlers: it runs before them
        _REGISTERED = True


def _at_exit() -> None:
    for ref in list(_WATCHED):
        session = ref()
        if session is not None:
            park_at_exit(session)


def park_at_exit(session: Any) -> list[int]:
    """Stop ``session``'s active runs at the end of their current chunk, write what they left, close it.

    Args:
        session: a :class:`~rapidfire_nb.experiment.session.FitSession` (``closed``, ``scheduler``,
            ``recorder``, ``executor``, ``snapshots()``, ``close()``; its reporter is the recorder's).

    Returns:
        The ids of the runs that were training (and are now STOPPED, or ended on their own meanwhile); ``[]``
        when the session was closed already or nothing trained.
    """
    if session.closed or not session.scheduler.started:
        return []
    say = session.recorder.reporter.say
    active = [s.run_id for s in session.scheduler.snapshot() if s.status.in_rotation()]
    if active:
        say(
            f"the script ended while runs {active} trained in the background: stopping them at the end of their "
            "current chunk (call experiment.wait() or end() before the script's last line to let them finish)"
        )
        for rid in active:
            session.scheduler.submit(Op(OpKind.STOP, rid, payload={"reason": _REASON}, source="api"))
    try:
        session.scheduler.wait()
        session.recorder.flush()
        session.executor.flush()
    finally:
        session.close()
    snaps = session.snapshots()
    stopped = [rid for rid in active if snaps[rid].status is RunStatus.STOPPED]
    if stopped:
        steps = ", ".join(f"run {rid} at step {snaps[rid].step}/{snaps[rid].total_steps}" for rid in stopped)
        say(
            f"{steps} STOPPED (checkpoints and weights saved). To continue, run the script again with "
            f"experiment.resume({stopped}) and experiment.wait() after run_fit"
        )
    return active
