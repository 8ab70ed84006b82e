"""The tracker interfaces: :class:`Tracker` (what every backend implements: each call the fan-out makes),
:class:`Trackers` (what the recorder calls on its one tracker object: the fan-out, or the null tracker),
:class:`TrackedRun` (what a tracker is told about a run), the metric naming of the split style, and a
:class:`BackendTracker` base whose every method does nothing (a backend overrides what it writes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = ["BackendTracker", "Point", "TrackedRun", "Tracker", "Trackers", "split_name"]

Point = tuple[int, Mapping[str, Any], float | None]
"""One stored log call of a run: ``(step, {metric name: value}, wall_time)`` (unix seconds, None: unknown)."""


@dataclass(frozen=True)
class TrackedRun:
    """What a tracker is told about one run when it starts tracking it.

    Attributes:
        run_id: the run's id (the same number as in the store and the panel).
        params: its hyperparameters in the one naming scheme (``learning_rate``, ``lora.r``,
            ``model_kwargs.<key>``), secrets already ``<redacted>``.
        config: its whole config as JSON data (``LeafConfig.to_json()``, secrets ``<redacted>``).
        trainer_type: ``"SFT"``, ``"DPO"`` or ``"GRPO"``.
        parent_id: the run it was cloned from (None for a run of the config group).
        warm_start: a clone that starts from its parent's latest chunk boundary.
        group: experiment-level settings shown with every run (``num_chunks``, ``seed``).
    """

    run_id: int
    params: Mapping[str, Any]
    config: Mapping[str, Any]
    trainer_type: str
    parent_id: int | None = None
    warm_start: bool = False
    group: Mapping[str, Any] = field(default_factory=dict)


def split_name(name: str) -> str:
    """TRL's log name as transformers' TensorBoard/W&B/Trackio callbacks write it: ``eval_loss`` -> ``eval/loss``,
    ``loss`` -> ``train/loss``."""
    return name.replace("eval_", "eval/", 1) if name.startswith("eval_") else f"train/{name}"


@runtime_checkable
class Tracker(Protocol):
    """A backend (TensorBoard, MLflow, Trackio, W&B): every call the :class:`~.fanout.TrackerSet` makes on it, on the
    trackers' thread only. :class:`BackendTracker` gives every method a default (nothing to do), so a backend
    overrides only what it writes; the set calls them all, on every backend.

    ``status`` values are :class:`kernel_scheduler.RunStatus` values (``NEW ONGOING STOPPED COMPLETED FAILED DELETED
    INTERRUPTED``); each tracker maps them to its backend's lifecycle.

    Attributes:
        name: the backend's name in ``tracking=[...]`` (in the set's failure lines).
        metric_style: ``"trl"`` (metric names as TRL logs them: ``eval_loss``) or ``"split"`` (``eval/loss``,
            ``train/loss``: :func:`split_name`).
    """

    name: str
    metric_style: str

    def describe(self) -> str | None:
        """One line printed when training starts: where the data goes and how to look at it (None: nothing)."""

    def log_scalars(
        self, run_id: int, step: int, scalars: Mapping[str, Any], wall_time: float | None = None
    ) -> None:
        """Log named scalar values of run ``run_id`` at optimizer step ``step`` (``wall_time``: unix seconds)."""

    def log_hparams(self, run_id: int, hparams: Mapping[str, Any], step: int = 0) -> None:
        """Log the run's hyperparameters once."""

    def start_run(self, run: TrackedRun, status: str) -> None:
        """Track ``run`` (now in ``status``): create its backend run, or continue the one an earlier kernel made."""

    def set_status(self, run_id: int, status: str, error: str | None = None, at: float | None = None) -> None:
        """Run ``run_id`` changed to ``status`` (``error``: why it failed; ``at``: when, unix seconds, None: now)."""

    def continue_from(self, run_id: int, step: int) -> None:
        """Run ``run_id`` restarts from its checkpoint at ``step``: what was logged above ``step`` before is not
        shown twice."""

    def restore_points(self, run_id: int, step: int, points: Sequence[Point]) -> None:
        """A restarted run's points up to its checkpoint at ``step``, from the store (``(step, {name: value},
        wall_time)`` per log call, in order, names in this tracker's ``metric_style``): write those the backend
        lacks (a killed process may not have written its last ones)."""

    def end_batch(self) -> None:
        """A write window is over (:data:`~.fanout.WRITE_EVERY_S`): write what was buffered."""

    def flush(self) -> None:
        """Write buffered data out."""

    def close(self) -> None:
        """Flush and release everything; idempotent."""

    def mark_deleted(self, run_id: int) -> Path | None:
        """Stop logging run ``run_id`` and mark its data as deleted."""


@runtime_checkable
class Trackers(Protocol):
    """The recorder's one tracker object: every call its :class:`~rapidfire_nb.experiment.record_trackers.TrackerFeed`
    makes, on the trackers' thread only. Implemented by the :class:`~.fanout.TrackerSet` (every backend behind one
    object) and by :class:`~.tensorboard.NullTracker` (nothing to do). Metric names are TRL's (``loss``,
    ``eval_loss``); the set maps them per backend."""

    def open(self) -> None:
        """Make the backends (imports, MLflow's store migrations: seconds); idempotent."""

    def start_run(self, run: TrackedRun, status: str) -> None:
        """Track ``run`` (now in ``status``)."""

    def set_status(self, run_id: int, status: str, error: str | None = None, at: float | None = None) -> None:
        """Run ``run_id`` changed to ``status`` since ``at`` (unix seconds; None: now)."""

    def log_metrics(
        self, run_id: int, step: int, metrics: Mapping[str, float], wall_time: float | None = None
    ) -> None:
        """One TRL log call (``{name: value}``) of run ``run_id`` at ``step``."""

    def continue_from(self, run_id: int, step: int) -> None:
        """Run ``run_id`` continues from its checkpoint at ``step``."""

    def restore_points(self, run_id: int, step: int, points: Sequence[Point]) -> None:
        """A restarted (or unconfirmed ended) run's stored points up to ``step``, TRL's names."""

    def mark_deleted(self, run_id: int) -> object:
        """Run ``run_id`` was deleted (its return value is not used)."""

    def end_batch(self) -> None:
        """The recorder wrote one batch (the set writes the backends' buffers once per window)."""

    def flush(self) -> None:
        """Write everything held before returning."""

    def close(self) -> None:
        """Flush and close everything; idempotent."""


class BackendTracker:
    """Defaults for a backend (MLflow, Trackio, W&B; the :class:`~.tensorboard.NullTracker`): every method of
    :class:`Tracker`, each doing nothing. Subclasses override what their backend does.

    Attributes:
        name: the backend's name in ``tracking=[...]``.
        metric_style: ``"trl"`` (metric names as TRL logs them) or ``"split"`` (``train/loss``, ``eval/loss``).
    """

    name = "backend"
    metric_style = "split"

    def describe(self) -> str | None:
        """One line printed when training starts: where the data goes and how to look at it (None: nothing)."""
        return None

    def start_run(self, run: TrackedRun, status: str) -> None:
        return None

    def set_status(self, run_id: int, status: str, error: str | None = None, at: float | None = None) -> None:
        return None

    def log_scalars(
        self, run_id: int, step: int, scalars: Mapping[str, Any], wall_time: float | None = None
    ) -> None:
        return None

    def log_hparams(self, run_id: int, hparams: Mapping[str, Any], step: int = 0) -> None:
        return None

    def continue_from(self, run_id: int, step: int) -> None:
        return None

    def restore_points(self, run_id: int, step: int, points: Sequence[Point]) -> None:
        """Nothing to write again (W&B: its points are not restored)."""
        return None

    def end_batch(self) -> None:
        """A write window is over (:data:`~.fanout.WRITE_EVERY_S`, the :class:`~.fanout.TrackerSet` decides): write
        what was buffered (one request per run, not one per step)."""
        return None

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None

    def mark_deleted(self, run_id: int) -> Path | None:
        return None


class HeldSteps:
    """The points a backend already holds above a restart point, so that a continued run does not log them twice.

    MLflow and Trackio cannot drop a point once logged. When a run continues from its checkpoint at step ``s``
    after a kernel died, the backend may hold points of steps above ``s`` that the dead kernel logged; the continued
    run logs those steps again (the store dropped its own copies). A tracker records, per metric name, the highest
    step it holds above ``s`` (:meth:`hold`) and skips points at or below it (:meth:`new_only`). The resume is exact
    (TRL's ``resume_from_checkpoint``), so the points kept are the values the continued run computes again.
    """

    def __init__(self) -> None:
        self._held: dict[int, dict[str, int]] = {}
        # every name's highest step, at or below the restart point too (lacking)
        self._highest: dict[int, dict[str, int]] = {}

    def hold(self, run_id: int, from_step: int, steps_by_name: Mapping[str, int]) -> None:
        """Run ``run_id`` continues from ``from_step``; the backend holds ``{name: highest step}``."""
        self._highest[run_id] = {k: int(v) for k, v in steps_by_name.items()}
        held = {k: int(v) for k, v in steps_by_name.items() if int(v) > from_step}
        if held:
            self._held[run_id] = held
        else:
            self._held.pop(run_id, None)

    def new_only(self, run_id: int, step: int, scalars: Mapping[str, Any]) -> dict[str, Any]:
        """``scalars`` without the names the backend holds at ``step`` already."""
        held = self._held.get(run_id)
        if not held:
            return dict(scalars)
        kept = {k: v for k, v in scalars.items() if step > held.get(k, -1)}
        if all(step > v for v in held.values()):
            del self._held[run_id]  # past every held point: nothing to skip any more
        return kept

    def knows(self, run_id: int) -> bool:
        """Whether :meth:`hold` was told what the backend holds of ``run_id``."""
        return run_id in self._highest

    def lacking(self, run_id: int, step: int, scalars: Mapping[str, Any]) -> dict[str, Any]:
        """Of a stored point at ``step`` (at or below the restart point), the names the backend lacks.

        A dead kernel's points of one name reached the backend oldest first, and what it lost was the end it still
        buffered (the write window); so the backend lacks a name's points above its highest step of that name.
        """
        highest = self._highest.get(run_id, {})
        return {k: v for k, v in scalars.items() if step > highest.get(k, -1)}
