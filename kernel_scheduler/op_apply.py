"""Applying IC Ops on the scheduler thread: stop, resume, delete and clone, at the run's chunk boundary.

:func:`~kernel_scheduler.ops.decide` says what an op does given its run's status, whether the run is training and
the run's earlier open ops; :class:`OpApplier` carries it out: it cancels the ops a later one replaces, defers a
stop or delete of a run in flight to its chunk boundary, changes the run's status and queues the executor's status
call for the run's device (final weights are saved there once no segment trains), and hands clones to the
:class:`~kernel_scheduler.clone_builder.CloneBuilder` (which prepares them off the loop, then builds them). A failing op is rejected with its error; it never takes the
loop down. Standard library only.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable, Sequence
from functools import partial

from .clone_builder import CloneBuilder
from .core import SchedulerCore
from .early_stopping import EARLY_STOPPING
from .op_book import queued_message
from .op_kinds import OP_KINDS, OpKind
from .ops import Decision, Op, OpAck, OpState, decide
from .runs import Run
from .status import RunStatus

__all__ = ["OpApplier"]

log = logging.getLogger(__name__)


class OpApplier:
    """Applies ops to runs (see the module).

    Args:
        core: the scheduler's shared state.
        clones: builds a clone op's child.
    """

    def __init__(self, core: SchedulerCore, clones: CloneBuilder) -> None:
        self._core = core
        self._clones = clones
        self._commands: queue.Queue[Op] = queue.Queue()  # accepted ops, applied by drain() in order

    def accept(self, op: Op) -> tuple[OpAck, bool]:
        """``submit``'s bookkeeping: ``op``'s acknowledgement, and True when it was queued for :meth:`drain`.

        A repeat of an ``op_id`` gets its first answer; a repeat of a pending stop / resume / delete of the same
        run follows it; what needs no run state (unknown or DELETED run, illegal status, a halted scheduler) is
        answered at once; a clone's child run exists, NEW and pending, from now on.
        """
        core, book = self._core, self._core.book
        with core.lock:
            known = book.ack(op.op_id)
            if known is not None:
                return known, False
            leader = book.leader(op)
            run = core.runs.get(op.run_id)
            if core.halted is not None:  # a write to disk failed: nothing more is applied
                ack = book.answer_now(op, OpState.REJECTED, core.halted)
            elif (
                leader is not None
            ):  # a repeat while the first request is pending: same outcome, applied once
                ack = book.follow(op, leader)
            else:
                decision = decide(op.kind, run.status if run else None, False, op.run_id, book.pending_of(op))
                cancelled = self.cancel(decision.cancels, op)
                if decision.verdict in ("reject", "done"):
                    state = OpState.REJECTED if decision.verdict == "reject" else OpState.APPLIED
                    ack = book.answer_now(op, state, decision.reason)
                else:
                    ack = self._queue(op, cancelled)
            queued = ack.state == OpState.QUEUED.value and leader is None
            if queued:
                core.busy = True
                core.unapplied += 1
            else:
                core.tell(op, ack)
                return ack, False
        core.tell(op, ack)
        self._commands.put(op)
        return ack, True

    def drain(self) -> None:
        """Build the clones whose preparation finished, then apply every op accepted so far, in order (scheduler
        thread)."""
        self._clones.collect()
        while True:
            try:
                op = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                self.apply(op)
            finally:
                with self._core.lock:
                    self._core.unapplied -= 1

    def _queue(self, op: Op, cancelled: str) -> OpAck:
        """Queue ``op`` (lock held); a clone's child run exists, NEW and pending, from now on."""
        core = self._core
        child_id = None
        if OP_KINDS[op.kind].takes_changes:  # a clone: its new run
            child = core.new_run(
                op.payload.get("spec"), parent_id=op.run_id, warm_start=bool(op.payload.get("warm_start"))
            )
            child_id = op.payload["child_id"] = child.run_id
        message = queued_message(op, core.slots.running(op.run_id))
        message += f" (it cancels the pending {cancelled})" if cancelled else ""
        return core.book.queue(op, message, new_run_id=child_id)

    def status_call(self, run_id: int, status: RunStatus) -> Callable[[], None]:
        """The executor's ``on_status`` call for ``run_id`` becoming ``status``, to queue for its device."""
        return partial(self._core.executor.on_status, run_id, status.value)

    def cancel(self, op_ids: Sequence[str], by: Op) -> str:
        """Answer the open ops ``op_ids`` rejected, cancelled by the later op ``by``; returns what they were
        (e.g. ``"stop (op 3f2a…)"``). A cancelled op is never applied: the loop skips answered ops."""
        core = self._core
        names = []
        for op in core.book.open_ops(by.run_id, op_ids):
            run = core.runs.get(op.run_id)
            if run is not None and op in run.deferred:
                run.deferred.remove(op)
            core.reject(
                op,
                f"cancelled by op {by.op_id}: a later {by.kind.value} of run {by.run_id} replaced this "
                f"{op.kind.value} before it took effect",
            )
            names.append(f"{op.kind.value} (op {op.op_id[:8]})")
        return ", ".join(names)

    def apply(self, op: Op) -> None:
        """Apply queued ``op`` now, or defer it to its run's chunk boundary (a stop or delete of a run in flight).

        An op answered meanwhile (cancelled by a later op) is skipped.
        """
        core = self._core
        with core.lock:
            if core.book.answered(op.op_id):
                return  # answered meanwhile (cancelled by a later op): never applied
            run = core.runs.get(op.run_id)
            on_device = core.slots.running(op.run_id)
            decision = decide(
                op.kind, run.status if run else None, on_device, op.run_id, core.book.pending_of(op)
            )
            self.cancel(decision.cancels, op)
            if decision.verdict == "defer" and run is not None:
                run.deferred.append(op)
                return
            core.book.applying(op.op_id)
        if decision.verdict in ("reject", "done"):
            self._settle(op, decision)
            return
        try:
            self._apply_now(op)
        except Exception as exc:  # a bad op never crashes the loop
            log.debug("op %s failed", op.op_id, exc_info=True)
            self._clones.reject_op(op, f"{type(exc).__name__}: {exc}")

    def _settle(self, op: Op, decision: Decision) -> None:
        if decision.verdict == "done":
            self._core.resolved(op, decision.reason)
        else:
            self._clones.reject_op(op, decision.reason)

    def _apply_now(self, op: Op) -> None:
        """Carry out ``op`` (its decision was ``apply``): each kind's own step, then the run's new status goes to
        the executor on the run's device and the op is answered with its kind's ``applied`` message."""
        core = self._core
        with core.lock:
            run = core.runs[op.run_id]
        if op.kind is OpKind.CLONE:  # prepared off the loop, then built on its device between segments
            self._clones.request(op)
            # the parent is unchanged, so not emitted: a finished run restored from the store has no chunk plan,
            # and its snapshot (epoch 0.0) would overwrite its stored row
            with core.lock:
                core.changed.notify_all()
            return
        info = OP_KINDS[op.kind]
        assert info.result is not None, op.kind
        with core.lock:
            core.set_status(run, info.result)
            why = _AFTER.get(op.kind, _nothing_more)(run, op)
        message = info.applied.format(run_id=run.run_id, step=run.step) + (f": {why}" if why else "")
        core.when_free(self.status_call(run.run_id, run.status), run.device)
        core.resolved(op, message)
        core.emit(run)


def _after_stop(run: Run, op: Op) -> str:
    """A stopped run remembers who stopped it and why; returns the stop's own reason (the early-stopping policy's,
    or a bulk stop's: ``"stop all but best 2 by eval_loss"``), if any."""
    by_policy = op.source == EARLY_STOPPING
    why = str(op.payload.get("reason") or "")
    run.pruned = by_policy
    run.stop_reason = why or (
        "stopped by early stopping" if by_policy else f"stopped by the user ({op.source})"
    )
    return why


def _after_resume(run: Run, op: Op) -> str:
    """A resumed run is no longer pruned; the user's own resume wins over the policy for the chunks done."""
    if run.pruned and op.source != EARLY_STOPPING:
        run.exempt_through = run.chunks(run.segments_done)
    run.pruned, run.stop_reason = False, None
    return ""


def _nothing_more(run: Run, op: Op) -> str:
    """A run op that changes only the run's status (delete)."""
    return ""


#: What a run op changes besides the run's status (lock held); returns the text added to its applied message. A kind
#: missing here changes the status only.
_AFTER: dict[OpKind, Callable[[Run, Op], str]] = {OpKind.STOP: _after_stop, OpKind.RESUME: _after_resume}
