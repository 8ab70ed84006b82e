"""Who may train an experiment: one writer process, held by an OS lock on ``<experiment>/writer.lock``.

The process that trains holds the lock (:class:`rapidfire_nb._writer_lock.WriterLock`) from ``run_fit`` to
``end()``; the system drops it when that process dies. Everyone else opens the experiment read-only, and whoever
finds it orphaned (lock free, no live writer on another host) settles what the dead writer left behind.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path
from typing import Any

from .._writer_lock import LOCK_FILENAME, WriterLock
from ..errors import ExperimentError
from .restore import reconcile

__all__ = ["other_writer", "settle_orphan", "wipe"]


def other_writer(lock: WriterLock, store: Any) -> int | None:
    """Pid of another live process training this experiment (its writer lock is held, or — for a writer on
    another host — its heartbeat is fresh); None when nobody else is (-1 when the pid is unknown)."""
    if not lock.held and not lock.is_free():
        return lock.holder_pid() or -1
    beat = store.heartbeat()
    if beat is not None and beat.get("host") != socket.gethostname() and store.writer_alive():
        return int(beat.get("pid") or -1)
    return None


def settle_orphan(lock: WriterLock, store: Any) -> int | None:
    """If the experiment's writer is gone, settle its runs and ops (:func:`~.restore.reconcile`).

    Returns:
        The pid of the live writer elsewhere (nothing is changed then), else None.
    """
    other = other_writer(lock, store)
    if other is None and store.heartbeat() is not None:
        reconcile(store)
    return other


def wipe(path: Path, name: str) -> None:
    """``overwrite=True``: delete everything in the experiment folder but the lock file, which stays locked meanwhile.

    Raises:
        ExperimentError: another process trains it.
    """
    guard = WriterLock(path)
    if not guard.acquire():
        raise ExperimentError(
            f"experiment {name!r} is being trained by process {guard.holder_pid()}; it cannot be "
            "overwritten while it trains. End it there first, or pick a new name"
        )
    try:
        for child in path.iterdir():
            if child.name == LOCK_FILENAME:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    finally:
        guard.release()
