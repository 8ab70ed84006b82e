"""MLflow and Trackio beside TensorBoard in a real (tiny) experiment, with IC Ops in their run lifecycle (issue 15).

One module-scoped experiment, ``tracking=["tensorboard", "mlflow", "trackio"]``, MLflow in its default SQLite store
inside the experiment folder (a copy of a migrated empty store), Trackio in a temporary ``TRACKIO_DIR``:

=====  ===========================================  ===========================================================
run    config                                       what happens to it
=====  ===========================================  ===========================================================
1      lr 1e-3, r 4, ``hub_token`` set              never touched: COMPLETED
2      lr 1e-3                                      stopped after chunk 1; after a restart (a new Experiment
                                                    object, run_fit again) resumed: COMPLETED
3      lr 5e-4                                      deleted mid-training
4      warm clone of 1, no changes                  COMPLETED, tagged with its parent
=====  ===========================================  ===========================================================

8 rows, batch 2 -> 4 steps, 4 chunks of one step, logging every step. A second, small experiment has MLflow raise
mid-run. MLflow and Trackio are imported before training starts (as in a kernel that used them before): a first
import takes 5-10 s on this machine, on the low-priority recorder thread, and would make the IC Ops below arrive
after the runs ended.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import qa_dataset, qa_to_chat, result_series
from tests.rapidfire_nb.tracking._tracking_helpers import (
    mlflow_history,
    mlflow_store_at,
    need,
    trackio_history,
)

SEED = 5
N_TRAIN = 8
STEPS = N_TRAIN // 2
BATCH = 2
NUM_CHUNKS = 4
SECRET = "hf_NOT_A_REAL_TOKEN_4242"
TRACKING = ["tensorboard", "mlflow", "trackio"]
WAIT_S = 150


def _group(lrs: tuple[float, ...]) -> Any:
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    def config(lr: float) -> Any:
        return RFModelConfig(
            model_name="tiny",
            formatting_func=qa_to_chat,
            peft_config=RFLoraConfig(
                r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"]
            ),
            training_args=RFSFTConfig(
                learning_rate=lr,
                per_device_train_batch_size=BATCH,
                num_train_epochs=1,
                max_length=32,
                logging_steps=1,
                hub_token=SECRET,
            ),
        )

    return RFGridSearch(configs=List([config(lr) for lr in lrs]), trainer_type="SFT")


def _until(cond: Any, timeout: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def no_mlflow_uri() -> Iterator[None]:
    saved = os.environ.pop("MLFLOW_TRACKING_URI", None)
    yield
    if saved is not None:
        os.environ["MLFLOW_TRACKING_URI"] = saved


def _status(exp: Any, rid: int) -> str:
    snap = exp.run_snapshot(rid)
    return snap.status.value if snap else "MISSING"


@pytest.fixture(scope="module")
def tracked(
    tmp_path_factory: pytest.TempPathFactory, mlflow_template: Path, no_mlflow_uri: None
) -> dict[str, Any]:
    need("trackio")
    import trackio  # noqa: F401 - warm import (see the module docstring)

    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model

    root = tmp_path_factory.mktemp("tracked")
    train, group = qa_dataset(N_TRAIN, seed=0), _group((1e-3, 1e-3, 5e-4))
    said: list[str] = []
    exp = Experiment("trk", experiment_path=root, tracking=TRACKING)
    exp.on_message(said.append)
    mlflow_store_at(mlflow_template, exp.path / "mlflow.db")
    exp.run_fit(group, tiny_create_model, train, num_chunks=NUM_CHUNKS, seed=SEED, background=True)
    assert exp.wait(timeout=WAIT_S, chunks=1)  # returns with the runs still training, trackers on or not
    out_ops = [exp.stop(2), exp.delete(3)]
    assert all(ack.state != "rejected" for ack in out_ops), out_ops
    clone = exp.clone_modify(1, {}, warm_start=True)
    assert _until(lambda: _status(exp, 2) == "STOPPED" and _status(exp, 3) == "DELETED")
    assert exp.wait(timeout=WAIT_S)
    out: dict[str, Any] = {"root": root, "path": exp.path, "clone": clone, "said": said}
    out["results_a"] = exp.get_results(include_deleted=True)
    out["ids_a"] = exp.store.get_meta("trackers")
    exp.end()
    out["mlflow_a"] = _mlflow_view(exp.path, out["ids_a"])
    out["trackio_a"] = _trackio_view(out["ids_a"])

    again = Experiment("trk", experiment_path=root, tracking=TRACKING)  # a new object: a restarted kernel
    again.on_message(said.append)
    again.run_fit(group, tiny_create_model, train, num_chunks=NUM_CHUNKS, seed=SEED, background=True)
    again.resume(2)
    assert again.wait(timeout=WAIT_S)
    out["results_b"] = again.get_results(include_deleted=True)
    out["ids_b"] = again.store.get_meta("trackers")
    again.end()
    out["mlflow_b"] = _mlflow_view(exp.path, out["ids_b"])
    out["trackio_b"] = _trackio_view(out["ids_b"])
    return out


def _mlflow_view(path: Path, ids: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Per run id: MLflow's status, lifecycle stage, params, tags and every metric's history."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{path / 'mlflow.db'}")
    view = {}
    for rid, mid in ids["mlflow"]["runs"].items():
        run = client.get_run(mid)
        view[int(rid)] = {
            "id": mid,
            "name": run.info.run_name,
            "status": run.info.status,
            "stage": run.info.lifecycle_stage,
            "params": dict(run.data.params),
            "tags": dict(run.data.tags),
            "metrics": {k: mlflow_history(client, mid, k) for k in run.data.metrics},
        }
    return view


def _trackio_view(ids: dict[str, Any]) -> dict[str, Any]:
    """The Trackio runs of the project (by name), and per run id its alerts' titles and its train/loss points."""
    import trackio

    runs = {r.name: r for r in trackio.Api().runs("trk")}
    view: dict[str, Any] = {"names": sorted(runs), "runs": {}}
    for rid, tid in ids["trackio"]["runs"].items():
        run = runs.get(f"run-{rid}")
        view["runs"][int(rid)] = {
            "id": tid,
            "alerts": [a["title"] for a in sorted(run.alerts(), key=lambda a: a["timestamp"])]
            if run
            else None,
            "config": run.config if run else None,
            "loss": trackio_history("trk", f"run-{rid}", tid, "train/loss"),
        }
    return view


def _metric_names(results: Any) -> list[str]:
    return [c for c in results.columns if c not in ("run_id", "step", "samples_seen")]


# ============================================================================================ MLflow
def test_mlflow_holds_every_run_with_the_store_metric_values(tracked: dict[str, Any]) -> None:
    results, mlflow = tracked["results_b"], tracked["mlflow_b"]
    clone = tracked["clone"]
    assert sorted(mlflow) == [1, 2, 3, clone]
    for rid in (1, 2, clone):
        assert mlflow[rid]["name"] == f"run-{rid}"
        names = [n for n in _metric_names(results) if result_series(results, rid, n)]
        assert "loss" in names and "learning_rate" in names
        assert sorted(mlflow[rid]["metrics"]) == sorted(names), rid
        for name in names:  # TRL's names, the same steps, the same values
            # (TRL logs `epoch` twice at the last step, with its train_runtime line: compare distinct points)
            got, want = set(mlflow[rid]["metrics"][name]), set(result_series(results, rid, name))
            assert got == want, (rid, name)
        assert mlflow[rid]["metrics"]["loss"] == result_series(results, rid, "loss")  # each step once


def test_mlflow_statuses_follow_the_ic_ops(tracked: dict[str, Any]) -> None:
    before, after, clone = tracked["mlflow_a"], tracked["mlflow_b"], tracked["clone"]
    assert {rid: (v["status"], v["stage"]) for rid, v in before.items()} == {
        1: ("FINISHED", "active"),
        2: ("KILLED", "active"),  # stopped
        3: ("KILLED", "deleted"),  # deleted while it trained: not left RUNNING if restored
        clone: ("FINISHED", "active"),
    }
    assert after[2]["status"] == "FINISHED"  # resumed after the restart, then completed
    assert after[3]["stage"] == "deleted"
    store_loss = result_series(tracked["results_a"], 3, "loss")
    assert store_loss and before[3]["metrics"]["loss"] == store_loss  # its points, as the store holds them


def test_mlflow_params_tags_and_no_secret(tracked: dict[str, Any]) -> None:
    mlflow, clone = tracked["mlflow_b"], tracked["clone"]
    params = mlflow[1]["params"]
    assert params["learning_rate"] == "0.001" and params["lora.r"] == "4" and params["model_name"] == "tiny"
    assert params["per_device_train_batch_size"] == "2" and params["rapidfire.num_chunks"] == "4"
    assert params["hub_token"] == "<redacted>"
    assert mlflow[3]["params"]["learning_rate"] == "0.0005"
    tags = mlflow[clone]["tags"]
    assert tags["rapidfire.parent_run"] == "1" and tags["rapidfire.warm_start"] == "true"
    assert tags["rapidfire.parent_mlflow_run_id"] == mlflow[1]["id"]
    assert tags["rapidfire.trainer_type"] == "SFT" and mlflow[1]["tags"]["rapidfire.warm_start"] == "false"
    from tests.rapidfire_nb.tracking.conftest import TRACKIO_DIR

    for folder in (tracked["path"], TRACKIO_DIR):
        for file in Path(folder).rglob("*"):
            if file.is_file():
                assert SECRET.encode() not in file.read_bytes(), file


def test_a_restart_continues_the_same_backend_runs(tracked: dict[str, Any]) -> None:
    assert tracked["ids_b"]["mlflow"]["runs"] == tracked["ids_a"]["mlflow"]["runs"]
    assert tracked["ids_b"]["trackio"]["runs"] == tracked["ids_a"]["trackio"]["runs"]
    stopped_at = max(s for s, _ in result_series(tracked["results_a"], 2, "loss"))
    assert tracked["mlflow_b"][2]["tags"]["rapidfire.continued_from_step"] == str(stopped_at)
    before = tracked["mlflow_a"][2]["metrics"]["loss"]
    after = tracked["mlflow_b"][2]["metrics"]["loss"]
    assert after[: len(before)] == before and len(after) == STEPS  # the same MLflow run, grown to its end


def test_the_start_line_prints_the_tracking_uri_and_the_ui_command(tracked: dict[str, Any]) -> None:
    lines = [s for s in tracked["said"] if s.startswith("[rapidfire] MLflow:")]
    uri = f"sqlite:///{(tracked['path'] / 'mlflow.db').resolve()}"
    assert lines and f"mlflow ui --backend-store-uri '{uri}'" in lines[0]
    assert any(
        s.startswith("[rapidfire] Trackio: project 'trk'") and "trackio show" in s for s in tracked["said"]
    )


# ============================================================================================ Trackio
def test_trackio_holds_the_runs_with_the_store_values_and_their_lifecycle(tracked: dict[str, Any]) -> None:
    clone, before, after = tracked["clone"], tracked["trackio_a"], tracked["trackio_b"]
    assert after["names"] == sorted(["run-1", "run-2", f"run-{clone}"])  # run 3 was deleted from the project
    for rid in (1, 2, clone):
        assert after["runs"][rid]["loss"] == result_series(tracked["results_b"], rid, "loss"), rid
    assert before["runs"][2]["alerts"][-1] == "run-2 killed"
    assert after["runs"][2]["alerts"][-2:] == ["run-2 running", "run-2 finished"]
    assert after["runs"][1]["alerts"][-1] == "run-1 finished"
    config = after["runs"][clone]["config"]
    assert config["rapidfire.parent_run"] == 1 and config["rapidfire.warm_start"] is True
    assert config["learning_rate"] == 0.001 and config["hub_token"] == "<redacted>"


# ============================================================================================ a failing backend
def test_a_backend_that_raises_mid_run_leaves_training_and_the_store_intact(
    tmp_path: Path, mlflow_template: Path, no_mlflow_uri: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    need("trackio")
    from mlflow.tracking import MlflowClient

    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model

    calls = {"n": 0}
    real = MlflowClient.log_batch

    def flaky(self: Any, run_id: str, metrics: Any = (), **kwargs: Any) -> Any:
        if metrics:
            calls["n"] += 1
            if calls["n"] == 1:  # the first metrics: the MLflow run exists, its params are written
                raise ConnectionError("tracking server went away")
        return real(self, run_id, metrics=metrics, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", flaky)
    said: list[str] = []
    exp = Experiment("flaky", experiment_path=tmp_path, tracking=["mlflow", "trackio"])
    exp.on_message(said.append)
    mlflow_store_at(mlflow_template, exp.path / "mlflow.db")
    exp.run_fit(_group((1e-3,)), tiny_create_model, qa_dataset(N_TRAIN), num_chunks=NUM_CHUNKS, seed=SEED)
    results = exp.get_results()
    ids = exp.store.get_meta("trackers")
    exp.end()
    losses = result_series(results, 1, "loss")
    assert [s for s, _ in losses] == list(range(1, STEPS + 1))  # training and the store went on
    failures = [s for s in said if "tracking failed" in s]
    assert len(failures) == 1 and failures[0].startswith("[rapidfire] mlflow tracking failed (")
    assert "tracking server went away" in failures[0] and "off for the rest of this experiment" in failures[0]
    assert trackio_history("flaky", "run-1", ids["trackio"]["runs"]["1"], "train/loss") == losses
    assert calls["n"] == 1  # never called again after its failure
