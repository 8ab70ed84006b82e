"""rapidfire_nb.view: store rows (+ the kernel's live state) -> the panel/page snapshot, legal ops, text."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kernel_scheduler import OpKind, RunSnapshot, RunStatus, decide
from rapidfire_nb import view
from rapidfire_nb.view import KernelState, StoreRows

REPO = Path(__file__).resolve().parents[3]

META = {
    "created_at": 1000.0,
    "num_chunks": 4,
    "hparam_columns": ["learning_rate"],
    "metric_names": ["eval_loss", "loss"],
    "editable_fields": {"1": {"learning_rate": "float", "lora.r": "int"}},
}


def _row(run_id: int, status: str, **extra: Any) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "status": status,
        "hparams": {"learning_rate": 1e-4 * run_id, "lora.r": 8, "formatting_func": "<function f>"},
        "completed_steps": 3 * run_id,
        "total_steps": 12,
        "chunks_done": run_id,
        "num_segments": 4,
        "epoch": 0.25 * run_id,
        "samples_seen": 12 * run_id,
        "error": None,
        "parent_id": None,
        "warm_start": 0,
        **extra,
    }


def _rows(*runs: dict[str, Any], meta: dict[str, Any] | None = None) -> StoreRows:
    ops = [
        {
            "op_id": "a",
            "run_id": 1,
            "kind": "stop",
            "state": "applied",
            "message": "ok",
            "source": "panel",
            "requested_at": 1.0,
            "applied_at": 2.0,
            "payload": {},
        }
    ]
    return StoreRows(
        meta=META if meta is None else meta,
        runs=list(runs),
        latest={1: {"loss": 0.5, "eval_loss": 0.75}},
        ops=ops,
    )


def _snap(
    run_id: int, status: RunStatus, step: int = 6, on_device: bool = False, **extra: Any
) -> RunSnapshot:
    fields: dict[str, Any] = {
        "run_id": run_id,
        "status": status,
        "step": step,
        "total_steps": 12,
        "segments_done": step // 3,
        "num_segments": 4,
        "position": (1, step // 3 + 1),
        "samples_seen": 4 * step,
        "on_device": on_device,
        "parent_id": None,
        "warm_start": False,
        "error": None,
        "spec": None,
        "steps_per_epoch": 12,
    }
    fields.update(extra)
    return RunSnapshot(**fields)


# ------------------------------------------------------------------------------------------------ rules


@pytest.mark.parametrize("status", list(RunStatus))
def test_legal_ops_are_what_decide_does_not_reject(status: RunStatus) -> None:
    expected = [k.value for k in OpKind if decide(k, status, False, 1).verdict != "reject"]
    assert view.legal_ops(status) == view.legal_ops(status.value) == expected
    assert view.legal_ops(status, accepting=False) == []


def test_legal_ops_examples() -> None:
    assert view.legal_ops("ONGOING") == ["stop", "delete", "clone"]
    assert view.legal_ops("STOPPED") == ["resume", "delete", "clone"]
    assert view.legal_ops("INTERRUPTED") == ["stop", "resume", "delete", "clone"]
    assert view.legal_ops("COMPLETED") == ["delete", "clone"]
    assert view.legal_ops("DELETED") == [] == view.legal_ops("BOGUS") == view.legal_ops(None)


def test_reported_status_and_device_status() -> None:
    assert view.reported_status("ONGOING", writer_alive=False) == "INTERRUPTED"
    assert view.reported_status("ONGOING", writer_alive=True) == "ONGOING"
    assert view.reported_status("NEW", writer_alive=False) == "NEW"
    assert view.device_status(["NEW", "COMPLETED"], True) == "training (kernel alive)"
    assert view.device_status([RunStatus.STOPPED], True) == "device idle (kernel alive)"
    assert view.device_status(["ONGOING"], False) == "no kernel running"


def test_editable_fields_one_rule() -> None:
    hp = {"learning_rate": 1e-4, "formatting_func": "<function f>", "packing": None}
    recorded = {"1": {"learning_rate": "float", "x": "weird"}}
    assert view.editable_fields(recorded, 1, hp) == {"learning_rate": "float", "x": "other"}
    assert view.editable_fields(recorded, 2, hp) is None  # recorded, but not for this run
    assert view.editable_fields(None, 2, hp) == {"learning_rate": "float", "packing": "null"}
    assert view.editable_fields(None, 2, "not a dict") == {}


# ------------------------------------------------------------------------------------------------ formatting


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1e-4, "1e-4"),
        (0.812345, "0.8123"),
        (2.5e-5, "2.5e-5"),
        (12, "12"),
        (1234.5678, "1235"),
        (123456.0, "1.235e5"),
        (0.0, "0"),
        (None, "-"),
        (True, "True"),
        ("cosine", "cosine"),
        (math.nan, "nan"),
        (math.inf, "inf"),
    ],
)
def test_fmt_num(value: Any, text: str) -> None:
    assert view.fmt_num(value) == text


def test_progress_text_for_each_trainer() -> None:
    ongoing, new, done = RunStatus.ONGOING, RunStatus.NEW, RunStatus.COMPLETED
    runs = [(ongoing, (1, 3)), (new, (1, 2)), (done, None), (RunStatus.DELETED, None)]
    assert view.progress_text(runs, 4, "here") == "chunk 2/4 of epoch 1"
    assert view.progress_text(runs, 4, "alive") == "chunk 2/4 of epoch 1"
    assert view.progress_text(runs, 4, "gone") == "no kernel is running this experiment — 1/3 runs completed"
    assert view.progress_text(runs, 4, "not_here") == (
        "not training in this kernel — 1/3 runs completed; 1 interrupted (run_fit with the same arguments "
        "continues them)"
    )
    assert view.progress_text([(done, None)], 4, "here") == "idle — 1/1 runs completed"
    assert view.chunk_position(5, 4) == (2, 2)


def test_chunk_line() -> None:
    snap = _snap(2, RunStatus.ONGOING, step=6)
    assert view.chunk_line(snap, {"loss": 0.812345, "eval_loss": math.nan}, 4) == (
        "run 2 · chunk 2/4 of epoch 1 done · step 6/12 · loss 0.8123 · eval_loss nan"
    )
    done = _snap(2, RunStatus.COMPLETED, step=12)
    assert view.chunk_line(done, {"loss": 1.5e-4}, 4) == "run 2 · completed · step 12/12 · loss 1.5e-4"
    failed = _snap(3, RunStatus.FAILED, error="boom")
    assert view.chunk_line(failed, {"loss": 1.0}, 4) == "run 3 · FAILED: boom"


# ------------------------------------------------------------------------------------------------ snapshots


def test_store_snapshot_from_rows() -> None:
    rows = _rows(_row(1, "ONGOING"), _row(2, "COMPLETED"), _row(3, "NEW", chunks_done=0))
    snap = view.store_snapshot("exp", rows, writer_alive=True, last_beat=5.0, now=7.0)
    assert {
        k: snap[k]
        for k in (
            "experiment",
            "started_at",
            "now",
            "on_device",
            "num_chunks",
            "progress",
            "writer_alive",
            "last_beat",
            "source",
            "device_status",
        )
    } == {
        "experiment": "exp",
        "started_at": 1000.0,
        "now": 7.0,
        "on_device": None,
        "num_chunks": 4,
        "progress": "chunk 1/4 of epoch 1",
        "writer_alive": True,
        "last_beat": 5.0,
        "source": "store",
        "device_status": "training (kernel alive)",
    }
    assert snap["ops"] == [
        {
            "op_id": "a",
            "run_id": 1,
            "kind": "stop",
            "state": "applied",
            "message": "ok",
            "requested_at": 1.0,
            "applied_at": 2.0,
        }
    ]
    run1 = snap["runs"][0]
    assert run1["hparams"] == {"learning_rate": 1e-4} and run1["legal_ops"] == ["stop", "delete", "clone"]
    assert run1["editable"] == {"learning_rate": 1e-4, "lora.r": 8}  # as recorded by the kernel
    assert snap["runs"][1]["editable"] == {"learning_rate": 2e-4, "lora.r": 8}  # no record: no object reprs
    assert (run1["loss"], run1["eval_loss"], run1["on_device"]) == (0.5, 0.75, False)
    assert [r["completed_steps"] for r in snap["runs"]] == [3, 6, 9]


def test_store_snapshot_of_a_dead_writer() -> None:
    snap = view.store_snapshot("exp", _rows(_row(1, "ONGOING"), _row(2, "DELETED")), writer_alive=False)
    assert [r["status"] for r in snap["runs"]] == ["INTERRUPTED", "DELETED"]
    assert all(r["legal_ops"] == [] for r in snap["runs"])
    assert snap["progress"] == "no kernel is running this experiment — 0/1 runs completed"
    assert snap["device_status"] == "no kernel running"


def test_kernel_snapshot_overlays_the_scheduler() -> None:
    rows = _rows(_row(1, "NEW"), _row(2, "NEW"), _row(3, "COMPLETED"))
    kernel = KernelState(
        started_at=2000.0,
        num_chunks=4,
        hparam_columns=["lora.r"],
        runs=[_snap(1, RunStatus.ONGOING, step=3, on_device=True), _snap(2, RunStatus.STOPPED, step=6)],
        on_device=1,
        live_steps={1: 5, 2: 99},
    )
    snap = view.kernel_snapshot("exp", rows, kernel, now=3.0)
    assert "writer_alive" not in snap and snap["on_device"] == 1 and snap["started_at"] == 2000.0
    assert snap["hparam_columns"] == ["lora.r"] and snap["metric_names"] == ["eval_loss", "loss"]
    one, two, three = snap["runs"]
    assert (one["status"], one["on_device"], one["completed_steps"]) == ("ONGOING", True, 5)  # live step
    assert (two["status"], two["completed_steps"], two["legal_ops"]) == (
        "STOPPED",
        6,
        ["resume", "delete", "clone"],
    )
    assert (three["status"], three["completed_steps"], three["epoch"]) == ("COMPLETED", 9, 0.75)  # the row's
    assert one["hparams"] == {"lora.r": 8} and one["epoch"] == 0.25 and one["samples_seen"] == 12
    assert snap["progress"] == "chunk 2/4 of epoch 1"


def test_kernel_snapshot_without_a_scheduler() -> None:
    rows = _rows(_row(1, "INTERRUPTED"), _row(2, "COMPLETED"))
    snap = view.kernel_snapshot("exp", rows, KernelState(started_at=None, num_chunks=0, hparam_columns=[]))
    assert snap["started_at"] == 1000.0 and snap["on_device"] is None and snap["num_chunks"] == 0
    assert snap["runs"][0]["hparams"] == _row(1, "X")["hparams"]  # no columns: every hyperparameter
    assert snap["runs"][0]["legal_ops"] == ["stop", "resume", "delete", "clone"]
    assert snap["progress"].startswith("not training in this kernel — 1/2 runs completed; 1 interrupted")


def test_store_rows_read_calls_the_store_readers() -> None:
    class FakeStore:
        def meta(self) -> dict[str, Any]:
            return {"x": 1}

        def runs(self) -> list[dict[str, Any]]:
            return [_row(1, "NEW")]

        def latest_metrics(self, names: Any) -> dict[int, dict[str, float]]:
            assert list(names) == ["loss", "eval_loss"]
            return {1: {"loss": 1.0}}

        def ops(self) -> list[dict[str, Any]]:
            return []

    rows = StoreRows.read(FakeStore())
    assert rows.meta == {"x": 1} and rows.latest == {1: {"loss": 1.0}} and len(rows.runs) == 1


def test_view_imports_no_torch() -> None:
    code = (
        "import sys, rapidfire_nb.view, rapidfire_nb.testing.fake_source; "
        "bad = [m for m in ('torch', 'transformers', 'trl', 'anywidget') if m in sys.modules]; "
        "sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_queued_stop_makes_resume_legal_it_cancels_the_stop() -> None:
    ops = [
        {"op_id": "a", "run_id": 1, "kind": "stop", "state": "queued"},
        {"op_id": "b", "run_id": 2, "kind": "stop", "state": "applied"},
        {"op_id": "c", "run_id": 1, "kind": "clone", "state": "queued"},
    ]
    pending = view.pending_ops(ops, 1)
    assert [p.op_id for p in pending] == ["a"]
    assert view.legal_ops("ONGOING", pending=pending) == ["stop", "resume", "delete", "clone"]
    assert view.legal_ops("ONGOING", pending=view.pending_ops(ops, 2)) == ["stop", "delete", "clone"]


OPTUNA = {
    "label": "RFOptuna(minimize:eval_loss, tpe, pruner hyperband, budget 24)",
    "kind": "search",
    "name": "Optuna",
    "trials": 11,
    "budget": 24,
    "pruned": 5,
    "running": 3,
}
HALVING = {
    "label": "SuccessiveHalving(eval_loss, min, η=2, grace 1 chunk)",
    "kind": "rungs",
    "name": "successive halving (η=2)",
    "metric": "eval_loss",
    "next_rung": 4,
}


def test_early_stopping_text_for_each_policy() -> None:
    pruned = [{"pruned": True}, {"pruned": True}, {"pruned": False}, {}]
    assert view.early_stopping_text(OPTUNA) == "Optuna: 11 of 24 trials asked · 5 pruned · 3 running"
    assert view.early_stopping_text(HALVING, pruned) == (
        "successive halving (η=2) on eval_loss: 2 pruned, next rung at chunk 4"
    )
    assert view.early_stopping_text({**HALVING, "next_rung": None}, pruned).endswith("2 pruned, no rung left")
    # what pruning saved: the pruned runs' untrained steps of every run's full budget (a deleted run left out)
    budget = [
        {"pruned": True, "status": "STOPPED", "completed_steps": 12, "total_steps": 48},
        {"pruned": True, "status": "STOPPED", "completed_steps": 24, "total_steps": 48},
        {"status": "COMPLETED", "completed_steps": 48, "total_steps": 48},
        {"status": "ONGOING", "completed_steps": 30, "total_steps": 48},
        {"pruned": True, "status": "DELETED", "completed_steps": 0, "total_steps": 48},
    ]
    assert view.early_stopping_text(HALVING, budget) == (
        "successive halving (η=2) on eval_loss: 2 pruned (saved 60 of 192 steps), next rung at chunk 4"
    )
    assert view.early_stopping_text({"label": "MyPolicy(x)"}) == "MyPolicy(x)"
    assert view.early_stopping_text(None) is None and view.early_stopping_text({}) is None
    # an older or hand-written dict: wrong types are left out, never raised on
    odd = {"kind": "search", "name": "Optuna", "trials": 3, "budget": "many", "pruned": None, "running": -1}
    assert view.early_stopping_text(odd, pruned) == "Optuna: 3 trials asked · 2 pruned"
    assert (
        view.early_stopping_text({"kind": "rungs", "next_rung": True})
        == "early stopping: 0 pruned, no rung left"
    )


def test_the_snapshots_carry_the_early_stopping_line() -> None:
    rows = _rows(
        _row(1, "ONGOING"), _row(2, "COMPLETED"), meta={**META, view.EARLY_STOPPING_META_KEY: OPTUNA}
    )
    line = "Optuna: 11 of 24 trials asked · 5 pruned · 3 running"
    assert view.store_snapshot("exp", rows, writer_alive=True, now=3.0)["early_stopping"] == line
    kernel = KernelState(started_at=None, num_chunks=0, hparam_columns=[])  # no scheduler here: the store's
    assert view.kernel_snapshot("exp", rows, kernel)["early_stopping"] == line
    live = {**OPTUNA, "trials": 12, "running": 4}  # the scheduler's is newer than the store's
    kernel = KernelState(
        started_at=1.0,
        num_chunks=4,
        hparam_columns=[],
        runs=[_snap(1, RunStatus.ONGOING)],
        early_stopping=live,
    )
    assert view.kernel_snapshot("exp", rows, kernel)["early_stopping"].startswith("Optuna: 12 of 24")
    kernel = KernelState(started_at=1.0, num_chunks=4, hparam_columns=[], runs=[_snap(1, RunStatus.ONGOING)])
    assert view.kernel_snapshot("exp", rows, kernel)["early_stopping"] is None  # this run_fit has no policy
    assert view.store_snapshot("exp", _rows(_row(1, "NEW")), writer_alive=False)["early_stopping"] is None


# ------------------------------------------------------------------------------------------------ devices


def test_one_device_shows_no_device_and_no_device_list() -> None:
    rows = _rows(_row(1, "ONGOING"), _row(2, "NEW"))
    kernel = KernelState(
        started_at=1.0,
        num_chunks=4,
        hparam_columns=[],
        runs=[_snap(1, RunStatus.ONGOING, on_device=True, device="device"), _snap(2, RunStatus.NEW)],
        on_device=1,
    )
    snap = view.kernel_snapshot("exp", rows, kernel, now=2.0)
    assert [r["device"] for r in snap["runs"]] == [None, None]  # the in-kernel device is never shown
    assert (snap["devices"], snap["device_runs"], snap["on_device"]) == ([], {}, 1)
    page = view.store_snapshot("exp", rows, writer_alive=True, now=2.0)
    assert [r["device"] for r in page["runs"]] == [None, None] and page["devices"] == []


def test_kernel_snapshot_with_two_devices_two_runs_training() -> None:
    meta = {**META, "devices": {"1": "cpu:0", "2": "cpu:1", "3": "cpu:1"}}
    rows = _rows(_row(1, "ONGOING"), _row(2, "ONGOING"), _row(3, "COMPLETED"), meta=meta)
    kernel = KernelState(
        started_at=1.0,
        num_chunks=4,
        hparam_columns=[],
        runs=[
            _snap(1, RunStatus.ONGOING, on_device=True, device="cpu:1"),  # moved: the scheduler's device wins
            _snap(2, RunStatus.ONGOING, on_device=True, device="cpu:0"),
            _snap(3, RunStatus.COMPLETED, step=12, device=""),  # finished earlier: the stored device
        ],
        on_device=2,
        devices={"cpu:0": "training", "cpu:1": "training", "cpu:2": "lost"},
        device_runs={"cpu:0": 2, "cpu:1": 1},
    )
    snap = view.kernel_snapshot("exp", rows, kernel, now=2.0)
    assert [(r["run_id"], r["device"], r["on_device"]) for r in snap["runs"]] == [
        (1, "cpu:1", True),
        (2, "cpu:0", True),
        (3, "cpu:1", False),
    ]
    assert snap["devices"] == [
        {"name": "cpu:0", "state": "training", "run_id": 2},
        {"name": "cpu:1", "state": "training", "run_id": 1},
        {"name": "cpu:2", "state": "lost", "run_id": None},
    ]
    assert snap["device_runs"] == {"cpu:0": 2, "cpu:1": 1} and snap["on_device"] == 2
    assert snap["training"] is False  # (the clock's flag; the meta here has no clock)


def test_store_snapshot_names_the_stored_devices_state_unknown() -> None:
    meta = {**META, "devices": {"1": "cpu:10", "2": "cpu:2", "4": "device", "x": "cpu:9"}}
    rows = _rows(_row(1, "ONGOING"), _row(2, "COMPLETED"), _row(3, "NEW", chunks_done=0), meta=meta)
    snap = view.store_snapshot("exp", rows, writer_alive=True, now=2.0)
    assert [r["device"] for r in snap["runs"]] == ["cpu:10", "cpu:2", None]
    assert snap["devices"] == [
        {"name": "cpu:2", "state": "—", "run_id": None},
        {"name": "cpu:10", "state": "—", "run_id": None},
    ]
    assert snap["device_runs"] == {} and snap["on_device"] is None
    assert view.device_list({"cuda:0": "idle"}, {}, ["cuda:0", "cuda:1"]) == [
        {"name": "cuda:0", "state": "idle", "run_id": None},
        {"name": "cuda:1", "state": "—", "run_id": None},
    ]


def test_a_pruned_run_shows_stopped_once_the_store_has_the_value_it_was_pruned_on() -> None:
    """The scheduler prunes a run right after its chunk-end eval; the recorder writes that eval point and then the
    STOPPED status, ~0.3 s later: the panel shows the prune when the store has both, never the badge first."""
    snap = _snap(
        2, RunStatus.STOPPED, stop_reason="pruned at chunk 2/4: eval_loss 2.1 not in the best 1", pruned=True
    )
    kernel = KernelState(
        started_at=1.0, num_chunks=4, hparam_columns=[], runs=[_snap(1, RunStatus.ONGOING), snap]
    )
    before = view.kernel_snapshot("exp", _rows(_row(1, "ONGOING"), _row(2, "ONGOING")), kernel)["runs"][1]
    assert (before["status"], before["pruned"], before["stop_reason"]) == ("ONGOING", False, None)
    after = view.kernel_snapshot("exp", _rows(_row(1, "ONGOING"), _row(2, "STOPPED")), kernel)["runs"][1]
    assert (after["status"], after["pruned"]) == ("STOPPED", True)
    assert after["stop_reason"].startswith("pruned at chunk 2/4")
    user = _snap(2, RunStatus.STOPPED, stop_reason="stopped by the user (panel)")  # a user's stop: at once
    kernel = KernelState(
        started_at=1.0, num_chunks=4, hparam_columns=[], runs=[_snap(1, RunStatus.ONGOING), user]
    )
    assert (
        view.kernel_snapshot("exp", _rows(_row(1, "ONGOING"), _row(2, "ONGOING")), kernel)["runs"][1][
            "status"
        ]
        == "STOPPED"
    )
