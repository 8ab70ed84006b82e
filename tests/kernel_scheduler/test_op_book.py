"""The op book (kernel_scheduler.op_book): acks, leaders and followers, open ops, cancellation, without a thread."""

from __future__ import annotations

from kernel_scheduler import EARLY_STOPPING, Op, OpKind, OpState, PendingOp
from kernel_scheduler.op_book import OpBook, queued_message


def _op(kind: OpKind, run_id: int = 1, op_id: str = "", source: str = "api") -> Op:
    return Op(kind, run_id, op_id=op_id or f"{kind.value}-{run_id}", source=source)


def test_a_queued_stop_leads_and_its_repeat_gets_its_outcome() -> None:
    book = OpBook()
    stop, again = _op(OpKind.STOP, op_id="a"), _op(OpKind.STOP, op_id="b")
    assert book.queue(stop, "queued").state == OpState.QUEUED.value
    assert book.leader(again) == "a"
    assert book.follow(again, "a").state == OpState.QUEUED.value
    told = book.settle(stop, OpState.APPLIED, "run 1 stopped at step 4")
    assert [(op.op_id, ack.state, ack.message) for op, ack in told] == [
        ("a", "applied", "run 1 stopped at step 4"),
        ("b", "applied", "run 1 stopped at step 4"),
    ]
    assert book.leader(again) is None
    assert book.answered("a") and book.answered("b")
    assert book.settle(again, OpState.APPLIED, "x")[1:] == []  # a follower has no followers of its own


def test_pending_ops_are_the_earlier_open_ones_and_applying_ones_cannot_be_cancelled() -> None:
    book = OpBook()
    stop, resume, delete = (
        _op(OpKind.STOP, op_id="s"),
        _op(OpKind.RESUME, op_id="r"),
        _op(OpKind.DELETE, op_id="d"),
    )
    for op in (stop, resume, delete):
        book.queue(op, "queued")
    book.applying("s")
    assert book.pending_of(delete) == [
        PendingOp(OpKind.STOP, "s", False),
        PendingOp(OpKind.RESUME, "r", True),
    ]
    assert book.pending_of(stop) == []
    assert [o.op_id for o in book.open_ops(1, ["r", "d", "zz"])] == ["r", "d"]
    book.settle(resume, OpState.REJECTED, "cancelled")
    assert book.pending_of(delete) == [PendingOp(OpKind.STOP, "s", False)]
    assert book.ack("r") is not None and book.ack("r").state == "rejected"  # type: ignore[union-attr]


def test_clones_neither_lead_nor_stay_open_and_keep_their_child_id() -> None:
    book = OpBook()
    clone = _op(OpKind.CLONE, op_id="c")
    ack = book.queue(clone, "queued", new_run_id=7)
    assert book.leader(_op(OpKind.CLONE, op_id="c2")) is None
    assert book.pending_of(_op(OpKind.STOP, op_id="s")) == []
    assert book.with_message(clone, "waits").message == "waits"
    assert book.ack("c") == ack  # telling another message does not change the kept ack
    (_, settled), *_ = book.settle(clone, OpState.REJECTED, "boom")
    assert (settled.state, settled.message, settled.new_run_id) == ("rejected", "boom", 7)


def test_a_user_op_exempts_its_run_from_the_policy_until_answered() -> None:
    book = OpBook()
    policy_stop = _op(OpKind.STOP, op_id="p", source=EARLY_STOPPING)
    book.queue(policy_stop, "queued")
    assert not book.exempt(1, EARLY_STOPPING)
    resume = _op(OpKind.RESUME, op_id="u", source="panel")
    book.queue(resume, "queued")
    assert book.exempt(1, EARLY_STOPPING)
    book.settle(resume, OpState.APPLIED, "resumed")
    assert not book.exempt(1, EARLY_STOPPING) and not book.exempt(2, EARLY_STOPPING)


def test_answers_given_at_once_are_final_and_unknown_ops_are_not_answered() -> None:
    book = OpBook()
    op = _op(OpKind.RESUME, op_id="x")
    assert not book.answered("x") and book.ack("x") is None
    ack = book.answer_now(op, OpState.REJECTED, "run 1 is COMPLETED")
    assert (ack.state, book.answered("x"), book.leader(op)) == ("rejected", True, None)


def test_queued_messages_say_when() -> None:
    assert (
        queued_message(_op(OpKind.STOP), True)
        == "stop requested for run 1 — applies at the end of its current chunk"
    )
    assert queued_message(_op(OpKind.DELETE), False) == "delete requested for run 1 — applies now"
    clone = Op(OpKind.CLONE, 2, payload={"warm_start": True, "child_id": 5})
    assert queued_message(clone, False) == (
        "clone of run 2 requested (warm start from its latest chunk boundary or final state) — run 5 joins the rotation at the "
        "next chunk boundary"
    )
