"""DevicePool.close: every member closed, then ``on_closed`` once (the Ray backend removes its placement group)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb.devices.pool import DevicePool


class _Member:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def alive(self, device: str) -> bool:
        return True

    def close(self) -> None:
        self.log.append(f"close {self.name}")


def _pool(log: list[str], hook: Any) -> DevicePool:
    members = {"cpu:0": _Member(log, "cpu:0"), "cpu:1": _Member(log, "cpu:1")}
    return DevicePool(members, Path("."), lambda spec, folder: (None, None), on_closed=hook)


def test_on_closed_runs_once_after_every_member_closed() -> None:
    log: list[str] = []
    pool = _pool(log, lambda: log.append("removed"))
    pool.close()
    assert sorted(log[:2]) == ["close cpu:0", "close cpu:1"]
    assert log[2:] == ["removed"]
    pool.close()  # the members' close is theirs to make idempotent; the hook runs no more
    assert log.count("removed") == 1


def test_a_failing_on_closed_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    def hook() -> None:
        raise RuntimeError("no cluster")

    with caplog.at_level(logging.ERROR):
        _pool([], hook).close()
    assert "no cluster" in caplog.text


class _Trainer(_Member):
    """A member that builds runs and may hold a boundary for them."""

    def __init__(self, log: list[str], name: str, boundary: bool) -> None:
        super().__init__(log, name)
        self.boundary = boundary

    def add_run(self, run_id: int, spec: Any, warm_from: Any = None, resume_from: Any = None) -> str:
        self.log.append(f"{self.name} add {run_id} from {resume_from}")
        return "start"

    def has_boundary(self, run_id: int) -> bool:
        return self.boundary

    def export_boundary(self, run_id: int) -> Path:
        self.log.append(f"{self.name} export {run_id}")
        return Path(f"/x/runs/{run_id}/checkpoint-4")

    def drop_run(self, run_id: int) -> None:
        self.log.append(f"{self.name} drop {run_id}")


@pytest.mark.parametrize("boundary", [True, False])
def test_a_move_exports_the_boundary_or_starts_where_the_run_started(tmp_path: Path, boundary: bool) -> None:
    log: list[str] = []
    members = {"cpu:0": _Trainer(log, "cpu:0", boundary), "cpu:1": _Trainer(log, "cpu:1", boundary)}
    pool = DevicePool(members, tmp_path, lambda spec, folder: (None, None))
    pool.add_run(3, "spec", device="cpu:0")
    assert pool.move_run(3, "spec", "cpu:1") == "start" and pool.device_of(3) == "cpu:1"
    pool.close()
    if boundary:  # its latest chunk boundary, exported by the device it trained on
        assert log[1:3] == ["cpu:0 export 3", "cpu:1 add 3 from /x/runs/3/checkpoint-4"]
    else:  # it never ended a chunk on cpu:0 (a new run): nothing to export, it starts on cpu:1 (step 0)
        assert log[1] == "cpu:1 add 3 from None"
    assert "cpu:0 drop 3" in log


def test_checkpoint_dir_falls_back_to_the_disk_when_the_worker_dies_during_the_call(tmp_path: Path) -> None:
    """Issue 34 item 3: the recorder asked a worker killed a moment before for a run's checkpoint and printed a raw
    WorkerLost traceback. The pool answers from the disk instead."""
    from rapidfire_nb._atomic import COMPLETE_MARKER
    from rapidfire_nb.devices.errors import WorkerLost
    from rapidfire_nb.run_folder import run_dir

    class Dying(_Trainer):
        def checkpoint_dir(self, run_id: int) -> Path:
            raise WorkerLost("the worker of cpu:0 died (killed by signal 9)")

    log: list[str] = []
    pool = DevicePool({"cpu:0": Dying(log, "cpu:0", True)}, tmp_path, lambda spec, folder: (None, None))
    pool.add_run(2, "spec", device="cpu:0")
    assert pool.checkpoint_dir(2) is None  # nothing on disk yet
    written = run_dir(tmp_path, 2) / "checkpoint-4"
    written.mkdir(parents=True)
    (written / COMPLETE_MARKER).write_text("{}")  # a complete checkpoint folder
    (run_dir(tmp_path, 2) / "checkpoint-6").mkdir()  # half-written: no marker
    assert pool.checkpoint_dir(2) == written
    pool.close()
