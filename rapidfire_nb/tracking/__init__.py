"""Experiment trackers: TensorBoard always (unless turned off), others optional.

Every tracker has the methods of :class:`Tracker`; :class:`NullTracker` is the null object used when
tracking is off. The TensorBoard package itself is imported only when a ``TensorBoardTracker`` is made.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rapidfire_nb.tracking.tensorboard import NullTracker, TensorBoardTracker

__all__ = ["NullTracker", "TensorBoardTracker", "Tracker"]


@runtime_checkable
class Tracker(Protocol):
    """What the training layer calls on a tracker. Implementations must be thread-safe."""

    def log_scalars(
        self, run_id: int, step: int, scalars: Mapping[str, Any], wall_time: float | None = None
    ) -> None:
        """Log named scalar values of run ``run_id`` at optimizer step ``step``."""

    def log_hparams(self, run_id: int, hparams: Mapping[str, Any], step: int = 0) -> None:
        """Log the run's hyperparameters once."""

    def continue_from(self, run_id: int, step: int) -> None:
        """Run ``run_id`` restarts from its checkpoint at ``step``: hide what was logged above ``step`` before."""

    def flush(self) -> None:
        """Write buffered data out."""

    def close(self) -> None:
        """Flush and release everything; idempotent."""

    def mark_deleted(self, run_id: int) -> Path | None:
        """Stop logging run ``run_id`` and mark its data as deleted."""
