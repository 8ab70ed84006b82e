"""Early stopping inside the scheduler loop, on the fake executor: the policy's decisions become stop ops from
source "early_stopping" with the reason, a user's resume wins, clones enter the rungs by their chunk count, a
broken policy is switched off with a note."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from kernel_scheduler import (
    EARLY_STOPPING,
    ChunkResult,
    Decisions,
    EarlyStop,
    EarlyStoppingPolicy,
    NewRun,
    Op,
    OpKind,
    RunState,
    RunStatus,
    SuccessiveHalving,
)
from rapidfire_nb.testing.fakes import TIMEOUT, FakeSpec, Harness

S = RunStatus


def spec(*curve: float) -> FakeSpec:
    """16 rows, 2 rows/step: 8 steps, one per chunk with num_chunks=8; ``curve`` padded to 8 chunks."""
    values = tuple(curve) + (curve[-1],) * (8 - len(curve))
    return FakeSpec(rows=16, batch=2, curve=values)


@pytest.fixture
def harnesses() -> Iterator[list[Harness]]:
    made: list[Harness] = []
    yield made
    for h in made:
        h.close()
        assert not h.fake.violations, h.fake.violations
        assert h.sched.loop_error is None, h.sched.loop_error


def make(
    made: list[Harness], specs: Sequence[FakeSpec], policy: EarlyStoppingPolicy | None = None
) -> Harness:
    h = Harness(specs, num_chunks=8, early_stopping=policy or SuccessiveHalving(), idle_poll_s=0.002)
    made.append(h)
    return h


def policy_stops(h: Harness) -> dict[int, str]:
    """Run id -> the message of its applied stop op from the policy."""
    out = {}
    for op_id, state, message in h.rec.op_events:
        op = h.rec.ops_seen[op_id]
        if op.source == EARLY_STOPPING and op.kind is OpKind.STOP and state == "applied":
            out[op.run_id] = message
    return out


def steps_trained(h: Harness, run_id: int) -> int:
    snap = h.sched.run_snapshot(run_id)
    assert snap is not None
    return snap.step


def test_eight_runs_halve_and_the_best_trains_to_the_end(harnesses: list[Harness]) -> None:
    h = make(harnesses, [spec(float(r)) for r in range(1, 9)])  # run r's eval_loss is r throughout
    assert h.sched.wait(timeout=TIMEOUT)
    assert [h.status(r) for r in range(1, 9)] == [S.COMPLETED] + [S.STOPPED] * 7
    assert [steps_trained(h, r) for r in range(1, 9)] == [8, 4, 2, 2, 1, 1, 1, 1]
    stops = policy_stops(h)
    assert sorted(stops) == [2, 3, 4, 5, 6, 7, 8]
    assert stops[8] == (
        "run 8 stopped at step 1: pruned at chunk 1/8: eval_loss 8 not in the best 4 of 8 at this rung (cutoff 4)"
    )
    snap = h.sched.run_snapshot(3)
    assert snap is not None and snap.pruned
    assert (
        snap.stop_reason == "pruned at chunk 2/8: eval_loss 3 not in the best 2 of 4 at this rung (cutoff 2)"
    )
    assert sum(steps_trained(h, r) for r in range(1, 9)) == 20  # of 64 without early stopping


def test_a_user_resume_wins_and_the_run_is_judged_again_at_later_rungs(harnesses: list[Harness]) -> None:
    # run 4 is poor at chunk 1 (pruned there) but the best afterwards; run 3 is poor throughout
    h = make(harnesses, [spec(1.0), spec(2.0), spec(9.0), spec(8.0, 0.1)])
    assert h.sched.wait(timeout=TIMEOUT)
    assert [h.status(r) for r in (1, 2, 3, 4)] == [S.COMPLETED, S.STOPPED, S.STOPPED, S.STOPPED]
    for run_id in (3, 4):
        ack = h.sched.submit(Op(OpKind.RESUME, run_id, source="panel"))
        assert ack.state in ("queued", "applied"), ack
    assert h.sched.wait(timeout=TIMEOUT)
    snap = h.sched.run_snapshot(4)
    assert snap is not None and snap.status is S.COMPLETED and snap.stop_reason is None
    # run 3 was not pruned again at chunk 1, but at rung 2, on arrival (values 1 and 2 recorded there by runs 1, 2)
    snap = h.sched.run_snapshot(3)
    assert snap is not None and snap.status is S.STOPPED and snap.step == 2
    assert (
        snap.stop_reason == "pruned at chunk 2/8: eval_loss 9 not in the best 1 of 3 at this rung (cutoff 1)"
    )


def test_a_user_stop_says_who_stopped_it(harnesses: list[Harness]) -> None:
    h = Harness([spec(1.0), spec(2.0)], num_chunks=8, mode="manual", early_stopping=SuccessiveHalving())
    harnesses.append(h)
    h.sched.submit(Op(OpKind.STOP, 2, source="magic"))
    h.settle()
    snap = h.sched.run_snapshot(2)
    assert snap is not None and snap.status is S.STOPPED
    assert snap.stop_reason == "stopped by the user (magic)" and not snap.pruned


def test_a_cold_clone_is_judged_on_arrival_at_the_rungs_already_decided(harnesses: list[Harness]) -> None:
    h = Harness(
        [spec(1.0), spec(2.0), spec(3.0), spec(4.0)],
        num_chunks=8,
        mode="manual",
        early_stopping=SuccessiveHalving(),
    )
    harnesses.append(h)
    for _ in range(4):
        h.step()  # chunk 1 of every run: rung 1 decided, 3 and 4 stopped
    assert [h.status(r) for r in (3, 4)] == [S.STOPPED, S.STOPPED]
    ack = h.sched.submit(Op(OpKind.CLONE, 1, payload={"spec": spec(3.5), "warm_start": False, "changes": {}}))
    assert ack.new_run_id == 5
    h.run_to_idle()
    snap = h.sched.run_snapshot(5)
    assert snap is not None and snap.status is S.STOPPED and snap.step == 1
    assert (
        snap.stop_reason
        == "pruned at chunk 1/8: eval_loss 3.5 not in the best 2 of 5 at this rung (cutoff 2)"
    )
    assert h.status(1) is S.COMPLETED


def test_a_warm_clone_enters_at_its_parents_chunk(harnesses: list[Harness]) -> None:
    h = Harness([spec(1.0), spec(2.0)], num_chunks=8, mode="manual", early_stopping=SuccessiveHalving())
    harnesses.append(h)
    h.step()
    h.step()  # rung 1: run 2 stopped; run 1 trains its chunk 2
    assert h.status(2) is S.STOPPED
    ack = h.sched.submit(Op(OpKind.CLONE, 1, payload={"spec": spec(0.5), "warm_start": True, "changes": {}}))
    h.run_to_idle()
    child = h.sched.run_snapshot(ack.new_run_id or 0)
    assert child is not None
    # it starts at its parent's chunk 2 (not judged at rung 2, decided with run 1 alone) and is better than its
    # parent at rung 4: the parent stops there
    assert child.status is S.COMPLETED
    assert child.step == 8 and h.fake.calls.count((child.run_id, 2)) == 0
    parent = h.sched.run_snapshot(1)
    assert parent is not None and parent.status is S.STOPPED
    assert (
        parent.stop_reason
        == "pruned at chunk 4/8: eval_loss 1 not in the best 1 of 2 at this rung (cutoff 0.5)"
    )


class Broken(EarlyStoppingPolicy):
    def on_chunk(self, result: ChunkResult, runs: Sequence[RunState]) -> Decisions:
        raise RuntimeError("boom")

    def describe(self) -> str:
        return "Broken"


def test_a_broken_policy_is_switched_off_with_a_note(harnesses: list[Harness]) -> None:
    h = make(harnesses, [spec(1.0), spec(2.0)], Broken())
    assert h.sched.wait(timeout=TIMEOUT)
    assert [h.status(r) for r in (1, 2)] == [S.COMPLETED, S.COMPLETED]
    assert h.rec.notes == [
        "early stopping stopped working (RuntimeError: boom); the runs train on without it"
    ]
    assert h.sched.early_stopping_progress() == {}
    assert h.rec.progress[-1] == {}  # the store's copy says so too


def test_the_progress_is_told_at_start_and_whenever_it_changes(harnesses: list[Harness]) -> None:
    h = make(harnesses, [spec(float(r)) for r in range(1, 5)])  # rungs 1, 2, 4, 8 of 8 chunks
    assert h.sched.wait(timeout=TIMEOUT)
    told = [p["next_rung"] for p in h.rec.progress]
    assert told[0] is None  # at start, before any run was seen
    assert [r for i, r in enumerate(told) if i == 0 or r != told[i - 1]] == told  # only changes are told
    assert [r for r in told if r is not None] == [1, 2, 4, 8]
    assert told[-1] is None and h.sched.early_stopping_progress() == h.rec.progress[-1]
    assert h.rec.progress[-1]["name"] == "successive halving (η=2)"


def test_a_metric_nobody_logs_prunes_nothing_and_says_so(harnesses: list[Harness]) -> None:
    h = make(harnesses, [spec(1.0), spec(2.0)], SuccessiveHalving(metric="eval_accuracy"))
    assert h.sched.wait(timeout=TIMEOUT)
    assert [h.status(r) for r in (1, 2)] == [S.COMPLETED, S.COMPLETED]
    assert len(h.rec.notes) == 1 and "logged no 'eval_accuracy'" in h.rec.notes[0]
    assert "it logged eval_loss" in h.rec.notes[0]


class AddsOne(EarlyStoppingPolicy):
    """Stops run 2 after its first chunk and adds a run in its place (what a search asking a new trial does)."""

    def __init__(self, new: FakeSpec) -> None:
        self.new = new
        self.added: list[int] = []

    def on_chunk(self, result: ChunkResult, runs: Sequence[RunState]) -> Decisions:
        if result.run_id == 2 and result.chunk == 1:
            return Decisions(
                stops=(EarlyStop(2, 1, "replaced by a new trial"),),
                new_runs=(NewRun(self.new, {"trial": 3}),),
            )
        return Decisions()

    def on_added(self, run_id: int, new_run: NewRun) -> None:
        self.added.append(run_id)

    def describe(self) -> str:
        return "AddsOne"


def test_a_policy_may_add_a_run_that_joins_the_rotation(harnesses: list[Harness]) -> None:
    policy = AddsOne(spec(0.5))
    h = make(harnesses, [spec(1.0), spec(2.0)], policy)
    assert h.sched.wait(timeout=TIMEOUT)
    assert policy.added == [3] and h.rec.added == [(3, {"trial": 3})]
    assert [h.status(r) for r in (1, 2, 3)] == [S.COMPLETED, S.STOPPED, S.COMPLETED]
    assert steps_trained(h, 3) == 8 and h.fake.calls.count((3, 1)) == 1
    snap = h.sched.run_snapshot(2)
    assert snap is not None and snap.stop_reason == "replaced by a new trial"


def test_a_new_run_that_cannot_be_built_fails_with_the_reason(harnesses: list[Harness]) -> None:
    bad = FakeSpec(rows=16, batch=2, add_error="no such model")
    h = make(harnesses, [spec(1.0), spec(2.0)], AddsOne(bad))
    assert h.sched.wait(timeout=TIMEOUT)
    snap = h.sched.run_snapshot(3)
    assert snap is not None and snap.status is S.FAILED and "no such model" in (snap.error or "")
    assert h.status(1) is S.COMPLETED


def test_a_run_that_ends_before_a_rung_is_no_candidate_there(harnesses: list[Harness]) -> None:
    """Issue 34 item 1: a 2-step run (chunk 1 ends at step 4) with the best value took the only place at rung 1
    and both full runs were pruned against it. It never trained on chunk 1's rows: the full runs compete alone."""
    full = [
        FakeSpec(rows=32, batch=2, curve=(7.0, 6.0, 5.0, 4.0)),
        FakeSpec(rows=32, batch=2, curve=(8.0,) * 4),
    ]
    short = FakeSpec(rows=32, batch=2, max_steps=2, curve=(6.1,))
    h = Harness([*full, short], num_chunks=4, early_stopping=SuccessiveHalving(), idle_poll_s=0.002)
    harnesses.append(h)
    assert h.sched.wait(timeout=TIMEOUT)
    assert [h.status(r) for r in (1, 2, 3)] == [S.COMPLETED, S.STOPPED, S.COMPLETED]
    assert [steps_trained(h, r) for r in (1, 2, 3)] == [16, 4, 2]
    assert policy_stops(h) == {
        2: "run 2 stopped at step 4: pruned at chunk 1/4: eval_loss 8 not in the best 1 of 2 at this rung (cutoff 7)"
    }
    assert (
        "early stopping: run 3 ended at step 2, inside chunk 1 (its max_steps): it is not compared at the rung after "
        "chunk 1, whose rows it did not all train on"
    ) in h.rec.notes


def test_a_run_cut_inside_a_later_chunk_counts_all_its_chunks_in_the_reason(harnesses: list[Harness]) -> None:
    """A fresh-user pass found "pruned at chunk 1/1" for a run planned for 2 chunks whose max_steps ends inside
    chunk 2 (its whole chunks had been shown as its total): the reason counts its chunks as the panel does."""
    specs = [
        FakeSpec(rows=32, batch=2, curve=(7.0, 6.0, 5.0, 4.0)),
        FakeSpec(rows=32, batch=2, curve=(8.0,) * 4),
        FakeSpec(rows=32, batch=2, max_steps=6, curve=(9.0, 9.0)),  # chunk ends at 4, 8: 2 chunks, 1 whole
    ]
    h = Harness(specs, num_chunks=4, early_stopping=SuccessiveHalving(), idle_poll_s=0.002)
    harnesses.append(h)
    assert h.sched.wait(timeout=TIMEOUT)
    assert [h.status(r) for r in (1, 2, 3)] == [S.COMPLETED, S.STOPPED, S.STOPPED]
    assert policy_stops(h) == {
        2: "run 2 stopped at step 4: pruned at chunk 1/4: eval_loss 8 not in the best 1 of 3 at this rung (cutoff 7)",
        3: "run 3 stopped at step 4: pruned at chunk 1/2: eval_loss 9 not in the best 1 of 3 at this rung (cutoff 7)",
    }
