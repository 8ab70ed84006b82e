"""One writer per experiment: an exclusive advisory lock on ``<experiment>/writer.lock``.

The process that trains an experiment holds ``fcntl.flock(LOCK_EX)`` on this file until the experiment ends. The
operating system drops the lock when the process dies, however it dies (SIGKILL, out of memory), so "the lock can
be taken" means "nobody is training this experiment on this machine" — a sharper test than the heartbeat's age.
The holder writes its pid into the file (for messages only).

``flock`` locks belong to an open file description, so two ``WriterLock`` objects on the same folder exclude each
other even inside one process. On a system without ``fcntl`` (Windows) ``acquire`` always succeeds and the
heartbeat stays the only guard. Locks on network file systems may not be honoured across machines; the store's
heartbeat (host + age) covers that case.

Standard library only.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_FILENAME", "WriterLock"]

LOCK_FILENAME = "writer.lock"


class WriterLock:
    """The writer lock of the experiment folder ``experiment_dir`` (the folder must exist)."""

    def __init__(self, experiment_dir: str | os.PathLike[str]) -> None:
        self.path = Path(experiment_dir) / LOCK_FILENAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """True while this object holds the lock."""
        return self._fd is not None

    def acquire(self) -> bool:
        """Take the lock without waiting. Returns False when another holder (process or object) has it."""
        if self._fd is not None:
            return True
        if fcntl is None:  # pragma: no cover - Windows
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # BlockingIOError: held elsewhere
            os.close(fd)
            return False
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return True

    def release(self) -> None:
        """Give the lock back (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def holder_pid(self) -> int | None:
        """The pid the current (or last) holder wrote, or None. For messages; the lock itself is the truth."""
        try:
            text = self.path.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def is_free(self) -> bool:
        """True when nobody holds the lock (checked by taking and releasing it; True if this object holds it)."""
        if self._fd is not None:
            return True
        if not self.acquire():
            return False
        self.release()
        return True

    def __del__(self) -> None:  # an object dropped without end(): do not keep the lock for the process's life
        with contextlib.suppress(Exception):
            self.release()
