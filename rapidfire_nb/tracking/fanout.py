"""One object in front of every tracker of an experiment: the recorder's only view of tracking.

:class:`TrackerSet` opens the chosen backends (on the trackers' thread: opening MLflow's SQLite store runs its
migrations, seconds), hands each call to every backend, and isolates them: a backend that raises (server down,
disk full, bad URI, a bug) is reported once, closed and left out for the rest of the experiment; the other
backends, training and the store go on. Thread ownership: every method but :meth:`close` runs on the trackers'
thread; :meth:`close` runs after the trackers' thread stopped.

The write window: MLflow and Trackio buffer each run's points and write them in one request per run
(``end_batch``); each request has a fixed cost of milliseconds of CPU (MLflow's SQLAlchemy store: ~10 ms per
``log_batch`` whatever its size; Trackio: one SQLite transaction with its table checks), taken from training on a
small machine. So the set tells the backends to write at most once per :data:`WRITE_EVERY_S` seconds, not after
every recorder batch (a few a second); a run's status change writes its points first (each backend), and
:meth:`flush` / :meth:`close` write everything before they return.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, MutableSet, Sequence
from typing import Any

from rapidfire_nb.redact import hide_url_passwords
from rapidfire_nb.tracking.base import Point, TrackedRun, Tracker, split_name

__all__ = ["WRITE_EVERY_S", "TrackerSet"]

log = logging.getLogger(__name__)

WRITE_EVERY_S = 5.0
"""Seconds between two writes of the buffered points (``end_batch`` on every backend); a status change of a run,
:meth:`TrackerSet.flush` and :meth:`TrackerSet.close` write at once."""

Opener = tuple[str, Callable[[], Tracker]]
"""``(backend name, factory)``: the factory makes the opened tracker (it may raise: the backend is then off)."""


class TrackerSet:
    """The experiment's trackers behind one object, each isolated from the others.

    Args:
        openers: ``(name, factory)`` per chosen backend, in order (``tensorboard`` first by convention).
        report: prints one line (the backends' start lines and each failure, once).
        turned_off: the names of backends that failed earlier in this experiment (skipped); a backend that fails
            here is added, so the next ``run_fit`` of the same ``Experiment`` object leaves it out too.
        write_every_s: the write window (seconds between two ``end_batch`` of the backends).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        openers: Sequence[Opener],
        report: Callable[[str], None],
        turned_off: MutableSet[str] | None = None,
        write_every_s: float = WRITE_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._openers = list(openers)
        self._write_every_s = float(write_every_s)
        self._clock = clock
        self._last_write: float | None = None
        self._report = report
        self._off: MutableSet[str] = turned_off if turned_off is not None else set()
        self._live: list[Tracker] = []
        self._opened = False
        self.failures: dict[str, str] = {}

    @property
    def names(self) -> list[str]:
        """The backends still tracking (after :meth:`open`)."""
        return [t.name for t in self._live]

    def open(self) -> None:
        """Make every backend's tracker and print its start line (where the data goes); idempotent."""
        if self._opened:
            return
        self._opened = True
        for name, factory in self._openers:
            if name in self._off:
                continue
            try:
                tracker = factory()
            except Exception as exc:
                self._failed(name, "opening it", exc)
                continue
            self._live.append(tracker)
            line = self._call(tracker, "describe")
            if line:
                self._report(line)

    # ------------------------------------------------------------------ what the recorder calls
    def start_run(self, run: TrackedRun, status: str) -> None:
        self._each("start_run", run, status)

    def set_status(self, run_id: int, status: str, error: str | None = None, at: float | None = None) -> None:
        """Run ``run_id`` is now ``status`` since ``at`` (unix s; None: now); DELETED is :meth:`mark_deleted`."""
        self._each("set_status", run_id, status, error, at)

    def log_metrics(
        self, run_id: int, step: int, metrics: Mapping[str, float], wall_time: float | None = None
    ) -> None:
        """One TRL log call (``{name: value}`` with TRL's names) of run ``run_id`` at ``step``."""
        split: dict[str, float] | None = None
        for tracker in list(self._live):
            if tracker.metric_style == "trl":
                scalars: Mapping[str, float] = metrics
            else:
                if split is None:
                    split = {split_name(k): v for k, v in metrics.items()}
                scalars = split
            self._call(tracker, "log_scalars", run_id, step, scalars, wall_time)

    def continue_from(self, run_id: int, step: int) -> None:
        self._each("continue_from", run_id, step)

    def restore_points(self, run_id: int, step: int, points: Sequence[Point]) -> None:
        """A restarted run's points up to its checkpoint at ``step``, from the store (``(step, {TRL name: value},
        wall_time)`` per log call, in order), to every backend: those that write them again do (TensorBoard: a
        killed process may not have flushed its last ones; MLflow and Trackio: the steps they lack), the others'
        ``restore_points`` does nothing (:class:`~.base.BackendTracker`'s default)."""
        split: list[Point] | None = None
        for tracker in list(self._live):
            if tracker.metric_style == "trl":
                mapped: list[Point] = list(points)
            else:
                if split is None:
                    split = [(at, {split_name(k): v for k, v in m.items()}, wt) for at, m, wt in points]
                mapped = split
            self._call(tracker, "restore_points", run_id, step, mapped)

    def mark_deleted(self, run_id: int) -> None:
        self._each("mark_deleted", run_id)

    def end_batch(self) -> None:
        """The recorder wrote one batch: the backends write their buffered points if the window is over."""
        now = self._clock()
        if self._last_write is None:
            self._last_write = now  # the first window starts with the first batch
        if now - self._last_write < self._write_every_s:
            return
        self._last_write = now
        self._each("end_batch")

    def flush(self) -> None:
        """Every backend writes everything it holds (before this returns)."""
        self._last_write = self._clock()
        self._each("flush")

    def close(self) -> None:
        """Flush and close every backend (a failure is reported, never raised); idempotent."""
        self._each("close")
        self._live.clear()

    # ------------------------------------------------------------------ isolation
    def _each(self, method: str, *args: Any) -> None:
        for tracker in list(self._live):
            self._call(tracker, method, *args)

    def _call(self, tracker: Tracker, method: str, *args: Any) -> Any:
        try:
            return getattr(tracker, method)(*args)
        except Exception as exc:
            if tracker in self._live:
                self._live.remove(tracker)
            if method != "close":
                try:
                    tracker.close()
                except Exception:
                    log.debug("rapidfire tracking: closing %s after its failure failed too", tracker.name)
            self._failed(tracker.name, method, exc)
            return None

    def _failed(self, name: str, what: str, exc: Exception) -> None:
        log.debug("rapidfire tracking: %s failed in %s", name, what, exc_info=exc)
        self._off.add(name)
        if name in self.failures:
            return
        said = hide_url_passwords(f"{type(exc).__name__}: {exc}")  # MLflow quotes its URI, password included
        self.failures[name] = said
        self._report(
            f"{name} tracking failed ({what}: {said}); it is off for the rest of this "
            "experiment. Training, the store and the other trackers go on (get_results() has every metric)"
        )
