"""The scheduler thread (kernel_scheduler.loop.Scheduler) driven by a fake executor: order, epochs,
completion, failures, IC Ops (stop / resume / delete / clone cold and warm), idempotency, wait()."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence

import pytest

from kernel_scheduler import Op, OpKind, RunStatus, Scheduler
from rapidfire_nb.testing.fakes import TIMEOUT, FakeExecutor, FakeSpec, Harness, Recorder

S = RunStatus
TERMINAL = {"applied", "rejected"}

# 16 rows, 2 rows/step -> 8 steps per epoch; with 4 chunks the boundaries are 2, 4, 6, 8
FOUR = FakeSpec(rows=16, batch=2)
# 16 rows, 4 rows/step -> 4 steps; with 2 chunks the boundaries are 2, 4
TWO = FakeSpec(rows=16, batch=4)


@pytest.fixture
def harnesses() -> Iterator[list[Harness]]:
    made: list[Harness] = []
    yield made
    for h in made:
        h.close()
        assert not h.fake.violations, h.fake.violations
        assert h.sched.loop_error is None, h.sched.loop_error


Make = Callable[..., Harness]


@pytest.fixture
def make(harnesses: list[Harness]) -> Make:
    """``make(specs, num_chunks=2, mode="auto", start=True)``: a Harness closed (and checked) after the test."""

    def _make(
        specs: Sequence[FakeSpec] | dict[int, FakeSpec],
        num_chunks: int = 2,
        mode: str = "auto",
        start: bool = True,
    ) -> Harness:
        h = Harness(specs, num_chunks=num_chunks, mode=mode, start=start)
        harnesses.append(h)
        return h

    return _make


def clone(run_id: int, spec: FakeSpec, warm: bool = False, op_id: str | None = None) -> Op:
    op = Op(OpKind.CLONE, run_id, payload={"spec": spec, "warm_start": warm, "changes": {}})
    if op_id is not None:
        op.op_id = op_id
    return op


def assert_ops_terminal(h: Harness) -> None:
    """Every op the listener heard of was queued (or rejected at once) and then resolved exactly once."""
    for op_id in {e[0] for e in h.rec.op_events}:
        states = h.rec.states(op_id)
        assert states[-1] in TERMINAL, (op_id, states)
        assert sum(s in TERMINAL for s in states) == 1, (op_id, states)
        assert all(s == "queued" for s in states[:-1]), (op_id, states)
        ack = h.sched.ack(op_id)
        assert ack is not None and ack.state == states[-1]


# ====================================================================== order and completion
def test_round_robin_by_chunk(make: Make) -> None:
    h = make([FOUR, FOUR, FOUR], num_chunks=4)
    assert h.sched.wait(timeout=TIMEOUT)
    assert h.fake.calls == [(r, s) for s in (2, 4, 6, 8) for r in (1, 2, 3)]
    for snap in h.sched.snapshot():
        assert snap.status is S.COMPLETED
        assert (snap.step, snap.total_steps, snap.segments_done, snap.num_segments) == (8, 8, 4, 4)
        assert snap.samples_seen == 16 and snap.epoch == 1.0 and not snap.on_device
        assert h.fake.statuses(snap.run_id) == ["COMPLETED"]
        assert h.rec.statuses(snap.run_id) == [S.ONGOING, S.COMPLETED]
    assert h.sched.is_idle()


def test_round_robin_with_futures_resolved_from_another_thread(make: Make) -> None:
    h = make([FOUR, FOUR, FOUR], num_chunks=4, mode="thread")
    assert h.sched.wait(timeout=TIMEOUT)
    assert h.fake.calls == [(r, s) for s in (2, 4, 6, 8) for r in (1, 2, 3)]


def test_runs_with_different_lengths_and_epochs(make: Make) -> None:
    specs = [
        FakeSpec(rows=16, batch=4),  # 4 steps: boundaries 2, 4
        FakeSpec(rows=16, batch=2, epochs=2),  # 8 steps/epoch: 4, 8 | 12, 16
        FakeSpec(rows=16, batch=4, max_steps=3),  # ends inside its chunk 2: 2, 3
    ]
    h = make(specs, num_chunks=2)
    assert h.sched.wait(timeout=TIMEOUT)
    assert h.fake.calls == [(1, 2), (2, 4), (3, 2), (1, 4), (2, 8), (3, 3), (2, 12), (2, 16)]
    s1, s2, s3 = h.sched.snapshot()
    assert (s1.status, s1.step, s1.samples_seen, s1.segments_done) == (S.COMPLETED, 4, 16, 2)
    assert (s2.status, s2.step, s2.samples_seen, s2.segments_done, s2.epoch) == (S.COMPLETED, 16, 32, 4, 2.0)
    assert s2.position == (2, 2)
    assert (s3.status, s3.step, s3.samples_seen, s3.segments_done) == (S.COMPLETED, 3, 12, 2)


def test_max_steps_inside_the_first_chunk(make: Make) -> None:
    h = make([FakeSpec(rows=16, batch=2, max_steps=3), FOUR], num_chunks=2)
    assert h.sched.wait(timeout=TIMEOUT)
    assert h.fake.calls == [(1, 3), (2, 4), (2, 8)]
    assert h.status(1) is S.COMPLETED and h.sched.run_snapshot(1).step == 3  # type: ignore[union-attr]


def test_a_failing_segment_fails_only_its_run(make: Make) -> None:
    h = make([FOUR, FakeSpec(rows=16, batch=2, fail_at_step=3), FOUR], num_chunks=4)
    assert h.sched.wait(timeout=TIMEOUT)
    assert h.fake.calls_of(2) == [2, 4]
    assert h.fake.calls_of(1) == h.fake.calls_of(3) == [2, 4, 6, 8]
    snap = h.sched.run_snapshot(2)
    assert snap is not None and snap.status is S.FAILED and snap.error == "boom at step 3"
    assert snap.step == 2 and snap.segments_done == 1
    assert h.status(1) is S.COMPLETED and h.status(3) is S.COMPLETED
    assert h.fake.statuses(2) == ["FAILED"]


def test_a_segment_future_that_raises_fails_the_run(make: Make) -> None:
    """Executors must report errors in SegmentResult; one that raises anyway must not wedge the loop."""
    h = make([TWO, TWO], mode="manual")
    assert h.fake.wait_inflight() == (1, 2)
    h.fake.resolve(raise_exc=RuntimeError("worker died"))
    h.run_to_idle()
    snap = h.sched.run_snapshot(1)
    assert snap is not None and snap.status is S.FAILED and "worker died" in (snap.error or "")
    assert h.status(2) is S.COMPLETED
    assert h.fake.calls_of(1) == [2]


def test_run_segment_that_raises_fails_the_run(make: Make) -> None:
    h = make([TWO, TWO], start=False)
    real = h.fake.run_segment

    def flaky(run_id: int, stop: int):  # type: ignore[no-untyped-def]
        if run_id == 1:
            raise RuntimeError("cannot start")
        return real(run_id, stop)

    h.fake.run_segment = flaky  # type: ignore[method-assign]
    h.sched.start()
    assert h.sched.wait(timeout=TIMEOUT)
    assert h.status(1) is S.FAILED and "cannot start" in (h.sched.run_snapshot(1).error or "")  # type: ignore[union-attr]
    assert h.status(2) is S.COMPLETED


# ====================================================================== stop / resume / delete
def test_stop_of_the_run_on_device_applies_at_its_boundary(make: Make) -> None:
    h = make([TWO, TWO, TWO], mode="manual")
    assert h.fake.wait_inflight() == (1, 2)
    ack = h.sched.submit(Op(OpKind.STOP, 1))
    assert ack.state == "queued" and "end of" in ack.message and "chunk" in ack.message
    h.settle()
    snap = h.sched.run_snapshot(1)
    assert snap is not None and snap.status is S.ONGOING and snap.on_device and h.sched.on_device() == 1
    assert h.sched.ack(ack.op_id).state == "queued"  # type: ignore[union-attr]
    assert h.fake.statuses(1) == []
    h.step()  # run 1 finishes its chunk, then parks
    snap = h.sched.run_snapshot(1)
    assert snap is not None and snap.status is S.STOPPED and snap.segments_done == 1 and snap.step == 2
    assert h.sched.ack(ack.op_id).state == "applied"  # type: ignore[union-attr]
    assert h.fake.statuses(1) == ["STOPPED"]
    h.run_to_idle()
    assert h.fake.calls_of(1) == [2], "a stopped run is not chosen again"
    assert h.status(1) is S.STOPPED and h.status(2) is S.COMPLETED and h.status(3) is S.COMPLETED
    assert h.sched.wait(timeout=0.1), "stopped runs do not keep wait() blocking"
    assert_ops_terminal(h)


@pytest.mark.parametrize("kind", [OpKind.STOP, OpKind.DELETE])
def test_a_repeated_request_while_the_first_waits_gets_its_outcome(make: Make, kind: OpKind) -> None:
    """Two clicks on Stop (or Delete) of the run on the device: both end applied, the run changes once."""
    h = make([TWO, TWO], mode="manual")
    assert h.fake.wait_inflight() == (1, 2)
    first = h.sched.submit(Op(kind, 1))
    second = h.sched.submit(Op(kind, 1))
    assert first.state == second.state == "queued"
    assert "already requested" in second.message
    h.settle()
    h.step()  # run 1 reaches its boundary: the request applies, and the repeat with it
    a1, a2 = h.sched.ack(first.op_id), h.sched.ack(second.op_id)
    assert a1 is not None and a2 is not None
    assert (a1.state, a2.state) == ("applied", "applied") and a2.message == a1.message
    target = "STOPPED" if kind is OpKind.STOP else "DELETED"
    assert h.fake.statuses(1) == [target]
    # once applied, a third request is judged on the new status again
    third = h.sched.submit(Op(kind, 1))
    assert third.state == "rejected"
    h.run_to_idle()
    assert_ops_terminal(h)


def test_a_repeated_request_follows_a_rejection_too(make: Make) -> None:
    h = make([TWO], mode="manual")
    h.step()
    assert h.fake.wait_inflight() == (1, 4)
    first, second = h.sched.submit(Op(OpKind.STOP, 1)), h.sched.submit(Op(OpKind.STOP, 1))
    h.step()  # the run completes in this chunk: the stop is rejected, and its repeat with it
    assert h.status(1) is S.COMPLETED
    a1, a2 = h.sched.ack(first.op_id), h.sched.ack(second.op_id)
    assert a1 is not None and a2 is not None
    assert a1.state == a2.state == "rejected" and "COMPLETED" in a2.message
    assert_ops_terminal(h)


def test_stop_of_a_parked_run_applies_at_once(make: Make) -> None:
    h = make([TWO, TWO, TWO], mode="manual")
    assert h.fake.wait_inflight() == (1, 2)
    ack = h.sched.submit(Op(OpKind.STOP, 2))
    h.settle()
    assert h.sched.ack(ack.op_id).state == "applied"  # type: ignore[union-attr]
    assert h.status(2) is S.STOPPED and h.fake.inflight is not None  # run 1 is still training
    h.run_to_idle()
    assert h.fake.calls_of(2) == []
    assert h.fake.statuses(2) == ["STOPPED"]
    # the STOPPED notification waited for run 1's segment (the fake records a violation otherwise)
    assert h.fake.events.index(("on_status", 2, "STOPPED")) > h.fake.events.index(("segment", 1, 2))


def test_stopping_every_run_does_not_end_and_resume_continues(make: Make) -> None:
    h = make([TWO, TWO], mode="manual")
    h.fake.wait_inflight()
    for r in (1, 2):
        h.sched.submit(Op(OpKind.STOP, r))
    h.run_to_idle()
    assert [h.status(1), h.status(2)] == [S.STOPPED, S.STOPPED]
    assert h.fake.calls == [(1, 2)]
    assert h.sched.wait(timeout=0.1)
    ack = h.sched.submit(Op(OpKind.RESUME, 1))
    h.run_to_idle()
    assert h.sched.ack(ack.op_id).state == "applied"  # type: ignore[union-attr]
    assert h.fake.calls == [(1, 2), (1, 4)]
    assert h.status(1) is S.COMPLETED and h.status(2) is S.STOPPED
    assert h.fake.statuses(1) == ["STOPPED", "ONGOING", "COMPLETED"]


def test_resumed_run_catches_up_furthest_behind_first(make: Make) -> None:
    h = make([FOUR, FOUR, FOUR], num_chunks=4, mode="manual", start=False)
    h.sched.submit(Op(OpKind.STOP, 3))  # queued before start: applied on the first turn
    h.sched.start()
    for _ in range(4):
        h.step()
    assert h.status(3) is S.STOPPED
    assert h.fake.wait_inflight() == (1, 6)
    assert h.fake.calls == [(1, 2), (2, 2), (1, 4), (2, 4), (1, 6)]
    h.sched.submit(Op(OpKind.RESUME, 3))
    h.run_to_idle()
    assert h.fake.calls[4:] == [
        (1, 6),  # in flight when run 3 was resumed
        (3, 2),
        (3, 4),  # run 3 catches up...
        (2, 6),
        (3, 6),  # ... ties at chunk 3 go by run id
        (1, 8),
        (2, 8),
        (3, 8),
    ]
    assert all(h.status(r) is S.COMPLETED for r in (1, 2, 3))


def test_resume_of_a_run_stopped_before_its_first_chunk(make: Make) -> None:
    h = make([TWO, TWO], start=False)
    h.sched.submit(Op(OpKind.STOP, 1))
    h.sched.start()
    assert h.sched.wait(timeout=TIMEOUT)
    assert h.status(1) is S.STOPPED and h.fake.calls_of(1) == []
    h.sched.submit(Op(OpKind.RESUME, 1))
    assert h.sched.wait(timeout=TIMEOUT)
    assert h.status(1) is S.COMPLETED and h.fake.calls_of(1) == [2, 4]
    assert h.rec.statuses(1) == [S.STOPPED, S.ONGOING, S.COMPLETED]


def test_delete(make: Make) -> None:
    h = make([TWO, TWO, TWO, TWO], mode="manual")
    assert h.fake.wait_inflight() == (1, 2)
    on_device = h.sched.submit(Op(OpKind.DELETE, 1))
    parked = h.sched.submit(Op(OpKind.DELETE, 2))
    h.settle()
    assert h.status(2) is S.DELETED and h.status(1) is S.ONGOING
    assert h.sched.ack(parked.op_id).state == "applied"  # type: ignore[union-attr]
    assert h.sched.ack(on_device.op_id).state == "queued"  # type: ignore[union-attr]
    h.step()
    assert h.status(1) is S.DELETED
    assert h.sched.ack(on_device.op_id).state == "applied"  # type: ignore[union-attr]
    h.run_to_idle()
    assert h.fake.calls_of(1) == [2] and h.fake.calls_of(2) == []
    assert h.fake.statuses(1) == ["DELETED"] and h.fake.statuses(2) == ["DELETED"]
    # a COMPLETED run may be deleted
    assert h.status(3) is S.COMPLETED
    ack = h.sched.submit(Op(OpKind.DELETE, 3))
    h.settle()
    assert h.sched.ack(ack.op_id).state == "applied" and h.status(3) is S.DELETED  # type: ignore[union-attr]
    assert h.fake.statuses(3) == ["COMPLETED", "DELETED"]
    assert_ops_terminal(h)


def test_delete_of_a_failed_run(make: Make) -> None:
    h = make([FakeSpec(rows=16, batch=4, fail_at_step=1), TWO])
    assert h.sched.wait(timeout=TIMEOUT)
    assert h.status(1) is S.FAILED
    ack = h.sched.submit(Op(OpKind.DELETE, 1))
    assert h.sched.wait(timeout=TIMEOUT)
    assert h.sched.ack(ack.op_id).state == "applied" and h.status(1) is S.DELETED  # type: ignore[union-attr]


# ====================================================================== clone
def test_cold_clone_gets_max_plus_one_and_catches_up(make: Make) -> None:
    h = make([FOUR, FOUR, FOUR], num_chunks=4, mode="manual")
    for _ in range(6):
        h.step()
    assert h.fake.wait_inflight() == (1, 6)
    assert h.fake.calls == [(r, s) for s in (2, 4) for r in (1, 2, 3)] + [(1, 6)]
    ack = h.sched.submit(clone(2, FOUR))
    assert ack.state == "queued" and ack.new_run_id == 4
    snap = h.sched.run_snapshot(4)
    assert snap is not None and snap.status is S.NEW and snap.parent_id == 2 and not snap.warm_start
    assert snap.spec == FOUR
    h.settle()
    assert ("add_run", 4, None) not in h.fake.events, "add_run waits for the segment in flight"
    h.step()  # run 1's chunk 3 ends; the clone is created at that boundary and starts right away
    assert ("add_run", 4, None) in h.fake.events
    assert h.sched.ack(ack.op_id).state == "applied"  # type: ignore[union-attr]
    h.run_to_idle()
    assert h.fake.calls[6:] == [
        (1, 6),
        (4, 2),
        (4, 4),  # the clone catches up from chunk 1
        (2, 6),
        (3, 6),
        (4, 6),
        (1, 8),
        (2, 8),
        (3, 8),
        (4, 8),
    ]
    assert h.status(4) is S.COMPLETED
    assert_ops_terminal(h)


def test_clone_ids_keep_increasing(make: Make) -> None:
    h = make({1: TWO, 5: TWO})
    assert h.sched.wait(timeout=TIMEOUT)
    assert h.sched.submit(clone(1, TWO)).new_run_id == 6
    assert h.sched.submit(clone(5, TWO)).new_run_id == 7
    assert h.sched.wait(timeout=TIMEOUT)
    assert [s.run_id for s in h.sched.snapshot()] == [1, 5, 6, 7]


def test_clone_of_a_finished_run_restarts_the_loop(make: Make) -> None:
    h = make([TWO, TWO])
    assert h.sched.wait(timeout=TIMEOUT)
    for i in range(20):  # repeated: wait() must never return before the clone has trained
        child = h.sched.submit(clone(1, TWO)).new_run_id
        assert child is not None
        assert h.sched.wait(timeout=TIMEOUT)
        assert h.status(child) is S.COMPLETED, f"iteration {i}: wait() returned before clone {child} trained"
        assert h.fake.calls_of(child) == [2, 4]


def test_wait_does_not_return_while_submit_is_between_ack_and_queue() -> None:
    """submit() tells the listener "queued" and then puts the op on the queue; an idle loop turn in between
    must not let wait() report "nothing left to train" while the clone is not applied yet."""
    in_window, release = threading.Event(), threading.Event()

    class SlowQueued(Recorder):
        def on_op(self, op, ack):  # type: ignore[no-untyped-def]
            super().on_op(op, ack)
            if ack.state == "queued" and op.op_id == "slow":
                in_window.set()
                release.wait(TIMEOUT)

    fake, rec = FakeExecutor(), SlowQueued()
    sched = Scheduler(fake, listener=rec, idle_poll_s=0.002)
    sched.add_run(1, TWO)
    sched.start()
    try:
        assert sched.wait(timeout=TIMEOUT)
        submitter = threading.Thread(target=lambda: sched.submit(clone(1, TWO, op_id="slow")), daemon=True)
        submitter.start()
        assert in_window.wait(TIMEOUT)
        rec.wait_beats(3)  # the loop keeps turning, idle, while the op is not on the queue yet
        assert not sched.wait(timeout=0.05), "wait() returned before the clone was applied"
        assert not sched.is_idle()
        release.set()
        submitter.join(TIMEOUT)
        assert sched.wait(timeout=TIMEOUT)
        assert sched.run_snapshot(2).status is S.COMPLETED  # type: ignore[union-attr]
    finally:
        release.set()
        sched.close(timeout=TIMEOUT)
    assert not fake.violations


def test_wait_covers_a_clone_whose_add_run_is_slow(make: Make) -> None:
    h = make([TWO])
    assert h.sched.wait(timeout=TIMEOUT)
    h.fake.add_run_delay = 0.05
    child = h.sched.submit(clone(1, TWO)).new_run_id
    assert h.sched.wait(timeout=TIMEOUT)
    assert h.status(child) is S.COMPLETED  # type: ignore[arg-type]


def test_clone_of_a_failed_run_is_allowed(make: Make) -> None:
    h = make([FakeSpec(rows=16, batch=4, fail_at_step=1)])
    assert h.sched.wait(timeout=TIMEOUT)
    ack = h.sched.submit(clone(1, TWO))
    assert h.sched.wait(timeout=TIMEOUT)
    assert h.sched.ack(ack.op_id).state == "applied" and h.status(2) is S.COMPLETED  # type: ignore[union-attr]


def test_clone_whose_add_run_fails_marks_the_child_failed(make: Make) -> None:
    h = make([TWO])
    ack = h.sched.submit(clone(1, FakeSpec(add_error="bad lora.r")))
    assert h.sched.wait(timeout=TIMEOUT)
    assert h.sched.ack(ack.op_id).state == "rejected"  # type: ignore[union-attr]
    assert "bad lora.r" in h.sched.ack(ack.op_id).message  # type: ignore[union-attr]
    snap = h.sched.run_snapshot(2)
    assert snap is not None and snap.status is S.FAILED and "bad lora.r" in (snap.error or "")
    assert h.status(1) is S.COMPLETED


def test_warm_clone_waits_for_its_parents_first_boundary(make: Make) -> None:
    h = make([TWO, TWO], mode="manual")
    assert h.fake.wait_inflight() == (1, 2)
    ack = h.sched.submit(clone(2, TWO, warm=True))  # run 2 has not trained yet
    assert ack.new_run_id == 3
    h.settle()
    snap = h.sched.run_snapshot(3)
    assert snap is not None and snap.status is S.NEW and snap.total_steps == 0 and snap.warm_start
    assert h.sched.ack(ack.op_id).state == "queued"  # type: ignore[union-attr]
    h.step()  # run 1 ends chunk 1; run 2 starts its chunk 1
    assert h.fake.wait_inflight() == (2, 2)
    assert not any(e[0] == "add_run" and e[1] == 3 for e in h.fake.events)
    assert any("waits" in m for i, s, m in h.rec.op_events if i == ack.op_id and s == "queued")
    h.step()  # run 2 reaches its first boundary: the clone starts from it
    assert ("add_run", 3, 2) in h.fake.events
    snap = h.sched.run_snapshot(3)
    assert snap is not None and (snap.step, snap.segments_done, snap.samples_seen) == (2, 1, 8)
    assert h.sched.ack(ack.op_id).state == "applied"  # type: ignore[union-attr]
    assert "warm" in h.sched.ack(ack.op_id).message  # type: ignore[union-attr]
    h.run_to_idle()
    assert h.fake.calls == [(1, 2), (2, 2), (1, 4), (2, 4), (3, 4)]
    assert h.status(3) is S.COMPLETED


def test_warm_clone_with_a_faked_boundary_applies_at_once(make: Make) -> None:
    h = make([TWO, TWO], mode="manual")
    h.fake.wait_inflight()
    h.fake.boundary_override[2] = True  # the executor says run 2 has a boundary (e.g. restored)
    ack = h.sched.submit(clone(2, TWO, warm=True))
    h.step()
    assert ("add_run", 3, 2) in h.fake.events
    assert h.sched.ack(ack.op_id).state == "applied"  # type: ignore[union-attr]
    h.run_to_idle()
    assert h.status(3) is S.COMPLETED


def test_warm_clone_of_a_parked_parent_without_boundary_is_rejected(make: Make) -> None:
    h = make([TWO, TWO], start=False)
    h.sched.submit(Op(OpKind.STOP, 2))
    h.sched.start()
    assert h.sched.wait(timeout=TIMEOUT)
    ack = h.sched.submit(clone(2, TWO, warm=True))
    assert h.sched.wait(timeout=TIMEOUT)
    final = h.sched.ack(ack.op_id)
    assert final is not None and final.state == "rejected" and "cold clone" in final.message
    snap = h.sched.run_snapshot(3)
    assert snap is not None and snap.status is S.FAILED and "cold clone" in (snap.error or "")
    assert not any(e[0] == "add_run" and e[1] == 3 for e in h.fake.events)


def test_waiting_warm_clone_is_resolved_when_its_parent_is_stopped(make: Make) -> None:
    """A warm clone waits for its parent's first boundary; if the parent is parked first, it must not hang."""
    h = make([TWO], start=False)
    ack = h.sched.submit(clone(1, TWO, warm=True))  # run 1 has no boundary yet: the clone will wait
    h.sched.submit(Op(OpKind.STOP, 1))  # ... and run 1 never trains now
    h.sched.start()
    h.settle()
    assert h.sched.wait(timeout=TIMEOUT)
    final = h.sched.ack(ack.op_id)
    assert final is not None and final.state == "rejected" and "cold clone" in final.message
    assert h.status(2) is S.FAILED
    assert h.fake.calls == []
    assert_ops_terminal(h)


def test_stopped_clone_whose_creation_fails(make: Make) -> None:
    """A clone stopped before it is created, whose creation then fails, ends FAILED without a loop error."""
    h = make([TWO], mode="manual")
    h.fake.wait_inflight()
    ack = h.sched.submit(clone(1, FakeSpec(add_error="bad value")))  # built at run 1's boundary
    h.sched.submit(Op(OpKind.STOP, 2))  # the child is parked before it exists
    h.settle()
    assert h.status(2) is S.STOPPED
    h.run_to_idle()
    assert h.status(2) is S.FAILED and "bad value" in (h.sched.run_snapshot(2).error or "")  # type: ignore[union-attr]
    assert h.sched.ack(ack.op_id).state == "rejected"  # type: ignore[union-attr]
    assert h.status(1) is S.COMPLETED
    assert_ops_terminal(h)


def test_clone_deleted_before_it_is_created_is_never_built(make: Make) -> None:
    h = make([TWO], mode="manual")
    h.fake.wait_inflight()
    ack = h.sched.submit(clone(1, TWO))
    h.sched.submit(Op(OpKind.DELETE, 2))
    h.run_to_idle()
    assert h.status(2) is S.DELETED
    assert not any(e[0] == "add_run" and e[1] == 2 for e in h.fake.events), "a deleted clone was built"
    assert h.sched.ack(ack.op_id).state == "rejected"  # type: ignore[union-attr]
    assert h.fake.calls_of(2) == []
    assert_ops_terminal(h)


def test_clone_queued_behind_a_delete_of_its_parent(make: Make) -> None:
    """The parent is deleted by an earlier op before the clone op is applied: the child must not stay NEW."""
    h = make([TWO, TWO], start=False)
    h.sched.submit(Op(OpKind.DELETE, 2))
    ack = h.sched.submit(clone(2, TWO))  # accepted: run 2 is not DELETED yet when this is submitted
    assert ack.state == "queued" and ack.new_run_id == 3
    h.sched.start()
    assert h.sched.wait(timeout=TIMEOUT)
    final = h.sched.ack(ack.op_id)
    assert final is not None and final.state == "rejected" and "DELETED" in final.message
    snap = h.sched.run_snapshot(3)
    assert snap is not None and snap.status is S.FAILED
    assert h.fake.calls_of(3) == []
    assert_ops_terminal(h)


def test_warm_clone_with_a_delete_of_its_parent_gets_the_parents_weights(make: Make) -> None:
    h = make([TWO, TWO], mode="manual")
    assert h.fake.wait_inflight() == (1, 2)
    ack = h.sched.submit(clone(1, TWO, warm=True))
    h.sched.submit(Op(OpKind.DELETE, 1))
    h.run_to_idle()
    ev = h.fake.events
    assert ev.index(("add_run", 3, 1)) < ev.index(("on_status", 1, "DELETED")), (
        "the delete waits for the clone"
    )
    assert h.sched.ack(ack.op_id).state == "applied"  # type: ignore[union-attr]
    assert h.fake.calls_of(3) == [4] and h.status(3) is S.COMPLETED and h.status(1) is S.DELETED


def test_warm_clone_of_a_completed_parent_has_nothing_left(make: Make) -> None:
    h = make([TWO])
    assert h.sched.wait(timeout=TIMEOUT)
    ack = h.sched.submit(clone(1, TWO, warm=True))
    assert h.sched.wait(timeout=TIMEOUT)
    assert h.sched.ack(ack.op_id).state == "applied"  # type: ignore[union-attr]
    snap = h.sched.run_snapshot(2)
    assert snap is not None and snap.status is S.COMPLETED and snap.step == 4
    assert h.fake.calls_of(2) == []
    # a warm clone with more steps continues from the parent's position
    ack = h.sched.submit(clone(1, FakeSpec(rows=16, batch=4, epochs=2), warm=True))
    assert h.sched.wait(timeout=TIMEOUT)
    assert h.fake.calls_of(3) == [6, 8] and h.status(3) is S.COMPLETED


# ====================================================================== op rules
def test_duplicate_op_id_is_applied_once(make: Make) -> None:
    h = make([TWO, TWO, TWO], mode="manual")
    h.fake.wait_inflight()
    first = h.sched.submit(Op(OpKind.STOP, 2, op_id="same"))
    again = h.sched.submit(Op(OpKind.STOP, 2, op_id="same"))
    assert again.op_id == first.op_id == "same"
    c1 = h.sched.submit(clone(3, TWO, op_id="clone-x"))
    c2 = h.sched.submit(clone(3, TWO, op_id="clone-x"))
    assert c1.new_run_id == c2.new_run_id == 4
    h.run_to_idle()
    assert h.rec.states("same") == ["queued", "applied"]
    assert h.rec.states("clone-x") == ["queued", "applied"]
    assert [s.run_id for s in h.sched.snapshot()] == [1, 2, 3, 4]
    assert h.fake.statuses(2) == ["STOPPED"]
    # once applied, the same id is still answered with its outcome, not applied again
    later = h.sched.submit(Op(OpKind.RESUME, 2, op_id="same"))
    assert later.state == "applied" and later.kind == "stop"
    h.settle()
    assert h.status(2) is S.STOPPED


@pytest.mark.parametrize(
    "kind,target,setup,reason",
    [
        (OpKind.STOP, 1, "completed", "COMPLETED"),
        (OpKind.RESUME, 1, "completed", "COMPLETED"),
        (OpKind.STOP, 1, "failed", "FAILED"),
        (OpKind.RESUME, 1, "failed", "FAILED"),
        (OpKind.STOP, 1, "deleted", "DELETED"),
        (OpKind.RESUME, 1, "deleted", "DELETED"),
        (OpKind.DELETE, 1, "deleted", "DELETED"),
        (OpKind.CLONE, 1, "deleted", "DELETED"),
        (OpKind.STOP, 99, "completed", "does not exist"),
        (OpKind.RESUME, 99, "completed", "does not exist"),
        (OpKind.DELETE, 99, "completed", "does not exist"),
        (OpKind.CLONE, 99, "completed", "does not exist"),
        (OpKind.STOP, 0, "completed", "does not exist"),
    ],
)
def test_illegal_ops_are_rejected_with_a_reason(
    make: Make, kind: OpKind, target: int, setup: str, reason: str
) -> None:
    first = FakeSpec(rows=16, batch=4, fail_at_step=1) if setup == "failed" else TWO
    h = make([first, TWO])
    assert h.sched.wait(timeout=TIMEOUT)
    if setup == "deleted":
        h.sched.submit(Op(OpKind.DELETE, 1))
        assert h.sched.wait(timeout=TIMEOUT)
    n_runs = len(h.sched.snapshot())
    op = clone(target, TWO) if kind is OpKind.CLONE else Op(kind, target)
    ack = h.sched.submit(op)
    assert ack.state == "rejected" and reason in ack.message and ack.new_run_id is None
    assert h.rec.states(op.op_id) == ["rejected"]
    assert len(h.sched.snapshot()) == n_runs, "a rejected clone creates no run"
    # the loop is alive and still takes ops
    ok = h.sched.submit(clone(2, TWO))
    assert h.sched.wait(timeout=TIMEOUT)
    assert h.sched.ack(ok.op_id).state == "applied"  # type: ignore[union-attr]
    assert h.status(ok.new_run_id) is S.COMPLETED  # type: ignore[arg-type]


def test_resume_of_the_run_on_device_is_rejected(make: Make) -> None:
    h = make([TWO, TWO], mode="manual")
    assert h.fake.wait_inflight() == (1, 2)
    ack = h.sched.submit(Op(OpKind.RESUME, 1))
    assert ack.state == "rejected" and "ONGOING" in ack.message
    h.run_to_idle()
    assert h.fake.calls_of(1) == [2, 4]


def test_stop_rejected_at_the_boundary_when_the_run_completes_in_its_last_chunk(make: Make) -> None:
    h = make([TWO], mode="manual")
    h.step()
    assert h.fake.wait_inflight() == (1, 4)
    stop = h.sched.submit(Op(OpKind.STOP, 1))
    h.step()
    assert h.status(1) is S.COMPLETED
    final = h.sched.ack(stop.op_id)
    assert final is not None and final.state == "rejected" and "COMPLETED" in final.message
    assert h.fake.statuses(1) == ["COMPLETED"]


def test_delete_deferred_to_the_last_boundary_follows_completion(make: Make) -> None:
    h = make([TWO], mode="manual")
    h.step()
    h.fake.wait_inflight()
    ack = h.sched.submit(Op(OpKind.DELETE, 1))
    h.step()
    assert h.status(1) is S.DELETED and h.sched.ack(ack.op_id).state == "applied"  # type: ignore[union-attr]
    assert h.fake.statuses(1) == ["COMPLETED", "DELETED"]
    assert h.rec.statuses(1) == [S.ONGOING, S.COMPLETED, S.DELETED]


def test_ops_from_the_inbox_are_applied(make: Make) -> None:
    h = make([TWO, TWO], mode="manual")
    h.fake.wait_inflight()
    op = Op(OpKind.STOP, 2, op_id="inbox-1", source="inbox")
    with h.rec.cond:
        h.rec.inbox.extend([op, Op(OpKind.STOP, 2, op_id="inbox-1", source="inbox")])  # duplicated
    h.run_to_idle()
    assert h.status(2) is S.STOPPED and h.rec.states("inbox-1") == ["queued", "applied"]


def test_queued_ack_messages_say_what_happens(make: Make) -> None:
    h = make([TWO, TWO, TWO], mode="manual")
    h.fake.wait_inflight()
    acks = {
        "stop-on-device": h.sched.submit(Op(OpKind.STOP, 1)),
        "stop-parked": h.sched.submit(Op(OpKind.STOP, 2)),
        "delete": h.sched.submit(Op(OpKind.DELETE, 3)),
        "clone": h.sched.submit(clone(1, TWO)),
    }
    for name, ack in acks.items():
        assert ack.state == "queued", name
        assert f"run {ack.run_id}" in ack.message, (name, ack.message)
    assert "end of" in acks["stop-on-device"].message
    assert "end of" not in acks["stop-parked"].message
    assert "run 4" in acks["clone"].message
    h.run_to_idle()
    assert_ops_terminal(h)


# ====================================================================== wait / idle
def test_wait_chunks_returns_when_every_active_run_has_done_k_chunks(make: Make) -> None:
    h = make([FOUR, FOUR, FOUR], num_chunks=4, mode="manual")
    assert not h.sched.wait(timeout=0.05, chunks=1)
    h.step()
    h.step()
    assert not h.sched.wait(timeout=0.05, chunks=1)
    h.step()
    assert h.sched.wait(timeout=TIMEOUT, chunks=1)
    assert all(s.segments_done >= 1 for s in h.sched.snapshot())
    assert not h.sched.wait(timeout=0.05, chunks=2)
    h.sched.submit(Op(OpKind.STOP, 3))  # a parked run no longer counts
    h.step()
    h.step()
    assert h.sched.wait(timeout=TIMEOUT, chunks=2)
    assert not h.sched.wait(timeout=0.05)  # runs 1 and 2 still have chunks to train
    h.run_to_idle()
    assert h.sched.wait(timeout=TIMEOUT, chunks=10)  # more chunks than a run has: its end counts
    assert h.sched.wait(timeout=TIMEOUT)


def test_wait_chunks_from_another_thread(make: Make) -> None:
    h = make([FOUR, FOUR], num_chunks=4, mode="thread")
    assert h.sched.wait(timeout=TIMEOUT, chunks=2)
    assert all(s.segments_done >= 2 for s in h.sched.snapshot())
    assert h.sched.wait(timeout=TIMEOUT)
    assert all(s.status is S.COMPLETED for s in h.sched.snapshot())


def test_wait_returns_when_idle(make: Make) -> None:
    h = make([TWO, TWO], mode="manual")
    assert not h.sched.is_idle()
    assert not h.sched.wait(timeout=0.05)
    done = threading.Event()
    threading.Thread(target=lambda: h.sched.wait(timeout=TIMEOUT) and done.set(), daemon=True).start()
    for _ in range(3):
        h.step()
        assert not done.is_set()
    h.step()
    assert done.wait(TIMEOUT)
    assert h.sched.is_idle() and all(s.status is S.COMPLETED for s in h.sched.snapshot())


def test_wait_after_close_does_not_hang(make: Make) -> None:
    h = make([TWO], mode="manual")
    h.fake.wait_inflight()
    h.sched.close(timeout=TIMEOUT)
    t0 = time.monotonic()
    assert not h.sched.wait(timeout=TIMEOUT), "run 1 never finished"
    assert time.monotonic() - t0 < TIMEOUT / 2


# ====================================================================== protocol with the executor
def test_no_executor_call_while_a_segment_is_in_flight(make: Make) -> None:
    """Ops rain in from another thread while segments run; the fake records any call made mid-segment."""
    h = make([FOUR, FOUR, FOUR], num_chunks=4, mode="thread")
    h.fake.delay = 0.003
    ops = [
        Op(OpKind.STOP, 2),
        clone(1, FOUR),
        Op(OpKind.RESUME, 2),
        clone(3, FOUR, warm=True),
        Op(OpKind.DELETE, 1),
        Op(OpKind.STOP, 4),
        Op(OpKind.RESUME, 4),
        clone(2, FOUR),
        Op(OpKind.DELETE, 5),
    ]
    for op in ops:
        time.sleep(0.004)
        h.sched.submit(op)
    assert h.sched.wait(timeout=TIMEOUT)
    assert not h.fake.violations
    assert_ops_terminal(h)
    assert all(not s.status.in_rotation() for s in h.sched.snapshot())


def test_listener_hears_queued_then_outcome_for_every_op(make: Make) -> None:
    h = make([TWO, TWO], mode="manual")
    h.fake.wait_inflight()
    ops = [
        Op(OpKind.STOP, 1),
        Op(OpKind.STOP, 2),
        Op(OpKind.RESUME, 2),
        clone(1, TWO),
        Op(OpKind.DELETE, 9),
        Op(OpKind.RESUME, 1),
    ]
    for op in ops:
        h.sched.submit(op)
        h.settle()
    h.run_to_idle()
    assert_ops_terminal(h)
    assert {e[0] for e in h.rec.op_events} == {op.op_id for op in ops}
    assert h.rec.states(ops[4].op_id) == ["rejected"]  # unknown run: rejected at once, never queued
    # the resume of run 1 came while its stop waited for the chunk boundary: the later request wins
    assert h.rec.states(ops[0].op_id) == ["queued", "rejected"]
    assert h.rec.states(ops[5].op_id) == ["applied"]
    assert h.rec.states(ops[1].op_id) == ["queued", "applied"]


def test_on_status_for_every_kind_of_end(make: Make) -> None:
    h = make([TWO, FakeSpec(rows=16, batch=4, fail_at_step=3), TWO, TWO], start=False)
    h.sched.submit(Op(OpKind.STOP, 3))
    h.sched.submit(Op(OpKind.DELETE, 4))
    h.sched.start()
    assert h.sched.wait(timeout=TIMEOUT)
    assert h.fake.statuses(1) == ["COMPLETED"]
    assert h.fake.statuses(2) == ["FAILED"]
    assert h.fake.statuses(3) == ["STOPPED"]
    assert h.fake.statuses(4) == ["DELETED"]


# ====================================================================== setup, snapshots, thread
def test_add_run_only_before_start(make: Make) -> None:
    h = make([TWO])
    with pytest.raises(RuntimeError, match="before start"):
        h.sched.add_run(2, TWO)


def test_add_run_propagates_bad_input() -> None:
    sched = Scheduler(FakeExecutor())
    with pytest.raises(ValueError, match="no rows"):
        sched.add_run(1, FakeSpec(add_error="no rows"))
    assert sched.snapshot() == []


def test_restored_runs() -> None:
    fake = FakeExecutor()
    rec = Recorder()
    sched = Scheduler(fake, listener=rec, idle_poll_s=0.002)
    sched.add_run(1, TWO, status=S.COMPLETED)
    sched.add_run(2, TWO, status=S.FAILED, error="old error")
    sched.add_run(3, TWO, status=S.STOPPED)
    sched.add_run(4, TWO)
    assert [e[1] for e in fake.events if e[0] == "add_run"] == [3, 4], "finished runs are not rebuilt"
    assert sched.run_snapshot(2).error == "old error"  # type: ignore[union-attr]
    sched.start()
    try:
        assert sched.wait(timeout=TIMEOUT)
        assert fake.calls == [(4, 2), (4, 4)]
        assert [s.status for s in sched.snapshot()] == [S.COMPLETED, S.FAILED, S.STOPPED, S.COMPLETED]
        assert sched.submit(Op(OpKind.CLONE, 3, payload={"spec": TWO})).new_run_id == 5
        sched.submit(Op(OpKind.RESUME, 3))
        assert sched.wait(timeout=TIMEOUT)
        assert sched.run_snapshot(3).status is S.COMPLETED  # type: ignore[union-attr]
        assert sched.run_snapshot(5).status is S.COMPLETED  # type: ignore[union-attr]
    finally:
        sched.close(timeout=TIMEOUT)
    assert not fake.violations


def test_submit_before_start_is_applied_on_the_first_turn(make: Make) -> None:
    h = make([TWO, TWO], start=False)
    ack = h.sched.submit(Op(OpKind.STOP, 1))
    assert ack.state == "queued" and h.status(1) is S.NEW
    h.sched.start()
    assert h.sched.wait(timeout=TIMEOUT)
    assert h.status(1) is S.STOPPED and h.fake.calls_of(1) == []


def test_snapshots_are_frozen_and_ordered(make: Make) -> None:
    h = make({3: TWO, 1: TWO, 2: TWO}, mode="manual")
    assert h.fake.wait_inflight() == (1, 2)
    h.settle()
    snaps = h.sched.snapshot()
    assert [s.run_id for s in snaps] == [1, 2, 3]
    assert h.sched.on_device() == 1 and snaps[0].on_device and not snaps[1].on_device
    with pytest.raises(AttributeError):
        snaps[0].status = S.STOPPED  # type: ignore[misc]
    assert h.sched.run_snapshot(42) is None
    h.run_to_idle()
    assert snaps[0].status is S.ONGOING, "an old snapshot does not change"
    assert h.sched.on_device() is None


def test_executor_and_listener_run_on_the_scheduler_thread(make: Make) -> None:
    h = make([TWO, TWO], start=False)
    started: list[str] = []
    h.sched.on_thread_start = lambda: started.append(threading.current_thread().name)
    h.sched.start()
    h.sched.start()  # idempotent
    assert h.sched.started
    assert h.sched.wait(timeout=TIMEOUT)
    assert started == ["rapidfire-scheduler"]
    assert h.rec.threads == {"rapidfire-scheduler"}


def test_close_joins_the_thread(make: Make) -> None:
    h = make([TWO], mode="manual")
    h.fake.wait_inflight()
    thread = h.sched._thread
    h.sched.close(timeout=TIMEOUT)
    assert thread is not None and not thread.is_alive()


def test_a_listener_that_raises_does_not_stop_training(make: Make) -> None:
    class Broken(Recorder):
        def on_run(self, snap):  # type: ignore[no-untyped-def]
            raise RuntimeError("listener bug")

        def on_op(self, op, ack):  # type: ignore[no-untyped-def]
            raise RuntimeError("listener bug")

    fake = FakeExecutor()
    sched = Scheduler(fake, listener=Broken(), idle_poll_s=0.002)
    sched.add_run(1, TWO)
    sched.start()
    try:
        sched.submit(clone(1, TWO))
        assert sched.wait(timeout=TIMEOUT)
        assert [s.status for s in sched.snapshot()] == [S.COMPLETED, S.COMPLETED]
    finally:
        sched.close(timeout=TIMEOUT)


# ====================================================================== halt (a storage failure)
def test_halt_lets_the_segment_in_flight_end_then_interrupts_the_rotation(make: Make) -> None:
    h = make([TWO, TWO, TWO], mode="manual")
    assert h.fake.wait_inflight() == (1, 2)
    h.sched.halt("writing the store failed: disk full")
    assert h.sched.halted == "writing the store failed: disk full"
    h.fake.resolve()  # run 1 reaches its boundary at step 2
    assert h.sched.wait(timeout=TIMEOUT), "nothing is left to train once halted"
    assert h.fake.calls == [(1, 2)], "no run got another chunk"
    assert (h.status(1), h.status(2), h.status(3)) == (S.INTERRUPTED, S.NEW, S.NEW)
    assert h.sched.run_snapshot(1).step == 2  # type: ignore[union-attr]
    ack = h.sched.submit(Op(OpKind.RESUME, 1))
    assert (ack.state, ack.message) == ("rejected", "writing the store failed: disk full")
