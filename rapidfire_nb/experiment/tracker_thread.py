"""The trackers' own thread: every tracker call the recorder makes runs here, in order, after the store write.

The recorder thread writes the store, which ``wait()``, the result tables and the panel read; the trackers
(TensorBoard, MLflow, Trackio, W&B through a :class:`~rapidfire_nb.tracking.fanout.TrackerSet`) are slower and can
stall: opening MLflow imports it and migrates its SQLite store (seconds), each MLflow request costs ~10 ms, a
tracking server can hang. Made on the recorder thread, those calls held back every store write behind them, so
``wait(chunks=1)`` and ``get_runs_info()`` waited for MLflow. :class:`TrackerThread` takes each call off the
recorder thread: the recorder hands it over (a queue put) and goes on; one thread, ``rapidfire-trackers``, makes
the calls in the order they were handed over.

Thread ownership: the tracker object is used by this thread only while it runs (and by the caller of
:meth:`TrackerThread.close` after it stopped); the queue is the only thing shared. Standard library only (the tracker
interface is imported for its type).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._priority import lower_thread_priority

if TYPE_CHECKING:
    from ..tracking.base import Trackers

__all__ = ["TRACKER_QUEUE_ITEMS", "TrackerThread"]

log = logging.getLogger(__name__)

TRACKER_QUEUE_ITEMS = 100_000
"""Tracker calls that may wait (about one per TRL log call). A backend that hangs fills it; the recorder thread
then waits for it, as it did when it made the calls itself (training waits only once the recorder's queue is full
too)."""


class TrackerThread:
    """Runs the calls made on it (``thread.log_metrics(...)``, any method of ``tracker``) on its own thread, in order.

    Args:
        tracker: the trackers (a :class:`~rapidfire_nb.tracking.fanout.TrackerSet`, or any object with the
            :class:`~rapidfire_nb.tracking.base.Trackers` methods); its methods' return values are not passed back.

    A call that raises is logged and the next one runs (a :class:`~rapidfire_nb.tracking.fanout.TrackerSet`
    reports and isolates its backends' failures itself).
    """

    def __init__(self, tracker: Trackers) -> None:
        self.tracker = tracker
        self._queue: queue.Queue[tuple[str, tuple[Any, ...]] | None] = queue.Queue(
            maxsize=TRACKER_QUEUE_ITEMS
        )
        self._thread = threading.Thread(target=self._main, name="rapidfire-trackers", daemon=True)
        self._on_thread_start: Callable[[], None] | None = None

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("_"):
            raise AttributeError(name)
        getattr(self.tracker, name)  # AttributeError now, when the tracker has no such method

        def hand_over(*args: Any) -> None:
            self._queue.put((name, args))

        return hand_over

    def start(self, on_thread_start: Callable[[], None] | None = None) -> None:
        """Start the thread (``on_thread_start`` runs on it first, e.g. ipykernel's thread parent for its lines)."""
        self._on_thread_start = on_thread_start
        self._thread.start()

    def after(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` on this thread once every call handed over before it has run."""
        self._queue.put(("", (fn,)))

    def close(self) -> None:
        """Run every call handed over, then stop the thread (joined); without a started thread, run them here."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
            return
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                self._run(item)

    def _main(self) -> None:
        lower_thread_priority()  # the trackers wait; training does not
        if self._on_thread_start is not None:
            self._on_thread_start()
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._run(item)

    def _run(self, item: tuple[str, tuple[Any, ...]]) -> None:
        name, args = item
        try:
            if name:
                getattr(self.tracker, name)(*args)
            else:
                args[0]()
        except Exception:  # one bad call must not stop the others
            log.exception("rapidfire trackers: %s failed", name or "a callback")
