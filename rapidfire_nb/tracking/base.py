"""The tracker interfaces: :class:`Tracker` (what every backend implements: each call the fan-out makes),
:class:`Trackers` (what the recorder calls on its one tracker object: the fan-out, or the null tracker),
:class:`TrackedRun` (what a tracker is told about a run), the metric naming of the split style, and a
:class:`BackendTracker` base whose every method does nothing (a backend overrides what it writes)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
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

    Its name and tags (:attr:`run_name`, :attr:`tags`) are read from ``config``: labels, never keys (each backend
    finds its run by the id it saved, not by name).
    """

    run_id: int
    params: Mapping[str, Any]
    config: Mapping[str, Any]
    trainer_type: str
    parent_id: int | None = None
    warm_start: bool = False
    group: Mapping[str, Any] = field(default_factory=dict)

    @property
    def run_name(self) -> str | None:
        """The run's name (``RFModelConfig(run_name=...)``), None for a run without one."""
        name = self.config.get("run_name")
        return name if isinstance(name, str) and name else None

    @property
    def tags(self) -> tuple[str, ...]:
        """The run's free tags (``RFModelConfig(tags=[...])``), in the order given."""
        tags = self.config.get("tags")
        return tuple(t for t in tags if isinstance(t, str)) if isinstance(tags, (list, tuple)) else ()

    @property
    def display_name(self) -> str:
        """What a tracker names the run: its name, else ``run-<id>`` (as before runs had names)."""
        return self.run_name or f"run-{self.run_id}"


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
    """The points a backend already holds, so that a continued run (or the store's points handed back after a
    restart) does not log them twice.

    MLflow and Trackio cannot drop a point once logged. When a run continues from its checkpoint at step ``s``
    after a kernel died, the backend may hold points of steps above ``s`` that the dead kernel logged; the continued
    run logs those steps again (the store dropped its own copies), and the points of steps up to ``s`` that the
    dead kernel never wrote are handed back from the store (:meth:`lacking`). The resume is exact (TRL's
    ``resume_from_checkpoint``), so the points kept are the values the continued run computes again.

    Two ways to say what the backend holds: :meth:`hold_points` (every point, per name its steps with repeats:
    TRL logs ``epoch`` in the training log and again in the evaluation log of the same step, and the final
    summary a third time) keeps each ``(name, step)`` at as many points as the uninterrupted run logged;
    :meth:`hold` (per name its highest step) holds every point at or below it (a backend that cannot list its
    points' steps cheaply).
    """

    def __init__(self) -> None:
        self._cover: dict[int, dict[str, int]] = {}  # run -> name -> every point at or below this step held
        self._counts: dict[
            int, dict[str, Counter[int]]
        ] = {}  # run -> name -> step -> points held, not yet met
        self._known: set[int] = set()

    def hold(self, run_id: int, from_step: int, steps_by_name: Mapping[str, int]) -> None:
        """Run ``run_id`` continues from ``from_step``; the backend holds ``{name: highest step}``."""
        self._known.add(run_id)
        self._counts.pop(run_id, None)
        self._cover[run_id] = {k: int(v) for k, v in steps_by_name.items()}

    def hold_points(self, run_id: int, from_step: int, steps_by_name: Mapping[str, Iterable[int]]) -> None:
        """Run ``run_id`` continues from ``from_step``; the backend holds ``{name: the step of each point}``."""
        self._known.add(run_id)
        self._cover.pop(run_id, None)
        self._counts[run_id] = {k: Counter(int(s) for s in steps) for k, steps in steps_by_name.items()}

    def _held(self, run_id: int, name: str, step: int) -> bool:
        """Whether the backend holds a point of ``name`` at ``step`` not met yet (it is met now)."""
        if step <= self._cover.get(run_id, {}).get(name, -1):
            return True
        counts = self._counts.get(run_id, {}).get(name)
        if counts and counts[step] > 0:
            counts[step] -= 1
            return True
        return False

    def new_only(self, run_id: int, step: int, scalars: Mapping[str, Any]) -> dict[str, Any]:
        """``scalars`` without the names the backend holds at ``step`` already."""
        if run_id not in self._known:
            return dict(scalars)
        return {k: v for k, v in scalars.items() if not self._held(run_id, k, step)}

    def knows(self, run_id: int) -> bool:
        """Whether :meth:`hold` or :meth:`hold_points` was told what the backend holds of ``run_id``."""
        return run_id in self._known

    def lacking(self, run_id: int, step: int, scalars: Mapping[str, Any]) -> dict[str, Any]:
        """Of a stored point at ``step`` (at or below the restart point), the names the backend lacks.

        With :meth:`hold`: a dead kernel's points of one name reached the backend oldest first, and what it lost
        was the end it still buffered (the write window); so the backend lacks a name's points above its highest
        step of that name. With :meth:`hold_points`: the points beyond the ones it holds at that step.
        """
        return self.new_only(run_id, step, scalars)
