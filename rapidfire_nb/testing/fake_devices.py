"""A fake executor with several devices (no torch): segments take simulated time per device, in parallel.

:class:`FakeDevices` implements :class:`kernel_scheduler.Executor` for ``devices=("d0", "d1", ...)``: each
device trains one segment at a time on its own timer thread (``seconds_per_step`` each), runs stick to the
device they were added on, :meth:`move_run` moves a parked run (from its latest boundary, or from its latest
"checkpoint" when its device died), and :meth:`kill` makes a device's worker die (its segment resolves with
``device_lost=True``). Every segment start is recorded with the run's chunks done and the time, so tests can
check the fairness invariant and the parallelism on the recorded schedule; every protocol breach (two segments
on one device, a call for a device while it trains, a call on a dead device) goes to ``violations``.

Composite devices (a gang, ``"d0+d1"``) may be listed beside single ones: a :class:`GangSpec` run (``width`` 2) is
added on a composite of that many parts (:meth:`FakeDevices.width_of`); two devices sharing a part training at once,
or a call on a device while one sharing a part with it trains, is a violation; a part that dies kills its
composites.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from kernel_scheduler import Executor, RunStart, SegmentResult, device_parts, device_width, overlaps

from .fakes import FakeSpec

__all__ = ["FakeDevices", "GangSpec", "SegmentRecord"]


@dataclass(frozen=True)
class GangSpec(FakeSpec):
    """A fake run that trains on ``width`` devices at once (a composite device of that many parts)."""

    width: int = 2


@dataclass(frozen=True)
class SegmentRecord:
    """One segment as it started: where, which run, its chunks done before it, and when (monotonic s)."""

    device: str
    run_id: int
    segments_done: int
    start: float
    end: float = 0.0


class FakeDevices(Executor):
    """Several fake devices.

    Args:
        devices: device names.
        num_chunks: chunks per epoch of every run.
        seconds_per_step: per device (default 0.002 s each).
        checkpoint_lag: a run that loses its device continues from this many chunks before its latest boundary
            (0: the latest boundary was checkpointed).
    """

    def __init__(
        self,
        devices: Sequence[str] = ("d0", "d1"),
        num_chunks: int = 4,
        seconds_per_step: Mapping[str, float] | None = None,
        checkpoint_lag: int = 0,
    ) -> None:
        self._devices = tuple(devices)
        self.num_chunks = num_chunks
        self.seconds = {d: 0.002 for d in self._devices} | dict(seconds_per_step or {})
        self.checkpoint_lag = checkpoint_lag
        self.lock = threading.Lock()
        self.where: dict[int, str] = {}
        self.specs: dict[int, FakeSpec] = {}
        self.steps: dict[int, int] = {}
        self.boundaries: dict[int, bool] = {}
        self.dead: set[str] = set()
        self.inflight: dict[str, tuple[int, Future[SegmentResult], threading.Timer]] = {}
        self.schedule: list[SegmentRecord] = []
        self.moves: list[tuple[int, str, str, int]] = []  # (run id, from, to, step)
        self.events: list[
            tuple[Any, ...]
        ] = []  # ("add_run", id, device, warm_from, device asked), ("on_status", ...)
        self.violations: list[str] = []

    # ------------------------------------------------------------------ devices
    @property
    def devices(self) -> tuple[str, ...]:
        return self._devices

    def device_of(self, run_id: int) -> str:
        return self.where[run_id]

    def alive(self, device: str) -> bool:
        return device not in self.dead and self.dead.isdisjoint(device_parts(device))

    def width_of(self, spec: Any) -> int:
        return int(getattr(spec, "width", 1))

    def kill(self, device: str) -> None:
        """The device's worker dies now (and every composite it is part of): a segment in flight there resolves
        with ``device_lost=True``."""
        with self.lock:
            self.dead.add(device)
            flights = [self.inflight.pop(d) for d in list(self.inflight) if overlaps(d, device)]
        for flight in flights:
            run_id, fut, timer = flight
            timer.cancel()
            fut.set_result(
                SegmentResult(self.steps[run_id], 0, error=f"worker {device} died: killed", device_lost=True)
            )

    # ------------------------------------------------------------------ Executor API
    def _check(self, device: str, what: str) -> None:
        with self.lock:
            for d, (rid, _, _) in self.inflight.items():
                if overlaps(d, device):
                    self.violations.append(f"{what} on {device} while {d} trains run {rid}")
            if not self.alive(device):
                self.violations.append(f"{what} on dead device {device}")

    def add_run(
        self, run_id: int, spec: Any, warm_from: int | None = None, device: str | None = None
    ) -> RunStart:
        asked = device
        if warm_from is not None:
            device = self.where[warm_from]
        if device is None:
            width = self.width_of(spec)
            live = [d for d in self._devices if self.alive(d) and device_width(d) == width]
            # the fewest runs on it and on the devices sharing a part with it, then device order
            device = min(
                live, key=lambda d: (sum(1 for w in self.where.values() if overlaps(w, d)), live.index(d))
            )
        self._check(device, f"add_run({run_id})")
        self.events.append(("add_run", run_id, device, warm_from, asked))
        plan = spec.plan(self.num_chunks)
        step = self.steps.get(warm_from, 0) if warm_from is not None else 0
        with self.lock:
            self.where[run_id], self.specs[run_id], self.steps[run_id] = device, spec, step
            self.boundaries[run_id] = False
        return RunStart(plan, step, plan.segments_done_at(step), plan.samples_seen(step))

    def run_segment(self, run_id: int, stop_step: int) -> Future[SegmentResult]:
        device = self.where[run_id]
        fut: Future[SegmentResult] = Future()
        with self.lock:
            if device in self.inflight:
                self.violations.append(f"two segments on {device}")
            elif any(overlaps(d, device) for d in self.inflight):
                self.violations.append(f"two segments on devices sharing a part with {device}")
            if not self.alive(device):
                fut.set_result(SegmentResult(self.steps[run_id], 0, error="dead", device_lost=True))
                return fut
            start_step = self.steps[run_id]
            plan = self.specs[run_id].plan(self.num_chunks)
            record = SegmentRecord(device, run_id, plan.segments_done_at(start_step), time.monotonic())
            index = len(self.schedule)
            self.schedule.append(record)
        seconds = (stop_step - start_step) * self.seconds[device]

        def done() -> None:
            with self.lock:
                if self.inflight.get(device, (None,))[0] != run_id:
                    return  # killed meanwhile
                del self.inflight[device]
                self.steps[run_id] = stop_step
                self.boundaries[run_id] = True
                self.schedule[index] = SegmentRecord(
                    record.device, record.run_id, record.segments_done, record.start, time.monotonic()
                )
            segments = plan.segments_done_at(stop_step)
            fut.set_result(
                SegmentResult(
                    stop_step,
                    plan.samples_seen(stop_step),
                    finished=stop_step >= plan.total_steps,
                    metrics=self.specs[run_id].metrics_at(segments),
                )
            )

        timer = threading.Timer(seconds, done)
        with self.lock:
            self.inflight[device] = (run_id, fut, timer)
        timer.start()
        return fut

    def has_boundary(self, run_id: int) -> bool:
        device = self.where.get(run_id)
        return self.boundaries.get(run_id, False) and device is not None and self.alive(device)

    def on_status(self, run_id: int, status: str) -> None:
        device = self.where.get(run_id)
        if device is not None and self.alive(device):
            self._check(device, f"on_status({run_id}, {status})")
        self.events.append(("on_status", run_id, status))

    def move_run(self, run_id: int, spec: Any, device: str) -> RunStart:
        source = self.where[run_id]
        self._check(device, f"move_run({run_id})")
        plan = self.specs[run_id].plan(self.num_chunks)
        step = self.steps[run_id]
        if not self.alive(source) and self.checkpoint_lag:  # the latest checkpoint lies further back
            done = max(0, plan.segments_done_at(step) - self.checkpoint_lag)
            step = plan.boundary(done - 1) if done else 0
        with self.lock:
            self.where[run_id], self.steps[run_id] = device, step
            self.boundaries[run_id] = (
                False  # as a real device: no in-memory boundary until it ends a chunk there
            )
            self.moves.append((run_id, source, device, step))
        return RunStart(plan, step, plan.segments_done_at(step), plan.samples_seen(step))

    def close(self) -> None:
        with self.lock:
            timers = [t for _, _, t in self.inflight.values()]
        for timer in timers:
            timer.cancel()
