"""DevicePool: several devices behind one :class:`kernel_scheduler.Executor` (torch-free).

Each member trains on one device and hosts today's training layer there: a
:class:`~rapidfire_nb.devices.local.WorkerExecutor` (a spawned process) or a
:class:`~rapidfire_nb.devices.ray_backend.RayWorkerExecutor` (a Ray actor). The pool only routes: a run lives on
one member (its trainer, adapter and base model are there), every call for it goes to that member, and a move
to another member goes through the run's latest boundary checkpoint, the path a crash resume takes (so a moved
run stays exact). The scheduler thread decides where runs go (``kernel_scheduler.placement``); the pool does what
it is told, and places a run itself only when nobody says where (initial runs: the member with fewest runs).

A clone is built in one call here (``Executor.prepare_run``'s default: nothing prepared off the loop): the worker
builds it on its own device thread while the scheduler thread waits for the reply: the segments in flight on the
other devices end, but none starts and no op applies meanwhile. Tokenizing a clone's rows in the worker before the build (as
``training.prepared_rows`` does in one process) would need a "prepare" request in the worker protocol; not done.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from kernel_scheduler import Executor, RunStart, SegmentResult, device_parts, overlaps

from ..errors import ConfigError
from ..run_folder import WARM_START_PREFIX, latest_checkpoint, run_dir
from ..spec.gangs import run_width
from .errors import WorkerLost
from .gang import GangExecutor

__all__ = ["DevicePool"]

log = logging.getLogger(__name__)

ModelLoader = Callable[[Any, Path], tuple[Any, Any]]
"""``load(spec, final_dir) -> (model, tokenizer)``, in the kernel process (``training.runtime.load_final_model``)."""


class DevicePool(Executor):
    """Routes every run's calls to the device it lives on; moves runs between devices through checkpoints.

    Args:
        members: device name -> that device's executor (one device each), in device order.
        exp_dir: the experiment folder (``runs/<id>/`` holds the checkpoints a move resumes from).
        load_model: loads a run's final weights in the kernel process (``Experiment.load_model``).
        on_closed: called once by :meth:`close` after every member closed (the Ray backend removes its placement
            group there); what it raises is logged, not raised.

    Called from the scheduler thread (and, before it starts, from ``run_fit``'s thread), except
    :meth:`checkpoint_dir` (the recorder thread).
    """

    def __init__(
        self,
        members: Mapping[str, Any],
        exp_dir: Path,
        load_model: ModelLoader,
        on_closed: Callable[[], None] | None = None,
    ) -> None:
        if not members:
            raise ValueError("a DevicePool needs at least one device")
        self._on_closed = on_closed
        self._members = dict(members)
        self._exp_dir = Path(exp_dir)
        self._load = load_model
        self._where: dict[int, str] = {}
        self._specs: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._drops: list[threading.Thread] = []

    # ------------------------------------------------------------------ devices
    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(self._members)

    def member(self, device: str) -> Any:
        """The executor of ``device`` (tests, the panel's device states)."""
        return self._members[device]

    def device_of(self, run_id: int) -> str:
        with self._lock:
            return self._where[run_id]

    def alive(self, device: str) -> bool:
        return bool(self._members[device].alive(device))

    def _live(self) -> list[str]:
        return [d for d in self._members if self.alive(d)]

    # ------------------------------------------------------------------ Executor API
    def add_run(
        self,
        run_id: int,
        spec: Any,
        warm_from: int | None = None,
        resume_from: Path | None = None,
        device: str | None = None,
    ) -> RunStart:
        """Build run ``run_id`` on ``device``: a warm clone on its parent's device (the parent's boundary snapshot
        is there), else ``device``, else the live device with the fewest runs.

        Raises:
            ConfigError: bad input (from the device's trainer build), or no device is alive.
        """
        width = self.width_of(spec)
        if warm_from is not None and warm_from in self._where:  # else on disk: it finished before
            device = self.device_of(warm_from)
        if device is None or not self.alive(device) or len(device_parts(device)) != width:
            device = self._least_used(width)
        start: RunStart = self._members[device].add_run(
            run_id, spec, warm_from=warm_from, resume_from=resume_from
        )
        with self._lock:
            self._where[run_id] = device
            self._specs[run_id] = spec
        return start

    def width_of(self, spec: Any) -> int:
        """The devices a run of ``spec`` trains on at once (its ``num_gpus``; :func:`~rapidfire_nb.spec.gangs.run_width`)."""
        return run_width(spec)

    def revive(self, device: str) -> bool:
        """Start fresh workers for a dead composite device (a gang, :class:`~.gang.GangExecutor`); True when it is
        alive afterwards. A single device is not revived (its runs move to the others)."""
        member = self._members[device]
        return bool(member.revive(device)) if isinstance(member, GangExecutor) else self.alive(device)

    def _least_used(self, width: int) -> str:
        """The live device of ``width`` parts with the fewest runs.

        Raises:
            ConfigError: none is alive (every worker died, or this run_fit has no gang of that width).
        """
        live = [d for d in self._live() if len(device_parts(d)) == width]
        if not live:
            if width > 1:
                gangs = [d for d in self._members if len(device_parts(d)) > 1] or ["none"]
                raise ConfigError(
                    f"num_gpus={width}: this run_fit has no live gang of {width} devices (its gangs: "
                    f"{', '.join(gangs)}); give the run a num_gpus that one of them has"
                )
            raise ConfigError("no device is left to train on: every worker died")
        with self._lock:  # runs on a device sharing a part count too: they never train at once with it
            counts = {d: sum(1 for w in self._where.values() if overlaps(w, d)) for d in live}
        return min(live, key=lambda d: (counts[d], live.index(d)))

    def run_segment(self, run_id: int, stop_step: int) -> Future[SegmentResult]:
        fut: Future[SegmentResult] = self._members[self.device_of(run_id)].run_segment(run_id, stop_step)
        return fut

    def has_boundary(self, run_id: int) -> bool:
        device = self._where.get(run_id)
        if device is None:  # finished before this run_fit: its final state on disk (a shared folder)
            live = self._live()
            return bool(live) and bool(self._members[live[0]].has_boundary(run_id))
        return self.alive(device) and bool(self._members[device].has_boundary(run_id))

    def on_status(self, run_id: int, status: str) -> None:
        device = self._where.get(run_id)
        if device is None or not self.alive(device):
            return  # a lost run's status change: nothing is left of it on that device
        self._members[device].on_status(run_id, status)

    def move_run(self, run_id: int, spec: Any, device: str) -> RunStart:
        """Continue run ``run_id`` on ``device`` from its latest boundary: exported by its device when that one is
        alive and the run ended a chunk there, else the latest complete checkpoint on disk (or its warm start, or
        step 0 when it has neither: a run that has not trained yet simply starts on ``device``).

        Raises:
            ConfigError: ``device`` is not alive or the trainer cannot be rebuilt there.
        """
        source = self.device_of(run_id)
        if not self.alive(device):
            raise ConfigError(f"device {device} is not alive")
        if self.alive(source) and self._members[source].has_boundary(run_id):
            checkpoint: Path | None = Path(self._members[source].export_boundary(run_id))
        else:  # its device died, or it has not ended a chunk there: where it started is on disk (or step 0)
            folder = run_dir(self._exp_dir, run_id)
            checkpoint = latest_checkpoint(folder) or latest_checkpoint(folder, WARM_START_PREFIX)
        start: RunStart = self._members[device].add_run(run_id, spec, resume_from=checkpoint)
        with self._lock:
            self._where[run_id] = device
            self._specs[run_id] = spec
        if self.alive(source) and source != device:
            self._drop_later(source, run_id)
        return start

    def _drop_later(self, device: str, run_id: int) -> None:
        """Free the run's trainer on its old device once that device finishes what it trains (not waited for)."""

        def drop() -> None:
            try:
                self._members[device].drop_run(run_id)
            except Exception:  # the worker died meanwhile: nothing is left to free
                log.debug("drop of run %s on %s failed", run_id, device, exc_info=True)

        thread = threading.Thread(target=drop, name=f"rapidfire-drop-{run_id}", daemon=True)
        thread.start()
        self._drops = [t for t in self._drops if t.is_alive()] + [thread]

    def close(self) -> None:
        """Shut every device's worker down (in parallel; each joins its worker, then kills it if it must; up to
        ~60 s each), then call ``on_closed`` (once, even when called again)."""
        for thread in self._drops:
            thread.join(timeout=10)
        threads = [
            threading.Thread(target=member.close, name=f"rapidfire-close-{d}", daemon=True)
            for d, member in self._members.items()
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=90)
        hook, self._on_closed = self._on_closed, None
        if hook is not None:
            try:
                hook()
            except Exception:
                log.exception("rapidfire_nb: closing the devices")

    # ------------------------------------------------------------------ extras used by the experiment layer
    def flush(self) -> None:
        """Wait until every live device's queued checkpoints are on disk."""
        for device in self._live():
            self._members[device].flush()

    def has_run(self, run_id: int) -> bool:
        device = self._where.get(run_id)
        return device is not None and self.alive(device)

    def checkpoint_dir(self, run_id: int) -> Path | None:
        """The run's latest written checkpoint: its device's answer, or the disk's once that device's worker is
        dead (also when it dies during this call: the recorder asks at every run event)."""
        device = self._where.get(run_id)
        if device is not None and self.alive(device):
            try:
                found = self._members[device].checkpoint_dir(run_id)
            except WorkerLost:
                pass
            else:
                return Path(found) if found is not None else None
        return latest_checkpoint(run_dir(self._exp_dir, run_id))

    def save_final(self, run_id: int) -> Path:
        return Path(self._members[self.device_of(run_id)].save_final(run_id))

    def load_model(
        self, run_id: int, spec: Any | None = None, final_dir: Path | None = None
    ) -> tuple[Any, Any]:
        """A fresh ``(model, tokenizer)`` with the run's trained weights, loaded in this (the kernel's) process.

        A run trained here is saved first when it has no final weights yet.

        Raises:
            ConfigError: the run is unknown here and no ``final_dir`` with saved weights was given.
        """
        if self.has_run(run_id):
            final = self._members[self.device_of(run_id)].final_dir(run_id)
            final_dir = Path(final) if final is not None else self.save_final(run_id)
            spec = self._specs[run_id]
        if spec is None or final_dir is None or not Path(final_dir).is_dir():
            raise ConfigError(f"run {run_id} has no saved final weights to load")
        return self._load(spec, Path(final_dir))
