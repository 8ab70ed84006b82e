"""Crash-safe file and folder writes (standard library only).

A reader never sees a half-written file or folder: data goes to a temporary sibling first, is fsynced,
and is then renamed into place (a rename within one folder is atomic on POSIX and on NTFS).

Folders written with :func:`atomic_dir` carry a ``COMPLETE`` marker, written last; a folder without it
(:func:`is_complete_dir` is false) must not be trusted. After a crash, :func:`recover_dir` puts the last
complete version back in place and removes leftovers.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "COMPLETE_MARKER",
    "leftovers",
    "atomic_dir",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "is_complete_dir",
    "recover_dir",
]

COMPLETE_MARKER = "COMPLETE"

PathLike = str | os.PathLike[str]


def _umask() -> int:
    """The process umask, read without changing it (``os.umask`` would, process-wide)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _fsync_dir(path: Path) -> None:
    """Make a rename/creation inside ``path`` durable (a no-op where folders cannot be opened)."""
    if os.name == "nt":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same folder, fsync, ``os.replace``).

    The parent folder is created if missing. An existing file keeps its permission bits; a new one gets
    the default ``0o666 & ~umask``.
    """
    target = Path(path)
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = target.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    fd, tmp_name = tempfile.mkstemp(dir=parent, prefix=f".{target.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(parent)


def atomic_write_text(path: PathLike, text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: PathLike, obj: Any, *, indent: int | None = 2, sort_keys: bool = True) -> None:
    """Write ``obj`` as JSON (plus a trailing newline) to ``path`` atomically.

    Raises:
        TypeError: ``obj`` is not JSON-serialisable (nothing is written).
    """
    atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys) + "\n")


def is_complete_dir(path: PathLike) -> bool:
    """True when ``path`` is a folder holding the ``COMPLETE`` marker written by :func:`atomic_dir`."""
    p = Path(path)
    return p.is_dir() and (p / COMPLETE_MARKER).is_file()


def _tmp_prefix(final: Path) -> str:
    return f".{final.name}.tmp-"


def _old_prefix(final: Path) -> str:
    return f".{final.name}.old-"


def leftovers(parent: PathLike, name_glob: str = "*") -> list[Path]:
    """The temporary and renamed-away siblings that :func:`atomic_dir` writes of folders named ``name_glob``
    left in ``parent`` (a process died mid-write). Only safe to delete while no write to them is in progress.

    Args:
        parent: the folder holding the atomically written folders.
        name_glob: which final names, as a glob (e.g. ``"checkpoint-*"``).
    """
    folder = Path(parent)
    if not folder.is_dir():
        return []
    return [*folder.glob(f".{name_glob}.tmp-*"), *folder.glob(f".{name_glob}.old-*")]


def _fsync_tree(root: Path) -> None:
    """fsync every file and folder under ``root`` (the body may have used plain writes)."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            fp = Path(dirpath) / name
            if not fp.is_symlink():
                _fsync_file(fp)
        _fsync_dir(Path(dirpath))


@contextlib.contextmanager
def atomic_dir(final_path: PathLike) -> Iterator[Path]:
    """Build a folder in a temporary sibling and move it onto ``final_path`` only on success.

    Usage::

        with atomic_dir(ckpt_dir / "chunk-3") as tmp:
            (tmp / "adapter.safetensors").write_bytes(...)

    On normal exit: every file inside is fsynced, the ``COMPLETE`` marker is written last, then an
    existing ``final_path`` is renamed away, the new folder renamed in, and the old one deleted. If the
    body raises, the temporary folder is removed and an existing ``final_path`` is left untouched.
    A crash at any point leaves either the previous or the new complete version at ``final_path``,
    or (only between the two renames) both as hidden siblings, which :func:`recover_dir` resolves.

    Yields:
        The temporary folder (a hidden sibling of ``final_path``) to write into.
    """
    final = Path(final_path)
    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=_tmp_prefix(final)))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it 0o700
        yield tmp
        _fsync_tree(tmp)
        atomic_write_text(tmp / COMPLETE_MARKER, json.dumps({"completed_at": time.time()}) + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    if not final.exists() and not final.is_symlink():
        os.rename(tmp, final)
        _fsync_dir(parent)
        return

    old = parent / f"{_old_prefix(final)}{uuid.uuid4().hex}"
    os.rename(final, old)
    try:
        os.rename(tmp, final)
    except BaseException:
        # Put the previous version back; the new one is discarded.
        os.rename(old, final)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(parent)
    if old.is_dir() and not old.is_symlink():
        shutil.rmtree(old, ignore_errors=True)
    else:
        old.unlink()


def recover_dir(final_path: PathLike) -> bool:
    """Clean up after a crash inside :func:`atomic_dir` for ``final_path``.

    If ``final_path`` is missing, the newest complete leftover is renamed onto it: a finished new
    version (crash between the two renames) before a previous version that was renamed away. All other
    leftovers (unfinished temporary folders, old versions) are deleted. Call it only while no
    :func:`atomic_dir` for the same path is in progress (e.g. when an experiment is opened).

    Returns:
        True when ``final_path`` now holds a complete folder.
    """
    final = Path(final_path)
    parent = final.parent
    if not parent.is_dir():
        return False
    tmps = sorted(parent.glob(f"{_tmp_prefix(final)}*"), key=lambda p: p.stat().st_mtime, reverse=True)
    olds = sorted(parent.glob(f"{_old_prefix(final)}*"), key=lambda p: p.stat().st_mtime, reverse=True)
    if not final.exists():
        for candidate in [*tmps, *olds]:
            if is_complete_dir(candidate):
                os.rename(candidate, final)
                _fsync_dir(parent)
                break
    for leftover in [*tmps, *olds]:
        if leftover.exists():
            shutil.rmtree(leftover, ignore_errors=True)
    return is_complete_dir(final)
