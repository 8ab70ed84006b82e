"""What the scheduler knows about each run: its frozen snapshot (any thread), its mutable record (the scheduler
thread only) and the listener hooks the scheduler calls (standard library only)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .chunks import ChunkPlan
from .executor import RunStart
from .ops import Op, OpAck
from .status import RunStatus

__all__ = ["Run", "RunSnapshot", "SchedulerListener", "StopInfo"]


@dataclass(frozen=True)
class RunSnapshot:
    """A frozen view of one run (safe to read from any thread).

    Attributes:
        run_id: 1..N, the same number everywhere.
        status: :class:`RunStatus`.
        step: optimizer steps done; ``total_steps`` the run's total (0 while not prepared).
        segments_done: chunks completed over all epochs; ``num_segments`` the run's total.
        position: ``(epoch, chunk)`` of the next chunk to train (1-based).
        samples_seen: training rows consumed.
        on_device: True while this run is training.
        parent_id / warm_start: set for clones.
        error: the failure text for FAILED runs (or a rejected warm start).
        spec: the run's config object (opaque to the scheduler).
        stop_reason: why a STOPPED run stopped: the early-stopping policy's reason (``"pruned at chunk 2/8:
            ..."``) or ``"stopped by the user (panel)"``; None for a run that is not STOPPED.
        pruned: True when the early-stopping policy stopped it (and nobody resumed it since).
        device: the device the run is on (its trainer and base model live there), e.g. ``"cpu:1"``; ``""``
            for a run not placed (finished in an earlier process).
    """

    run_id: int
    status: RunStatus
    step: int
    total_steps: int
    segments_done: int
    num_segments: int
    position: tuple[int, int]
    samples_seen: int
    on_device: bool
    parent_id: int | None
    warm_start: bool
    error: str | None
    spec: Any
    steps_per_epoch: int = 0
    stop_reason: str | None = None
    pruned: bool = False
    device: str = ""

    @property
    def epoch(self) -> float:
        """Fractional epoch (steps / steps per epoch), TRL's convention."""
        return self.step / self.steps_per_epoch if self.steps_per_epoch else 0.0


class SchedulerListener:
    """Hooks called on the scheduler thread. Override what you need; defaults do nothing."""

    def on_run(self, snap: RunSnapshot) -> None:
        """A run's state changed (status, progress)."""

    def on_op(self, op: Op, ack: OpAck) -> None:
        """An op was queued, applied or rejected."""

    def poll_ops(self) -> Sequence[Op]:
        """Ops from another process (the ops inbox); called at chunk boundaries and ~1/s while idle."""
        return ()

    def on_heartbeat(self) -> None:
        """Called at every loop turn (at most ~1/s while idle)."""

    def on_added(self, snap: RunSnapshot, info: Mapping[str, Any]) -> None:
        """The early-stopping policy added a run mid-experiment (a search's new trial); ``info`` says what it is."""

    def on_note(self, text: str) -> None:
        """A sentence for the user from the early-stopping policy (e.g. a metric no run logs)."""

    def on_rewound(self, snap: RunSnapshot, step: int) -> None:
        """The run continues from its checkpoint at ``step`` (its worker died): what it logged after ``step`` is
        void and will be logged again."""

    def on_early_stopping(self, progress: Mapping[str, Any]) -> None:
        """The early-stopping policy's progress changed (:meth:`Scheduler.early_stopping_progress`): at start and
        whenever a decision point changes it ({} once a broken policy was switched off)."""


@dataclass(frozen=True)
class StopInfo:
    """One run's stops so far (rebuilt from the ops log by ``rapidfire_nb.stops.stop_history`` on a restart).

    Attributes:
        reason: why its latest applied stop happened (None after a later resume).
        pruned: the latest applied stop came from the early-stopping policy and nobody resumed it since.
        exempt_through: the user resumed it after the policy stopped it after this many chunks (0: never); the
            policy does not stop it again at a rung up to there (later rungs judge it like any run).
    """

    reason: str | None = None
    pruned: bool = False
    exempt_through: int = 0


@dataclass
class Run:
    """One run's mutable state, owned by the scheduler thread (others read :class:`RunSnapshot` copies)."""

    run_id: int
    spec: Any
    status: RunStatus = RunStatus.NEW
    plan: ChunkPlan | None = None
    step: int = 0
    segments_done: int = 0
    samples_seen: int = 0
    parent_id: int | None = None
    warm_start: bool = False
    error: str | None = None
    deferred: list[Op] = field(default_factory=list)
    fixed_total: int = 0  # total steps of a finished run registered without a plan
    pending: bool = False  # a clone whose op is not applied yet
    waiting_clone: Op | None = None  # a warm clone waiting for its parent's first boundary
    pruned: bool = False  # its latest stop came from the early-stopping policy
    stop_reason: str | None = None  # why it is STOPPED (the policy's reason or who stopped it)
    exempt_through: int = (
        0  # the user resumed it after the policy stopped it at this chunk: not judged up to it
    )
    device: str | None = None  # where its trainer lives (None: not built in this process)
    lost: bool = False  # its device's worker died: it moves to another device before it trains again
    moving: bool = False  # a move to another device is queued
    seconds_per_step: float | None = None  # measured over its latest segment (placement estimates)

    def place(self, start: RunStart) -> None:
        """Put the run where the executor says it starts (its plan and position; a warm clone starts mid-way)."""
        self.plan, self.step = start.plan, start.step
        self.segments_done, self.samples_seen = start.segments_done, start.samples_seen

    def position(self) -> tuple[int, int]:
        """``(epoch, chunk)`` of the chunk its next segment ends in (1-based); ``(1, 1)`` before it is planned."""
        if self.plan is None:
            return (1, 1)
        return self.plan.label(self.segments_done)

    def chunks(self, segments: int) -> int:
        """Whole chunks done over all epochs once ``segments`` of its segments are complete (a last chunk that
        ``max_steps`` cuts short does not count: :meth:`ChunkPlan.full_chunks_at`; ``segments`` unplanned)."""
        return self.plan.full_chunks_at(segments) if self.plan is not None else segments
