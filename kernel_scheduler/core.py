"""What the scheduler's parts share: the runs, one lock, the op book, the executor, the device slots, the listener.

:class:`~kernel_scheduler.loop.Scheduler` (the turn loop and the public API), the
:class:`~kernel_scheduler.roster.DeviceRoster` (placement, lost devices, moves), the
:class:`~kernel_scheduler.clone_builder.CloneBuilder` and the
:class:`~kernel_scheduler.consultation.Consultation` (early stopping) each own one job and share this one
object, so that run state has one home. Runs change only on the scheduler thread (after ``start``); other threads
read :class:`~kernel_scheduler.runs.RunSnapshot` copies taken under :attr:`SchedulerCore.lock`. Listener calls
never raise into the loop: a failing hook is logged. Standard library only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .executor import Executor, RunStart, SegmentResult
from .op_book import OpBook
from .ops import Op, OpAck, OpState
from .runs import Run, RunSnapshot, SchedulerListener
from .slots import DeviceSlots
from .status import RunStatus, check_transition

__all__ = ["SchedulerCore"]

log = logging.getLogger(__name__)


class SchedulerCore:
    """The shared state of one scheduler (see the module).

    Args:
        executor: trains the runs (called on the scheduler thread only, after ``start``).
        listener: the hooks told about runs, ops and notes.
        slots: segments in flight, leases and boundary actions per device.
        first_run_id: the id the first run added mid-experiment gets when no run is registered yet.

    Attributes:
        runs: run id -> its mutable record (the scheduler thread changes it, under :attr:`lock`).
        lock: guards ``runs``, the op book and the flags below; re-entrant.
        changed: notified whenever a run or the loop's idleness changes (``Scheduler.wait`` waits on it).
        book: the ops' acks, leaders, followers and open ops.
        next_id: the id the next clone or new trial gets.
        busy: True while the loop has work (a segment or queued commands).
        unapplied: ops accepted by ``submit`` whose apply has not returned yet (a deferred op counts as applied:
            it then waits on the run in flight), and the clones whose preparation runs off the loop
            (``Executor.prepare_run``) until they are built. The command queue's size alone is not enough:
            ``submit`` puts an op on it after releasing the lock, and the loop takes it off before applying it.
        halted: why training stopped for good (``Scheduler.halt``); None while it goes on.
        loop_error: traceback of an unexpected error of the loop or of a boundary action (shown to the user).
    """

    def __init__(
        self, executor: Executor, listener: SchedulerListener, slots: DeviceSlots, first_run_id: int = 1
    ) -> None:
        self.executor = executor
        self.listener = listener
        self.slots = slots
        self.runs: dict[int, Run] = {}
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.book = OpBook()
        self.next_id = first_run_id
        self.busy = False
        self.unapplied = 0
        self.halted: str | None = None
        self.loop_error: str | None = None

    # ------------------------------------------------------------------ runs
    def new_run(self, spec: object, parent_id: int | None = None, warm_start: bool = False) -> Run:
        """A NEW run with the next free id, registered and ``pending`` (not ready until it is built)."""
        run = Run(run_id=self.next_id, spec=spec, parent_id=parent_id, warm_start=warm_start, pending=True)
        self.next_id += 1
        self.runs[run.run_id] = run
        return run

    @staticmethod
    def set_status(run: Run, new: RunStatus) -> None:
        """Change ``run``'s status. Raises :class:`~kernel_scheduler.status.IllegalTransition` for a move the
        status machine forbids."""
        check_transition(run.status, new)
        run.status = new

    def register(self, run: Run, start: RunStart | None, progress: tuple[int, int, int, int] | None) -> None:
        """Add ``run`` (before the loop starts): placed at ``start``, or a finished run shown at ``progress``
        (``(step, total_steps, chunks_done, samples_seen)``: steps, steps, chunks, rows)."""
        if start is not None:
            run.place(start)
            run.device = self.device_of(run.run_id)
        elif progress is not None:
            run.step, run.fixed_total, run.segments_done, run.samples_seen = progress
        with self.lock:
            self.runs[run.run_id] = run
            self.next_id = max(self.next_id, run.run_id + 1)

    def reached(self, chunks: int) -> bool:
        """True when every run in rotation (not pending) has done ``chunks`` chunks, or all of its own (lock held)."""
        return all(
            r.segments_done >= min(chunks, r.plan.num_segments if r.plan else chunks)
            for r in self.runs.values()
            if r.status.in_rotation() and not r.pending
        )

    def record_segment(self, run: Run, res: SegmentResult) -> None:
        """What a finished segment did to ``run`` (lock held): its progress and, at its end or on an error, its
        status; a lost device leaves its progress at the checkpoint and makes it INTERRUPTED."""
        if res.device_lost:  # not the run's fault: it continues from its checkpoint elsewhere
            run.error = None
            run.lost = True
            if run.status is RunStatus.ONGOING:
                self.set_status(run, RunStatus.INTERRUPTED)
            return
        run.step = res.step
        run.samples_seen = res.samples_seen
        if run.plan is not None:
            run.segments_done = run.plan.segments_done_at(res.step)
        if res.error is not None:
            run.error = res.error
            self.set_status(run, RunStatus.FAILED)
        elif res.finished or (run.plan is not None and res.step >= run.plan.total_steps):
            self.set_status(run, RunStatus.COMPLETED)

    def interrupt_all(self) -> None:
        """After a halt, with no segment in flight: ONGOING runs become INTERRUPTED (resumable)."""
        with self.lock:
            ongoing = [r for r in self.runs.values() if r.status is RunStatus.ONGOING]
            for run in ongoing:
                self.set_status(run, RunStatus.INTERRUPTED)
        for run in ongoing:
            self.emit(run)

    def ready(self, run: Run) -> bool:
        """True when ``run`` can train now: planned, not waiting to be built, not moving to another device."""
        return run.plan is not None and not run.pending and not run.moving

    def snap(self, r: Run) -> RunSnapshot:
        """A frozen copy of ``r`` (call with :attr:`lock` held)."""
        return RunSnapshot(
            run_id=r.run_id,
            status=r.status,
            step=r.step,
            total_steps=r.plan.total_steps if r.plan else r.fixed_total,
            segments_done=r.segments_done,
            num_segments=r.plan.num_segments if r.plan else r.segments_done,
            position=r.position(),
            samples_seen=r.samples_seen,
            on_device=self.slots.running(r.run_id),
            parent_id=r.parent_id,
            warm_start=r.warm_start,
            error=r.error,
            spec=r.spec,
            steps_per_epoch=r.plan.steps_per_epoch if r.plan else 0,
            stop_reason=r.stop_reason if r.status is RunStatus.STOPPED else None,
            pruned=r.pruned and r.status is RunStatus.STOPPED,
            device=r.device or "",
        )

    def emit(self, run: Run) -> None:
        """Tell the listener (and waiters) that ``run`` changed."""
        with self.lock:
            snap = self.snap(run)
            self.changed.notify_all()
        self._hook("on_run", self.listener.on_run, snap)

    def note(self, text: str) -> None:
        """A sentence for the user (``listener.on_note``)."""
        self._hook("on_note", self.listener.on_note, text)

    # ------------------------------------------------------------------ ops
    def tell(self, op: Op, ack: OpAck) -> None:
        """Tell the listener about ``op``'s acknowledgement."""
        self._hook("on_op", self.listener.on_op, op, ack)

    def settle(self, op: Op, state: OpState, message: str) -> None:
        """Answer ``op`` and its followers (applied or rejected) and tell the listener."""
        with self.lock:
            told = self.book.settle(op, state, message)
        for pair in told:
            self.tell(*pair)

    def resolved(self, op: Op, message: str) -> None:
        """``op`` took effect: APPLIED with ``message`` (what it achieved)."""
        self.settle(op, OpState.APPLIED, message)

    def reject(self, op: Op, reason: str) -> None:
        """``op`` is REJECTED with ``reason`` (never applied)."""
        self.settle(op, OpState.REJECTED, reason)

    # ------------------------------------------------------------------ devices
    def alive(self, device: str) -> bool:
        """False once ``device``'s worker died (an executor that raises counts as dead)."""
        try:
            return bool(self.executor.alive(device))
        except Exception:
            return False

    def device_of(self, run_id: int) -> str:
        """The device the executor built run ``run_id`` on (the first device when it cannot say)."""
        try:
            return str(self.executor.device_of(run_id))
        except Exception:
            return self.slots.devices[0]

    def flush_boundary(self) -> None:
        """Run the executor calls waiting for their device (on every device with no segment in flight)."""
        self.slots.flush()
        if self.slots.error is not None:
            self.loop_error, self.slots.error = self.slots.error, None

    def when_free(self, fn: Callable[[], None], device: str | None = None) -> None:
        """Run ``fn`` now if no segment trains on ``device`` (default: the first device), else at its boundary."""
        self.slots.queue(device if device is not None else self.slots.devices[0], fn)
        self.flush_boundary()

    @staticmethod
    def _hook(name: str, fn: Callable[..., None], *args: object) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("listener.%s failed", name)
