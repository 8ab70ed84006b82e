"""The IC Ops' bookkeeping: acknowledgements, leaders and followers, open ops and cancellation (pure, no thread).

Every op submitted to the scheduler gets one :class:`~kernel_scheduler.ops.OpAck`, kept here by op id, so the same
``op_id`` is answered once and a repeat gets the same answer. A stop / resume / delete that is queued or waiting
for its run's chunk boundary *leads* its ``(kind, run id)``: a second request of the same kind for the same run
*follows* it and gets its outcome (applied once). The ops of a run accepted and not answered yet are *open*,
oldest first; those the loop has begun to apply are no longer cancellable (:func:`~kernel_scheduler.ops.decide`
decides which a later op cancels).

Not locked: the scheduler calls it with its lock held and tells the listener, outside this class, about the
``(op, ack)`` pairs that :meth:`OpBook.settle` and :meth:`OpBook.follow` return. Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .op_kinds import OP_KINDS, OpKind
from .ops import Op, OpAck, OpState, PendingOp

__all__ = ["OpBook", "queued_message"]


class OpBook:
    """Acks by op id, leaders by ``(kind, run id)``, followers by leader, open ops by run (see the module)."""

    def __init__(self) -> None:
        self._acks: dict[str, OpAck] = {}
        # a stop/resume/delete that is queued or waiting for a chunk boundary, by (kind, run id) -> its op id
        self._leaders: dict[tuple[OpKind, int], str] = {}
        self._followers: dict[str, list[Op]] = {}
        # per run, the stop/resume/delete ops accepted and not answered yet, oldest first
        self._open: dict[int, list[Op]] = {}
        self._applying: set[str] = set()  # open ops the loop has begun to apply (no longer cancellable)

    def ack(self, op_id: str) -> OpAck | None:
        """The latest acknowledgement of ``op_id``, or None for an op never submitted."""
        return self._acks.get(op_id)

    def remember(self, ack: OpAck) -> None:
        """An answer given by an earlier process (the ops log after a restart): a later submission of its op id
        gets it back and is not applied again. An op id already known here keeps its own answer."""
        self._acks.setdefault(ack.op_id, ack)

    def answered(self, op_id: str) -> bool:
        """True once ``op_id`` is applied or rejected (a cancelled op is rejected: the loop skips it)."""
        ack = self._acks.get(op_id)
        return ack is not None and ack.state != OpState.QUEUED.value

    def leader(self, op: Op) -> str | None:
        """The op id of the pending op of ``op``'s kind and run that ``op`` would repeat, or None."""
        return self._leaders.get((op.kind, op.run_id))

    def answer_now(self, op: Op, state: OpState, message: str) -> OpAck:
        """Record ``op``'s final answer at submission (no run state was needed); returns the ack to tell."""
        ack = OpAck(op.op_id, op.run_id, op.kind.value, state.value, message)
        self._acks[op.op_id] = ack
        return ack

    def follow(self, op: Op, leader: str) -> OpAck:
        """``op`` repeats the pending op ``leader`` (same kind, same run): it will get its outcome."""
        ack = OpAck(
            op.op_id,
            op.run_id,
            op.kind.value,
            OpState.QUEUED.value,
            f"{op.kind.value} already requested for run {op.run_id}; this request gets its outcome",
        )
        self._acks[op.op_id] = ack
        self._followers.setdefault(leader, []).append(op)
        return ack

    def queue(self, op: Op, message: str, new_run_id: int | None = None) -> OpAck:
        """Accept ``op`` (QUEUED with ``message``); a stop / resume / delete leads its kind and run and is open."""
        ack = OpAck(op.op_id, op.run_id, op.kind.value, OpState.QUEUED.value, message, new_run_id=new_run_id)
        self._acks[op.op_id] = ack
        if OP_KINDS[op.kind].result is not None:  # a run op: it leads its kind and run, and is open
            self._leaders[(op.kind, op.run_id)] = op.op_id
            self._open.setdefault(op.run_id, []).append(op)
        return ack

    def with_message(self, op: Op, message: str) -> OpAck:
        """``op``'s ack with another message, to tell (e.g. a warm clone now waits for its parent); the ack kept
        for ``op_id`` is not changed."""
        return replace(self._acks[op.op_id], message=message)

    def pending_of(self, op: Op) -> list[PendingOp]:
        """The stop/resume/delete ops of ``op``'s run accepted before it and not answered yet, oldest first."""
        if OP_KINDS[op.kind].result is None:
            return []
        out = []
        for other in self._open.get(op.run_id, []):
            if other.op_id == op.op_id:
                break
            out.append(PendingOp(other.kind, other.op_id, cancellable=other.op_id not in self._applying))
        return out

    def open_ops(self, run_id: int, op_ids: Sequence[str]) -> list[Op]:
        """The open ops of run ``run_id`` among ``op_ids``, oldest first (those a later op cancels)."""
        return [o for o in self._open.get(run_id, []) if o.op_id in op_ids]

    def applying(self, op_id: str) -> None:
        """The loop has begun to apply ``op_id``: a later op can no longer cancel it."""
        self._applying.add(op_id)

    def exempt(self, run_id: int, policy_source: str) -> bool:
        """True while run ``run_id`` has an open op from someone other than ``policy_source`` (the early-stopping
        policy then leaves it alone: the user's op decides)."""
        return any(o.source != policy_source for o in self._open.get(run_id, ()))

    def settle(self, op: Op, state: OpState, message: str) -> list[tuple[Op, OpAck]]:
        """Answer ``op`` (APPLIED or REJECTED with ``message``) and the repeats that followed it; ``op`` is no
        longer open or leading. Returns the ``(op, ack)`` pairs to tell the listener, ``op``'s first."""
        prev = self._acks.get(op.op_id)
        if prev is None:
            ack = OpAck(op.op_id, op.run_id, op.kind.value, state.value, message)
        else:
            ack = replace(prev, state=state.value, message=message)
        self._acks[op.op_id] = ack
        out = [(op, ack)]
        if self._leaders.get((op.kind, op.run_id)) == op.op_id:
            del self._leaders[(op.kind, op.run_id)]
        still_open = [o for o in self._open.get(op.run_id, []) if o.op_id != op.op_id]
        if still_open:
            self._open[op.run_id] = still_open
        else:
            self._open.pop(op.run_id, None)
        self._applying.discard(op.op_id)
        for f in self._followers.pop(op.op_id, []):
            ack = replace(self._acks[f.op_id], state=state.value, message=message)
            self._acks[f.op_id] = ack
            out.append((f, ack))
        return out


def queued_message(op: Op, on_device: bool) -> str:
    """What a queued op's ack says will happen and when (``on_device``: its run is training right now)."""
    return OP_KINDS[op.kind].queued.format(
        run_id=op.run_id,
        when="at the end of its current chunk" if on_device else "now",
        how=(
            "warm start from its latest chunk boundary or final state"
            if op.payload.get("warm_start")
            else "from scratch"
        ),
        child_id=op.payload.get("child_id"),
    )
