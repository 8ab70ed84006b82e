"""The scheduler thread: the chunk loop that owns all run state.

Only this thread changes run state and calls the :class:`~kernel_scheduler.executor.Executor`. Other
threads (notebook cells, the panel, the magic, the ops inbox) call :meth:`Scheduler.submit` (which only
enqueues) and read frozen :class:`RunSnapshot` objects.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import replace
from functools import partial
from typing import Any

from .arbiter import DeviceArbiter, device_arbiter
from .early_stopping import (
    EARLY_STOPPING,
    ChunkResult,
    EarlyStoppingPolicy,
    NewRun,
    PolicyDriver,
    RunState,
)
from .executor import Executor, RunStart, SegmentResult
from .ops import Decision, Op, OpAck, OpKind, OpState, PendingOp, decide
from .placement import Assignment, DeviceView, FairPlacement, PlacedRun
from .policy import FurthestBehindFirst, RunView, SchedulingPolicy
from .runs import Run as _Run
from .runs import RunSnapshot, SchedulerListener
from .slots import DeviceSlots
from .status import RunStatus, check_transition

__all__ = ["Scheduler", "RunSnapshot", "SchedulerListener"]

log = logging.getLogger(__name__)


class Scheduler:
    """Runs the chunk loop in a background thread.

    Usage::

        sched = Scheduler(executor, listener=..., policy=FurthestBehindFirst())
        sched.add_run(1, spec)            # before start: prepares the run synchronously (validation)
        sched.start()
        ack = sched.submit(Op(OpKind.STOP, run_id=1))
        sched.wait()                      # until no run is left to train
        sched.close()

    Thread-safety: ``submit``, ``snapshot``, ``wait`` may be called from any thread. ``add_run`` only before
    ``start``. The executor and the listener are only called from the scheduler thread (after ``start``).

    The device: every executor call of the loop (a segment, and the boundary actions: clones, status changes,
    final saves) happens while the scheduler holds a lease of ``arbiter`` (default: the process-wide
    :func:`~kernel_scheduler.arbiter.device_arbiter`), given back after each segment, so the schedulers of one
    process take turns chunk by chunk and never train at once. Waiting for the lease never blocks the loop:
    it keeps draining commands, beating and polling the inbox until the grant wakes it. ``add_run`` before
    ``start`` calls the executor on the caller's thread: that caller holds the device itself
    (``arbiter.acquire``) when other schedulers may be training.
    """

    def __init__(
        self,
        executor: Executor,
        listener: SchedulerListener | None = None,
        policy: SchedulingPolicy | None = None,
        idle_poll_s: float = 1.0,
        first_run_id: int = 1,
        arbiter: DeviceArbiter | None = None,
        owner: str = "",
        early_stopping: EarlyStoppingPolicy | None = None,
    ) -> None:
        self._executor = executor
        # the device is shared with every other scheduler of the process: a lease is held while a segment
        # trains and while boundary actions call the executor, and given back between segments
        self._arbiter = arbiter if arbiter is not None else device_arbiter()
        self._owner = owner or f"scheduler {id(self):x}"
        self._listener = listener or SchedulerListener()
        self._policy = policy or FurthestBehindFirst()
        self._idle_poll_s = idle_poll_s
        self._runs: dict[int, _Run] = {}
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._commands: queue.Queue[Op] = queue.Queue()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        # segments in flight, leases and the executor calls waiting for a device to be free, per device
        self._slots = DeviceSlots(executor.devices, self._arbiter, self._owner, self._wake.set)
        self._placement = FairPlacement()
        self._noted_dead: set[str] = set()  # devices whose death the user was told about
        self._started_at: dict[
            int, tuple[float, int]
        ] = {}  # run id -> (monotonic start, step) of its segment
        self._acks: dict[str, OpAck] = {}
        # a stop/resume/delete that is queued or waiting for a chunk boundary, by (kind, run id) -> its op id; a
        # second request of the same kind for the same run follows it (same outcome, applied once)
        self._leaders: dict[tuple[OpKind, int], str] = {}
        self._followers: dict[str, list[Op]] = {}
        # per run, the stop/resume/delete ops accepted and not answered yet, oldest first (a later op of another
        # kind cancels them: ops.decide); _applying: those the loop has begun to apply (no longer cancellable)
        self._open: dict[int, list[Op]] = {}
        self._applying: set[str] = set()
        self._next_id = first_run_id
        self._busy = False  # True while the loop has work (a segment or queued commands)
        # ops accepted by submit() whose _apply has not returned yet (a deferred op counts as applied: it
        # then waits on the run in flight). qsize() alone is not enough: submit() puts an op on the queue
        # after releasing the lock, and the loop takes it off before applying it.
        self._unapplied = 0
        self._loop_error: str | None = None
        self._halted: str | None = None  # why training stopped for good (halt()); None while it goes on
        # the early-stopping policy, asked at chunk boundaries (its stops are ops from source "early_stopping")
        self._stopper = (
            PolicyDriver(early_stopping, self.submit, self._add_new_run, self._note)
            if early_stopping is not None
            else None
        )
        self._stopper_progress: dict[str, Any] = {}  # its latest progress(), asked on the scheduler thread
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
        pruned: bool = False,
        exempt_through: int = 0,
        stop_reason: str | None = None,
    ) -> None:
        """Register a run before :meth:`start` (prepared synchronously through the executor).

        Args:
            run_id: its id; ids are unique and the next clone gets ``max + 1``.
            spec: the run's config (passed to ``executor.add_run``).
            start: an already known start (restored runs); else ``executor.add_run`` is called.
            status: initial status (restored runs may be STOPPED, COMPLETED, ...).
            progress: for a finished run shown from the store: ``(step, total_steps, chunks_done, samples_seen)``.
            pruned: its latest stop came from the early-stopping policy (a user's resume then exempts it).
            exempt_through: the user resumed it after the policy stopped it after this many chunks: the policy
                does not stop it again at a rung up to there (later rungs judge it like any run).
            stop_reason: why a STOPPED run stopped (shown as :attr:`RunSnapshot.stop_reason`).

        Raises:
            RuntimeError: after start. Whatever ``executor.add_run`` raises (bad input).
        """
        if self._thread is not None:
            raise RuntimeError("add_run is only allowed before start(); use a clone op afterwards")
        if start is None and not status.is_finished():
            start = self._executor.add_run(run_id, spec)
        run = _Run(
            run_id=run_id,
            spec=spec,
            status=status,
            parent_id=parent_id,
            warm_start=warm_start,
            error=error,
            pruned=pruned,
            exempt_through=exempt_through,
            stop_reason=stop_reason if status is RunStatus.STOPPED else None,
        )
        if start is not None:
            run.place(start)
            run.device = self._device_of(run_id)
        elif progress is not None:
            run.step, run.fixed_total, run.segments_done, run.samples_seen = progress
        with self._lock:
            self._runs[run_id] = run
            self._next_id = max(self._next_id, run_id + 1)

    def start(self) -> None:
        """Start the scheduler thread (idempotent)."""
        if self._thread is not None:
            return
        self._report_progress()  # the policy's progress before the first chunk (the thread has not started)
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
        with self._lock:
            return [self._snap(r) for r in sorted(self._runs.values(), key=lambda r: r.run_id)]

    def run_snapshot(self, run_id: int) -> RunSnapshot | None:
        with self._lock:
            r = self._runs.get(run_id)
            return self._snap(r) if r else None

    def on_device(self) -> int | None:
        """Run id training right now (the first device's, with several), or None."""
        running = self._slots.running_ids()
        return next(iter(running.values()), None)

    def training(self) -> dict[str, int]:
        """Device -> id of the run training there right now (devices with no segment left out). Any thread."""
        return self._slots.running_ids()

    @property
    def devices(self) -> tuple[str, ...]:
        """The executor's devices, in order."""
        return self._slots.devices

    def device_states(self) -> dict[str, str]:
        """Device -> ``"training run N"``, ``"idle"`` or ``"lost"`` (its worker died). Any thread."""
        running = self._slots.running_ids()
        out = {}
        for device in self._slots.devices:
            if device in running:
                out[device] = f"training run {running[device]}"
            else:
                out[device] = "idle" if self._alive(device) else "lost"
        return out

    def submit(self, op: Op) -> OpAck:
        """Queue an op; returns its acknowledgement at once. The same ``op_id`` is applied once.

        A clone op gets its child run id here (``ack.new_run_id``); the child exists from now on (NEW).
        Rejections that need no run state (unknown run, DELETED run, illegal status) are answered at once.
        """
        with self._lock:
            if op.op_id in self._acks:
                return self._acks[op.op_id]
            run = self._runs.get(op.run_id)
            if self._halted is not None:  # a write to disk failed: nothing more is applied
                ack = OpAck(op.op_id, op.run_id, op.kind.value, OpState.REJECTED.value, self._halted)
                self._acks[op.op_id] = ack
                self._notify_op(op, ack)
                return ack
            leader = self._leaders.get((op.kind, op.run_id))
            if leader is not None:  # a repeat while the first request is pending: same outcome, applied once
                return self._follow(op, leader)
            decision = decide(op.kind, run.status if run else None, False, op.run_id, self._pending_of(op))
            if decision.verdict in ("reject", "done"):
                self._cancel(decision.cancels, op)
                state = OpState.REJECTED if decision.verdict == "reject" else OpState.APPLIED
                ack = OpAck(op.op_id, op.run_id, op.kind.value, state.value, decision.reason)
                self._acks[op.op_id] = ack
                self._notify_op(op, ack)
                return ack
            cancelled = self._cancel(decision.cancels, op)
            child_id = None
            if op.kind is OpKind.CLONE:
                child_id = self._next_id
                self._next_id += 1
                op.payload["child_id"] = child_id
                self._runs[child_id] = _Run(
                    run_id=child_id,
                    spec=op.payload.get("spec"),
                    parent_id=op.run_id,
                    warm_start=bool(op.payload.get("warm_start")),
                )
                self._runs[child_id].pending = True  # not ready until the op is applied
            ack = OpAck(
                op.op_id,
                op.run_id,
                op.kind.value,
                OpState.QUEUED.value,
                self._queued_message(op) + (f" (it cancels the pending {cancelled})" if cancelled else ""),
                new_run_id=child_id,
            )
            self._acks[op.op_id] = ack
            if op.kind is not OpKind.CLONE:
                self._leaders[(op.kind, op.run_id)] = op.op_id
                self._open.setdefault(op.run_id, []).append(op)
            self._busy = True
            self._unapplied += 1
        self._notify_op(op, ack)
        self._commands.put(op)
        self._wake.set()
        return ack

    def _follow(self, op: Op, leader: str) -> OpAck:
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
        self._notify_op(op, ack)
        return ack

    def _pending_of(self, op: Op) -> list[PendingOp]:
        """The stop/resume/delete ops of ``op``'s run accepted before it and not answered yet, oldest first."""
        if op.kind is OpKind.CLONE:
            return []
        out = []
        for other in self._open.get(op.run_id, []):
            if other.op_id == op.op_id:
                break
            out.append(PendingOp(other.kind, other.op_id, cancellable=other.op_id not in self._applying))
        return out

    def _cancel(self, op_ids: Sequence[str], by: Op) -> str:
        """Answer the pending ops ``op_ids`` rejected, cancelled by the later op ``by``; returns what they were
        (e.g. ``"stop (op 3f2a…)"``). A cancelled op is never applied: the loop skips answered ops."""
        names = []
        for op in [o for o in self._open.get(by.run_id, []) if o.op_id in op_ids]:
            run = self._runs.get(op.run_id)
            if run is not None and op in run.deferred:
                run.deferred.remove(op)
            self._reject(
                op,
                f"cancelled by op {by.op_id}: a later {by.kind.value} of run {by.run_id} replaced this "
                f"{op.kind.value} before it took effect",
            )
            names.append(f"{op.kind.value} (op {op.op_id[:8]})")
        return ", ".join(names)

    def _queued_message(self, op: Op) -> str:
        on_device = self._slots.running(op.run_id)
        when = "at the end of its current chunk" if on_device else "now"
        if op.kind is OpKind.STOP:
            return f"stop requested for run {op.run_id} — applies {when}"
        if op.kind is OpKind.RESUME:
            return f"resume requested for run {op.run_id} — it rejoins the rotation {when}"
        if op.kind is OpKind.DELETE:
            return f"delete requested for run {op.run_id} — applies {when}"
        how = "warm start from its latest chunk boundary" if op.payload.get("warm_start") else "from scratch"
        return (
            f"clone of run {op.run_id} requested ({how}) — run {op.payload.get('child_id')} joins the rotation "
            "at the next chunk boundary"
        )

    def ack(self, op_id: str) -> OpAck | None:
        with self._lock:
            return self._acks.get(op_id)

    def wait(self, timeout: float | None = None, chunks: int | None = None) -> bool:
        """Block until no run is left to train (or, with ``chunks=k``, every active run has done k chunks).

        Returns True when the condition holds, False on timeout.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while not self._done(chunks):
                if self._closing.is_set() and self._thread is not None and not self._thread.is_alive():
                    return False  # closed: nothing will change any more
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._changed.wait(timeout=min(0.5, remaining) if remaining is not None else 0.5)
            return True

    def is_idle(self) -> bool:
        with self._lock:
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
        return self._loop_error

    # ------------------------------------------------------------------ internals (scheduler thread)
    def _done(self, chunks: int | None) -> bool:
        if self._loop_error and self._thread is not None and not self._thread.is_alive():
            return True
        if chunks is not None:
            return (
                all(
                    r.segments_done >= min(chunks, r.plan.num_segments if r.plan else chunks)
                    for r in self._runs.values()
                    if r.status.in_rotation() and not r.pending
                )
                and not self._unapplied
            )
        if self._busy or self._slots.any_running() or self._unapplied or self._slots.pending():
            return False
        return self._choose() is None

    def halt(self, reason: str) -> None:
        """Stop training for good: no run gets another chunk. Any thread.

        The segment in flight ends at its chunk boundary as usual; then every ONGOING run becomes INTERRUPTED
        (resumable from its checkpoint) and NEW runs stay NEW. Ops submitted afterwards are rejected with
        ``reason`` (e.g. "writing the store failed: disk full; ..."), and :meth:`wait` returns.
        """
        with self._lock:
            if self._halted is not None:
                return
            self._halted = reason
            self._busy = True
        self._wake.set()

    @property
    def halted(self) -> str | None:
        """Why :meth:`halt` stopped training, or None."""
        return self._halted

    def _interrupt_all(self) -> None:
        """After :meth:`halt`, with no segment in flight: ONGOING runs become INTERRUPTED."""
        with self._lock:
            ongoing = [r for r in self._runs.values() if r.status is RunStatus.ONGOING]
            for run in ongoing:
                self._set_status(run, RunStatus.INTERRUPTED)
        for run in ongoing:
            self._emit(run)

    def _choose(self) -> int | None:
        """The run the first free device trains next (one device: the policy's choice), or None."""
        if self._halted is not None:
            return None
        if not self._multi():
            views = [
                RunView(r.run_id, r.status, r.position(), ready=self._ready(r)) for r in self._runs.values()
            ]
            return self._policy.choose(views)
        picks = self._assign(list(self._slots.devices))
        return picks[0].run_id if picks else None

    def _multi(self) -> bool:
        return len(self._slots.devices) > 1

    def _ready(self, r: _Run) -> bool:
        return r.plan is not None and not r.pending and not r.moving

    def _alive(self, device: str) -> bool:
        try:
            return bool(self._executor.alive(device))
        except Exception:
            return False

    def _device_of(self, run_id: int) -> str:
        try:
            return str(self._executor.device_of(run_id))
        except Exception:
            return self._slots.devices[0]

    def _placed(self) -> list[PlacedRun]:
        held = self._held_at_rungs()
        return [
            PlacedRun(
                run_id=r.run_id,
                status=r.status,
                segments_done=r.segments_done,
                device=r.device,
                ready=self._ready(r) and r.run_id not in held,
                in_flight=self._slots.running(r.run_id),
                remaining_steps=max(0, r.plan.total_steps - r.step) if r.plan is not None else 0,
                seconds_per_step=r.seconds_per_step,
            )
            for r in sorted(self._runs.values(), key=lambda r: r.run_id)
        ]

    def _held_at_rungs(self) -> set[int]:
        """Runs that reached an early-stopping rung another active run has not reached yet: they wait there, so
        that no run trains a chunk past a rung that prunes it (several devices; one device rotates anyway)."""
        stopper = self._stopper
        if stopper is None or not self._multi():
            return set()
        active = [r for r in self._runs.values() if r.status.in_rotation() and self._ready(r)]
        done = {r.run_id: self._chunks(r, r.segments_done) for r in active}
        lowest = min(done.values(), default=0)
        return {rid for rid, c in done.items() if c > lowest and stopper.waits_at(c)}

    def _device_views(self) -> list[DeviceView]:
        return [DeviceView(d, alive=self._alive(d), busy=self._slots.busy(d)) for d in self._slots.devices]

    def _assign(self, free: Sequence[str]) -> list[Assignment]:
        """What each of the ``free`` devices trains next (several devices: the placement policy)."""
        if self._halted is not None:
            return []
        if not self._multi():
            run_id = self._choose()
            return [Assignment(run_id, free[0])] if run_id is not None and free else []
        wanted = set(free)
        return [
            a for a in self._placement.assign_free(self._device_views(), self._placed()) if a.device in wanted
        ]

    def _place_new(self) -> str:
        """The device a new run (a cold clone, a search's trial) is built on: where the least work remains."""
        if not self._multi():
            return self._slots.devices[0]
        try:
            return self._placement.place_new(self._device_views(), self._placed())
        except ValueError:  # no device alive: the build fails with the executor's own error
            return self._slots.devices[0]

    def _main(self) -> None:
        if self.on_thread_start is not None:
            self.on_thread_start()
        try:
            while not self._closing.is_set():
                try:
                    self._turn()
                except Exception:  # never let the loop die
                    self._loop_error = traceback.format_exc()
                    log.exception("rapidfire scheduler error")
                    self._closing.wait(0.1)
        finally:
            self._slots.release_all()
        with self._changed:
            self._changed.notify_all()

    def _turn(self) -> None:
        self._listener.on_heartbeat()
        self._drain_commands()
        finished = self._slots.finished()
        for device, run_id, fut in finished:
            try:
                res = fut.result()
            except Exception as exc:  # the contract says never; a raising Future must not wedge the loop
                run = self._runs[run_id]
                res = SegmentResult(
                    step=run.step, samples_seen=run.samples_seen, error=f"{type(exc).__name__}: {exc}"
                )
            self._finish_segment(device, run_id, res)
        if finished:
            return
        free = [d for d in self._slots.devices if not self._slots.busy(d)]
        if free:
            if self._halted is not None and not self._slots.any_running():
                self._interrupt_all()
            self._find_lost()
            wanted = [d for d in free if self._needs_device(d)]
            held = [d for d in wanted if self._slots.held(d)]
            if wanted and not held and not self._slots.any_running():
                self._idle_wait()  # the grant sets _wake
                return
            self._flush_boundary()
            self._resolve_waiting_clones()
            self._consult()  # a run left the rotation: a rung may be decided now
            with self._lock:
                picks = [a for a in self._assign(free) if a.device in held or self._slots.held(a.device)]
                if not picks and not self._slots.any_running():
                    self._busy = False
                    self._changed.notify_all()
            for pick in picks:
                self._begin(pick)
            if picks:
                return
            if not self._slots.any_running():
                for device in free:
                    if not self._slots.pending(device):
                        self._slots.release(device)
                self._idle_wait()
                return
        self._wake.wait(self._idle_poll_s)
        self._wake.clear()
        if not self._slots.finished():
            self._poll_inbox()  # ops from other processes for parked runs apply without waiting a chunk

    def _begin(self, pick: Assignment) -> None:
        run_id, device = pick.run_id, pick.device
        if pick.move_from is not None or self._runs[run_id].device != device:
            if not self._move(self._runs[run_id], device):
                return
        with self._lock:
            run = self._runs[run_id]
            assert run.plan is not None
            if run.segments_done >= run.plan.num_segments or run.step >= run.plan.total_steps:
                # nothing left to train (e.g. a warm clone of a parent that made its last step)
                self._set_status(run, RunStatus.COMPLETED)
                self._slots.queue(
                    device, partial(self._executor.on_status, run_id, RunStatus.COMPLETED.value)
                )
                done = True
            else:
                done = False
                if run.status is RunStatus.NEW:
                    self._set_status(run, RunStatus.ONGOING)
                stop = run.plan.boundary(run.segments_done)
                self._busy = True
        if done:
            self._emit(run)
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
        self._started_at[run_id] = (time.monotonic(), run.step)
        self._slots.start(device, run_id, fut)
        self._emit(run)

    def _move(self, run: _Run, device: str) -> bool:
        """Move ``run`` to ``device`` through its latest boundary checkpoint (the crash-resume path); False when
        the move failed (the run is then FAILED, or INTERRUPTED when its device died meanwhile)."""
        source = run.device
        try:
            start = self._executor.move_run(run.run_id, run.spec, device)
        except Exception as exc:
            with self._lock:
                run.moving = False
                if not self._alive(device) or (source is not None and not self._alive(source)):
                    return (
                        False  # a worker died meanwhile: not the run's fault; the next turn places it again
                    )
                run.error = f"moving it from {source} to {device} failed: {type(exc).__name__}: {exc}"
                if run.status.in_rotation() or run.status is RunStatus.INTERRUPTED:
                    self._set_status(run, RunStatus.FAILED)
            self._emit(run)
            return False
        rewound = run.lost  # what it logged after its checkpoint (a chunk cut short) is void
        with self._lock:
            run.place(start)
            run.device, run.lost, run.moving = device, False, False
            if run.status is RunStatus.INTERRUPTED:
                self._set_status(run, RunStatus.ONGOING)
        snap = self._snap(run)
        if rewound:
            try:
                self._listener.on_rewound(snap, start.step)
            except Exception:
                log.exception("listener.on_rewound failed")
        self._note(f"run {run.run_id} moved from {source} to {device} at step {start.step}")
        self._emit(run)
        return True

    def _find_lost(self) -> None:
        """Runs on a device whose worker died: ONGOING ones become INTERRUPTED; all move before training again."""
        if not self._multi():
            return
        dead = {d for d in self._slots.devices if not self._slots.busy(d) and not self._alive(d)}
        if not dead:
            return
        changed: list[_Run] = []
        names = ", ".join(sorted(dead))
        with self._lock:
            for run in self._runs.values():
                if run.device in dead and not run.moving and not run.status.is_finished():
                    run.lost = True
                    if run.status is RunStatus.ONGOING:
                        self._set_status(run, RunStatus.INTERRUPTED)
                    changed.append(run)
            live = [d for d in self._slots.devices if self._alive(d)]
            alive = bool(live)
            if live:  # what waited for a dead device (a clone, a status change) runs on a live one
                self._slots.reroute(dead, live[0])
        for run in changed:
            self._emit(run)
        if alive and changed:  # each to the live device with the least work left, once that device is free
            moving = {r.run_id for r in changed}
            for move in self._placement.relocate(self._device_views(), self._placed()):
                run = self._runs[move.run_id]
                if move.run_id in moving:
                    run.moving = True
                    self._slots.queue(move.device, partial(self._relocate, run, move.device))
        if changed and not self._noted_dead >= dead:
            names = ", ".join(sorted(dead - self._noted_dead))
            self._noted_dead |= dead
            self._note(
                f"the worker of {names} died; runs {', '.join(str(r.run_id) for r in changed)} continue from "
                "their latest checkpoints on the other devices"
                if alive
                else f"the worker of {names} died and no device is left: training stops"
            )
        if not alive and self._halted is None:
            self.halt(
                f"every device's worker died ({', '.join(sorted(dead))}); run_fit(...) again continues every run "
                "from its latest checkpoint on new workers"
            )

    def _relocate(self, run: _Run, device: str) -> None:
        """A queued move of a run whose device died (on ``device``, now free)."""
        if not run.lost or run.status is RunStatus.DELETED:
            run.moving = False
            return
        if not self._alive(device):  # that one died too: the next turn places it again
            run.moving = False
            return
        self._move(run, device)

    def _finish_segment(self, device: str, run_id: int, res: SegmentResult) -> None:
        with self._lock:
            self._slots.end(device)
            run = self._runs[run_id]
            before = run.segments_done
            started = self._started_at.pop(run_id, None)
            if started is not None and res.step > started[1]:
                run.seconds_per_step = (time.monotonic() - started[0]) / (res.step - started[1])
            if res.device_lost:  # not the run's fault: it continues from its checkpoint elsewhere
                run.error = None
                run.lost = True
                if run.status is RunStatus.ONGOING:
                    self._set_status(run, RunStatus.INTERRUPTED)
                deferred, run.deferred = run.deferred, []
            else:
                run.step = res.step
                run.samples_seen = res.samples_seen
                if run.plan is not None:
                    run.segments_done = run.plan.segments_done_at(res.step)
                if res.error is not None:
                    run.error = res.error
                    self._set_status(run, RunStatus.FAILED)
                elif res.finished or (run.plan is not None and res.step >= run.plan.total_steps):
                    self._set_status(run, RunStatus.COMPLETED)
                if run.status.is_finished():
                    self._slots.queue(device, partial(self._executor.on_status, run_id, run.status.value))
                deferred, run.deferred = run.deferred, []
        self._emit(run)
        if res.device_lost:
            self._find_lost()
        # the boundary: first warm clones that waited for this run, then the ops deferred to it
        self._flush_boundary()
        self._resolve_waiting_clones()
        for op in deferred:
            self._apply(op)
        self._flush_boundary()
        self._consult(run, res, before)  # early stopping: its stops apply before another chunk starts
        self._slots.release(device)  # another experiment's segment may train now; the next turn asks again
        self._poll_inbox()
        with self._changed:
            self._changed.notify_all()

    def _idle_wait(self) -> None:
        """Wait for a command, a finished segment or the device (at most ``idle_poll_s``), then poll the inbox."""
        self._wake.wait(self._idle_poll_s)
        self._wake.clear()
        self._poll_inbox()

    def _needs_device(self, device: str) -> bool:
        """True when the loop has executor work on ``device``: boundary actions, a clone waiting, or a run."""
        with self._lock:
            if self._slots.pending(device) or any(r.waiting_clone is not None for r in self._runs.values()):
                return True
            return any(a.device == device for a in self._assign([device]))

    def _flush_boundary(self) -> None:
        """Run the executor calls waiting for their device (on every device with no segment in flight)."""
        self._slots.flush()
        if self._slots.error is not None:
            self._loop_error, self._slots.error = self._slots.error, None

    def _when_free(self, fn: Callable[[], None], device: str | None = None) -> None:
        """Run ``fn`` now if no segment trains on ``device`` (default: the first device), else at its boundary."""
        self._slots.queue(device if device is not None else self._slots.devices[0], fn)
        self._flush_boundary()

    def _poll_inbox(self) -> None:
        try:
            ops = list(self._listener.poll_ops())
        except Exception:
            log.exception("ops inbox poll failed")
            return
        for op in ops:
            self.submit(op)
        if ops:
            self._drain_commands()

    def _drain_commands(self) -> None:
        while True:
            try:
                op = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                self._apply(op)
            finally:
                with self._lock:
                    self._unapplied -= 1

    def _apply(self, op: Op) -> None:
        with self._lock:
            prev = self._acks.get(op.op_id)
            if prev is not None and prev.state != OpState.QUEUED.value:
                return  # answered meanwhile (cancelled by a later op): never applied
            run = self._runs.get(op.run_id)
            on_device = self._slots.running(op.run_id)
            decision = decide(
                op.kind, run.status if run else None, on_device, op.run_id, self._pending_of(op)
            )
            self._cancel(decision.cancels, op)
            if decision.verdict == "defer" and run is not None:
                run.deferred.append(op)
                return
            self._applying.add(op.op_id)
        if decision.verdict in ("reject", "done"):
            self._settle(op, decision)
            return
        try:
            self._apply_now(op)
        except Exception as exc:  # a bad op never crashes the loop
            log.debug("op %s failed", op.op_id, exc_info=True)
            self._reject_op(op, f"{type(exc).__name__}: {exc}")

    def _settle(self, op: Op, decision: Decision) -> None:
        if decision.verdict == "done":
            self._resolved(op, decision.reason)
        else:
            self._reject_op(op, decision.reason)

    def _reject_op(self, op: Op, reason: str) -> None:
        """Reject ``op``; a clone's child (created NEW by submit) fails with the same reason."""
        child = self._runs.get(int(op.payload.get("child_id", -1))) if op.kind is OpKind.CLONE else None
        if child is not None and child.pending:
            self._fail_child(child, op, reason)
        else:
            self._reject(op, reason)

    def _apply_now(self, op: Op) -> None:
        assert op.kind in OpKind
        with self._lock:
            run = self._runs[op.run_id]
        if op.kind is OpKind.STOP:
            by_policy = op.source == EARLY_STOPPING
            why = str(op.payload.get("reason") or "") if by_policy else ""
            with self._lock:
                self._set_status(run, RunStatus.STOPPED)
                run.pruned = by_policy
                run.stop_reason = why or (
                    "stopped by early stopping" if by_policy else f"stopped by the user ({op.source})"
                )
            self._when_free(
                partial(self._executor.on_status, run.run_id, RunStatus.STOPPED.value), run.device
            )
            self._resolved(op, f"run {run.run_id} stopped at step {run.step}" + (f": {why}" if why else ""))
        elif op.kind is OpKind.RESUME:
            with self._lock:
                self._set_status(run, RunStatus.ONGOING)
                if run.pruned and op.source != EARLY_STOPPING:  # the user's own op wins over the policy
                    run.exempt_through = self._chunks(run, run.segments_done)
                run.pruned, run.stop_reason = False, None
            self._when_free(
                partial(self._executor.on_status, run.run_id, RunStatus.ONGOING.value), run.device
            )
            self._resolved(op, f"run {run.run_id} resumed from step {run.step}")
        elif op.kind is OpKind.DELETE:
            with self._lock:
                self._set_status(run, RunStatus.DELETED)
            self._when_free(
                partial(self._executor.on_status, run.run_id, RunStatus.DELETED.value), run.device
            )
            self._resolved(op, f"run {run.run_id} deleted")
        elif op.kind is OpKind.CLONE:
            self._when_free(lambda: self._apply_clone_or_reject(op), self._clone_device(op))
        self._emit(run)

    def _clone_device(self, op: Op) -> str:
        """Where a clone is built: a warm clone on its parent's device (the parent's boundary snapshot is there;
        a device that would idle may take it over later), a cold one where the least work remains."""
        with self._lock:
            parent = self._runs.get(op.run_id)
            if op.payload.get("warm_start") and parent is not None and parent.device is not None:
                return parent.device
            return self._place_new()

    def _add_to(self, device: str, run_id: int, spec: Any, warm_from: int | None = None) -> RunStart:
        """``executor.add_run`` on ``device``."""
        return self._executor.add_run(run_id, spec, warm_from=warm_from, device=device)

    def _apply_clone_or_reject(self, op: Op) -> None:
        try:
            self._apply_clone(op)
        except Exception as exc:  # never leave the op queued and the child pending
            log.exception("rapidfire scheduler: clone failed")
            self._reject_op(op, f"{type(exc).__name__}: {exc}")

    def _apply_clone(self, op: Op) -> None:
        child_id = int(op.payload["child_id"])
        with self._lock:
            child = self._runs[child_id]
        if child.status is RunStatus.DELETED:  # deleted before it was created: never build it
            self._fail_child(child, op, f"run {child_id} was deleted before it was created")
            return
        warm = bool(op.payload.get("warm_start"))
        if warm and not self._executor.has_boundary(op.run_id):
            with self._lock:
                parent = self._runs[op.run_id]
                if parent.status.in_rotation():
                    child.waiting_clone = op  # waits for the parent's first boundary
                    self._notify_op(
                        op,
                        replace(
                            self._acks[op.op_id],
                            message=(
                                f"run {child_id} waits for run {op.run_id} to finish its first chunk (warm start)"
                            ),
                        ),
                    )
                    return
            self._fail_child(
                child,
                op,
                f"run {op.run_id} has no completed chunk to warm-start from and is "
                f"{parent.status.value}; use a cold clone (warm_start=False)",
            )
            return
        try:
            device = self._clone_device(op)
            start = self._add_to(device, child_id, child.spec, warm_from=op.run_id if warm else None)
        except Exception as exc:
            self._fail_child(child, op, f"{type(exc).__name__}: {exc}")
            return
        with self._lock:
            child.place(start)
            child.device = self._device_of(child_id)
            child.waiting_clone = None
            child.pending = False
        how = "from scratch"
        if warm:  # a warm start begins at the parent's latest chunk boundary, which may lie behind its step
            parent_step = self._runs[op.run_id].step
            how = f"warm from run {op.run_id}'s latest chunk boundary, step {start.step}"
            how += f"; run {op.run_id} is at step {parent_step}" if parent_step > start.step else ""
        self._resolved(op, f"run {child_id} created ({how})")
        self._emit(child)

    def _fail_child(self, child: _Run, op: Op, reason: str) -> None:
        with self._lock:
            child.waiting_clone = None
            child.pending = False
            if child.status is not RunStatus.DELETED:  # a child deleted before it existed stays DELETED
                child.error = reason
                self._set_status(child, RunStatus.FAILED)
        self._reject(op, reason)
        self._emit(child)

    def _resolve_waiting_clones(self) -> None:
        with self._lock:
            waiting = [r.waiting_clone for r in self._runs.values() if r.waiting_clone is not None]
        for op in waiting:
            assert op is not None
            with self._lock:
                parent, child = self._runs[op.run_id], self._runs[int(op.payload["child_id"])]
                gone = child.status is RunStatus.DELETED or not parent.status.in_rotation()
            if gone or self._executor.has_boundary(op.run_id):
                child.waiting_clone = None
                self._apply_clone_or_reject(op)

    # ------------------------------------------------------------------ early stopping (scheduler thread)
    def early_stopping_progress(self) -> dict[str, Any] | None:
        """What the early-stopping policy reports for the panel header (None without one; {} once a broken policy
        was switched off): its latest ``progress()``, asked on the scheduler thread at each decision point (the
        policy is never called from another thread). Any thread."""
        if self._stopper is None:
            return None
        return dict(self._stopper_progress)

    def _report_progress(self) -> None:
        """Ask the policy for its progress; tell the listener when it changed."""
        if self._stopper is None:
            return
        progress = self._stopper.progress()
        if progress == self._stopper_progress and self._thread is not None:
            return
        self._stopper_progress = progress
        try:
            self._listener.on_early_stopping(dict(progress))
        except Exception:
            log.exception("listener.on_early_stopping failed")

    def _consult(self, run: _Run | None = None, res: SegmentResult | None = None, before: int = 0) -> None:
        """Ask the early-stopping policy: ``run``'s finished chunk (``res``), then the runs that changed; its stop
        ops are applied here, before another chunk starts."""
        stopper = self._stopper
        if stopper is None or self._halted is not None:
            return
        if run is not None and res is not None and res.error is None and run.plan is not None:
            if run.segments_done > before:
                chunk = run.plan.chunks_at(run.segments_done)
                final = run.status is RunStatus.COMPLETED
                stopper.chunk(ChunkResult(run.run_id, chunk, res.metrics, final), self._run_states())
        stopper.review(self._run_states())
        self._drain_commands()
        self._flush_boundary()
        self._report_progress()

    def _run_states(self) -> list[RunState]:
        """Every run as the early-stopping policy sees it (chunks counted over all epochs)."""

        chunks = self._chunks
        with self._lock:
            return [
                RunState(
                    r.run_id,
                    r.status,
                    chunks(r, r.segments_done),
                    chunks(r, r.plan.num_segments) if r.plan is not None else 0,
                    exempt=any(o.source != EARLY_STOPPING for o in self._open.get(r.run_id, ())),
                    exempt_through=r.exempt_through,
                )
                for r in sorted(self._runs.values(), key=lambda r: r.run_id)
            ]

    @staticmethod
    def _chunks(r: _Run, segments: int) -> int:
        return r.plan.chunks_at(segments) if r.plan is not None else segments

    def _add_new_run(self, new: NewRun) -> int:
        """Register ``new`` mid-experiment (a search's new trial): NEW at once, built once no segment runs, then
        it joins the rotation like a cold clone (a build that fails makes it FAILED with the reason)."""
        with self._lock:
            run_id = self._next_id
            self._next_id += 1
            run = _Run(run_id=run_id, spec=new.spec, pending=True)
            self._runs[run_id] = run
            self._busy = True
            snap = self._snap(run)
        try:
            self._listener.on_added(snap, dict(new.info))
        except Exception:
            log.exception("listener.on_added failed")
        device = self._place_new()
        self._when_free(partial(self._build_new_run, run, device), device)
        return run_id

    def _build_new_run(self, run: _Run, device: str) -> None:
        if run.status is RunStatus.DELETED:  # deleted before it was built
            run.pending = False
            return
        try:
            start = self._add_to(device, run.run_id, run.spec)
        except Exception as exc:
            with self._lock:
                run.pending = False
                run.error = f"{type(exc).__name__}: {exc}"
                self._set_status(run, RunStatus.FAILED)
            self._emit(run)
            return
        with self._lock:
            run.place(start)
            run.device = self._device_of(run.run_id)
            run.pending = False
        self._emit(run)

    def _note(self, text: str) -> None:
        try:
            self._listener.on_note(text)
        except Exception:
            log.exception("listener.on_note failed")

    def _set_status(self, run: _Run, new: RunStatus) -> None:
        check_transition(run.status, new)
        run.status = new

    def _resolved(self, op: Op, message: str) -> None:
        with self._lock:
            ack = replace(self._acks[op.op_id], state=OpState.APPLIED.value, message=message)
            self._acks[op.op_id] = ack
        self._notify_op(op, ack)
        self._settle_followers(op, OpState.APPLIED.value, message)

    def _reject(self, op: Op, reason: str) -> None:
        with self._lock:
            prev = self._acks.get(op.op_id)
            ack = OpAck(
                op.op_id,
                op.run_id,
                op.kind.value,
                OpState.REJECTED.value,
                reason,
                new_run_id=prev.new_run_id if prev else None,
            )
            self._acks[op.op_id] = ack
        self._notify_op(op, ack)
        self._settle_followers(op, OpState.REJECTED.value, reason)

    def _settle_followers(self, op: Op, state: str, message: str) -> None:
        """Give the repeats of ``op`` (same kind, same run, sent while it was pending) its outcome."""
        with self._lock:
            if self._leaders.get((op.kind, op.run_id)) == op.op_id:
                del self._leaders[(op.kind, op.run_id)]
            still_open = [o for o in self._open.get(op.run_id, []) if o.op_id != op.op_id]
            if still_open:
                self._open[op.run_id] = still_open
            else:
                self._open.pop(op.run_id, None)
            self._applying.discard(op.op_id)
            followers = self._followers.pop(op.op_id, [])
            acks = []
            for f in followers:
                ack = replace(self._acks[f.op_id], state=state, message=message)
                self._acks[f.op_id] = ack
                acks.append((f, ack))
        for f, ack in acks:
            self._notify_op(f, ack)

    def _notify_op(self, op: Op, ack: OpAck) -> None:
        try:
            self._listener.on_op(op, ack)
        except Exception:
            log.exception("listener.on_op failed")

    def _emit(self, run: _Run) -> None:
        with self._lock:
            snap = self._snap(run)
            self._changed.notify_all()
        try:
            self._listener.on_run(snap)
        except Exception:
            log.exception("listener.on_run failed")

    def _snap(self, r: _Run) -> RunSnapshot:
        return RunSnapshot(
            run_id=r.run_id,
            status=r.status,
            step=r.step,
            total_steps=r.plan.total_steps if r.plan else r.fixed_total,
            segments_done=r.segments_done,
            num_segments=r.plan.num_segments if r.plan else r.segments_done,
            position=r.position(),
            samples_seen=r.samples_seen,
            on_device=self._slots.running(r.run_id),
            parent_id=r.parent_id,
            warm_start=r.warm_start,
            error=r.error,
            spec=r.spec,
            steps_per_epoch=r.plan.steps_per_epoch if r.plan else 0,
            stop_reason=r.stop_reason if r.status is RunStatus.STOPPED else None,
            pruned=r.pruned and r.status is RunStatus.STOPPED,
            device=r.device or "",
        )

    # test helper
    def runs_iter(self) -> Iterable[RunSnapshot]:  # pragma: no cover - convenience
        return iter(self.snapshot())
