"""The interface between the scheduler and whatever trains runs (torch/TRL in rapidfire_nb.training)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from .chunks import ChunkPlan

__all__ = ["Executor", "SegmentResult", "RunStart", "check_device"]


@dataclass(frozen=True)
class SegmentResult:
    """What a run reports at the end of a segment.

    Attributes:
        step: global optimizer steps done.
        samples_seen: training rows consumed.
        finished: True when the run made its last step.
        error: the error text when the run failed (the run is then FAILED).
        metrics: the metrics the run logged during the segment, latest value per name (TRL's names, e.g. the
            chunk-end ``eval_loss``); what early-stopping policies compare.
        device_lost: the device's worker died during the segment (killed, out of memory, a crash): not the run's
            fault. The run becomes INTERRUPTED and continues from its latest checkpoint on another device;
            ``error`` then says what happened to the worker.
    """

    step: int
    samples_seen: int
    finished: bool = False
    error: str | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    device_lost: bool = False


@dataclass(frozen=True)
class RunStart:
    """Where a newly added run starts: its plan and position (a warm clone starts mid-way)."""

    plan: ChunkPlan
    step: int = 0
    segments_done: int = 0
    samples_seen: int = 0


class Executor(ABC):
    """Trains runs segment by segment. Called only from the scheduler thread.

    At most one segment runs at a time per device (:attr:`devices`; one device unless the executor says more).
    ``run_segment`` must not block: it returns a Future resolved with a :class:`SegmentResult` (never with an
    exception: a failing run reports ``error``).
    """

    @property
    def devices(self) -> tuple[str, ...]:
        """The devices this executor trains on, by name (e.g. ``("cpu:0", "cpu:1")``); one by default.

        Besides single devices it may list composite devices, a gang of k devices that train one run at once
        (FSDP), named by joining the parts with ``+``: ``("cpu:0", "cpu:1", "cpu:0+cpu:1")``
        (:mod:`~kernel_scheduler.gangs`). The scheduler never trains two devices that share a part at once; a
        run of width k lives on a composite of k parts for its life (:meth:`width_of`).
        """
        from .arbiter import DEFAULT_DEVICE

        return (DEFAULT_DEVICE,)

    def width_of(self, spec: Any) -> int:
        """How many devices a run of config ``spec`` trains on at once: 1 (the default) for a single device, k
        for a composite device of k parts. The scheduler places a new run (a clone, a search's trial) on a live
        device of that many parts; it never changes for a run.

        Raises:
            Whatever bad input raises (the run then fails with it).
        """
        return 1

    def device_of(self, run_id: int) -> str:
        """The device run ``run_id`` is on (its trainer and base model live there)."""
        return self.devices[0]

    def alive(self, device: str) -> bool:
        """False once ``device``'s worker died (its runs must move elsewhere). A composite device is dead as soon
        as one of its parts is (the executor says so for the composite too)."""
        return True

    def revive(self, device: str) -> bool:
        """Start fresh workers for ``device`` whose worker died; True when it is alive afterwards. The scheduler
        asks for a dead composite device (a gang) whose runs have no other device of their width: they then move
        back onto it from their latest checkpoints. Default: False (nothing is restarted)."""
        return False

    def move_run(self, run_id: int, spec: Any, device: str) -> RunStart:
        """Move a parked run to ``device`` through its latest boundary checkpoint (the crash-resume path).

        Used when a device would otherwise idle or break the fairness invariant, and for the runs of a device
        whose worker died (then from the latest checkpoint on disk). Raises on an executor with one device.
        """
        raise NotImplementedError("this executor has a single device")

    @abstractmethod
    def add_run(
        self, run_id: int, spec: Any, warm_from: int | None = None, *, device: str | None = None
    ) -> RunStart:
        """Prepare a run (build its trainer, validate) and return its plan and start position.

        Args:
            run_id: the run's id.
            spec: its config (opaque to the scheduler).
            warm_from: parent run id to warm-start from (its latest completed chunk boundary).
            device: where to build it, one of :attr:`devices` (the scheduler always names one); ``None`` lets
                the executor choose. An executor with one device builds there (:func:`check_device`).

        Raises:
            ValueError: ``device`` is not one of :attr:`devices`. Whatever bad input raises (the scheduler then
                rejects / fails the run).
        """

    def prepare_run(self, run_id: int, spec: Any, *, device: str | None = None) -> Future[None] | None:
        """Start the slow part of building a run that needs neither the device nor the scheduler thread (e.g.
        tokenizing its dataset), before :meth:`add_run` builds it. Called on the scheduler thread for a clone (or a
        search's new trial) when its op is applied; returns at once.

        The scheduler keeps training the other runs and applying ops meanwhile; once the Future resolves it calls
        :meth:`add_run` for the run (on its device, between segments, as for any build), which uses what was
        prepared. Whatever touches the device, the shared base model or the process-wide RNG (attaching an adapter,
        building the trainer, which seeds torch) belongs in :meth:`add_run`, never here.

        Args:
            run_id: the run's id.
            spec: its config (opaque to the scheduler).
            device: the device :meth:`add_run` will build it on.

        Returns:
            A Future resolved (with ``None``) once the preparation is done, or with the error bad input raises (the
            scheduler then fails the run with it); or ``None`` (the default) when there is nothing to prepare:
            :meth:`add_run` does everything.
        """
        return None

    @abstractmethod
    def run_segment(self, run_id: int, stop_step: int) -> Future[SegmentResult]:
        """Train ``run_id`` until global optimizer step ``stop_step`` (or its end)."""

    @abstractmethod
    def has_boundary(self, run_id: int) -> bool:
        """True once the run has completed at least one chunk, or finished (its final state: a warm clone can
        start from it)."""

    @abstractmethod
    def on_status(self, run_id: int, status: str) -> None:
        """The run's status changed (e.g. STOPPED/COMPLETED: save final weights; DELETED: release)."""

    @abstractmethod
    def close(self) -> None:
        """Release everything (threads, models)."""


def check_device(executor: Executor, device: str | None) -> None:
    """Raise ValueError when ``device`` is given and is not one of ``executor``'s :attr:`Executor.devices`."""
    if device is not None and device not in executor.devices:
        raise ValueError(f"unknown device {device!r} (devices: {', '.join(executor.devices)})")
