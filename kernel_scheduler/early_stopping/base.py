"""What an early-stopping policy sees at chunk boundaries and what it decides (pure; standard library only).

A policy reads each run's metrics at each completed chunk and returns :class:`Decisions`: stop a run (with a
reason), add a run (a search's new trial), or a note for the user. The scheduler turns a stop into an ordinary IC
Op (``stop`` from source :data:`EARLY_STOPPING`, the reason in its payload), so the ops log, the panel, the store
and restarts need nothing new, and a user's own ops win: a run with a pending op of the user is ``exempt``, and one the user
resumed after the policy stopped it is not stopped again at a rung up to the chunk it was stopped at
(``exempt_through``).

Chunks are counted over all epochs (1 once a run's first chunk is done): equal counts mean equal rows seen, so
runs with different batch sizes are compared at the same data, never at raw global steps.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..status import RunStatus

__all__ = [
    "EARLY_STOPPING",
    "ChunkResult",
    "Decisions",
    "EarlyStop",
    "EarlyStoppingPolicy",
    "NewRun",
    "RunState",
    "check_metric",
    "check_mode",
    "num",
    "nums",
]

EARLY_STOPPING = "early_stopping"
"""The ``source`` of the stop ops a policy's decisions become (the ops log and the panel show it)."""


@dataclass(frozen=True)
class ChunkResult:
    """One run's metrics at the end of one of its chunks.

    Attributes:
        run_id: the run.
        chunk: chunks it has completed, counted over all epochs (1 after its first chunk).
        metrics: the metrics it logged during that chunk, latest value per name (TRL's names: ``eval_loss``,
            ``eval_rewards/margins``, a ``compute_metrics`` value as ``eval_<name>``, ``loss``, ...). A name it did
            not log is missing; a value may be NaN (a diverged run).
        final: True when the run made its last step with this chunk.
    """

    run_id: int
    chunk: int
    metrics: Mapping[str, float] = field(default_factory=dict)
    final: bool = False

    def value(self, name: str) -> float | None:
        """The metric ``name`` as a float (NaN kept), or None when it was not logged or is not a number."""
        raw = self.metrics.get(name)
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            return None
        return float(raw)


@dataclass(frozen=True)
class RunState:
    """One run as a policy sees it at a decision.

    Attributes:
        run_id: the run.
        status: its :class:`~kernel_scheduler.status.RunStatus`.
        chunks_done: chunks completed over all epochs (a warm clone or a continued run starts above 0).
        total_chunks: chunks it trains in all (0 while it is not built yet).
        exempt: True while the user decides for this run (a pending op of the user): the policy does not stop
            it; its values still count for the others.
        exempt_through: the user resumed it after the policy stopped it after this many chunks: it is not
            stopped at a rung up to there (0: never resumed so); later rungs judge it like any run.
    """

    run_id: int
    status: RunStatus
    chunks_done: int
    total_chunks: int
    exempt: bool = False
    exempt_through: int = 0

    @property
    def active(self) -> bool:
        """True while the run trains further (NEW or ONGOING)."""
        return self.status.in_rotation()


@dataclass(frozen=True)
class EarlyStop:
    """Stop ``run_id`` (it ended chunk ``chunk``) for ``reason`` (a sentence the ops log and panel show)."""

    run_id: int
    chunk: int
    reason: str


@dataclass(frozen=True)
class NewRun:
    """A run to add to the rotation (a search's new trial): ``spec`` is opaque to the scheduler.

    Attributes:
        spec: the run's config, handed to ``Executor.add_run``.
        info: what the listener records with it (e.g. ``{"source": "trial", "trial": 9, "columns": [...]}``).
    """

    spec: Any
    info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Decisions:
    """What a policy decided: runs to stop, runs to add, notes to show the user (each in order)."""

    stops: tuple[EarlyStop, ...] = ()
    new_runs: tuple[NewRun, ...] = ()
    notes: tuple[str, ...] = ()

    def __add__(self, other: Decisions) -> Decisions:
        return Decisions(self.stops + other.stops, self.new_runs + other.new_runs, self.notes + other.notes)

    def __bool__(self) -> bool:
        return bool(self.stops or self.new_runs or self.notes)


class EarlyStoppingPolicy(ABC):
    """Decides, at chunk boundaries, which runs stop early. Called only from the scheduler thread.

    Contract: deterministic (the same reports in the same order give the same decisions), never blocks, and each
    decision is made once: reporting the same ``(run, chunk)`` again, or calling :meth:`on_change` with nothing
    changed, decides nothing new. A stop for a run that is no longer active, or is ``exempt``, is never returned.
    """

    @abstractmethod
    def on_chunk(self, result: ChunkResult, runs: Sequence[RunState]) -> Decisions:
        """A run ended a chunk with ``result``; ``runs`` is every run of the experiment now."""

    def on_change(self, runs: Sequence[RunState], changed: Sequence[RunState]) -> Decisions:
        """Runs changed status or progress (``changed``: their new states), e.g. one left the rotation."""
        return Decisions()

    def on_added(self, run_id: int, new_run: NewRun) -> None:
        """The scheduler added ``new_run`` (one this policy returned) as run ``run_id``."""
        return None

    def waits_at(self, chunk: int) -> bool:
        """True when a run that has done ``chunk`` chunks must not start another until every run in the rotation
        has done as many (a rung: its decision comes first). On one device the rotation gives that for free; on
        several a run could otherwise train a chunk past a rung that then prunes it. Default: never."""
        return False

    def progress(self) -> dict[str, Any]:
        """What the panel's header shows about the policy: a JSON-able dict, stored in the experiment's meta.

        Always ``"label"`` (:meth:`describe`). A rung policy adds ``"kind": "rungs"``, ``"name"`` (e.g.
        ``"successive halving (η=2)"``), ``"metric"`` and ``"next_rung"`` (the next chunk count runs are compared
        at, None when none is left); a search adds ``"kind": "search"``, ``"name"``, ``"trials"`` (asked so far),
        ``"budget"``, ``"pruned"`` and ``"running"`` (trials). Called on the scheduler thread only.
        """
        return {"label": self.describe()}

    def restore_added(self, added: Mapping[int, Mapping[str, Any]]) -> dict[int, Any]:
        """A restarted kernel: take back the runs this policy added in an earlier one.

        Called once by ``run_fit``, before the scheduler starts (also when ``added`` is empty, so a search can
        settle trials it asked that no run got).

        Args:
            added: run id -> the :attr:`NewRun.info` the policy gave that run when it added it.

        Returns:
            run id -> the run's spec again, for the runs it rebuilds (they continue as its own: their trials or
            values count again); a run left out cannot be continued. The default rebuilds none.
        """
        return {}

    def keep_book(
        self, journal: Callable[[Mapping[str, Any]], None], events: Sequence[Mapping[str, Any]] = ()
    ) -> int:
        """Keep what the policy decided across restarts: rebuild its state from ``events`` (what it told an
        earlier kernel's ``journal``, in order) and tell ``journal`` each change from now on (small JSON-able
        dicts, to be stored in order). Called once by ``run_fit`` before the scheduler starts.

        Returns:
            The events taken. The default keeps nothing and takes none (a rung policy keeps its rung book:
            :meth:`~kernel_scheduler.early_stopping.rungs.RungPolicy.keep_book`).
        """
        return 0

    def restore_chunk(self, result: ChunkResult) -> bool:
        """A chunk a run completed in an earlier kernel, read back from the store after :meth:`keep_book`: record
        what :meth:`on_chunk` would have recorded if the kill lost it (the run continues past that chunk and
        never reports it again); decide nothing yet. Returns True when it recorded something (default: never)."""
        return False

    @abstractmethod
    def describe(self) -> str:
        """A short name with the settings, e.g. ``"SuccessiveHalving(eval_loss, min, η=2, grace 1 chunk)"``."""


def check_metric(metric: Any) -> str:
    """``metric`` as a metric name.

    Raises:
        ValueError: not a non-empty string.
    """
    if not isinstance(metric, str) or not metric.strip():
        raise ValueError(
            f"metric must be the name of a logged metric, e.g. metric='eval_loss', got {metric!r}"
        )
    return metric.strip()


def check_mode(mode: Any) -> str:
    """``mode`` as ``"min"`` or ``"max"``.

    Raises:
        ValueError: anything else (the message names both values).
    """
    if mode not in ("min", "max"):
        raise ValueError(
            f"mode must be 'min' (lower is better, e.g. eval_loss) or 'max' (higher is better, e.g. a reward), "
            f"got {mode!r}"
        )
    return str(mode)


def num(value: float, digits: int = 4) -> str:
    """A metric value for a reason sentence: ``digits`` significant digits, ``NaN`` spelled out."""
    if math.isnan(value):
        return "NaN"
    return f"{value:.{digits}g}"


def nums(value: float, other: float) -> tuple[str, str]:
    """Two metric values compared in one sentence: 4 significant digits, more when 4 would print different values
    alike ("6.144 is worse than the median 6.144"), up to the 17 that tell any two floats apart."""
    digits = 4
    while digits < 17 and value != other and num(value, digits) == num(other, digits):
        digits += 1
    return num(value, digits), num(other, digits)
