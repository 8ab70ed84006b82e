"""Scheduling policies: pure functions of run views that return which run trains next."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from .status import RunStatus

__all__ = ["RunView", "SchedulingPolicy", "FurthestBehindFirst"]


@dataclass(frozen=True)
class RunView:
    """What a policy may look at for one run.

    Attributes:
        run_id: the run's id (1..N, the same number everywhere).
        status: its :class:`RunStatus`.
        position: ``(epoch, chunk)`` of the segment it would train next (1-based).
        ready: False while the run cannot train yet (e.g. a warm clone waiting for its parent).
    """

    run_id: int
    status: RunStatus
    position: tuple[int, int]
    ready: bool = True


class SchedulingPolicy(ABC):
    """Chooses the next run. Must be idempotent: the same views give the same answer."""

    @abstractmethod
    def choose(self, runs: Sequence[RunView]) -> int | None:
        """Return the run id to train next, or ``None`` when no run can train."""


class FurthestBehindFirst(SchedulingPolicy):
    """The run that is furthest behind (lowest epoch, then fewest chunks done) goes next; ties by run id.

    While runs started together are active none is more than one chunk ahead of another, and a run that
    joins late (a clone, a resumed run) catches up before the others move on.
    """

    def choose(self, runs: Sequence[RunView]) -> int | None:
        candidates = [r for r in runs if r.status.in_rotation() and r.ready]
        if not candidates:
            return None
        return min(candidates, key=lambda r: (r.position, r.run_id)).run_id
