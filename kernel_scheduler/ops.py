"""IC Ops (stop, resume, delete, clone) and the pure rules that decide their fate.

Semantics (also in the README):

* Ops are applied by the scheduler thread at the run's next chunk boundary, immediately if the run is not
  on the device. One command queue, one writer; every op gets an outcome (applied / rejected + reason).
* stop: NEW/ONGOING/INTERRUPTED -> STOPPED. resume: STOPPED/INTERRUPTED -> ONGOING. delete: any status but
  DELETED -> DELETED. clone: any status but DELETED; the new run starts NEW.
* Everything else is rejected with a reason, never a crash of the loop.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .status import RunStatus

__all__ = ["OpKind", "OpState", "Op", "OpAck", "Decision", "decide", "new_op_id"]


class OpKind(str, Enum):
    STOP = "stop"
    RESUME = "resume"
    DELETE = "delete"
    CLONE = "clone"


class OpState(str, Enum):
    QUEUED = "queued"
    APPLIED = "applied"
    REJECTED = "rejected"


def new_op_id() -> str:
    """A fresh op id (uuid4 hex)."""
    return uuid.uuid4().hex


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
    """Outcome of :func:`decide`: ``apply`` now, ``defer`` to the run's next chunk boundary, or reject."""

    verdict: str  # "apply" | "defer" | "reject"
    reason: str = ""


_STOPPABLE = (RunStatus.NEW, RunStatus.ONGOING, RunStatus.INTERRUPTED)
_RESUMABLE = (RunStatus.STOPPED, RunStatus.INTERRUPTED)


def decide(kind: OpKind, status: RunStatus | None, on_device: bool, run_id: int) -> Decision:
    """Decide what happens to an op on a run with ``status`` (``None``: the run does not exist).

    Args:
        kind: the op.
        status: the target run's status, or ``None`` for an unknown run id.
        on_device: whether the run is training right now (its op then waits for the chunk boundary).
        run_id: for messages.

    Returns:
        A :class:`Decision`. Pure: no side effects.
    """
    if status is None:
        return Decision("reject", f"run {run_id} does not exist")
    if status is RunStatus.DELETED:
        return Decision("reject", f"run {run_id} is DELETED")
    if kind is OpKind.STOP and status not in _STOPPABLE:
        return Decision(
            "reject", f"run {run_id} is {status.value}; only NEW, ONGOING or INTERRUPTED runs can be stopped"
        )
    if kind is OpKind.RESUME and status not in _RESUMABLE:
        return Decision(
            "reject", f"run {run_id} is {status.value}; only STOPPED or INTERRUPTED runs can be resumed"
        )
    if on_device and kind in (OpKind.STOP, OpKind.DELETE):
        return Decision("defer", f"applies at the end of run {run_id}'s current chunk")
    return Decision("apply")
