"""Exceptions raised by rapidfire_nb (all importable without torch)."""

from __future__ import annotations

import difflib
import errno
import shutil
import sqlite3
from collections.abc import Iterable
from pathlib import Path

__all__ = ["ConfigError", "ExperimentError", "OpError", "StorageError", "closest_name", "storage_error"]


class ConfigError(ValueError):
    """Bad user input found before any training starts.

    The message always names the offending field and says how to fix it.
    """


class ExperimentError(RuntimeError):
    """An experiment-level misuse (e.g. ``run_fit`` while training, a different config group)."""


class OpError(ValueError):
    """An IC Op that cannot be accepted (unknown run id, illegal for the run's status, bad changes)."""


def closest_name(name: str, candidates: Iterable[str]) -> str | None:
    """Return the candidate closest to ``name`` (difflib ratio >= 0.6), or ``None``."""
    matches = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


class StorageError(ExperimentError):
    """rapidfire_nb's own write to disk failed (the store, a checkpoint, final weights, TensorBoard): not the run's
    fault. Training stops with every run resumable from its latest complete checkpoint.

    Attributes:
        where: the file or folder being written.
        reason: what the system said (e.g. ``No space left on device (errno 28)``).
    """

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"writing {where} failed: {reason}")
        self.where = where
        self.reason = reason


#: errno values that mean "the disk, not the data": full, quota, read-only, I/O error
_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG})
_SQLITE_STORAGE_WORDS = ("disk is full", "disk i/o error", "readonly database", "unable to open database")


def storage_error(exc: BaseException, where: str) -> StorageError | None:
    """``exc`` as a :class:`StorageError` about ``where`` when it says the disk failed (full, quota, read-only,
    I/O error), else None. SQLite reports these as ``sqlite3.OperationalError`` text; torch's writer as a
    ``RuntimeError`` wrapping the ``OSError``."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, StorageError):
            return seen
        if isinstance(seen, OSError) and seen.errno in _STORAGE_ERRNOS:
            return StorageError(where, f"{seen.strerror or seen} (errno {seen.errno})")
        if isinstance(seen, sqlite3.Error) and any(w in str(seen).lower() for w in _SQLITE_STORAGE_WORDS):
            return StorageError(where, f"SQLite: {seen}")
        if isinstance(seen, RuntimeError) and _torch_write_failed(str(seen)):
            return StorageError(where, _torch_reason(where, str(seen)))
        seen = seen.__cause__ or seen.__context__
    return None


NEARLY_FULL_BYTES = 64 * 2**20
"""Free bytes under which a failed torch write is put down to a full disk (a checkpoint is megabytes or more)."""


def _torch_write_failed(text: str) -> bool:
    """torch.save's writer failing: "PytorchStreamWriter failed writing file ..." or, after a short write on a full
    disk, "[enforce fail at inline_container.cc] . unexpected pos 64 vs 0" (the file ends before its header)."""
    low = text.lower()
    return ("write" in low and "file" in low) or "unexpected pos" in low


def _torch_reason(where: str, text: str) -> str:
    """torch's words, led by "No space left on device" when the disk holding ``where`` is (nearly) full: torch
    does not say that a short write was the disk filling up."""
    free = free_bytes(where)
    if free is None or free >= NEARLY_FULL_BYTES:
        return text
    return f"No space left on device ({free} bytes free on its disk; torch said: {text.strip()})"


def free_bytes(where: str) -> int | None:
    """Free bytes on the file system holding ``where`` (its nearest existing folder), or None when unknown."""
    path = Path(where)
    for folder in (path, *path.parents):
        if folder.exists():
            try:
                return int(shutil.disk_usage(folder).free)
            except OSError:
                return None
    return None
