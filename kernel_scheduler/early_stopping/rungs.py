"""Rungs: when a chunk's comparison is decided, and the shared judging loop of the rung policies.

A rung is a chunk count at which runs are compared. Rung ``r`` is decided once every run in the rotation that
will reach it has reached it (``RunState.chunks_done >= r``, or left the rotation). In a chunk rotation that
costs no waiting: no run starts chunk ``r + 1`` before all have finished chunk ``r``, so the decision falls
between two chunks. Once decided, a rung stays closed: a run that reaches it later (a cold clone, a resumed run,
one on a slower device) is judged on arrival against every value recorded at that rung (ASHA's rule), so nobody
waits for a straggler. Runs that start past a rung (a warm clone at its parent's chunk, a run continued from a
checkpoint) are not judged there.

The book survives a restart: every value, decision and judgement is told to a journal the store keeps, and
:meth:`RungPolicy.keep_book` rebuilds it on every open (:mod:`~kernel_scheduler.early_stopping.book`), so a kill
at any point of a decision gives the decisions an uninterrupted process would have made.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from .base import ChunkResult, Decisions, EarlyStop, EarlyStoppingPolicy, RunState, check_metric, check_mode
from .book import Journal, RungBook

__all__ = ["RungBook", "RungPolicy", "rank", "worse"]


def rank(values: Mapping[int, float], mode: str) -> list[tuple[int, float]]:
    """``(run_id, value)`` best first (``mode`` min or max); NaN values last; equal values by arrival order."""
    finite = [(r, v) for r, v in values.items() if not math.isnan(v)]
    finite.sort(key=lambda rv: rv[1] if mode == "min" else -rv[1])  # stable: arrival order among ties
    return finite + [(r, v) for r, v in values.items() if math.isnan(v)]


def worse(value: float, than: float, mode: str) -> bool:
    """True when ``value`` is strictly worse than ``than`` (NaN is worse than any number, never than NaN)."""
    if math.isnan(value):
        return not math.isnan(than)
    if math.isnan(than):
        return False
    return value > than if mode == "min" else value < than


class RungPolicy(EarlyStoppingPolicy):
    """A policy that compares runs at rungs: records the metric at each rung and judges each run once there.

    Subclasses say which chunk counts are rungs (:meth:`is_rung`) and how a run fares against the values recorded
    at a rung (:meth:`judge`). A run whose chunk did not log ``metric`` is not judged there (one note says so).

    Args:
        metric: the metric compared (any logged name: ``eval_loss``, ``eval_rewards/margins``, ...).
        mode: ``"min"`` (lower is better) or ``"max"``.

    Raises:
        ValueError: an empty metric name, or a mode other than min/max.
    """

    def __init__(self, metric: str, mode: str) -> None:
        self.metric = check_metric(metric)
        self.mode = check_mode(mode)
        self._book = RungBook(self.metric)
        self._missing_said = False
        self._next_rung: int | None = None  # the next rung the active runs reach (for progress())

    @abstractmethod
    def is_rung(self, chunk: int) -> bool:
        """True when runs are compared after ``chunk`` chunks."""

    def waits_at(self, chunk: int) -> bool:
        """A run waits at a rung until the others reach it (the rung is decided first)."""
        return self.is_rung(chunk)

    @abstractmethod
    def judge(self, run_id: int, rung: int, total_chunks: int, values: Mapping[int, float]) -> str | None:
        """The reason to stop ``run_id`` at ``rung`` given ``values`` (every run's value there), or None."""

    @property
    def name(self) -> str:
        """How the panel's header names the policy (``"successive halving (η=2)"``); subclasses say."""
        return "rungs"

    def next_rung(self, after: int, last: int) -> int | None:
        """The first rung above ``after`` chunks and at most ``last`` (None: there is none)."""
        return next((c for c in range(after + 1, last + 1) if self.is_rung(c)), None)

    def progress(self) -> dict[str, Any]:
        return {
            "label": self.describe(),
            "kind": "rungs",
            "name": self.name,
            "metric": self.metric,
            "next_rung": self._next_rung,
        }

    def on_chunk(self, result: ChunkResult, runs: Sequence[RunState]) -> Decisions:
        notes: tuple[str, ...] = ()
        if self.is_rung(result.chunk):
            value = result.value(self.metric)
            if value is None:
                notes = self._missing(result)
            else:
                self._book.record(result.chunk, result.run_id, value)
        return Decisions(notes=notes) + self._sweep(runs)

    def on_change(self, runs: Sequence[RunState], changed: Sequence[RunState]) -> Decisions:
        return self._sweep(runs)

    def keep_book(self, journal: Journal, events: Sequence[Mapping[str, Any]] = ()) -> int:
        """Rebuild the rung book from ``events`` (the journal an earlier kernel kept, in order) and tell
        ``journal`` every change from now on. Returns the events taken (values of another metric are left out).

        Call it once, before the scheduler starts: the first decision point then decides what the dead kernel
        left undecided, and stops again a run it stopped whose stop never applied (one that still trains)."""
        book = RungBook(self.metric)
        taken = book.restore(events)
        book.journal = journal
        self._book = book
        return taken

    def restore_chunk(self, result: ChunkResult) -> bool:
        value = result.value(self.metric) if self.is_rung(result.chunk) else None
        return value is not None and self._book.record(result.chunk, result.run_id, value)

    def _sweep(self, runs: Sequence[RunState]) -> Decisions:
        states = {s.run_id: s for s in runs}
        active = [s for s in runs if s.active and s.total_chunks]
        self._next_rung = (
            self.next_rung(min(s.chunks_done for s in active), max(s.total_chunks for s in active))
            if active
            else None
        )
        stops, owed = [], []
        for rung, run_id in self._book.take_owed():  # stopped by an earlier kernel: again if it still trains
            state = states.get(run_id)
            if self._behind(state, rung):
                owed.append((rung, run_id))
                continue
            reason = self._judge(state, rung)
            if state is not None and reason is not None:
                stops.append(EarlyStop(run_id, rung, reason))
        self._book.owe(owed)
        for rung, run_id in self._book.due(runs):
            state = states.get(run_id)
            if self._behind(state, rung):
                continue
            reason = self._judge(state, rung)
            if (
                state is None or reason is None
            ):  # finished, stopped, deleted or the user decides: it still counts
                self._book.settle(rung, run_id, "kept" if self._judgeable(state, rung) else "skipped")
                continue
            self._book.settle(rung, run_id, "stopped")
            stops.append(EarlyStop(run_id, rung, reason))
        return Decisions(stops=tuple(stops))

    @staticmethod
    def _behind(state: RunState | None, rung: int) -> bool:
        """True for a run that trains again below ``rung`` (restarted from an earlier checkpoint): it is judged
        there once it is back at the rung, after the same steps as a run never restarted."""
        return state is not None and state.active and state.chunks_done < rung

    @staticmethod
    def _judgeable(state: RunState | None, rung: int) -> bool:
        return state is not None and state.active and not state.exempt and rung > state.exempt_through

    def _judge(self, state: RunState | None, rung: int) -> str | None:
        """The reason to stop the run in ``state`` at ``rung`` against the values it is judged by, or None."""
        if state is None or not self._judgeable(state, rung):
            return None
        seen = self._book.seen_by(rung, state.run_id)
        return self.judge(state.run_id, rung, state.total_chunks, seen)

    def _missing(self, result: ChunkResult) -> tuple[str, ...]:
        if self._missing_said:
            return ()
        self._missing_said = True
        logged = sorted(k for k in result.metrics if result.value(k) is not None)
        hint = (
            f"it logged {', '.join(logged)}"
            if logged
            else "it logged no metric (give run_fit an eval_dataset)"
        )
        return (
            f"early stopping: run {result.run_id} logged no {self.metric!r} in chunk {result.chunk} ({hint}); "
            "a run is not judged at a chunk without it. Name a logged metric, e.g. metric='eval_loss'",
        )
