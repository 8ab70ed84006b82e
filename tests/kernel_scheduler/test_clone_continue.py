"""A warm clone of a finished run (issue 34 item 4), on the fake executor: it continues the parent from its final
state when the executor has it, and fails with the reason (and the cold-clone fix) when it does not."""

from __future__ import annotations

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
        state, message = _continue(h, 1)
        assert state == "applied"
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
