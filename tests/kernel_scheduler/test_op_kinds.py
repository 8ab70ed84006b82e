"""The op-kind table (kernel_scheduler.op_kinds) is what decide, the op book and the applier follow."""

from __future__ import annotations

import pytest

from kernel_scheduler import OP_KINDS, Op, OpKind, RunStatus, decide
from kernel_scheduler.op_book import queued_message
from kernel_scheduler.op_kinds import either, front_end_table, run_kinds


def test_every_kind_has_one_row_in_enum_order() -> None:
    assert list(OP_KINDS) == list(OpKind)
    assert all(info.kind is kind and info.name == kind.value for kind, info in OP_KINDS.items())
    assert run_kinds() == (OpKind.STOP, OpKind.RESUME, OpKind.DELETE)
    assert [k for k, info in OP_KINDS.items() if info.takes_changes] == [OpKind.CLONE]


@pytest.mark.parametrize("kind", list(OpKind))
@pytest.mark.parametrize("status", [s for s in RunStatus if s is not RunStatus.DELETED])
def test_decide_allows_exactly_the_allowed_statuses(kind: OpKind, status: RunStatus) -> None:
    verdict = decide(kind, status, False, 1).verdict
    assert (verdict != "reject") == (status in OP_KINDS[kind].allowed)


def test_refusals_are_worded_from_the_table() -> None:
    assert either((RunStatus.STOPPED,)) == "STOPPED"
    assert decide(OpKind.STOP, RunStatus.COMPLETED, False, 3).reason == (
        "run 3 is COMPLETED; only NEW, ONGOING or INTERRUPTED runs can be stopped"
    )
    assert decide(OpKind.RESUME, RunStatus.ONGOING, False, 2).reason == (
        "run 2 is ONGOING; only STOPPED or INTERRUPTED runs can be resumed"
    )


@pytest.mark.parametrize(
    ("kind", "on_device", "verdict"),
    [(OpKind.STOP, True, "defer"), (OpKind.DELETE, True, "defer"), (OpKind.STOP, False, "apply")],
)
def test_at_boundary_kinds_wait_for_a_training_run(kind: OpKind, on_device: bool, verdict: str) -> None:
    assert decide(kind, RunStatus.ONGOING, on_device, 1).verdict == verdict


def test_queued_messages_fill_the_table_templates() -> None:
    assert (
        queued_message(Op(OpKind.STOP, 2), True)
        == "stop requested for run 2 — applies at the end of its current chunk"
    )
    assert (
        queued_message(Op(OpKind.RESUME, 2), False)
        == "resume requested for run 2 — it rejoins the rotation now"
    )
    assert queued_message(Op(OpKind.DELETE, 4), False) == "delete requested for run 4 — applies now"
    clone = Op(OpKind.CLONE, 1, payload={"warm_start": True, "child_id": 5})
    assert queued_message(clone, False) == (
        "clone of run 1 requested (warm start from its latest chunk boundary or final state) — run 5 joins the rotation at the "
        "next chunk boundary"
    )


def test_front_end_table_carries_what_the_buttons_show() -> None:
    table = front_end_table()
    assert [row["name"] for row in table] == [k.value for k in OpKind]
    assert table[3] == {
        "name": "clone",
        "label": "Clone…",
        "title": "Start a new run from this one's config, with changes",
        "takes_changes": True,
        "requested": "clone of run {run_id} requested — the new run joins at the next chunk boundary",
    }
