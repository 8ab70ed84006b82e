"""The server and the experiment's files: symlinked stores, damaged stores, ended experiments (issue 12)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rapidfire_nb.server.manager import ApiError, ExperimentsManager
from rapidfire_nb.store import ExperimentEndedError, Store
from tests.rapidfire_nb.server._stores import make_experiment


@pytest.fixture
def mgr(rf_root: Path, writers: dict[str, Store]) -> ExperimentsManager:
    return ExperimentsManager(rf_root)


@pytest.mark.parametrize("linked", ["store.sqlite", "store.sqlite-wal", "writer.lock"])
def test_a_store_file_symlinked_out_of_the_root_is_neither_served_nor_written(
    mgr: ExperimentsManager, rf_root: Path, tmp_path: Path, linked: str
) -> None:
    outside = make_experiment(tmp_path / "elsewhere", "secret")  # a live writer: ops would be accepted
    outside.close()
    folder = rf_root / "evil"
    folder.mkdir()
    if linked == "store.sqlite":
        (folder / "store.sqlite").symlink_to(outside.path)
    else:  # the store is a copy; one of the files SQLite or the lock writes is a link out of the root
        shutil.copy(outside.path, folder / "store.sqlite")
        (folder / linked).symlink_to(tmp_path / "elsewhere" / "secret" / linked)
    assert "evil" not in {x["name"] for x in mgr.list_experiments()["experiments"]}
    for call in (mgr.runs, mgr.snapshot, mgr.experiment):
        with pytest.raises(ApiError) as exc:
            call("evil")
        assert exc.value.status == 400 and "outside the experiments root" in exc.value.message
    with pytest.raises(ApiError) as exc:
        mgr.post_op("evil", {"kind": "stop", "run_id": 1})
    assert exc.value.status == 400
    with Store(outside.path) as target:
        assert target.take_inbox_ops() == []  # nothing was posted through the link
    assert os.path.islink(folder / linked)


@pytest.mark.parametrize("linked", ["store.sqlite", "store.sqlite-wal", "writer.lock"])
def test_a_store_file_hard_linked_out_of_the_root_is_neither_served_nor_written(
    mgr: ExperimentsManager, rf_root: Path, tmp_path: Path, linked: str
) -> None:
    outside = make_experiment(tmp_path / "elsewhere", "secret")  # a live writer: ops would be accepted
    outside.close()
    folder = rf_root / "evil"
    folder.mkdir()
    if linked == "store.sqlite":
        os.link(outside.path, folder / "store.sqlite")
    else:
        shutil.copy(outside.path, folder / "store.sqlite")
        (tmp_path / "elsewhere" / "secret" / linked).write_bytes(b"")
        os.link(tmp_path / "elsewhere" / "secret" / linked, folder / linked)
    assert "evil" not in {x["name"] for x in mgr.list_experiments()["experiments"]}
    for call in (mgr.runs, mgr.snapshot, mgr.experiment, mgr.metrics):
        with pytest.raises(ApiError) as exc:
            call("evil")
        assert exc.value.status == 400 and f"{linked} has 2 hard links" in exc.value.message
    with pytest.raises(ApiError) as exc:
        mgr.post_op("evil", {"kind": "stop", "run_id": 1})
    assert exc.value.status == 400
    with Store(outside.path) as target:
        assert target.take_inbox_ops() == []  # nothing was posted through the link
    (tmp_path / "elsewhere" / "secret" / linked).unlink(missing_ok=True)  # (closing the store drops its WAL)
    assert mgr.runs("evil")["runs"][0]["run_id"] == 1  # the last name: served again


def test_a_symlinked_store_inside_the_root_is_served(mgr: ExperimentsManager, rf_root: Path) -> None:
    (rf_root / "alias").mkdir()
    (rf_root / "alias" / "store.sqlite").symlink_to(rf_root / "live" / "store.sqlite")
    assert mgr.runs("alias")["runs"][0]["run_id"] == 1


def test_the_side_files_checked_include_the_writer_lock() -> None:
    from rapidfire_nb._writer_lock import LOCK_FILENAME
    from rapidfire_nb.paths import STORE_FILENAME, STORE_SIDE_FILES

    assert {LOCK_FILENAME, STORE_FILENAME} <= set(STORE_SIDE_FILES)


def test_a_damaged_store_is_listed_with_what_is_wrong_and_the_others_still_are(
    mgr: ExperimentsManager, rf_root: Path
) -> None:
    (rf_root / "broken").mkdir()
    (rf_root / "broken" / "store.sqlite").write_bytes(b"\x00garbage" * 300)
    by_name = {x["name"]: x for x in mgr.list_experiments()["experiments"]}
    assert sorted(by_name) == ["broken", "dead", "live"] and "error" not in by_name["live"]
    error = by_name["broken"]["error"]
    assert str(rf_root / "broken" / "store.sqlite") in error and "damaged" in error, error
    assert "file is not a database" in error and "backup" in error
    with pytest.raises(ApiError) as exc:
        mgr.snapshot("broken")
    assert exc.value.status == 500 and exc.value.message == error


def test_an_ended_experiment_refuses_ops_while_its_kernel_lives(
    mgr: ExperimentsManager, writers: dict[str, Store]
) -> None:
    live = writers["live"]
    live.post_inbox_op("before-end", "stop", 1)
    untaken = live.mark_ended()  # what Experiment.end() does; the kernel process (and its heartbeat) lives on
    assert [op["op_id"] for op in untaken] == ["before-end"]  # handed to the kernel to answer, never lost
    assert live.writer_alive()
    snap = mgr.snapshot("live")
    assert (snap["ended"], snap["writer_alive"], snap["device_status"]) == (True, False, "experiment ended")
    assert all(r["legal_ops"] == [] for r in snap["runs"])
    assert snap["progress"].startswith("experiment ended — 1/3 runs completed; re-run Experiment(...)")
    summary = {x["name"]: x for x in mgr.list_experiments()["experiments"]}["live"]
    assert summary["ended"] is True and summary["writer_alive"] is False
    for body in (
        {"kind": "clone", "run_id": 1, "changes": {"learning_rate": 1e-4}},
        {"kind": "stop", "run_id": 1},
    ):
        with pytest.raises(ApiError) as exc:
            mgr.post_op("live", body)
        message = exc.value.message
        assert exc.value.status == 409 and "experiment 'live' has ended" in message, message
        assert "re-run the notebook's Experiment(...) and run_fit(...) cells" in message
    with Store(live.path, read_only=True) as reader, pytest.raises(ExperimentEndedError, match="has ended"):
        reader.post_inbox_op("raced", "stop", 1)  # the store refuses too (a post racing end())
    assert live.take_inbox_ops() == []
    live.reopen()  # a kernel trains it again
    live.beat()
    assert mgr.post_op("live", {"op_id": "again", "kind": "stop", "run_id": 1})["state"] == "queued"
    assert mgr.snapshot("live")["device_status"] == "training (kernel alive)"
    assert [op["op_id"] for op in live.take_inbox_ops()] == ["again"]
