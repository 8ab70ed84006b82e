"""rapidfire_nb._atomic: atomic files and folders, crash behaviour."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rapidfire_nb._atomic import (
    COMPLETE_MARKER,
    atomic_dir,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    is_complete_dir,
    recover_dir,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_atomic_write_round_trips_and_leaves_no_temp_files(tmp_path):
    target = tmp_path / "sub" / "f.bin"
    atomic_write_bytes(target, b"one")
    assert target.read_bytes() == b"one"
    atomic_write_bytes(target, b"two")
    assert target.read_bytes() == b"two"
    atomic_write_text(tmp_path / "t.txt", "héllo")
    assert (tmp_path / "t.txt").read_text(encoding="utf-8") == "héllo"
    atomic_write_json(tmp_path / "j.json", {"b": 1, "a": [1.5, None]})
    assert json.loads((tmp_path / "j.json").read_text()) == {"a": [1.5, None], "b": 1}
    assert _names(tmp_path) == ["j.json", "sub", "t.txt"]
    assert _names(tmp_path / "sub") == ["f.bin"]


def test_atomic_write_keeps_existing_permissions_and_uses_umask_for_new_files(tmp_path):
    target = tmp_path / "f"
    atomic_write_bytes(target, b"x")
    umask = os.umask(0o022)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask
    target.chmod(0o600)
    atomic_write_bytes(target, b"y")
    assert target.stat().st_mode & 0o777 == 0o600


def test_failed_json_write_keeps_old_content(tmp_path):
    target = tmp_path / "j.json"
    atomic_write_json(target, {"v": 1})
    with pytest.raises(TypeError):
        atomic_write_json(target, {"v": object()})
    assert json.loads(target.read_text()) == {"v": 1}
    assert _names(tmp_path) == ["j.json"]


def test_atomic_dir_creates_complete_folder(tmp_path):
    final = tmp_path / "ckpt"
    with atomic_dir(final) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".")
        (tmp / "weights.bin").write_bytes(b"v1")
        (tmp / "nested").mkdir()
        (tmp / "nested" / "x.txt").write_text("n")
        assert not final.exists()
    assert (final / "weights.bin").read_bytes() == b"v1"
    assert (final / "nested" / "x.txt").read_text() == "n"
    assert is_complete_dir(final)
    assert "completed_at" in json.loads((final / COMPLETE_MARKER).read_text())
    assert _names(tmp_path) == ["ckpt"]


def test_atomic_dir_replaces_existing_version(tmp_path):
    final = tmp_path / "ckpt"
    with atomic_dir(final) as tmp:
        (tmp / "old-only").write_text("1")
    with atomic_dir(final) as tmp:
        (tmp / "weights.bin").write_bytes(b"v2")
    assert _names(final) == [COMPLETE_MARKER, "weights.bin"]
    assert (final / "weights.bin").read_bytes() == b"v2"
    assert _names(tmp_path) == ["ckpt"]


def test_atomic_dir_keeps_old_version_when_body_raises(tmp_path):
    final = tmp_path / "ckpt"
    with atomic_dir(final) as tmp:
        (tmp / "weights.bin").write_bytes(b"v1")
    with pytest.raises(RuntimeError, match="boom"), atomic_dir(final) as tmp:
        (tmp / "weights.bin").write_bytes(b"half")
        raise RuntimeError("boom")
    assert (final / "weights.bin").read_bytes() == b"v1"
    assert is_complete_dir(final)
    assert _names(tmp_path) == ["ckpt"]


def test_atomic_dir_restores_old_version_when_swap_fails(tmp_path, monkeypatch):
    import rapidfire_nb._atomic as atomic

    final = tmp_path / "ckpt"
    with atomic_dir(final) as tmp:
        (tmp / "weights.bin").write_bytes(b"v1")
    real_rename = os.rename
    calls = []

    def flaky_rename(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # the "new in" rename
            raise OSError("disk gone")
        real_rename(src, dst)

    monkeypatch.setattr(atomic.os, "rename", flaky_rename)
    with pytest.raises(OSError, match="disk gone"), atomic_dir(final) as tmp:
        (tmp / "weights.bin").write_bytes(b"v2")
    monkeypatch.undo()
    assert (final / "weights.bin").read_bytes() == b"v1"
    assert _names(tmp_path) == ["ckpt"]


def test_crash_before_rename_leaves_previous_version_readable(tmp_path):
    final = tmp_path / "ckpt"
    with atomic_dir(final) as tmp:
        (tmp / "weights.bin").write_bytes(b"v1")
    # Simulated crash: the body wrote the new version but the process died before the rename.
    cm = atomic_dir(final)
    tmp = cm.__enter__()
    (tmp / "weights.bin").write_bytes(b"v2-partial")
    assert (final / "weights.bin").read_bytes() == b"v1"
    assert is_complete_dir(final)
    assert not is_complete_dir(tmp)
    assert recover_dir(final) is True
    assert _names(tmp_path) == ["ckpt"]
    assert (final / "weights.bin").read_bytes() == b"v1"


def test_process_killed_between_the_two_renames_is_recovered(tmp_path):
    final = tmp_path / "ckpt"
    with atomic_dir(final) as tmp:
        (tmp / "weights.bin").write_bytes(b"v1")
    script = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(REPO_ROOT)!r})
        import rapidfire_nb._atomic as atomic
        real_rename = os.rename
        def rename_then_die(src, dst):
            real_rename(src, dst)
            os._exit(3)  # dies after renaming the old version away
        atomic.os.rename = rename_then_die
        with atomic.atomic_dir({str(final)!r}) as tmp:
            (tmp / "weights.bin").write_bytes(b"v2")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode == 3, proc.stderr.decode()
    assert not final.exists()
    assert recover_dir(final) is True
    assert (final / "weights.bin").read_bytes() == b"v2"  # the finished new version wins
    assert _names(tmp_path) == ["ckpt"]


def test_recover_dir_falls_back_to_old_version(tmp_path):
    final = tmp_path / "ckpt"
    with atomic_dir(final) as tmp:
        (tmp / "weights.bin").write_bytes(b"v1")
    os.rename(final, tmp_path / ".ckpt.old-abc")
    (tmp_path / ".ckpt.tmp-unfinished").mkdir()  # no COMPLETE: never used
    assert recover_dir(final) is True
    assert (final / "weights.bin").read_bytes() == b"v1"
    assert _names(tmp_path) == ["ckpt"]


def test_is_complete_dir(tmp_path):
    assert not is_complete_dir(tmp_path / "missing")
    (tmp_path / "d").mkdir()
    assert not is_complete_dir(tmp_path / "d")
    (tmp_path / "f").write_text("x")
    assert not is_complete_dir(tmp_path / "f")
    (tmp_path / "d" / COMPLETE_MARKER).write_text("{}")
    assert is_complete_dir(tmp_path / "d")
