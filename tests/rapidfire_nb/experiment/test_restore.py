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


# ------------------------------------------------------------------------------------------ the rung book (item 2)
def _halving() -> object:
    from kernel_scheduler import SuccessiveHalving

    return SuccessiveHalving("eval_loss", "min", 2, 1)


def _kernel(store: Store, policy: object) -> list[object]:
    """One kernel's open: the policy gets the stored book; its journal writes at once (the recorder's in_order,
    run in place). Returns the functions handed to in_order."""
    from rapidfire_nb.experiment.restore import keep_rung_book

    handed: list[object] = []

    def in_order(fn: object) -> None:
        handed.append(fn)
        fn()  # type: ignore[operator]

    keep_rung_book(policy, store, in_order)  # type: ignore[arg-type]
    return handed


def test_the_rung_book_is_stored_in_order_and_rebuilt_by_the_next_kernel(tmp_path: Path) -> None:
    import math

    from kernel_scheduler import ChunkResult, RunState

    ON = RunStatus.ONGOING
    with Store(tmp_path) as store:
        first = _halving()
        _kernel(store, first)
        for run_id, value in ((1, 1.0), (2, math.nan), (3, 3.0)):
            states = [RunState(r, ON, 1 if r <= run_id else 0, 4) for r in (1, 2, 3)]
            first.on_chunk(ChunkResult(run_id, 1, {"eval_loss": value}), states)  # type: ignore[attr-defined]
        events = store.get_meta("early_stopping_book")
        assert events["policy"] == "SuccessiveHalving(eval_loss, min, η=2, grace 1 chunk)"
        kinds = [(e["event"], e.get("run")) for e in events["events"]]
        assert kinds == [("value", 1), ("value", 2), ("value", 3), ("closed", None)] + [
            ("judged", r) for r in (1, 2, 3)
        ]
        assert math.isnan(events["events"][1]["value"])  # NaN kept through JSON
        again = _halving()
        _kernel(store, again)
        # the kernel died before its stops applied (runs 2 and 3 still train): the next one gives them again
        states = [RunState(r, ON, 1, 4) for r in (1, 2, 3)]
        owed = again.on_change(states, states)  # type: ignore[attr-defined]
        assert [(s.run_id, s.chunk) for s in owed.stops] == [(2, 1), (3, 1)]
        assert not again.on_change(states, states).stops  # type: ignore[attr-defined]
        # a cold clone (run 4) reaches rung 1 after the restart: judged against the 3 values recorded before
        states = [RunState(r, ON if r in (1, 4) else RunStatus.STOPPED, 1, 4) for r in (1, 2, 3, 4)]
        decided = again.on_chunk(ChunkResult(4, 1, {"eval_loss": 5.0}), states)  # type: ignore[attr-defined]
        assert [(s.run_id, s.reason) for s in decided.stops] == [
            (4, "pruned at chunk 1/4: eval_loss 5 not in the best 2 of 4 at this rung (cutoff 3)")
        ]


def test_a_book_kept_by_another_policy_is_not_handed_on(tmp_path: Path) -> None:
    from kernel_scheduler import MedianStopping
    from rapidfire_nb.experiment.restore import other_policy_note
    from rapidfire_nb.store.rung_book import rung_events

    with Store(tmp_path) as store:
        store.set_meta(
            "early_stopping_book",
            {"policy": "MedianStopping(eval_loss, min, grace 1, min 3 runs)", "events": [{"event": "x"}]},
        )
        assert rung_events(store, _halving().describe()) is None  # type: ignore[attr-defined]
        assert rung_events(store, MedianStopping().describe()) == [{"event": "x"}]
        assert other_policy_note(MedianStopping(), store) is None
        assert other_policy_note(_halving(), store) == (  # type: ignore[arg-type]
            "early stopping: the rungs decided before this restart were MedianStopping(eval_loss, min, grace 1, "
            "min 3 runs)'s; SuccessiveHalving(eval_loss, min, η=2, grace 1 chunk) starts its own (a run already "
            "past one of its rungs is not compared there). Pass the earlier policy to keep them"
        )
        _kernel(store, _halving())  # this policy's book replaces it
        assert store.get_meta("early_stopping_book") == {
            "policy": "SuccessiveHalving(eval_loss, min, η=2, grace 1 chunk)",
            "events": [],
        }


def test_a_value_whose_event_a_kill_lost_is_read_back_from_the_metric_rows(tmp_path: Path) -> None:
    """Run 2's chunk-1 checkpoint was written but its value's event was not: its metric rows give it back."""
    from kernel_scheduler import RunStart
    from rapidfire_nb.experiment.restore import recover_rung_values
    from rapidfire_nb.testing.fakes import FakeSpec

    plan = FakeSpec(rows=16, batch=4).plan(4)  # 4 steps, one per chunk
    with Store(tmp_path) as store:
        first = _halving()
        _kernel(store, first)
        store.add_metrics(
            [
                {"run_id": 2, "step": 1, "name": "loss", "value": 9.0},
                {"run_id": 2, "step": 1, "name": "eval_loss", "value": 2.5},
                {"run_id": 2, "step": 2, "name": "eval_loss", "value": 2.0},
            ]
        )
        again = _halving()
        _kernel(store, again)
        start = RunStart(plan=plan, step=1, segments_done=1, samples_seen=4)
        assert recover_rung_values(again, store, 2, start) == 1  # chunk 1 only: its checkpoint is at step 1
        assert recover_rung_values(again, store, 2, start) == 0  # a value the book has stays
        assert again._book.values(1) == {2: 2.5}  # type: ignore[attr-defined]
        assert recover_rung_values(_halving(), Store(tmp_path / "other"), 2, start) == 0  # no book kept: none


def test_the_events_of_one_decision_are_written_together_in_order(tmp_path: Path) -> None:
    from kernel_scheduler import ChunkResult, RunState
    from rapidfire_nb.experiment.restore import keep_rung_book

    queued: list[object] = []  # the recorder's in_order items, run later in their order
    with Store(tmp_path) as store:
        policy = _halving()
        keep_rung_book(policy, store, queued.append)  # type: ignore[arg-type]
        states = [RunState(r, RunStatus.ONGOING, 1, 4) for r in (1, 2)]
        waiting = [states[0], RunState(2, RunStatus.ONGOING, 0, 4)]  # run 2 holds rung 1 open
        policy.on_chunk(ChunkResult(1, 1, {"eval_loss": 1.0}), waiting)  # type: ignore[attr-defined]
        policy.on_chunk(ChunkResult(2, 1, {"eval_loss": 2.0}), states)  # type: ignore[attr-defined]
        assert len(queued) == 2  # the book's start, then one write for every event told since
        for fn in queued:
            fn()  # type: ignore[operator]
        events = store.get_meta("early_stopping_book")["events"]
        assert [(e["event"], e.get("run")) for e in events] == [
            ("value", 1),
            ("value", 2),
            ("closed", None),
            ("judged", 1),
            ("judged", 2),
        ]
        policy.on_chunk(ChunkResult(1, 2, {"eval_loss": 1.0}), states)  # type: ignore[attr-defined]
        assert len(queued) == 3  # told after the write ran: a new write is queued
