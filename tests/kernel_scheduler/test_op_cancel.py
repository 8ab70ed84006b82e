"""The later request wins: a stop / resume / delete cancels an earlier one of the run that has not taken effect.

Pure rules (``ops.decide`` with the run's pending ops) and the scheduler driven step by step with the fake
executor (manual mode: the segment in flight ends only when the test says so).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kernel_scheduler import Op, OpKind, RunStatus, decide
from kernel_scheduler.ops import PendingOp, expected_status
from rapidfire_nb.testing.fakes import FakeSpec, Harness

STOP, RESUME, DELETE, CLONE = OpKind.STOP, OpKind.RESUME, OpKind.DELETE, OpKind.CLONE
ONGOING, STOPPED = RunStatus.ONGOING, RunStatus.STOPPED


# ------------------------------------------------------------------------------------------------ pure rules
def test_expected_status_folds_the_pending_ops() -> None:
    assert expected_status(ONGOING, []) is ONGOING
    assert expected_status(ONGOING, [STOP]) is STOPPED
    assert expected_status(ONGOING, [STOP, RESUME]) is ONGOING
    assert expected_status(STOPPED, [DELETE]) is RunStatus.DELETED
    assert expected_status(ONGOING, [CLONE]) is ONGOING


@pytest.mark.parametrize(
    ("kind", "status", "on_device", "pending", "verdict", "cancels", "reason"),
    [
        # a resume while the run's stop waits for its boundary: the stop is cancelled, the run keeps training
        (
            RESUME,
            ONGOING,
            True,
            [PendingOp(STOP, "s")],
            "done",
            ("s",),
            "run 1 keeps training: its pending stop",
        ),
        # ... but not one the loop is applying already: the resume then follows it
        (RESUME, ONGOING, False, [PendingOp(STOP, "s", cancellable=False)], "apply", (), ""),
        (STOP, ONGOING, True, [PendingOp(DELETE, "d")], "defer", ("d",), "end of run 1's current chunk"),
        (DELETE, ONGOING, True, [PendingOp(STOP, "s")], "defer", ("s",), "end of run 1's current chunk"),
        (
            RESUME,
            ONGOING,
            True,
            [PendingOp(DELETE, "d")],
            "done",
            ("d",),
            "keeps training: its pending delete",
        ),
        (STOP, STOPPED, False, [PendingOp(RESUME, "r")], "done", ("r",), "run 1 stays STOPPED"),
        (RESUME, STOPPED, False, [PendingOp(DELETE, "d")], "apply", ("d",), ""),
        (RESUME, RunStatus.NEW, False, [PendingOp(STOP, "s")], "done", ("s",), "stays in the rotation"),
        (
            RESUME,
            ONGOING,
            False,
            [PendingOp(STOP, "s"), PendingOp(DELETE, "d")],
            "done",
            ("s", "d"),
            "pending delete and stop is cancelled",
        ),
        (RESUME, STOPPED, False, [PendingOp(DELETE, "d", cancellable=False)], "reject", (), "being deleted"),
        (CLONE, ONGOING, True, [PendingOp(STOP, "s")], "apply", (), ""),
        # nothing pending: the rules as before
        (RESUME, ONGOING, False, [], "reject", (), "only STOPPED or INTERRUPTED runs can be resumed"),
        (STOP, STOPPED, False, [], "reject", (), "only NEW, ONGOING or INTERRUPTED runs can be stopped"),
    ],
)
def test_decide_with_pending_ops(
    kind: OpKind,
    status: RunStatus,
    on_device: bool,
    pending: list[PendingOp],
    verdict: str,
    cancels: tuple[str, ...],
    reason: str,
) -> None:
    d = decide(kind, status, on_device, 1, pending)
    assert (d.verdict, d.cancels) == (verdict, cancels)
    assert reason in d.reason


# ------------------------------------------------------------------------------------------------ the scheduler
ONE = FakeSpec(rows=16, batch=4)  # 4 steps, 2 chunks (boundaries 2, 4)


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness([ONE, ONE], mode="manual")
    harness.fake.wait_inflight()  # run 1 trains its first chunk
    yield harness
    harness.close()


def _log(h: Harness, op: Op) -> dict[str, object]:
    return h.rec.ops_log[op.op_id]


def test_stop_then_resume_within_one_chunk_keeps_the_run_training(h: Harness) -> None:
    stop, resume = Op(STOP, 1), Op(RESUME, 1)
    assert h.sched.submit(stop).state == "queued"
    h.settle()
    ack = h.sched.submit(resume)
    assert ack.state == "applied" and "run 1 keeps training: its pending stop is cancelled" in ack.message
    assert _log(h, stop)["state"] == "rejected"
    assert f"cancelled by op {resume.op_id}: a later resume of run 1" in str(_log(h, stop)["message"])
    assert _log(h, resume)["state"] == "applied"
    h.run_to_idle()
    assert h.status(1) is RunStatus.COMPLETED
    assert h.fake.calls_of(1) == [2, 4]
    assert h.fake.statuses(1) == ["COMPLETED"]  # never stopped (no final save as STOPPED)


def test_stop_then_resume_of_every_run_in_a_script_does_not_end_training() -> None:
    h = Harness([ONE], mode="thread")
    try:
        h.fake.wait_inflight()
        h.sched.submit(Op(STOP, 1))
        h.sched.submit(Op(RESUME, 1))
        assert h.sched.wait(timeout=5)  # what a blocking run_fit waits for
        snap = h.sched.run_snapshot(1)
        assert snap is not None and snap.status is RunStatus.COMPLETED and snap.step == 4
    finally:
        h.close()


def test_stop_then_delete_deletes_without_stopping(h: Harness) -> None:
    stop, delete = Op(STOP, 1), Op(DELETE, 1)
    h.sched.submit(stop)
    ack = h.sched.submit(delete)
    assert ack.state == "queued" and "it cancels the pending stop" in ack.message
    assert _log(h, stop)["state"] == "rejected"
    h.step()
    assert h.status(1) is RunStatus.DELETED
    assert _log(h, delete)["state"] == "applied"
    assert h.fake.statuses(1) == ["DELETED"]


def test_delete_then_resume_keeps_the_run(h: Harness) -> None:
    delete, resume = Op(DELETE, 1), Op(RESUME, 1)
    h.sched.submit(delete)
    h.settle()
    assert h.sched.submit(resume).state == "applied"
    assert "cancelled by op" in str(_log(h, delete)["message"])
    h.run_to_idle()
    assert h.status(1) is RunStatus.COMPLETED


def test_delete_then_stop_stops(h: Harness) -> None:
    delete, stop = Op(DELETE, 1), Op(STOP, 1)
    h.sched.submit(delete)
    h.sched.submit(stop)
    h.step()
    assert h.status(1) is RunStatus.STOPPED
    assert (_log(h, delete)["state"], _log(h, stop)["state"]) == ("rejected", "applied")


def test_stop_resume_stop_ends_stopped_and_repeats_share_the_cancellation(h: Harness) -> None:
    first, repeat, resume, again = Op(STOP, 1), Op(STOP, 1), Op(RESUME, 1), Op(STOP, 1)
    h.sched.submit(first)
    h.sched.submit(repeat)  # follows the first stop
    h.sched.submit(resume)
    assert [_log(h, o)["state"] for o in (first, repeat, resume)] == ["rejected", "rejected", "applied"]
    assert h.sched.submit(again).state == "queued"
    h.step()
    assert h.status(1) is RunStatus.STOPPED
    assert _log(h, again)["state"] == "applied"
    assert h.rec.states(first.op_id) == ["queued", "rejected"]  # one outcome each
    assert h.rec.states(repeat.op_id) == ["queued", "rejected"]


def test_ops_on_parked_runs_before_start_follow_the_same_rule() -> None:
    h = Harness([ONE, ONE], mode="manual", start=False)
    try:
        stop, resume = Op(STOP, 2), Op(RESUME, 2)
        h.sched.submit(stop)
        assert h.sched.submit(resume).state == "applied"  # run 2 never leaves the rotation
        h.sched.start()
        h.run_to_idle()
        assert h.status(2) is RunStatus.COMPLETED
        assert _log(h, stop)["state"] == "rejected"
    finally:
        h.close()
