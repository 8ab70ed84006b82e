"""IC Ops (stop, resume, delete, clone) and the pure rules that decide their fate.

Semantics (also in the README):

* Ops are applied by the scheduler thread at the run's next chunk boundary, immediately if the run is not
  on the device. One command queue, one writer; every op gets an outcome (applied / rejected + reason).
* stop: NEW/ONGOING/INTERRUPTED -> STOPPED. resume: STOPPED/INTERRUPTED -> ONGOING. delete: any status but
  DELETED -> DELETED. clone: any status but DELETED; the new run starts NEW. Each kind is described once, in
  :data:`kernel_scheduler.op_kinds.OP_KINDS`; :func:`decide` reads it.
* The later request wins: a stop, resume or delete of a run cancels the earlier stop / resume / delete of that
  run (of another kind) that has not taken effect yet — queued, or waiting for the run's chunk boundary. The
  cancelled op is rejected ("cancelled by op <id>"); when the run is then already where the later op would
  take it (a resume while a stop waited: the run keeps training), the later op is applied at once with nothing
  left to do. A repeat of the same kind while the first waits gets the first one's outcome (the scheduler).
* Everything else is rejected with a reason, never a crash of the loop.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .op_kinds import OP_KINDS, OpKind, either
from .status import RunStatus

__all__ = [
    "OpKind",
    "OpState",
    "Op",
    "OpAck",
    "Decision",
    "PendingOp",
    "decide",
    "expected_status",
    "new_op_id",
    "OP_ID_PATTERN",
    "OP_ID_RULE",
]


class OpState(str, Enum):
    QUEUED = "queued"
    APPLIED = "applied"
    REJECTED = "rejected"


def new_op_id() -> str:
    """A fresh op id (uuid4 hex)."""
    return uuid.uuid4().hex


OP_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}")
"""What an op id a caller gives must match (the kernel API and REST alike): 1-128 characters, letters, digits,
``_ . : -``, starting with a letter or digit (a uuid is fine)."""

OP_ID_RULE = "op_id must be 1-128 characters: letters, digits, '_', '.', ':', '-' (a uuid is fine)"
"""The sentence that refuses an op id not matching :data:`OP_ID_PATTERN`."""


@dataclass
class Op:
    """One IC Op request.

    Attributes:
        kind: what to do.
        run_id: the run it targets (for clone: the parent).
        op_id: idempotency key; the same id is applied once.
        payload: kind-specific data (clone: ``changes``, ``warm_start``, ``child_id``, ``config``).
        source: who asked (``api``, ``panel``, ``magic``, ``inbox``).
        requested_at: unix seconds.
    """

    kind: OpKind
    run_id: int
    op_id: str = field(default_factory=new_op_id)
    payload: dict[str, Any] = field(default_factory=dict)
    source: str = "api"
    requested_at: float = field(default_factory=time.time)


@dataclass
class OpAck:
    """What the caller of an op gets back at once (and what the ops log shows later).

    Attributes:
        op_id, run_id, kind: the op.
        state: ``queued``, ``applied`` or ``rejected``.
        message: a sentence saying what will happen and when, or why it was rejected.
        new_run_id: for clone, the new run's id.
    """

    op_id: str
    run_id: int
    kind: str
    state: str
    message: str
    new_run_id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "op_id": self.op_id,
            "run_id": self.run_id,
            "kind": self.kind,
            "state": self.state,
            "message": self.message,
            "new_run_id": self.new_run_id,
        }

    def __repr__(self) -> str:
        return f"OpAck({self.kind} run {self.run_id}: {self.state} — {self.message})"


@dataclass(frozen=True)
class Decision:
    """Outcome of :func:`decide`.

    Attributes:
        verdict: ``apply`` now, ``defer`` to the run's next chunk boundary, ``reject``, or ``done``: the run is
            already where the op would take it once the ops it cancels are gone (the op is applied, nothing
            changes).
        reason: why (reject), when (defer), or what the op achieved (done).
        cancels: op ids of the earlier pending ops of the run that this op cancels (the later request wins).
    """

    verdict: str  # "apply" | "defer" | "reject" | "done"
    reason: str = ""
    cancels: tuple[str, ...] = ()


@dataclass(frozen=True)
class PendingOp:
    """An earlier stop / resume / delete of the same run that has not taken effect yet.

    Attributes:
        kind: what it does.
        op_id: its id.
        cancellable: False once the scheduler has begun applying it (a later op can no longer cancel it).
    """

    kind: OpKind
    op_id: str
    cancellable: bool = True


def expected_status(status: RunStatus, pending: Sequence[OpKind]) -> RunStatus:
    """The run's status once the ``pending`` stop / resume / delete ops (oldest first) have taken effect."""
    for kind in pending:
        status = OP_KINDS[kind].result or status
    return status


def decide(
    kind: OpKind,
    status: RunStatus | None,
    on_device: bool,
    run_id: int,
    pending: Sequence[PendingOp] = (),
) -> Decision:
    """Decide what happens to an op on a run with ``status`` (``None``: the run does not exist).

    Args:
        kind: the op.
        status: the target run's status, or ``None`` for an unknown run id.
        on_device: whether the run is training right now (its op then waits for the chunk boundary).
        run_id: for messages.
        pending: the run's earlier stop / resume / delete ops that have not taken effect yet, oldest first
            (not counting repeats of this op's kind, which follow their first request).

    Returns:
        A :class:`Decision`. Pure: no side effects. A stop / resume / delete cancels the cancellable pending
        ops of the other two kinds and is judged against the status the rest would leave.
    """
    if status is None:
        return Decision("reject", f"run {run_id} does not exist")
    if status is RunStatus.DELETED:
        return Decision("reject", f"run {run_id} is DELETED")
    info = OP_KINDS[kind]
    if info.result is None:  # not a run op (clone): it leaves the run as it is
        return Decision("apply")
    cancelled = [p for p in pending if p.cancellable and p.kind is not kind]
    cancels = tuple(p.op_id for p in cancelled)
    status = expected_status(status, [p.kind for p in pending if p.op_id not in cancels])
    if status is RunStatus.DELETED:
        return Decision("reject", f"run {run_id} is being deleted (its delete is applying)")
    if cancels and status in info.settled:
        what = " and ".join(sorted({p.kind.value for p in cancelled}))
        where = {RunStatus.STOPPED: "stays STOPPED", RunStatus.ONGOING: "keeps training"}.get(
            status, "stays in the rotation"
        )
        return Decision("done", f"run {run_id} {where}: its pending {what} is cancelled", cancels)
    if status not in info.allowed:
        return Decision(
            "reject", f"run {run_id} is {status.value}; only {either(info.allowed)} runs can be {info.past}"
        )
    if on_device and info.at_boundary:
        return Decision("defer", f"applies at the end of run {run_id}'s current chunk", cancels)
    return Decision("apply", "", cancels)
