"""One writer per experiment (rapidfire_nb._writer_lock and how Experiment uses it).

Unit tests of the lock (two holders exclude each other, even in one process; a killed holder's lock is free), then
Experiment-level rules: ``Experiment(name)`` twice in one process is one object; a second process cannot train
or overwrite an experiment another process trains; a heartbeat whose lock is free is a dead writer (its runs
become INTERRUPTED and its unapplied inbox ops are answered rejected). No torch: ``run_fit`` must refuse before it
imports anything heavy, so ``create_model_fn`` here raises if it is ever called.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb._writer_lock import LOCK_FILENAME, WriterLock

REPO = Path(__file__).resolve().parents[2]

HOLDER = """
import sys, time
sys.path.insert(0, {repo!r})
from rapidfire_nb._writer_lock import WriterLock
lock = WriterLock({path!r})
print("HELD" if lock.acquire() else "BUSY", flush=True)
time.sleep(120)
"""


def _hold_in_child(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(repo=str(REPO), path=str(path))],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "HELD"
    return proc


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def test_two_holders_exclude_each_other_even_in_one_process(tmp_path: Path) -> None:
    a, b = WriterLock(tmp_path), WriterLock(tmp_path)
    assert a.acquire() and a.held and a.acquire()  # re-entrant for its holder
    assert not b.acquire() and not b.held and not b.is_free()
    assert a.holder_pid() == os.getpid()
    a.release()
    assert b.is_free() and b.acquire()
    b.release()
    assert (tmp_path / LOCK_FILENAME).exists()


def test_a_killed_holders_lock_is_free(tmp_path: Path) -> None:
    proc = _hold_in_child(tmp_path)
    lock = WriterLock(tmp_path)
    try:
        assert not lock.acquire()
        assert lock.holder_pid() == proc.pid
    finally:
        _kill(proc)
    assert lock.acquire(), "the OS drops a dead process's lock"
    lock.release()


# ---------------------------------------------------------------------------------------------------- Experiment


def _never(_cfg: Any) -> Any:
    raise AssertionError("create_model_fn called: training started although it must have been refused")


def _group() -> Any:
    from rapidfire_nb.automl import List, RFGridSearch, RFModelConfig, RFSFTConfig

    return RFGridSearch(
        List([RFModelConfig("tiny", training_args=RFSFTConfig(learning_rate=lr)) for lr in (1e-3, 1e-4)]),
        "SFT",
    )


def _rows() -> Any:
    from datasets import Dataset

    return Dataset.from_dict({"prompt": ["a"] * 8, "completion": ["b"] * 8})


def test_same_folder_is_one_object_in_a_process(tmp_path: Path) -> None:
    from rapidfire_nb import Experiment

    a = Experiment("one", experiment_path=tmp_path)
    assert Experiment("one", experiment_path=tmp_path) is a
    assert Experiment("two", experiment_path=tmp_path) is not a
    a.end()
    b = Experiment("one", experiment_path=tmp_path)
    assert b is not a and not b.ended


def test_another_process_training_blocks_run_fit_and_overwrite(tmp_path: Path) -> None:
    from rapidfire_nb import Experiment
    from rapidfire_nb.errors import ExperimentError

    exp_dir = tmp_path / "busy"
    exp_dir.mkdir()
    proc = _hold_in_child(exp_dir)
    try:
        said: list[str] = []
        exp = Experiment("busy", experiment_path=tmp_path)
        exp.on_message(said.append)
        with pytest.raises(ExperimentError, match=rf"being trained by process {proc.pid}; continue it there"):
            exp.run_fit(_group(), _never, _rows(), num_chunks=2)
        exp.end()
        with pytest.raises(
            ExperimentError, match=rf"process {proc.pid}; it cannot be overwritten while it trains"
        ):
            Experiment("busy", experiment_path=tmp_path, overwrite=True)
        assert (exp_dir / "store.sqlite").exists(), "the other process's experiment was not deleted"
    finally:
        _kill(proc)


def test_heartbeat_with_a_free_lock_is_a_dead_writer(tmp_path: Path) -> None:
    """The store says a live pid (this one) beat a moment ago, but nobody holds the lock: the writer died (e.g. an
    old kernel whose pid was reused); its ONGOING runs become INTERRUPTED and its inbox ops are not applied later."""
    from rapidfire_nb import Experiment
    from rapidfire_nb.store import Store

    with Store(tmp_path / "dead") as store:
        store.upsert_run(1, status="ONGOING")
        store.upsert_run(2, status="STOPPED")
        store.upsert_run(3, status="COMPLETED")
        store.beat()  # this very process, fresh
        store.post_inbox_op("op-late", "stop", 1)
    exp = Experiment("dead", experiment_path=tmp_path)
    runs = {r["run_id"]: r["status"] for r in exp.store.runs()}
    assert runs == {1: "INTERRUPTED", 2: "STOPPED", 3: "COMPLETED"}
    op = exp.store.get_op("op-late")
    assert op is not None and op["state"] == "rejected" and "send it again" in op["message"]
    assert exp.store.take_inbox_ops() == []
    exp.end()


def test_a_live_writer_elsewhere_is_left_alone(tmp_path: Path) -> None:
    from rapidfire_nb import Experiment
    from rapidfire_nb.store import Store

    with Store(tmp_path / "live") as store:
        store.upsert_run(1, status="ONGOING")
        store.beat()
        store.post_inbox_op("op-1", "stop", 1)
    proc = _hold_in_child(tmp_path / "live")
    try:
        t0 = time.monotonic()
        exp = Experiment("live", experiment_path=tmp_path)
        assert time.monotonic() - t0 < 5
        assert {r["run_id"]: r["status"] for r in exp.store.runs()} == {1: "ONGOING"}
        assert [o["op_id"] for o in exp.store.take_inbox_ops()] == ["op-1"]  # still there for its kernel
        exp.end()
    finally:
        _kill(proc)


def test_a_refused_run_fit_gives_the_lock_back(tmp_path: Path) -> None:
    from rapidfire_nb import Experiment
    from rapidfire_nb.errors import ConfigError

    exp = Experiment("refused", experiment_path=tmp_path)
    with pytest.raises(ConfigError, match="num_chunks"):
        exp.run_fit(_group(), _never, _rows(), num_chunks=0)
    assert WriterLock(tmp_path / "refused").is_free(), "nothing trains, so another process may"
    exp.end()


def test_a_reader_whose_writer_died_reconciles_when_it_starts_training(tmp_path: Path) -> None:
    """B opened the experiment while A trained (read-only, nothing reconciled); A dies; B's run_fit must first
    do what a fresh Experiment would: runs INTERRUPTED, A's unapplied inbox ops rejected (never applied by B)."""
    from rapidfire_nb import Experiment
    from rapidfire_nb.store import Store

    with Store(tmp_path / "late") as store:
        store.upsert_run(1, status="ONGOING")
        store.beat()
    proc = _hold_in_child(tmp_path / "late")
    try:
        b = Experiment("late", experiment_path=tmp_path)
        with Store(tmp_path / "late") as store:
            store.post_inbox_op("op-for-a", "stop", 1)
    finally:
        _kill(proc)
    from rapidfire_nb.errors import ExperimentError

    with pytest.raises(ExperimentError, match="different config group"):  # refused later, after reconciling
        b.run_fit(_group(), _never, _rows(), num_chunks=2)
    assert {r["run_id"]: r["status"] for r in b.store.runs()}[1] == "INTERRUPTED"
    op = b.store.get_op("op-for-a")
    assert op is not None and op["state"] == "rejected"
    b.end()


def test_ops_a_dead_kernel_took_but_did_not_apply_are_settled(tmp_path: Path) -> None:
    from rapidfire_nb import Experiment
    from rapidfire_nb.store import Store

    with Store(tmp_path / "taken") as store:
        store.upsert_run(1, status="ONGOING")
        store.upsert_run(3, status="NEW", source="clone", parent_id=1)
        store.add_op("stop-1", "stop", 1, {}, source="inbox", state="queued", message="stop requested")
        store.add_op("clone-3", "clone", 1, {"child_id": 3}, source="inbox", state="queued", message="clone")
        store.add_op("clone-4", "clone", 1, {"child_id": 4}, source="inbox", state="queued", message="clone")
        store.beat()
    exp = Experiment("taken", experiment_path=tmp_path)
    states = {o["op_id"]: (o["state"], o["message"]) for o in exp.store.ops()}
    assert states["stop-1"][0] == "rejected" and "send it again" in states["stop-1"][1]
    assert states["clone-3"] == ("applied", "run 3 created; it continues after the restart")
    assert states["clone-4"][0] == "rejected"
    exp.end()
