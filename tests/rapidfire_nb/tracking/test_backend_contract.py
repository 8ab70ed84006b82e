"""One contract, run against the real MLflow (SQLite store) and Trackio (temporary folder) trackers (issue 15).

A first "kernel" tracks two runs and dies after run 1 logged steps 5 and 6 beyond its checkpoint at step 4 (its
points are in the backend, the store dropped its own). A second kernel, with the state the first one kept in the
store, continues run 1 from step 4 and logs steps 5..8 again (the same values: the resume is exact): the backend
holds each step once, in the same backend run, with the lifecycle of the store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb.tracking import TrackedRun
from rapidfire_nb.tracking.backends import openers
from rapidfire_nb.tracking.fanout import TrackerSet
from tests.rapidfire_nb.tracking._tracking_helpers import (
    mlflow_history,
    mlflow_store_at,
    need,
    trackio_history,
)

LOSS = {s: 10.0 - s for s in range(1, 9)}


class _Reader:
    """What the backend holds, read with its own API."""

    def __init__(self, backend: str, exp_dir: Path, project: str, state: dict[str, Any]) -> None:
        self.backend, self.exp_dir, self.project, self.state = backend, exp_dir, project, state

    def ids(self) -> dict[str, str]:
        return dict(self.state[self.backend]["runs"])

    def history(self, rid: int, name: str) -> list[tuple[int, float]]:
        bid = self.ids()[str(rid)]
        if self.backend == "mlflow":
            return mlflow_history(self._client(), bid, name)
        split = name.replace("eval_", "eval/", 1) if name.startswith("eval_") else f"train/{name}"
        return trackio_history(self.project, f"run-{rid}", bid, split)

    def lifecycle(self, rid: int) -> Any:
        """MLflow: (status, lifecycle stage); Trackio: the alert titles, or None when the run is gone."""
        bid = self.ids()[str(rid)]
        if self.backend == "mlflow":
            run = self._client().get_run(bid)
            return run.info.status, run.info.lifecycle_stage
        import trackio

        runs = {r.name: r for r in trackio.Api().runs(self.project)}
        run = runs.get(f"run-{rid}")
        return (
            None if run is None else [a["title"] for a in sorted(run.alerts(), key=lambda a: a["timestamp"])]
        )

    def _client(self) -> Any:
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=f"sqlite:///{self.exp_dir / 'mlflow.db'}")


def _tracker(backend: str, exp_dir: Path, project: str, state: dict[str, Any]) -> TrackerSet:
    def save(name: str, value: dict[str, Any]) -> None:
        state[name] = value

    fan = TrackerSet(openers([backend], exp_dir, project, dict(state), save), report=lambda line: None)
    fan.open()
    assert fan.names == [backend]
    return fan


@pytest.fixture(params=["mlflow", "trackio"])
def backend(request: pytest.FixtureRequest) -> str:
    need(request.param)
    if request.param == "mlflow":
        request.getfixturevalue("mlflow_dir")
    return str(request.param)


@pytest.fixture
def mlflow_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mlflow_template: Path) -> Path:
    """``tmp_path`` with its own migrated MLflow store (``MLFLOW_TRACKING_URI`` unset): the experiment folder."""
    need("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    mlflow_store_at(mlflow_template, tmp_path / "mlflow.db")
    return tmp_path


def test_a_restarted_kernel_continues_the_same_runs_without_duplicate_points(
    backend: str, tmp_path: Path
) -> None:
    project = f"contract-{backend}"
    state: dict[str, Any] = {}
    first = _tracker(backend, tmp_path, project, state)
    first.start_run(TrackedRun(1, {"learning_rate": 1e-3, "lora.r": 4}, {}, "SFT"), "NEW")
    first.start_run(TrackedRun(2, {"learning_rate": 5e-4}, {}, "SFT"), "NEW")
    reader = _Reader(backend, tmp_path, project, state)
    if backend == "mlflow":  # created when they leave NEW, as RUNNING (two requests fewer per run)
        assert reader.ids() == {}
    for rid in (1, 2):
        first.set_status(rid, "ONGOING")
    if backend == "mlflow":
        assert reader.lifecycle(1) == ("RUNNING", "active")
    for step in range(1, 7):
        first.log_metrics(1, step, {"loss": LOSS[step], "learning_rate": 1e-3}, 1000.0 + step)
        if step == 4:
            first.log_metrics(1, step, {"eval_loss": 3.5})
        first.end_batch()
    first.log_metrics(2, 1, {"loss": 9.5})
    first.mark_deleted(2)
    first.close()  # the kernel dies here; its last checkpoint of run 1 is at step 4
    ids = reader.ids()

    second = _tracker(backend, tmp_path, project, state)
    second.start_run(TrackedRun(1, {"learning_rate": 1e-3, "lora.r": 4}, {}, "SFT"), "INTERRUPTED")
    second.start_run(TrackedRun(2, {"learning_rate": 5e-4}, {}, "SFT"), "DELETED")
    second.continue_from(1, 4)
    second.set_status(1, "ONGOING")
    for step in range(5, 9):
        second.log_metrics(1, step, {"loss": LOSS[step], "learning_rate": 1e-3})
        second.end_batch()
    second.set_status(1, "COMPLETED")
    second.close()

    assert reader.ids() == ids  # the same backend runs
    assert reader.history(1, "loss") == [(s, LOSS[s]) for s in range(1, 9)]  # each step once
    assert reader.history(1, "eval_loss") == [(4, 3.5)]
    if backend == "mlflow":
        assert reader.lifecycle(1) == ("FINISHED", "active")
        assert reader.lifecycle(2)[1] == "deleted"
    else:
        assert reader.lifecycle(1) == ["run-1 running", "run-1 running", "run-1 finished"]
        assert reader.lifecycle(2) is None  # deleted from the project


def test_a_failed_run_says_why(backend: str, tmp_path: Path) -> None:
    project = f"failing-{backend}"
    state: dict[str, Any] = {}
    fan = _tracker(backend, tmp_path, project, state)
    fan.start_run(TrackedRun(1, {}, {}, "DPO"), "NEW")
    fan.set_status(1, "ONGOING")
    fan.log_metrics(1, 1, {"loss": float("nan")})  # NaN is passed on as NaN
    fan.set_status(1, "FAILED", "ValueError: the reward function returned None")
    fan.close()
    reader = _Reader(backend, tmp_path, project, state)
    if backend == "mlflow":
        run = reader._client().get_run(state["mlflow"]["runs"]["1"])
        assert run.info.status == "FAILED"
        assert run.data.tags["rapidfire.error"] == "ValueError: the reward function returned None"
        assert run.data.tags["rapidfire.trainer_type"] == "DPO"
    else:
        assert reader.lifecycle(1)[-1] == "run-1 failed"
    [(step, value)] = reader.history(1, "loss")
    assert step == 1 and value != value  # NaN


def test_mlflow_creates_a_run_when_it_leaves_new(mlflow_dir: Path) -> None:
    state: dict[str, Any] = {}
    fan = _tracker("mlflow", mlflow_dir, "lazy-mlflow", state)
    for rid in (1, 2, 3, 4):
        fan.start_run(TrackedRun(rid, {"learning_rate": rid * 1e-4}, {}, "SFT"), "NEW")
    fan.mark_deleted(2)  # deleted before it trained: never created
    fan.set_status(3, "STOPPED")  # stopped before it trained: created, KILLED
    fan.log_metrics(1, 1, {"loss": 2.5})  # a run that logs trains, whatever came first
    fan.set_status(1, "ONGOING")
    fan.set_status(1, "COMPLETED")
    fan.close()  # run 4 never left NEW: listed as SCHEDULED
    reader = _Reader("mlflow", mlflow_dir, "lazy-mlflow", state)
    assert sorted(reader.ids()) == ["1", "3", "4"]
    assert reader.lifecycle(1) == ("FINISHED", "active")
    assert reader.lifecycle(3) == ("KILLED", "active")
    assert reader.lifecycle(4) == ("SCHEDULED", "active")
    assert reader.history(1, "loss") == [(1, 2.5)]
    params = reader._client().get_run(reader.ids()["4"]).data.params
    assert params["learning_rate"] == "0.0004"


def test_trackio_starts_no_thread_in_sqlite_mode_and_writes_through_its_runs_in_jsonl_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Default (sqlite) mode: no Trackio thread, the points carry the time they were logged. jsonl mode (a
    network filesystem): each run's ``trackio.Run`` writes fragments, which Trackio's import turns into the same
    rows."""
    import threading

    need("trackio")
    from trackio import fragments

    for mode in ("sqlite", "jsonl"):
        monkeypatch.setenv("TRACKIO_STORAGE_MODE", mode)
        project = f"mode-{mode}"
        state: dict[str, Any] = {}
        threads = set(threading.enumerate())
        fan = _tracker("trackio", tmp_path, project, state)
        fan.start_run(TrackedRun(1, {"learning_rate": 1e-3}, {}, "SFT"), "NEW")
        fan.set_status(1, "ONGOING")
        for step in (1, 2, 3):
            fan.log_metrics(1, step, {"loss": LOSS[step]}, 1_700_000_000.0 + step)
        fan.end_batch()
        if mode == "sqlite":
            assert set(threading.enumerate()) <= threads  # nothing polls
        fan.set_status(1, "COMPLETED")
        fan.close()
        if mode == "jsonl":
            fragments.import_inbox_dir()
        reader = _Reader("trackio", tmp_path, project, state)
        assert reader.history(1, "loss") == [(s, LOSS[s]) for s in (1, 2, 3)], mode
        assert reader.lifecycle(1) == ["run-1 running", "run-1 finished"], mode
        if mode == "sqlite":
            from trackio.sqlite_storage import SQLiteStorage

            rows = SQLiteStorage.get_logs(project, "run-1", run_id=reader.ids()["1"])
            assert [r["timestamp"][:19] for r in rows] == [
                "2023-11-14T22:13:21",
                "2023-11-14T22:13:22",
                "2023-11-14T22:13:23",
            ]
            config = SQLiteStorage.get_run_config(project, "run-1", run_id=reader.ids()["1"])
            assert config["learning_rate"] == 1e-3 and "_Created" in config


def test_mlflow_times_are_the_runs_and_a_run_deleted_while_training_is_killed_with_its_points(
    mlflow_dir: Path,
) -> None:
    state: dict[str, Any] = {}
    fan = _tracker("mlflow", mlflow_dir, "times-mlflow", state)
    for rid in (1, 2):
        fan.start_run(TrackedRun(rid, {}, {}, "SFT"), "NEW")
        fan.set_status(rid, "ONGOING", at=1_700_000_000.0 + rid)
    fan.log_metrics(2, 1, {"loss": 2.5}, 1_700_000_003.0)
    fan.mark_deleted(2)  # deleted while it trained, its point not written yet
    fan.set_status(1, "COMPLETED", at=1_700_000_010.0)
    fan.close()
    reader = _Reader("mlflow", mlflow_dir, "times-mlflow", state)
    one = reader._client().get_run(reader.ids()["1"]).info
    assert (one.start_time, one.end_time) == (1_700_000_001_000, 1_700_000_010_000)
    assert reader.lifecycle(2) == ("KILLED", "deleted")  # restored, it does not look as if it still ran
    assert reader.history(2, "loss") == [(1, 2.5)]

    again = _tracker("mlflow", mlflow_dir, "times-mlflow", state)  # a restarted kernel
    again.start_run(TrackedRun(1, {}, {}, "SFT"), "COMPLETED")
    again.close()
    assert reader._client().get_run(reader.ids()["1"]).info.end_time == 1_700_000_010_000  # left as it was


def test_mlflow_start_line_says_how_to_open_a_store_given_by_mlflow_tracking_uri(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mlflow_template: Path
) -> None:
    need("mlflow")
    from rapidfire_nb.tracking.mlflow_tracker import MlflowTracker

    uri = mlflow_store_at(mlflow_template, tmp_path / "elsewhere" / "custom.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    tracker = MlflowTracker("custom-uri", tmp_path / "exp", {}, lambda state: None)
    assert tracker.describe() == (
        f"MLflow: experiment 'custom-uri' at {uri} (MLFLOW_TRACKING_URI); open the UI with: "
        f"mlflow ui --backend-store-uri '{uri}'  (then http://127.0.0.1:5000)"
    )
    tracker.close()


def test_a_kernel_killed_within_a_write_window_gets_its_unwritten_points_back_from_the_store(
    backend: str, tmp_path: Path
) -> None:
    """The first kernel writes its points up to step 2; steps 3..6 are still buffered when it is killed (no close),
    run 1's checkpoint at step 4, run 2 ended at step 4. The second one continues run 1 from step 4 and hands the
    stored points back (run 1's up to its checkpoint, all of run 2's): the backend holds each step once, steps 3
    and 4 included, with the store's values and the chunk-end eval."""
    project = f"killed-{backend}"
    state: dict[str, Any] = {}
    first = _tracker(backend, tmp_path, project, state)
    first.start_run(TrackedRun(1, {"learning_rate": 1e-3}, {}, "SFT"), "NEW")
    first.start_run(TrackedRun(2, {"learning_rate": 5e-4}, {}, "SFT"), "NEW")
    for rid in (1, 2):
        first.set_status(rid, "ONGOING")
    for step in range(1, 7):
        first.log_metrics(1, step, {"loss": LOSS[step]}, 1000.0 + step)
        if step == 4:
            first.log_metrics(1, step, {"eval_loss": 3.5}, 1004.5)
        if step <= 4:
            first.log_metrics(2, step, {"loss": LOSS[step] + 0.5}, 2000.0 + step)  # run 2 ends at step 4
        if step == 2:
            first.flush()  # the last write before the kill
    reader = _Reader(backend, tmp_path, project, state)
    assert reader.history(1, "loss") == [(1, LOSS[1]), (2, LOSS[2])]
    stored = [(s, {"loss": LOSS[s]}, 1000.0 + s) for s in range(1, 5)] + [(4, {"eval_loss": 3.5}, 1004.5)]
    stored_2 = [(s, {"loss": LOSS[s] + 0.5}, 2000.0 + s) for s in range(1, 5)]

    second = _tracker(backend, tmp_path, project, state)
    second.start_run(TrackedRun(1, {"learning_rate": 1e-3}, {}, "SFT"), "INTERRUPTED")
    second.start_run(TrackedRun(2, {"learning_rate": 5e-4}, {}, "SFT"), "COMPLETED")
    second.continue_from(1, 4)
    second.restore_points(1, 4, stored)
    second.restore_points(2, 4, stored_2)  # ended in the dead kernel: not continued, all its points
    second.set_status(1, "ONGOING")
    for step in range(5, 9):
        second.log_metrics(1, step, {"loss": LOSS[step]})
        second.end_batch()
    second.set_status(1, "COMPLETED")
    second.close()
    assert reader.history(1, "loss") == [(s, LOSS[s]) for s in range(1, 9)]
    assert reader.history(1, "eval_loss") == [(4, 3.5)]
    assert reader.history(2, "loss") == [(s, LOSS[s] + 0.5) for s in range(1, 5)]


def test_mlflow_keeps_each_repeated_point_of_a_step_after_a_restart(mlflow_dir: Path) -> None:
    """TRL logs ``epoch`` in the training log and again in the evaluation log of a chunk's last step. The first
    kernel wrote steps 1..4 and the training logs of steps 5 and 6, then was killed with step 4's and step 6's
    evaluation logs still buffered (run 1's checkpoint at step 4). The second kernel hands back the stored points
    up to step 4 and logs steps 5..8 again: MLflow's history equals the uninterrupted run's, ``epoch`` twice at
    each evaluated step (was: once at steps 4 and 6, the held step taken for every point of it)."""
    calls = {s: [{"loss": LOSS[s], "epoch": s / 8}] for s in range(1, 9)}
    for s in (4, 6, 8):
        calls[s].append({"eval_loss": LOSS[s] / 2, "epoch": s / 8})
    state: dict[str, Any] = {}
    first = _tracker("mlflow", mlflow_dir, "repeat", state)
    first.start_run(TrackedRun(1, {"learning_rate": 1e-3}, {}, "SFT"), "ONGOING")
    for step in range(1, 7):
        first.log_metrics(1, step, calls[step][0], 1000.0 + step)
        first.flush()
    for step in (4, 6):  # buffered, never written: the kernel is killed (no close)
        first.log_metrics(1, step, calls[step][1], 1000.5 + step)
    stored = [(s, c, 1000.0 + s + 0.5 * i) for s in range(1, 5) for i, c in enumerate(calls[s])]

    second = _tracker("mlflow", mlflow_dir, "repeat", state)
    second.start_run(TrackedRun(1, {"learning_rate": 1e-3}, {}, "SFT"), "INTERRUPTED")
    second.continue_from(1, 4)
    second.restore_points(1, 4, stored)
    second.set_status(1, "ONGOING")
    for step in range(5, 9):
        for i, c in enumerate(calls[step]):  # (MLflow keeps one of two equal points with the same time)
            second.log_metrics(1, step, c, 1000.0 + step + 0.5 * i)
        second.end_batch()
    second.set_status(1, "COMPLETED")
    second.close()
    reader = _Reader("mlflow", mlflow_dir, "repeat", state)
    uninterrupted = sorted((s, c["epoch"]) for s in range(1, 9) for c in calls[s])
    assert sorted(reader.history(1, "epoch")) == uninterrupted
    assert reader.history(1, "eval_loss") == [(s, LOSS[s] / 2) for s in (4, 6, 8)]
    assert reader.history(1, "loss") == [(s, LOSS[s]) for s in range(1, 9)]


def test_mlflow_keeps_two_equal_points_logged_within_one_millisecond(mlflow_dir: Path) -> None:
    """A run's last step: TRL's evaluation log and its final summary both carry ``epoch`` 1.0, 0.66 ms apart (as
    measured on the tiny model). MLflow's SQL store keeps one row of equal (key, timestamp, step, value), so one
    of the two was lost at random: a restarted run then held one ``epoch`` point more than an uninterrupted one
    that lost it (issue 34 item 9). Both points are kept, each key's timestamps increasing."""
    state: dict[str, Any] = {}
    fan = _tracker("mlflow", mlflow_dir, "same-ms", state)
    fan.start_run(TrackedRun(1, {"learning_rate": 1e-3}, {}, "SFT"), "ONGOING")
    fan.log_metrics(1, 8, {"loss": 2.0, "epoch": 1.0}, 1000.0257)
    fan.log_metrics(1, 8, {"eval_loss": 1.5, "epoch": 1.0}, 1000.0550)
    fan.log_metrics(1, 8, {"train_runtime": 0.3, "epoch": 1.0}, 1000.0556)
    fan.set_status(1, "COMPLETED")
    fan.close()
    reader = _Reader("mlflow", mlflow_dir, "same-ms", state)
    assert reader.history(1, "epoch") == [(8, 1.0)] * 3
    client = reader._client()
    stamps = [m.timestamp for m in client.get_metric_history(reader.ids()["1"], "epoch")]
    assert sorted(stamps) == [1000025, 1000055, 1000056]
