"""The rung book: the values a rung policy recorded, the rungs it decided, the runs it judged, kept across restarts.

Pure bookkeeping (standard library only; no clock, no threads). Every change is also told, in order, to a
``journal`` as a small JSON-able event, so that a store can keep them and a restarted kernel rebuild the same book
(:meth:`RungBook.restore`), the way Optuna keeps each trial's intermediate values in its storage:

* ``{"event": "value", "rung": r, "run": id, "metric": m, "value": v}`` — the value a run reached rung ``r`` with
  (the first one counts; NaN kept);
* ``{"event": "closed", "rung": r, "values": k}`` — rung ``r`` was decided with its first ``k`` values;
* ``{"event": "judged", "rung": r, "run": id, "outcome": o}`` — the run was judged there: ``"kept"``,
  ``"stopped"`` or ``"skipped"`` (not active, or the user decided for it then).

A kill leaves a prefix of these events (one writer keeps them in order), and every judgement is a function of the
events before it: a pair judged at a rung's decision is compared with the ``k`` values it was decided with, a run
arriving after the decision with the values recorded up to its own. So a rebuilt book judges what is left as an
uninterrupted process would have, and a stop it decided but that never applied (the kernel died first) is owed:
given again while the run still trains.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .base import RunState

__all__ = ["JUDGED", "RungBook"]

JUDGED = ("kept", "stopped", "skipped")
"""The outcomes a judged ``(run, rung)`` pair is journaled with."""

Journal = Callable[[Mapping[str, Any]], None]


class RungBook:
    """The values recorded at each rung, the rungs decided, the ``(run, rung)`` pairs judged (see the module).

    Args:
        metric: the metric the values are of (written with each value event).
        journal: told every event, in order (None: kept in memory only).
    """

    def __init__(self, metric: str = "", journal: Journal | None = None) -> None:
        self.metric = metric
        self.journal = journal
        self._values: dict[int, dict[int, float]] = {}  # rung -> run -> value, in arrival order
        self._closed: dict[int, int] = {}  # rung -> values it was decided with
        self._judged: dict[tuple[int, int], str] = {}  # (run, rung) -> outcome
        self._owed: list[tuple[int, int]] = []  # (rung, run): stopped before a restart, maybe never applied

    def record(self, rung: int, run_id: int, value: float) -> bool:
        """Record ``run_id``'s ``value`` at ``rung``; False when it was recorded already (nothing changes)."""
        at = self._values.setdefault(rung, {})
        if run_id in at:
            return False
        at[run_id] = value
        self._tell({"event": "value", "rung": rung, "run": run_id, "metric": self.metric, "value": value})
        return True

    def values(self, rung: int) -> Mapping[int, float]:
        """Run id -> value recorded at ``rung`` (arrival order)."""
        return dict(self._values.get(rung, {}))

    def seen_by(self, rung: int, run_id: int) -> Mapping[int, float]:
        """The values ``run_id`` is judged against at ``rung``: those the rung was decided with, or for a run that
        arrived after the decision, those recorded up to its own (its own value always among them)."""
        at = list(self._values.get(rung, {}).items())
        mine = next((i for i, (r, _) in enumerate(at) if r == run_id), len(at) - 1)
        return dict(at[: max(self._closed.get(rung, len(at)), mine + 1)])

    def closed(self, rung: int) -> bool:
        """True once ``rung`` was decided."""
        return rung in self._closed

    def judged(self, run_id: int, rung: int) -> str | None:
        """How ``run_id`` was judged at ``rung`` (one of :data:`JUDGED`), None when it was not."""
        return self._judged.get((run_id, rung))

    def due(self, runs: Sequence[RunState]) -> list[tuple[int, int]]:
        """The ``(rung, run_id)`` pairs to judge now, at rungs every run has reached; each is handed out until
        :meth:`settle` records its outcome (the caller settles every pair it is handed).

        Args:
            runs: every run now; an active run with ``chunks_done < rung <= total_chunks`` holds the rung open.
        """
        out: list[tuple[int, int]] = []
        for rung in sorted(self._values):
            if rung not in self._closed:
                if any(s.active and s.chunks_done < rung <= s.total_chunks for s in runs):
                    continue
                self._closed[rung] = len(self._values[rung])
                self._tell({"event": "closed", "rung": rung, "values": self._closed[rung]})
            out.extend((rung, r) for r in self._values[rung] if (r, rung) not in self._judged)
        return out

    def settle(self, rung: int, run_id: int, outcome: str) -> None:
        """Record how ``run_id`` was judged at ``rung`` (``outcome`` one of :data:`JUDGED`)."""
        self._judged[(run_id, rung)] = outcome
        self._tell({"event": "judged", "rung": rung, "run": run_id, "outcome": outcome})

    def take_owed(self) -> list[tuple[int, int]]:
        """The ``(rung, run_id)`` pairs stopped before a restart (:meth:`restore`), once: stop them again if they
        still train (their stop may never have applied)."""
        owed, self._owed = self._owed, []
        return owed

    def owe(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Hand ``pairs`` out again at the next :meth:`take_owed` (their runs are not back at the rung yet)."""
        self._owed.extend(pairs)

    def restore(self, events: Sequence[Mapping[str, Any]]) -> int:
        """Rebuild the book from a journal's ``events`` (in their order), told to no journal again.

        Value events of another metric and malformed events are left out. Returns the events taken.
        """
        taken = 0
        for event in events:
            taken += self._replay(event)
        self._owed = [(rung, run) for (run, rung), o in self._judged.items() if o == "stopped"]
        return taken

    def _replay(self, event: Mapping[str, Any]) -> int:
        if not isinstance(event, Mapping):
            return 0
        kind, rung, run = event.get("event"), _int(event.get("rung")), _int(event.get("run"))
        if rung is None:
            return 0
        if kind == "value" and run is not None and event.get("metric") == self.metric:
            value = _float(event.get("value"))
            if value is None or run in self._values.get(rung, {}):
                return 0
            self._values.setdefault(rung, {})[run] = value
            return 1
        if kind == "closed" and rung in self._values and rung not in self._closed:
            count = _int(event.get("values"))
            self._closed[rung] = len(self._values[rung]) if count is None else count
            return 1
        if kind == "judged" and run is not None and event.get("outcome") in JUDGED:
            if run in self._values.get(rung, {}) and rung in self._closed:
                self._judged[(run, rung)] = str(event["outcome"])
                return 1
        return 0

    def _tell(self, event: Mapping[str, Any]) -> None:
        if self.journal is not None:
            self.journal(event)


def _int(raw: Any) -> int | None:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else None


def _float(raw: Any) -> float | None:
    """A stored value as a float (JSON's ``NaN`` reads back as NaN); None when it is not a number."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        return None
    return float(raw)
