"""storage_error: what the disk said, in words a user reads (rapidfire_nb.errors)."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb import errors
from rapidfire_nb.errors import StorageError, storage_error


def _usage(free: int) -> Any:
    return lambda _path: shutil._ntuple_diskusage(total=10**9, used=10**9 - free, free=free)  # type: ignore[attr-defined]


def test_torch_s_short_write_on_a_full_disk_says_no_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34 item 9: a checkpoint write on a full disk reported torch's "unexpected pos 64 vs 0"."""
    monkeypatch.setattr(errors.shutil, "disk_usage", _usage(4096))
    where = str(
        tmp_path / "runs" / "1" / "checkpoint-4" / "optimizer.pt"
    )  # not created yet: its disk is asked
    failure = storage_error(
        RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0"), where
    )
    assert isinstance(failure, StorageError)
    assert str(failure) == (
        f"writing {where} failed: No space left on device (4096 bytes free on its disk; torch said: "
        "[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0)"
    )


def test_torch_s_words_stay_when_the_disk_has_room(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(errors.shutil, "disk_usage", _usage(10 * errors.NEARLY_FULL_BYTES))
    text = "PytorchStreamWriter failed writing file data/0: file write failed"
    failure = storage_error(RuntimeError(text), str(tmp_path))
    assert failure is not None and failure.reason == text
    assert storage_error(RuntimeError("CUDA out of memory"), str(tmp_path)) is None  # not the disk


def test_an_os_error_keeps_its_own_words(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failure = storage_error(OSError(errno.ENOSPC, "No space left on device"), str(tmp_path))
    assert failure is not None and failure.reason == "No space left on device (errno 28)"
    asked: list[Path] = []
    monkeypatch.setattr(errors.shutil, "disk_usage", lambda path: asked.append(path) or _usage(123)(path))
    assert errors.free_bytes(str(tmp_path / "a" / "b")) == 123
    assert asked == [tmp_path]  # the nearest folder that exists
