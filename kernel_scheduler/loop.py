"""The scheduler thread: the chunk loop that owns all run state.

Only this thread changes run state and calls the :class:`~kernel_scheduler.executor.Executor`. Other
threads (notebook cells, the panel, the magic, the ops inbox) call :meth:`Scheduler.submit` (which only
enqueues) and read frozen :class:`RunSnapshot` objects.

The loop is the turn: finished segments, boundary actions, ops, the next segment on each free device. Its helpers
own the rest, each with one job and the shared :class:`~kernel_scheduler.core.SchedulerCore`: the op book
(:mod:`~kernel_scheduler.op_book`: acks, leaders and followers, cancellation), the device roster
(:mod:`~kernel_scheduler.roster`: placement, held-at-rung runs, lost devices, moves), the clone builder
(:mod:`~kernel_scheduler.clone_builder`) and the early-stopping consultation (:mod:`~kernel_scheduler.consultation`).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

from .arbiter import DeviceArbiter, device_arbiter
from .clone_builder import CloneBuilder
from .consultation import Consultation
from .core import SchedulerCore
from .early_stopping import EarlyStoppingPolicy
from .executor import Executor, RunStart, SegmentResult
from .op_apply import OpApplier
from .ops import Op, OpAck
from .placement import Assignment
from .roster import DeviceRoster
from .runs import Run as _Run
from .runs import RunSnapshot, SchedulerListener, StopInfo
from .slots import DeviceSlots
from .status import RunStatus

__all__ = ["Scheduler", "RunSnapshot", "SchedulerListener"]

log = logging.getLogger(__name__)


class Scheduler:
    """Runs the chunk loop in a background thread.

    Usage::

        sched = Scheduler(executor, listener=...)
        sched.add_run(1, spec)            # before start: prepares the run synchronously (validation)
        sched.start()
        ack = sched.submit(Op(OpKind.STOP, run_id=1))
        sched.wait()                      # until no run is left to train
        sched.close()

    Thread-safety: ``submit``, ``snapshot``, ``wait`` may be called from any thread. ``add_run`` only before
    ``start``. The executor and the listener are only called from the scheduler thread (after ``start``).

    Which run trains next: :class:`~kernel_scheduler.placement.FairPlacement`, for one device or several (on one
    device it is :class:`~kernel_scheduler.policy.FurthestBehindFirst`'s order: lowest ``(epoch, chunk)``, then
    run id).

    The device: every executor call of the loop (a segment, and the boundary actions: clones, status changes,
    final saves) happens while the scheduler holds a lease of ``arbiter`` (default: the process-wide
    :func:`~kernel_scheduler.arbiter.device_arbiter`), given back after each segment, so the schedulers of one
    process take turns chunk by chunk and never train at once. Waiting for the lease never blocks the loop:
    it keeps draining commands, beating and polling the inbox until the grant wakes it. ``add_run`` before
    ``start`` calls the executor on the caller's thread: that caller holds the device itself
    (``arbiter.acquire``) when other schedulers may be training.

    Args:
        executor: trains the runs.
        listener: told about runs, ops, notes (default: hooks that do nothing).
        idle_poll_s: how long an idle loop waits before it polls the ops inbox again (seconds).
        first_run_id: the id the first run added mid-experiment gets when none is registered.
        arbiter: the device arbiter shared with the other schedulers of the process.
        owner: the name leases are held under (the experiment's name).
        early_stopping: the policy asked at chunk boundaries (its stops are ops from source "early_stopping").
    """

    def __init__(
        self,
        executor: Executor,
        listener: SchedulerListener | None = None,
        idle_poll_s: float = 1.0,
        first_run_id: int = 1,
        arbiter: DeviceArbiter | None = None,
        owner: str = "",
        early_stopping: EarlyStoppingPolicy | None = None,
    ) -> None:
        self._executor = executor
        self._arbiter = arbiter if arbiter is not None else device_arbiter()
        self._owner = owner or f"scheduler {id(self):x}"
        self._idle_poll_s = idle_poll_s
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        slots = DeviceSlots(executor.devices, self._arbiter, self._owner, self._wake.set)
        self._core = core = SchedulerCore(executor, listener or SchedulerListener(), slots, first_run_id)
        self._slots = slots
        self._roster = DeviceRoster(core, self.halt)
        self._clones = CloneBuilder(core, self._roster, self._wake.set)
        self._ops = OpApplier(core, self._clones)
        self._consultation: Consultation | None = None
        if early_stopping is not None:
            self._consultation = Consultation(
                core, early_stopping, self.submit, self._clones.add_new, self._apply_queued
            )
            self._roster.waits_at = self._consultation.waits_at
        self.on_thread_start: Callable[[], None] | None = None

    # ------------------------------------------------------------------ setup
    def add_run(
        self,
        run_id: int,
        spec: Any,
        start: RunStart | None = None,
        status: RunStatus = RunStatus.NEW,
        parent_id: int | None = None,
        warm_start: bool = False,
        error: str | None = None,
        progress: tuple[int, int, int, int] | None = None,
        stops: StopInfo | None = None,
    ) -> None:
        """Register a run before :meth:`start` (prepared synchronously through the executor).

        Args:
            run_id: its id; ids are unique and the next clone gets ``max + 1``.
            spec: the run's config (passed to ``executor.add_run``).
            start: an already known start (restored runs); else ``executor.add_run`` is called.
            status: initial status (restored runs may be STOPPED, COMPLETED, ...).
            parent_id, warm_start: a clone's parent and how it started.
            error: a FAILED run's error text.
            progress: for a finished run shown from the store: ``(step, total_steps, chunks_done, samples_seen)``
                (steps, steps, chunks, rows).
            stops: its stops so far (restored runs): whether the early-stopping policy stopped it (``pruned``: a
                user's resume then exempts it), the chunk up to which a user's resume exempts it
                (``exempt_through``) and why a STOPPED run stopped (``reason``, shown as
                :attr:`RunSnapshot.stop_reason`).

        Raises:
            RuntimeError: after start. Whatever ``executor.add_run`` raises (bad input).
        """
        if self._thread is not None:
            raise RuntimeError("add_run is only allowed before start(); use a clone op afterwards")
        if start is None and not status.is_finished():
            start = self._executor.add_run(run_id, spec)
        stops = stops or StopInfo()
        run = _Run(run_id, spec, status, parent_id=parent_id, warm_start=warm_start, error=error)
        run.pruned, run.exempt_through = stops.pruned, stops.exempt_through
        run.stop_reason = stops.reason if status is RunStatus.STOPPED else None
        self._core.register(run, start, progress)

    def start(self) -> None:
        """Start the scheduler thread (idempotent)."""
        if self._thread is not None:
            return
        if self._consultation is not None:  # the policy's progress before the first chunk
            self._consultation.report_progress()
        self._thread = threading.Thread(target=self._main, name="rapidfire-scheduler", daemon=True)
        self._thread.start()

    @property
    def started(self) -> bool:
        return self._thread is not None

    @property
    def arbiter(self) -> DeviceArbiter:
        """The device arbiter this scheduler shares with the other schedulers of the process."""
        return self._arbiter

    @property
    def owner(self) -> str:
        """The name this scheduler holds the device under (its experiment's name)."""
        return self._owner

    # ------------------------------------------------------------------ public, any thread
    def snapshot(self) -> list[RunSnapshot]:
        """Frozen views of every run, ordered by run id."""
        core = self._core
        with core.lock:
            return [core.snap(r) for r in sorted(core.runs.values(), key=lambda r: r.run_id)]

    def run_snapshot(self, run_id: int) -> RunSnapshot | None:
        with self._core.lock:
            r = self._core.runs.get(run_id)
            return self._core.snap(r) if r else None

    def on_device(self) -> int | None:
        """Run id training right now (the first device's, with several), or None."""
        return next(iter(self._slots.running_ids().values()), None)

    def training(self) -> dict[str, int]:
        """Device -> id of the run training there now (a gang's: its composite and each part). Any thread."""
        return self._slots.running_ids()

    @property
    def devices(self) -> tuple[str, ...]:
        """The executor's devices, in order."""
        return self._slots.devices

    def device_states(self) -> dict[str, str]:
        """Device -> ``"training run N"``, ``"idle"`` or ``"lost"`` (its worker died). Any thread."""
        return self._roster.states()

    def submit(self, op: Op) -> OpAck:
        """Queue an op; returns its acknowledgement at once. The same ``op_id`` is applied once.

        A clone op gets its child run id here (``ack.new_run_id``); the child exists from now on (NEW).
        Rejections that need no run state (unknown run, DELETED run, illegal status) are answered at once.
        """
        ack, queued = self._ops.accept(op)
        if queued:
            self._wake.set()
        return ack

    def ack(self, op_id: str) -> OpAck | None:
        with self._core.lock:
            return self._core.book.ack(op_id)

    def remember(self, acks: Iterable[OpAck]) -> None:
        """Answers an earlier process gave (the ops log): the same op id again gets its answer, never applied twice."""
        with self._core.lock:
            for ack in acks:
                self._core.book.remember(ack)

    def wait(self, timeout: float | None = None, chunks: int | None = None) -> bool:
        """Block until no run is left to train (or, with ``chunks=k``, every active run has done k chunks).

        Returns True when the condition holds, False on timeout.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._core.changed:
            while not self._done(chunks):
                if self._closing.is_set() and self._thread is not None and not self._thread.is_alive():
                    return False  # closed: nothing will change any more
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._core.changed.wait(timeout=min(0.5, remaining) if remaining is not None else 0.5)
            return True

    def is_idle(self) -> bool:
        with self._core.lock:
            return self._done(None)

    def close(self, timeout: float | None = None) -> None:
        """Stop the loop after the current segment and join the thread."""
        self._closing.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def loop_error(self) -> str | None:
        """Traceback of an unexpected scheduler error (the loop keeps going; shown to the user)."""
        return self._core.loop_error

    def halt(self, reason: str) -> None:
        """Stop training for good: no run gets another chunk. Any thread.

        The segment in flight ends at its chunk boundary as usual; then every ONGOING run becomes INTERRUPTED
        (resumable from its checkpoint) and NEW runs stay NEW. Ops submitted afterwards are rejected with
        ``reason`` (e.g. "writing the store failed: disk full; ..."), and :meth:`wait` returns.
        """
        with self._core.lock:
            if self._core.halted is not None:
                return
            self._core.halted = reason
            self._core.busy = True
        self._wake.set()

    @property
    def halted(self) -> str | None:
        """Why :meth:`halt` stopped training, or None."""
        return self._core.halted

    def early_stopping_progress(self) -> dict[str, Any] | None:
        """What the early-stopping policy reports for the panel header (None without one; {} once a broken policy
        was switched off): its latest ``progress()``, asked on the scheduler thread at each decision point (the
        policy is never called from another thread). Any thread."""
        return self._consultation.progress() if self._consultation is not None else None

    # ------------------------------------------------------------------ the turn (scheduler thread)
    def _done(self, chunks: int | None) -> bool:
        core = self._core
        if core.loop_error and self._thread is not None and not self._thread.is_alive():
            return True
        if chunks is not None:
            return core.reached(chunks) and not core.unapplied
        if core.busy or self._slots.any_running() or core.unapplied or self._slots.pending():
            return False
        return self._roster.choose() is None and not self._clones.any_building()

    def _main(self) -> None:
        if self.on_thread_start is not None:
            self.on_thread_start()
        try:
            while not self._closing.is_set():
                try:
                    self._turn()
                except Exception:  # never let the loop die
                    self._core.loop_error = traceback.format_exc()
                    log.exception("rapidfire scheduler error")
                    self._closing.wait(0.1)
        finally:
            self._slots.release_all()
        with self._core.changed:
            self._core.changed.notify_all()

    def _turn(self) -> None:
        self._core.listener.on_heartbeat()
        self._ops.drain()
        finished = self._slots.finished()
        for device, run_id, fut in finished:
            try:
                res = fut.result()
            except Exception as exc:  # the contract says never; a raising Future must not wedge the loop
                run = self._core.runs[run_id]
                res = SegmentResult(
                    step=run.step, samples_seen=run.samples_seen, error=f"{type(exc).__name__}: {exc}"
                )
            self._finish_segment(device, run_id, res)
        if finished:
            return
        free = [d for d in self._slots.devices if not self._slots.busy(d)]
        if free and self._fill(free):
            return
        self._wake.wait(self._idle_poll_s)
        self._wake.clear()
        if not self._slots.finished():
            self._poll_inbox()  # ops from other processes for parked runs apply without waiting a chunk

    def _fill(self, free: list[str]) -> bool:
        """Give the ``free`` devices their next segments (after the boundary work); True when the turn is over."""
        core = self._core
        if core.halted is not None and not self._slots.any_running():
            core.interrupt_all()
        self._roster.find_lost()
        wanted = [d for d in free if self._roster.needs(d, self._clones.any_waiting)]
        held = self._slots.hold(wanted)  # gives back the leases it does not use
        if wanted and not held and not self._slots.any_running():
            self._idle_wait()  # the grant sets _wake
            return True
        core.flush_boundary()
        self._clones.resolve_waiting()
        self._consult()  # a run left the rotation: a rung may be decided now
        with core.lock:
            picks = [a for a in self._roster.assign(free) if a.device in held or self._slots.held(a.device)]
            if not picks and not self._slots.any_running():
                core.busy = False
                core.changed.notify_all()
        for pick in picks:
            self._begin(pick)
        if picks:
            return True
        if not self._slots.any_running():
            for device in free:
                if not self._slots.pending(device):
                    self._slots.release(device)
            self._idle_wait()
            return True
        return False

    def _begin(self, pick: Assignment) -> None:
        core = self._core
        run_id, device = pick.run_id, pick.device
        run = core.runs[run_id]
        if (pick.move_from is not None or run.device != device) and not self._roster.move(run, device):
            return
        with core.lock:
            assert run.plan is not None
            done = run.segments_done >= run.plan.num_segments or run.step >= run.plan.total_steps
            if done:  # nothing left to train (e.g. a warm clone of a parent that made its last step)
                core.set_status(run, RunStatus.COMPLETED)
                self._slots.queue(device, self._ops.status_call(run_id, RunStatus.COMPLETED))
            else:
                if run.status is RunStatus.NEW:
                    core.set_status(run, RunStatus.ONGOING)
                stop = run.plan.boundary(run.segments_done)
                core.busy = True
        if done:
            core.emit(run)
            self._slots.flush(device)
            return
        try:
            fut = self._executor.run_segment(run_id, stop)
        except Exception as exc:  # the run fails at the end of this turn; the loop goes on
            fut = Future()
            fut.set_result(
                SegmentResult(
                    step=run.step, samples_seen=run.samples_seen, error=f"{type(exc).__name__}: {exc}"
                )
            )
        fut.add_done_callback(lambda _f: self._wake.set())
        self._slots.start(device, run_id, fut, run.step)
        core.emit(run)

    def _finish_segment(self, device: str, run_id: int, res: SegmentResult) -> None:
        core = self._core
        with core.lock:
            run = core.runs[run_id]
            before = run.segments_done
            run.seconds_per_step = self._slots.end(device, res.step) or run.seconds_per_step
            core.record_segment(run, res)
            if not res.device_lost and run.status.is_finished():
                self._slots.queue(device, self._ops.status_call(run_id, run.status))
            deferred, run.deferred = run.deferred, []
        core.emit(run)
        if res.device_lost:
            self._roster.find_lost()
        # the boundary: first warm clones that waited for this run, then the ops deferred to it
        core.flush_boundary()
        self._clones.resolve_waiting()
        for op in deferred:
            self._ops.apply(op)
        core.flush_boundary()
        self._consult(run, res, before)  # early stopping: its stops apply before another chunk starts
        self._slots.release(device)  # another experiment's segment may train now; the next turn asks again
        self._poll_inbox()
        with core.changed:
            core.changed.notify_all()

    def _consult(self, run: _Run | None = None, res: SegmentResult | None = None, before: int = 0) -> None:
        if self._consultation is not None:
            self._consultation.consult(run, res, before)

    def _idle_wait(self) -> None:
        """Wait for a command, a finished segment or the device (at most ``idle_poll_s``), then poll the inbox."""
        self._wake.wait(self._idle_poll_s)
        self._wake.clear()
        self._poll_inbox()

    def _poll_inbox(self) -> None:
        try:
            ops = list(self._core.listener.poll_ops())
        except Exception:
            log.exception("ops inbox poll failed")
            return
        for op in ops:
            self.submit(op)
        if ops:
            self._ops.drain()

    def _apply_queued(self) -> None:
        """Apply the ops queued so far and the boundary actions they queued (after the policy's decisions)."""
        self._ops.drain()
        self._core.flush_boundary()
