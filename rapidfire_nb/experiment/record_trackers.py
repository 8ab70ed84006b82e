"""The recorder's side of the trackers: what it tells them, handed to their own thread in order.

Tracker calls are handed on to a second thread, ``rapidfire-trackers``
(:class:`~rapidfire_nb.experiment.tracker_thread.TrackerThread`), in order, once the store write before them is
done: a slow or hanging backend (opening MLflow takes seconds) never holds back the store, so ``wait(chunks=k)``
and the result tables do not wait for it. A :class:`TrackerFeed` is used on the recorder thread only; it keeps each
run's status as the trackers know it (each change is told once), opens the trackers and starts the session's runs
(a restarted run gets its stored points back), and confirms an ended run once every tracker wrote and flushed its
points: the trackers' thread hands a :class:`~rapidfire_nb.experiment.record_items.TrackedItem` back to the
recorder's queue, which writes meta ``tracked_runs``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kernel_scheduler import RunSnapshot, RunStatus

from ..tracking.base import Trackers
from .record_items import RecordItem, TrackedItem
from .record_writes import TRACKED_RUNS_META_KEY, logged_points
from .tracker_thread import TrackerThread

__all__ = ["ENDED", "TrackerFeed"]

ENDED = (RunStatus.COMPLETED, RunStatus.FAILED)
"""Ended runs: not continued after a restart, so their points are confirmed as tracked (meta ``tracked_runs``)."""


class TrackerFeed:
    """What the recorder tells the trackers (recorder thread only); the calls run on the trackers' thread.

    Args:
        tracker: the trackers (a :class:`~rapidfire_nb.tracking.fanout.TrackerSet`, or a null tracker): every call
            of :class:`~rapidfire_nb.tracking.base.Trackers` is made on it (the null tracker's do nothing).
        hand_back: puts an item on the recorder's queue; called on the trackers' thread (even while closing).
    """

    def __init__(self, tracker: Trackers, hand_back: Callable[[RecordItem], None]) -> None:
        self.tracker = tracker
        self.thread = TrackerThread(tracker)  # every tracker call runs there, after the store write
        self._hand_back = hand_back
        self._status: dict[int, RunStatus] = {}  # each run's status as the trackers know it

    def start(self, on_thread_start: Callable[[], None] | None = None) -> None:
        """Start the trackers' thread (``on_thread_start`` runs on it first)."""
        self.thread.start(on_thread_start)

    def close(self) -> None:
        """Run every call handed over, then stop the trackers' thread (joined)."""
        self.thread.close()

    def status(self, snap: RunSnapshot, at: float) -> None:
        """Tell the trackers run ``snap.run_id``'s status if it changed (``at``: unix seconds); a DELETED run is
        marked deleted (TensorBoard renames it, MLflow/Trackio delete it); an ended run is then confirmed."""
        if self._status.get(snap.run_id) is snap.status:
            return
        self._status[snap.run_id] = snap.status
        if snap.status is RunStatus.DELETED:
            self.thread.mark_deleted(snap.run_id)
            return
        self.thread.set_status(snap.run_id, snap.status.value, snap.error, at)
        if snap.status in ENDED:
            self.confirm(snap.run_id)

    def start_added(self, run: Any, status: RunStatus) -> None:
        """Start tracking ``run`` (a ``TrackedRun``) added by the early-stopping policy, with the status the
        trackers know it by, else ``status`` (kept)."""
        known = self._status.setdefault(run.run_id, status)
        self.thread.start_run(run, known.value)

    def start_clone(self, run: Any) -> None:
        """Start tracking clone ``run`` (a ``TrackedRun``) with the status the trackers know it by, else NEW."""
        self.thread.start_run(run, self._status.get(run.run_id, RunStatus.NEW).value)

    def log_metrics(self, run_id: int, step: int, numbers: Mapping[str, float], wall_time: float) -> None:
        """One log call's numbers (TRL's names: each tracker maps them to its own) at ``step``, ``wall_time``."""
        self.thread.log_metrics(run_id, step, numbers, wall_time)

    def continue_from(self, run_id: int, step: int) -> None:
        """Run ``run_id`` continues from ``step``: its points above it are not shown twice."""
        self.thread.continue_from(run_id, step)

    def end_batch(self) -> None:
        """The end of one recorder batch: the trackers write their buffered points once per window."""
        self.thread.end_batch()

    def release(self, done: threading.Event) -> None:
        """Make every tracker write what it holds, then set ``done`` (on the trackers' thread)."""
        self.thread.flush()
        self.thread.after(done.set)

    def open_runs(
        self, store: Any, runs: Sequence[tuple[Any, RunStatus]], continued: Mapping[int, int]
    ) -> None:
        """Open the trackers and start ``runs`` (``(TrackedRun, status)``); a run continued from a step
        (``continued``: run id -> step) gets its stored points up to it back, and an ended run that no earlier
        kernel confirmed (meta ``tracked_runs``: its kernel died before the trackers wrote them) all of them."""
        self.thread.open()  # imports and opens the backends (MLflow's first SQLite store: seconds) there
        for run, status in runs:
            self._status[run.run_id] = status
            self.thread.start_run(run, status.value)
        for run_id, step in continued.items():
            self.thread.continue_from(run_id, step)
            self.thread.restore_points(run_id, step, logged_points(store, run_id, step))
        confirmed = set(store.get_meta(TRACKED_RUNS_META_KEY, []) or [])
        for run, status in runs:
            if status in ENDED and run.run_id not in continued and run.run_id not in confirmed:
                points = logged_points(store, run.run_id, None)
                if points:
                    last = max(at for at, _, _ in points)
                    self.thread.restore_points(run.run_id, last, points)
                self.confirm(run.run_id)

    def confirm(self, run_id: int) -> None:
        """Once every tracker wrote and flushed what it was handed so far, hand back that ended run ``run_id`` is
        fully tracked (a :class:`TrackedItem` on the recorder's queue)."""
        self.thread.flush()
        self.thread.after(lambda: self._hand_back(TrackedItem(run_id)))
