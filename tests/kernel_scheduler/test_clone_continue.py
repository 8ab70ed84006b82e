"""A warm clone of a finished run (issue 34 item 4), on the fake executor: it continues the parent from its final
state when the executor has it, and fails with the reason (and the cold-clone fix) when it does not."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from kernel_scheduler import Op, OpKind, RunStatus
from rapidfire_nb.testing.fakes import TIMEOUT, FakeSpec, Harness

# 16 rows, 4 rows/step, max 4 steps (2 chunks: boundaries 2, 4); the clone goes on to 8 steps (2 epochs)
PARENT = FakeSpec(rows=16, batch=4, max_steps=4)
LONGER = FakeSpec(rows=16, batch=4, max_steps=8)


def _continue(h: Harness, parent: int) -> tuple[str, str]:
    """Warm-clone ``parent`` (finished) into an 8-step run; ``(op state, op message)`` once nothing trains."""
    ack = h.sched.submit(
        Op(OpKind.CLONE, parent, payload={"spec": LONGER, "warm_start": True, "changes": {}})
    )
    assert h.sched.wait(timeout=TIMEOUT)
    final = h.sched.ack(ack.op_id)
    assert final is not None
    return final.state, final.message


def test_a_completed_parent_is_continued_from_its_final_step() -> None:
    h = Harness([PARENT], num_chunks=2)
    try:
        assert h.sched.wait(timeout=TIMEOUT)
        h.fake.boundary_override[1] = True  # the executor kept run 1's final state
        before = len(h.rec.snaps)
        state, message = _continue(h, 1)
        assert state == "applied"
        # the parent is not re-emitted (a listener would store it; a finished run restored from the store has no
        # chunk plan, so its snapshot's epoch is 0.0)
        assert [s.run_id for s in h.rec.snaps[before:] if s.run_id == 1] == []
        assert "warm from run 1's final state, step 4: it continues run 1" in message, message
        child, parent = h.sched.run_snapshot(2), h.sched.run_snapshot(1)
        assert child is not None and parent is not None
        assert (child.status, child.step, child.total_steps, child.parent_id) == (
            RunStatus.COMPLETED,
            8,
            8,
            1,
        )
        assert (parent.status, parent.step) == (RunStatus.COMPLETED, 4)  # untouched
        assert h.fake.calls[-2:] == [(2, 6), (2, 8)]  # from step 4 on, never from step 0
    finally:
        h.close()
    assert not h.fake.violations and h.sched.loop_error is None


def test_a_completed_parent_without_its_final_state_says_so() -> None:
    h = Harness([PARENT], num_chunks=2)
    try:
        assert h.sched.wait(timeout=TIMEOUT)
        h.fake.boundary_override[1] = False  # e.g. its checkpoint was removed
        state, message = _continue(h, 1)
        assert state == "rejected"
        assert (
            "run 1 is COMPLETED at step 4, but its final state is neither in this kernel nor on disk"
            in message
        ), message
        assert message.endswith("use a cold clone (warm_start=False)")
        child = h.sched.run_snapshot(2)
        assert child is not None and child.status is RunStatus.FAILED and child.error == message
    finally:
        h.close()
    assert not h.fake.violations and h.sched.loop_error is None


def test_wait_blocks_while_the_continuation_is_built_after_its_preparation() -> None:
    """``wait()`` is not True while a warm clone of a finished run is built (``add_run`` on the scheduler thread,
    after its off-loop preparation): the child is pending, no op is unapplied, no segment runs, nothing else is
    left to train, yet the child has not trained (a reopened experiment's ``clone_modify`` then ``wait()``)."""
    h = Harness([PARENT], num_chunks=2)
    building, release = threading.Event(), threading.Event()
    add_run = h.fake.add_run

    def slow_add_run(run_id: int, spec: Any, **kw: Any) -> Any:
        if run_id == 2:
            building.set()
            release.wait(TIMEOUT)
        return add_run(run_id, spec, **kw)

    def prepared(run_id: int, spec: Any, *, device: str | None = None) -> Future[None]:
        fut: Future[None] = Future()
        threading.Timer(0.05, fut.set_result, (None,)).start()  # done once the loop is idle again
        return fut

    try:
        assert h.sched.wait(timeout=TIMEOUT)
        h.fake.boundary_override[1] = True
        h.fake.add_run = slow_add_run  # type: ignore[method-assign]
        h.fake.prepare_run = prepared  # type: ignore[method-assign]
        h.sched.submit(Op(OpKind.CLONE, 1, payload={"spec": LONGER, "warm_start": True, "changes": {}}))
        assert building.wait(TIMEOUT)
        assert not h.sched.wait(timeout=0.3)  # the child is being built: work left
        release.set()
        assert h.sched.wait(timeout=TIMEOUT)
        child = h.sched.run_snapshot(2)
        assert child is not None and (child.status, child.step) == (RunStatus.COMPLETED, 8)
    finally:
        release.set()
        h.close()
    assert not h.fake.violations and h.sched.loop_error is None
