"""Test doubles for kernel_scheduler (no torch): a scriptable fake Executor, a recording listener, a driver.

:class:`FakeExecutor` records every call and every breach of the :class:`kernel_scheduler.Executor` protocol;
:class:`Recorder` records every listener hook; :class:`Harness` wires one :class:`kernel_scheduler.Scheduler`
over both. Used by ``tests/kernel_scheduler`` and by :mod:`rapidfire_nb.testing.fake_source`.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from kernel_scheduler import (
    ChunkPlan,
    DeviceArbiter,
    EarlyStoppingPolicy,
    Executor,
    Op,
    OpAck,
    RunSnapshot,
    RunStart,
    RunStatus,
    Scheduler,
    SchedulerListener,
    SegmentResult,
    check_device,
    plan_chunks,
)

__all__ = ["TIMEOUT", "FakeDevice", "FakeExecutor", "FakeSpec", "Harness", "Recorder"]

TIMEOUT = 5.0  # seconds; every wait in these tests is bounded


@dataclass(frozen=True)
class FakeSpec:
    """A run's config as the fake executor understands it.

    Attributes:
        rows: training rows per epoch (N).
        batch: rows per optimizer step (B).
        epochs: epochs (ignored when ``max_steps`` is set).
        max_steps: total optimizer steps, if set.
        fail_at_step: the segment that would reach this step fails (SegmentResult.error).
        add_error: ``add_run`` raises ValueError with this text.
        hparams: the hyperparameters a panel shows for the run (not compared, not hashed).
        curve: the value of ``metric`` the run logs at the end of its 1st, 2nd, ... segment (a segment past the
            curve's end logs nothing); what early-stopping policies read.
        metric: the name ``curve`` is logged under.
    """

    rows: int = 16
    batch: int = 4
    epochs: int = 1
    max_steps: int | None = None
    fail_at_step: int | None = None
    add_error: str | None = None
    hparams: dict[str, Any] = field(default_factory=dict, compare=False)
    curve: tuple[float, ...] = ()
    metric: str = "eval_loss"

    def metrics_at(self, segments: int) -> dict[str, float]:
        """What the run logs in its ``segments``-th segment (``{metric: curve[segments - 1]}`` or nothing)."""
        return {self.metric: self.curve[segments - 1]} if 0 < segments <= len(self.curve) else {}

    def plan(self, num_chunks: int) -> ChunkPlan:
        spe = math.ceil(self.rows / self.batch)
        total = self.max_steps if self.max_steps is not None else self.epochs * spe
        return plan_chunks(self.rows, num_chunks, self.batch, total)


class FakeDevice:
    """One device shared by several fake executors (experiments of one process).

    Records every breach of "one segment of any experiment at a time, and no executor call of another
    experiment while a segment trains" in ``violations``, and the order of all segments in ``segments``
    (``(executor name, run id, stop step)``).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.busy: tuple[str, int] | None = None  # (executor name, run id) of the segment in flight
        self.violations: list[str] = []
        self.segments: list[tuple[str, int, int]] = []

    def call(self, name: str, what: str) -> None:
        """An executor call of ``name``: a breach if another executor's segment is in flight."""
        with self.lock:
            if self.busy is not None and self.busy[0] != name:
                self.violations.append(f"{name}: {what} while {self.busy[0]} trains run {self.busy[1]}")

    def begin(self, name: str, run_id: int, stop: int) -> None:
        self.call(name, f"run_segment({run_id})")
        with self.lock:
            self.busy = (name, run_id)
            self.segments.append((name, run_id, stop))

    def end(self, name: str) -> None:
        with self.lock:
            if self.busy is not None and self.busy[0] == name:
                self.busy = None


class FakeExecutor(Executor):
    """A deterministic Executor.

    Modes:
        ``auto``: ``run_segment`` returns an already resolved Future.
        ``thread``: the Future is resolved by a timer thread after ``delay`` seconds.
        ``manual``: the Future stays pending until the test calls :meth:`resolve`.

    It records every call in ``events`` (``("add_run", id, warm_from)``, ``("segment", id, stop)``,
    ``("on_status", id, status)``, ``("has_boundary", id)``) and every protocol breach in ``violations``: an
    executor call other than ``run_segment`` while a segment is in flight, two segments at once, a segment for
    an unknown run or past its plan. With a shared ``device`` (:class:`FakeDevice`), calls made while another
    executor's segment trains are recorded there.
    """

    def __init__(
        self,
        num_chunks: int = 2,
        mode: str = "auto",
        delay: float = 0.002,
        device: FakeDevice | None = None,
        name: str = "fake",
    ) -> None:
        assert mode in ("auto", "thread", "manual")
        self.device = device
        self.name = name
        self.num_chunks = num_chunks
        self.mode = mode
        self.delay = delay
        self.cond = threading.Condition()
        self.events: list[tuple[Any, ...]] = []
        self.calls: list[tuple[int, int]] = []
        self.violations: list[str] = []
        self.specs: dict[int, FakeSpec] = {}
        self.plans: dict[int, ChunkPlan] = {}
        self.steps: dict[int, int] = {}
        self.last_boundary: dict[int, int] = {}
        self.boundary_override: dict[int, bool] = {}
        self.inflight: tuple[int, int, Future[SegmentResult]] | None = None
        self.on_segment: Callable[[int, int], None] | None = None  # hook run inside run_segment
        self.on_add_run: Callable[[int, int | None], None] | None = None  # hook run inside add_run
        self.add_run_delay = 0.0
        self.closed = False

    # ---------------------------------------------------------------- Executor API
    def add_run(
        self, run_id: int, spec: Any, warm_from: int | None = None, *, device: str | None = None
    ) -> RunStart:
        check_device(self, device)
        self._guard("add_run", run_id)
        with self.cond:
            self.events.append(("add_run", run_id, warm_from))
        if self.on_add_run is not None:
            self.on_add_run(run_id, warm_from)
        if self.add_run_delay:
            time.sleep(self.add_run_delay)
        assert isinstance(spec, FakeSpec), spec
        if spec.add_error:
            raise ValueError(spec.add_error)
        plan = spec.plan(self.num_chunks)
        with self.cond:
            self.specs[run_id] = spec
            self.plans[run_id] = plan
            if warm_from is not None:
                step = min(self.last_boundary.get(warm_from, 0), plan.total_steps)
                self.steps[run_id] = step
                if step:
                    self.last_boundary[run_id] = step
                return RunStart(
                    plan=plan,
                    step=step,
                    segments_done=plan.segments_done_at(step),
                    samples_seen=plan.samples_seen(step),
                )
            self.steps[run_id] = 0
        return RunStart(plan=plan)

    def run_segment(self, run_id: int, stop_step: int) -> Future[SegmentResult]:
        fut: Future[SegmentResult] = Future()
        with self.cond:
            if self.inflight is not None:
                self.violations.append(f"run_segment({run_id}) while run {self.inflight[0]} is training")
            plan = self.plans.get(run_id)
            if plan is None:
                self.violations.append(f"run_segment for unknown run {run_id}")
            elif not plan.is_boundary(stop_step) or stop_step <= self.steps[run_id]:
                self.violations.append(
                    f"run_segment({run_id}, {stop_step}): not the next boundary of "
                    f"{plan.boundaries} from step {self.steps[run_id]}"
                )
            self.calls.append((run_id, stop_step))
            self.events.append(("segment", run_id, stop_step))
            self.inflight = (run_id, stop_step, fut)
        if self.device is not None:
            self.device.begin(self.name, run_id, stop_step)
        if self.on_segment is not None:
            self.on_segment(run_id, stop_step)
        with self.cond:
            self.cond.notify_all()
        if self.mode == "auto":
            self.resolve()
        elif self.mode == "thread":
            t = threading.Timer(self.delay, self.resolve)
            t.daemon = True
            t.start()
        return fut

    def has_boundary(self, run_id: int) -> bool:
        self._guard("has_boundary", run_id)
        with self.cond:
            self.events.append(("has_boundary", run_id))
            if run_id in self.boundary_override:
                return self.boundary_override[run_id]
            return self.last_boundary.get(run_id, 0) > 0

    def on_status(self, run_id: int, status: str) -> None:
        self._guard("on_status", run_id)
        with self.cond:
            self.events.append(("on_status", run_id, status))

    def close(self) -> None:
        self.closed = True

    # ---------------------------------------------------------------- test controls
    def _guard(self, name: str, run_id: int) -> None:
        if self.device is not None:
            self.device.call(self.name, f"{name}({run_id})")
        with self.cond:
            if self.inflight is not None:
                self.violations.append(f"{name}({run_id}) called while run {self.inflight[0]} is training")

    def wait_inflight(self, timeout: float = TIMEOUT) -> tuple[int, int]:
        """Block until a segment is in flight; returns its ``(run_id, stop_step)``."""
        with self.cond:
            if not self.cond.wait_for(lambda: self.inflight is not None, timeout):
                raise AssertionError("no segment started")
            assert self.inflight is not None
            return self.inflight[0], self.inflight[1]

    def resolve(self, error: str | None = None, raise_exc: BaseException | None = None) -> tuple[int, int]:
        """Finish the segment in flight (with ``error`` it fails; with ``raise_exc`` the Future raises)."""
        with self.cond:
            assert self.inflight is not None, "no segment in flight"
            run_id, stop, fut = self.inflight
            plan, spec = self.plans[run_id], self.specs[run_id]
            before = self.steps[run_id]
            if spec.fail_at_step is not None and before < spec.fail_at_step <= stop:
                error = error or f"boom at step {spec.fail_at_step}"
            if error is not None or raise_exc is not None:
                res = SegmentResult(step=before, samples_seen=plan.samples_seen(before), error=error)
            else:
                self.steps[run_id] = stop
                self.last_boundary[run_id] = stop
                res = SegmentResult(
                    step=stop,
                    samples_seen=plan.samples_seen(stop),
                    finished=stop >= plan.total_steps,
                    metrics=spec.metrics_at(plan.segments_done_at(stop)),
                )
            self.inflight = None  # cleared before the scheduler can see the Future done
            if self.device is not None:
                self.device.end(self.name)
            self.cond.notify_all()
        if raise_exc is not None:
            fut.set_exception(raise_exc)
        else:
            fut.set_result(res)
        return run_id, stop

    def statuses(self, run_id: int) -> list[str]:
        """The statuses passed to ``on_status`` for ``run_id``, in order."""
        with self.cond:
            return [e[2] for e in self.events if e[0] == "on_status" and e[1] == run_id]

    def calls_of(self, run_id: int) -> list[int]:
        with self.cond:
            return [s for r, s in self.calls if r == run_id]


class Recorder(SchedulerListener):
    """Records every hook call; serves ops from ``inbox`` through ``poll_ops``; counts loop turns."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.snaps: list[RunSnapshot] = []
        self.op_events: list[tuple[str, str, str]] = []  # (op_id, state, message)
        self.ops_seen: dict[str, Op] = {}
        self.ops_log: dict[str, dict[str, Any]] = {}  # op id -> its entry, as the kernel's store keeps ops
        self.inbox: list[Op] = []
        self.beats = 0
        self.threads: set[str] = set()
        self.notes: list[str] = []
        self.added: list[tuple[int, dict[str, Any]]] = []  # (run id, info) of runs a policy added
        self.progress: list[dict[str, Any]] = []  # the early-stopping progress told, in order

    def on_run(self, snap: RunSnapshot) -> None:
        with self.cond:
            self.snaps.append(snap)
            self.threads.add(threading.current_thread().name)

    def on_op(self, op: Op, ack: OpAck) -> None:
        with self.cond:
            self.op_events.append((op.op_id, ack.state, ack.message))
            self.ops_seen[op.op_id] = op
            entry = self.ops_log.get(op.op_id)
            if entry is None:
                entry = {
                    "op_id": op.op_id,
                    "run_id": op.run_id,
                    "kind": op.kind.value,
                    "requested_at": op.requested_at,
                    "applied_at": None,
                }
                self.ops_log[op.op_id] = entry
            elif ack.state != "queued":
                entry["applied_at"] = time.time()
            entry.update(state=ack.state, message=ack.message)

    def poll_ops(self) -> Sequence[Op]:
        with self.cond:
            ops, self.inbox = self.inbox, []
            return ops

    def on_note(self, text: str) -> None:
        with self.cond:
            self.notes.append(text)

    def on_added(self, snap: RunSnapshot, info: Mapping[str, Any]) -> None:
        with self.cond:
            self.added.append((snap.run_id, dict(info)))

    def on_early_stopping(self, progress: Mapping[str, Any]) -> None:
        with self.cond:
            self.progress.append(dict(progress))

    def on_heartbeat(self) -> None:
        with self.cond:
            self.beats += 1
            self.cond.notify_all()

    def states(self, op_id: str) -> list[str]:
        with self.cond:
            return [s for i, s, _ in self.op_events if i == op_id]

    def statuses(self, run_id: int) -> list[RunStatus]:
        """The run's status in each on_run snapshot, consecutive duplicates collapsed."""
        with self.cond:
            out: list[RunStatus] = []
            for s in self.snaps:
                if s.run_id == run_id and (not out or out[-1] is not s.status):
                    out.append(s.status)
            return out

    def wait_beats(self, n: int, timeout: float = TIMEOUT) -> None:
        """Wait until the loop has started ``n`` more turns than now."""
        with self.cond:
            target = self.beats + n
            if not self.cond.wait_for(lambda: self.beats >= target, timeout):
                raise AssertionError(f"the scheduler loop made no progress ({self.beats}/{target} turns)")


class Harness:
    """One Scheduler over a FakeExecutor and a Recorder, with helpers to drive it step by step."""

    def __init__(
        self,
        specs: Sequence[FakeSpec] | dict[int, FakeSpec],
        num_chunks: int = 2,
        mode: str = "auto",
        idle_poll_s: float = 0.002,
        start: bool = True,
        arbiter: DeviceArbiter | None = None,
        device: FakeDevice | None = None,
        name: str = "fake",
        early_stopping: EarlyStoppingPolicy | None = None,
    ) -> None:
        self.fake = FakeExecutor(num_chunks=num_chunks, mode=mode, device=device, name=name)
        self.rec = Recorder()
        # its own arbiter unless told to share one: a harness left open cannot hold up the next test
        self.sched = Scheduler(
            self.fake,
            listener=self.rec,
            idle_poll_s=idle_poll_s,
            arbiter=arbiter or DeviceArbiter(),
            owner=name,
            early_stopping=early_stopping,
        )
        items = specs.items() if isinstance(specs, dict) else enumerate(specs, start=1)
        for run_id, spec in items:
            self.sched.add_run(run_id, spec)
        if start:
            self.sched.start()

    def settle(self) -> None:
        """Return once the loop has fully processed everything that happened before this call.

        Every loop turn drains the command queue, runs boundary actions, finishes a done segment or starts
        the next one; three complete turns after the call cover "finish segment, start the next, wait".
        """
        self.rec.wait_beats(4)

    def step(self, error: str | None = None) -> tuple[int, int]:
        """Finish the segment in flight (manual mode) and settle; returns its ``(run_id, stop_step)``."""
        self.fake.wait_inflight()
        out = self.fake.resolve(error)
        self.settle()
        return out

    def run_to_idle(self, timeout: float = TIMEOUT) -> None:
        """Manual mode: finish segments until nothing is left to train."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.settle()
            if self.fake.inflight is None and self.sched.is_idle():
                return
            if self.fake.inflight is not None:
                self.fake.resolve()
        raise AssertionError("the scheduler never became idle")

    def status(self, run_id: int) -> RunStatus:
        snap = self.sched.run_snapshot(run_id)
        assert snap is not None, f"run {run_id} does not exist"
        return snap.status

    def close(self) -> None:
        if self.fake.inflight is not None and self.fake.mode == "manual":
            self.fake.resolve()
        self.sched.close(timeout=TIMEOUT)
