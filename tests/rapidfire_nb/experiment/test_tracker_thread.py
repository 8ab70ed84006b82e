"""The trackers' thread: the recorder's tracker calls run there, in order, and one that raises stops none."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from rapidfire_nb.experiment.tracker_thread import TrackerThread


class _Tracker:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.threads: set[str] = set()

    def log_metrics(self, run_id: int, step: int) -> None:
        self.calls.append(("log_metrics", run_id, step))
        self.threads.add(threading.current_thread().name)

    def set_status(self, run_id: int, status: str) -> None:
        if status == "BAD":
            raise RuntimeError("a backend bug")
        self.calls.append(("set_status", run_id, status))


def test_calls_run_in_order_on_the_trackers_thread_and_after_waits_for_them() -> None:
    tracker = _Tracker()
    thread = TrackerThread(tracker)
    thread.start()
    for step in range(1, 201):
        thread.log_metrics(1, step)
    thread.set_status(1, "BAD")  # logged, and the next calls still run
    thread.set_status(1, "COMPLETED")
    done = threading.Event()
    thread.after(done.set)
    assert done.wait(10)
    assert tracker.calls == [("log_metrics", 1, s) for s in range(1, 201)] + [("set_status", 1, "COMPLETED")]
    assert tracker.threads == {"rapidfire-trackers"}
    thread.close()
    thread.close()  # idempotent


def test_a_method_the_tracker_lacks_fails_at_once_and_close_without_start_runs_what_was_handed_over() -> None:
    tracker = _Tracker()
    thread = TrackerThread(tracker)
    with pytest.raises(AttributeError):
        thread.flush_everything  # noqa: B018 - the lookup itself raises
    thread.log_metrics(2, 1)
    thread.close()
    assert tracker.calls == [("log_metrics", 2, 1)]
