"""The restore planner on temporary run folders: what each stored run becomes, and crash reconciliation."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kernel_scheduler import RunStatus
from rapidfire_nb.experiment.restore import (
    NO_WARM_START,
    RestoreAction,
    apply_restore,
    plan_reconcile,
    plan_restore,
    reconcile,
)
from rapidfire_nb.store import Store


def _checkpoint(folder: Path, name: str, step: int, *, complete: bool = True, readable: bool = True) -> Path:
    ck = folder / name
    ck.mkdir(parents=True)
    (ck / "trainer_state.json").write_text(json.dumps({"global_step": step}) if readable else "{not json")
    for f in ("adapter_model.safetensors", "optimizer.pt", "scheduler.pt"):
        (ck / f).write_bytes(b"x")
    if complete:
        (ck / "COMPLETE").write_text("{}")
    return ck


def _row(status: str, **kw: object) -> dict:
    return {"run_id": 1, "status": status, "completed_steps": 8, **kw}


def test_a_run_the_store_does_not_know_is_new(tmp_path: Path) -> None:
    plan = plan_restore(1, None, tmp_path / "runs" / "1")
    assert (plan.action, plan.status, plan.checkpoint) == (RestoreAction.NEW, RunStatus.NEW, None)


def test_finished_runs_are_shown_not_trained(tmp_path: Path) -> None:
    for status in ("COMPLETED", "FAILED", "DELETED"):
        plan = plan_restore(1, _row(status), tmp_path)
        assert (plan.action, plan.status) == (RestoreAction.FINISHED, RunStatus(status))


def test_an_interrupted_run_continues_from_its_latest_complete_checkpoint(tmp_path: Path) -> None:
    _checkpoint(tmp_path, "checkpoint-4", 4)
    latest = _checkpoint(tmp_path, "checkpoint-8", 8)
    _checkpoint(tmp_path, "checkpoint-12", 12, complete=False)  # half written: skipped
    plan = plan_restore(1, _row("INTERRUPTED"), tmp_path)
    assert (plan.action, plan.status, plan.checkpoint) == (RestoreAction.CONTINUE, RunStatus.ONGOING, latest)
    assert not plan.from_warm_start


def test_a_stopped_run_stays_stopped_with_its_checkpoint(tmp_path: Path) -> None:
    ck = _checkpoint(tmp_path, "checkpoint-8", 8)
    plan = plan_restore(1, _row("STOPPED"), tmp_path)
    assert (plan.action, plan.status, plan.checkpoint) == (RestoreAction.CONTINUE, RunStatus.STOPPED, ck)


def test_no_checkpoint_means_a_restart_from_step_0(tmp_path: Path) -> None:
    plan = plan_restore(1, _row("ONGOING"), tmp_path)
    assert (plan.action, plan.status, plan.checkpoint) == (RestoreAction.RESTART, RunStatus.NEW, None)
    assert plan.restart_reason == "it had no complete chunk checkpoint"


def test_a_damaged_checkpoint_is_set_aside_and_the_run_restarts(tmp_path: Path) -> None:
    bad = _checkpoint(tmp_path, "checkpoint-8", 8, readable=False)
    plan = plan_restore(1, _row("INTERRUPTED"), tmp_path)
    assert (plan.action, plan.damaged, plan.checkpoint) == (RestoreAction.RESTART, bad, None)
    assert plan.restart_reason == "its checkpoint was damaged"
    assert bad.is_dir(), "planning writes nothing"
    message = apply_restore(plan)
    assert not bad.exists() and (tmp_path / "damaged-checkpoint-8").is_dir()
    assert message == (
        "run 1: checkpoint checkpoint-8 is damaged (a missing, empty or unreadable file; moved to "
        "damaged-checkpoint-8); the run starts again from step 0"
    )


def test_an_empty_weights_file_counts_as_damaged(tmp_path: Path) -> None:
    ck = _checkpoint(tmp_path, "checkpoint-8", 8)
    (ck / "optimizer.pt").write_bytes(b"")
    assert plan_restore(1, _row("INTERRUPTED"), tmp_path).damaged == ck


def test_half_written_leftovers_are_listed_and_removed(tmp_path: Path) -> None:
    tmp = tmp_path / ".checkpoint-8.tmp-abc"
    old = tmp_path / ".checkpoint-4.old-def"
    tmp.mkdir()
    old.mkdir()
    plan = plan_restore(1, _row("INTERRUPTED"), tmp_path)
    assert sorted(plan.leftovers) == sorted([tmp, old])
    assert apply_restore(plan) is None
    assert not tmp.exists() and not old.exists()


def test_a_finished_runs_half_written_checkpoint_is_removed_too(tmp_path: Path) -> None:
    """The writer lags training: a kernel can die in a checkpoint write of a run the store has as COMPLETED."""
    final = _checkpoint(tmp_path, "final", 16)  # complete: the final weights were saved
    tmp = tmp_path / ".checkpoint-14.tmp-abc"
    tmp.mkdir()
    plan = plan_restore(1, _row("COMPLETED"), tmp_path)
    assert plan.action is RestoreAction.FINISHED and plan.leftovers == (tmp,)
    assert apply_restore(plan) is None
    assert not tmp.exists() and final.exists()


def test_a_warm_clone_before_its_first_chunk_continues_from_its_warm_start(tmp_path: Path) -> None:
    warm = _checkpoint(tmp_path, "warm-start-from-run-1-step-4", 4)
    plan = plan_restore(5, _row("INTERRUPTED", warm_start=1), tmp_path)
    assert (plan.action, plan.status, plan.checkpoint) == (RestoreAction.CONTINUE, RunStatus.ONGOING, warm)
    assert plan.from_warm_start
    own = _checkpoint(tmp_path, "checkpoint-8", 8)  # once it has its own chunk, that wins
    assert plan_restore(5, _row("INTERRUPTED", warm_start=1), tmp_path).checkpoint == own


def test_a_warm_clone_without_its_warm_start_fails(tmp_path: Path) -> None:
    plan = plan_restore(5, _row("INTERRUPTED", warm_start=1), tmp_path)
    assert (plan.action, plan.status, plan.error) == (RestoreAction.FAILED, RunStatus.FAILED, NO_WARM_START)


def test_a_damaged_warm_clone_checkpoint_falls_back_to_its_warm_start(tmp_path: Path) -> None:
    warm = _checkpoint(tmp_path, "warm-start-from-run-1-step-4", 4)
    _checkpoint(tmp_path, "checkpoint-8", 8, readable=False)
    plan = plan_restore(5, _row("INTERRUPTED", warm_start=1), tmp_path)
    assert (plan.checkpoint, plan.damaged.name) == (warm, "checkpoint-8")
    assert apply_restore(plan).endswith("the run starts again from its warm start")


def test_the_planner_imports_no_torch() -> None:
    assert "torch" not in sys.modules or "rapidfire_nb.experiment.restore" in sys.modules
    import ast

    import rapidfire_nb.experiment.restore as restore

    tree = ast.parse(Path(restore.__file__).read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not names & {"torch", "transformers", "trl", "peft"}


# ---------------------------------------------------------------------------------------------- reconciliation
def test_plan_reconcile_settles_a_dead_writers_state() -> None:
    runs = [
        {"run_id": 1, "status": "ONGOING"},
        {"run_id": 2, "status": "STOPPED"},
        {"run_id": 3, "status": "NEW"},
        {"run_id": 4, "status": "FAILED"},
    ]
    ops = [
        {"op_id": "a", "kind": "stop", "state": "queued"},
        {"op_id": "b", "kind": "clone", "state": "queued", "payload": {"child_id": 3}},
        {"op_id": "c", "kind": "clone", "state": "queued", "payload": {"child_id": 4}},
        {"op_id": "d", "kind": "stop", "state": "applied"},
    ]
    inbox = [{"op_id": "e", "kind": "resume", "run_id": 2}]
    plan = plan_reconcile(runs, ops, inbox)
    assert plan.interrupted == (1,)
    assert [o["op_id"] for o in plan.rejected_inbox] == ["e"]
    assert plan.op_updates == (
        ("a", "rejected", "the kernel stopped before applying it; send it again"),
        ("b", "applied", "run 3 created; it continues after the restart"),
        ("c", "rejected", "the kernel stopped before applying it; send it again"),
    )


def test_reconcile_writes_the_plan_into_the_store(tmp_path: Path) -> None:
    with Store(tmp_path / "exp") as store:
        store.upsert_run(1, status="ONGOING")
        store.add_op("a", "stop", 1, {}, source="panel", state="queued", message="")
        store.post_inbox_op("e", "resume", 1)
        reconcile(store)
        assert store.get_run(1)["status"] == "INTERRUPTED"
        states = {o["op_id"]: o["state"] for o in store.ops()}
        assert states == {"a": "rejected", "e": "rejected"}
        assert store.take_inbox_ops() == []


def test_a_completed_run_whose_final_weights_were_never_saved_continues_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    """The scheduler records COMPLETED before the final save; a kernel killed in between left no ``final``."""
    folder = tmp_path / "runs" / "1"
    ck = _checkpoint(folder, "checkpoint-6", 6)
    (folder / "final").mkdir()  # half written: no COMPLETE marker
    plan = plan_restore(1, _row("COMPLETED"), folder)
    assert (plan.action, plan.status, plan.checkpoint) == (RestoreAction.CONTINUE, RunStatus.ONGOING, ck)
    (folder / "final" / "COMPLETE").write_text("{}")  # saved: finished, as any completed run
    plan = plan_restore(1, _row("COMPLETED"), folder)
    assert (plan.action, plan.status) == (RestoreAction.FINISHED, RunStatus.COMPLETED)
    # no final and no checkpoint either (the run folder was removed): shown as it was, not trained again
    assert plan_restore(2, _row("COMPLETED"), tmp_path / "runs" / "2").action is RestoreAction.FINISHED
