"""A clone's build does not hold the loop (issue 34 item 5): its preparation (``Executor.prepare_run``, e.g.
tokenizing the dataset) runs off the scheduler thread while the other runs train and ops apply; the child joins
the rotation once it is built; a failed preparation fails the child only; a delete during it cancels the build, a
stop during it leaves the child STOPPED once built.

The fake executor trains in ``manual`` mode; its ``prepare_run`` hands back a Future the test resolves.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest

from kernel_scheduler import Op, OpKind, RunStatus
from rapidfire_nb.testing.fakes import TIMEOUT, FakeSpec, Harness

# 16 rows, 4 rows/step, 4 steps: 2 chunks of 2 steps (the clone); the parents train 4 epochs (8 chunks)
SPEC = FakeSpec(rows=16, batch=4, max_steps=4)
LONG = FakeSpec(rows=16, batch=4, max_steps=16)


class _Prep:
    """A ``prepare_run`` whose Futures the test resolves; records its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str | None]] = []
        self.futures: dict[int, Future[None]] = {}

    def __call__(self, run_id: int, spec: Any, *, device: str | None = None) -> Future[None]:
        self.calls.append((run_id, device))
        fut: Future[None] = Future()
        self.futures[run_id] = fut
        return fut


@pytest.fixture
def h() -> Any:
    harness = Harness([LONG, LONG], num_chunks=2, mode="manual")
    prep = _Prep()
    harness.fake.prepare_run = prep  # type: ignore[method-assign]
    harness.prep = prep  # type: ignore[attr-defined]
    yield harness
    harness.close()
    assert not harness.fake.violations and harness.sched.loop_error is None


def _clone(h: Any) -> tuple[str, int]:
    ack = h.sched.submit(Op(OpKind.CLONE, 1, payload={"spec": SPEC, "warm_start": False, "changes": {}}))
    assert ack.new_run_id == 3
    return ack.op_id, ack.new_run_id


def _added(h: Any, run_id: int) -> bool:
    return any(e[:2] == ("add_run", run_id) for e in h.fake.events)


def test_other_runs_train_and_ops_apply_while_a_clone_is_prepared(h: Any) -> None:
    h.fake.wait_inflight()
    op_id, child = _clone(h)
    h.step()  # run 1's or 2's chunk ends; the loop applies the clone: its preparation starts
    h.settle()
    assert [c[0] for c in h.prep.calls] == [child]
    trained_meanwhile = [h.step() for _ in range(3)]  # three more chunks train while it is prepared
    assert len(trained_meanwhile) == 3 and not _added(h, child)
    stop = h.sched.submit(Op(OpKind.STOP, 2))  # an op on another run is answered meanwhile
    if h.fake.inflight is not None and h.fake.inflight[0] == 2:
        h.step()  # a stop of the run in flight applies at its chunk boundary
    h.settle()
    assert h.sched.ack(stop.op_id).state == "applied"  # type: ignore[union-attr]
    assert h.status(2) is RunStatus.STOPPED
    snap = h.sched.run_snapshot(child)
    assert snap is not None and snap.status is RunStatus.NEW
    told = [m for o, _, m in h.rec.op_events if o == op_id]
    assert told[-1] == f"run {child} is being prepared (e.g. its dataset tokenized)", told
    assert not h.sched.wait(timeout=0.05)  # a clone being built is work left
    h.prep.futures[child].set_result(None)
    h.run_to_idle()
    assert _added(h, child) and h.status(child) is RunStatus.COMPLETED
    assert h.fake.calls_of(child) == [2, 4]
    assert h.sched.ack(op_id).state == "applied"  # type: ignore[union-attr]


def test_a_failed_preparation_fails_the_child_only(h: Any) -> None:
    h.fake.wait_inflight()
    op_id, child = _clone(h)
    h.step()
    h.prep.futures[child].set_exception(ValueError("max_length must be positive"))
    h.run_to_idle()
    snap = h.sched.run_snapshot(child)
    assert snap is not None and snap.status is RunStatus.FAILED
    assert snap.error == "ValueError: max_length must be positive"
    ack = h.sched.ack(op_id)
    assert ack is not None and (ack.state, ack.message) == ("rejected", snap.error)
    assert not _added(h, child)
    assert h.status(1) is RunStatus.COMPLETED and h.status(2) is RunStatus.COMPLETED


def test_a_delete_during_the_preparation_cancels_the_build(h: Any) -> None:
    h.fake.wait_inflight()
    op_id, child = _clone(h)
    h.step()
    delete = h.sched.submit(Op(OpKind.DELETE, child))
    h.settle()
    assert h.sched.ack(delete.op_id).state == "applied"  # type: ignore[union-attr]
    assert h.status(child) is RunStatus.DELETED
    h.prep.futures[child].cancel()  # what the executor does on DELETED
    h.run_to_idle()
    assert not _added(h, child) and h.status(child) is RunStatus.DELETED
    ack = h.sched.ack(op_id)
    assert ack is not None and ack.state == "rejected"
    assert ack.message == f"run {child} was deleted before it was created"
    assert "DELETED" in h.fake.statuses(child)


def test_a_stop_during_the_preparation_leaves_the_built_child_stopped(h: Any) -> None:
    h.fake.wait_inflight()
    _, child = _clone(h)
    h.step()
    stop = h.sched.submit(Op(OpKind.STOP, child))
    h.settle()
    assert h.sched.ack(stop.op_id).state == "applied"  # type: ignore[union-attr]
    h.prep.futures[child].set_result(None)
    h.run_to_idle()
    assert _added(h, child) and h.status(child) is RunStatus.STOPPED
    assert h.fake.calls_of(child) == []
    h.sched.submit(Op(OpKind.RESUME, child))
    h.run_to_idle()
    assert h.status(child) is RunStatus.COMPLETED and h.fake.calls_of(child) == [2, 4]


def test_wait_returns_once_the_prepared_clone_is_built_and_trained() -> None:
    h = Harness([SPEC], num_chunks=2, mode="auto")
    prep = _Prep()
    h.fake.prepare_run = prep  # type: ignore[method-assign]
    try:
        assert h.sched.wait(timeout=TIMEOUT)
        _, child = (lambda a: (a.op_id, a.new_run_id))(
            h.sched.submit(Op(OpKind.CLONE, 1, payload={"spec": SPEC, "warm_start": False, "changes": {}}))
        )
        assert not h.sched.wait(timeout=0.1)
        prep.futures[child].set_result(None)
        assert h.sched.wait(timeout=TIMEOUT)
        assert h.status(child) is RunStatus.COMPLETED
    finally:
        h.close()
    assert not h.fake.violations and h.sched.loop_error is None
