"""Run names and tags in the trackers: the MLflow / Trackio / W&B run name is the run's name (``run-<id>`` without
one) and its tags are the backend's tags; TensorBoard keeps the folder ``run-<id>`` and writes the name as a text
summary. Real MLflow (SQLite store) and Trackio (temporary folder), a fake ``wandb`` module; no training. The backend
run is found again by its saved id (a name is a label): a restarted kernel continues the same named run, and a Trackio
run tracked before runs had names keeps its ``run-<id>``."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb.tracking import TrackedRun
from rapidfire_nb.tracking.backends import openers
from rapidfire_nb.tracking.fanout import TrackerSet
from tests.rapidfire_nb.tracking._tracking_helpers import mlflow_store_at, need, trackio_history

NAMED = {"model_name": "m", "run_name": "lr1e-04-r8", "tags": ["sweep", "r=8"]}


def _runs() -> list[TrackedRun]:
    return [
        TrackedRun(1, {"learning_rate": 1e-4}, NAMED, "SFT"),
        TrackedRun(2, {"learning_rate": 2e-4}, {"model_name": "m"}, "SFT"),  # no name: run-2
        TrackedRun(3, {"learning_rate": 3e-4}, {**NAMED, "tags": []}, "SFT", parent_id=1),  # the same name
    ]


def _tracker(backend: str, exp_dir: Path, project: str, state: dict[str, Any]) -> TrackerSet:
    def save(name: str, value: dict[str, Any]) -> None:
        state[name] = value

    fan = TrackerSet(openers([backend], exp_dir, project, dict(state), save), report=lambda line: None)
    fan.open()
    return fan


def _train(fan: TrackerSet, runs: list[TrackedRun], status: str = "NEW") -> None:
    for run in runs:
        fan.start_run(run, status)
        fan.set_status(run.run_id, "ONGOING")
        fan.log_metrics(run.run_id, 1, {"loss": 2.0 + run.run_id})
    fan.end_batch()


def test_mlflow_names_the_run_and_tags_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mlflow_template: Path
) -> None:
    need("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    mlflow_store_at(mlflow_template, tmp_path / "mlflow.db")
    state: dict[str, Any] = {}
    fan = _tracker("mlflow", tmp_path, "names", state)
    _train(fan, _runs())
    fan.close()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    got = {rid: client.get_run(mid) for rid, mid in state["mlflow"]["runs"].items()}
    assert {rid: r.info.run_name for rid, r in got.items()} == {
        "1": "lr1e-04-r8",
        "2": "run-2",
        "3": "lr1e-04-r8",
    }
    tags = got["1"].data.tags
    assert tags["sweep"] == "" and tags["rapidfire.tags"] == "sweep, r=8"
    assert "r=8" not in tags  # '=' MLflow refuses in a key: only listed in rapidfire.tags
    assert tags["rapidfire.run_id"] == "1"  # the id beside the name
    assert "rapidfire.tags" not in got["2"].data.tags and "sweep" not in got["3"].data.tags
    # a restarted kernel whose run_fit renames run 2: the same MLflow run, renamed
    again = _tracker("mlflow", tmp_path, "names", state)
    again.start_run(TrackedRun(2, {}, {"model_name": "m", "run_name": "renamed"}, "SFT"), "COMPLETED")
    again.close()
    assert client.get_run(state["mlflow"]["runs"]["2"]).info.run_name == "renamed"
    assert len(state["mlflow"]["runs"]) == 3


def test_trackio_names_the_run_keeps_the_name_and_tells_repeats_apart(tmp_path: Path) -> None:
    need("trackio")
    state: dict[str, Any] = {"trackio": {}}
    first = _tracker("trackio", tmp_path, "names-trackio", state)
    _train(first, _runs())
    first.close()
    names = state["trackio"]["names"]
    assert names == {"1": "lr1e-04-r8", "2": "run-2", "3": "lr1e-04-r8 (run 3)"}
    ids = dict(state["trackio"]["runs"])
    # a restarted kernel logs into the same named run (found by its saved id and name)
    second = _tracker("trackio", tmp_path, "names-trackio", state)
    second.start_run(_runs()[0], "INTERRUPTED")
    second.continue_from(1, 1)
    second.set_status(1, "ONGOING")
    second.log_metrics(1, 2, {"loss": 1.5})
    second.close()
    assert state["trackio"]["runs"] == ids
    assert trackio_history("names-trackio", "lr1e-04-r8", ids["1"], "train/loss") == [(1, 3.0), (2, 1.5)]
    # a run tracked before runs had names (no "names" saved) keeps run-<id>, whatever its name is now
    legacy = {"trackio": {"dir": state["trackio"]["dir"], "runs": {"2": ids["2"]}}}
    third = _tracker("trackio", tmp_path, "names-trackio", legacy)
    third.start_run(TrackedRun(2, {}, NAMED, "SFT"), "INTERRUPTED")
    third.set_status(2, "ONGOING")
    third.log_metrics(2, 2, {"loss": 0.5})
    third.close()
    assert trackio_history("names-trackio", "run-2", ids["2"], "train/loss") == [(1, 4.0), (2, 0.5)]


def test_wandb_names_the_run_and_adds_its_tags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, Any]] = []

    def init(**kwargs: Any) -> Any:
        made.append(kwargs)
        return types.SimpleNamespace(
            log=lambda *a, **k: None, summary={}, finish=lambda exit_code=0: None, tags=()
        )

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    from rapidfire_nb.tracking.wandb_tracker import WandbTracker

    tracker = WandbTracker("exp", tmp_path, {}, lambda s: None)
    for run in _runs():
        tracker.start_run(run, "NEW")
        tracker.set_status(run.run_id, "ONGOING")
    assert [m["name"] for m in made] == ["lr1e-04-r8", "run-2", "lr1e-04-r8"]
    assert made[0]["tags"] == ["SFT", "sweep", "r=8"] and made[2]["tags"] == ["SFT", "clone"]
    assert [m["config"]["rapidfire.run_id"] for m in made] == [1, 2, 3]  # the id beside the name


def test_tensorboard_keeps_the_run_folder_and_writes_the_name_as_text(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rapidfire_nb.tracking.tensorboard import NAME_TAG, TensorBoardTracker

    tracker = TensorBoardTracker(tmp_path)
    for run in _runs()[:2]:
        tracker.start_run(run, "NEW")
    tracker.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-1", "run-2"]
    acc = EventAccumulator(str(tmp_path / "run-1"), size_guidance={"tensors": 0}).Reload()
    text = acc.Tensors(NAME_TAG)[0].tensor_proto.string_val[0].decode()
    assert text == "**run 1**: lr1e-04-r8  \ntags: sweep, r=8"
    unnamed = EventAccumulator(str(tmp_path / "run-2"), size_guidance={"tensors": 0}).Reload()
    assert NAME_TAG not in unnamed.Tags()["tensors"] and "hparams" in unnamed.Tags()["tensors"]
