"""Background threads' scheduling (rapidfire_nb/_priority.py): ten nicer than training, the calling thread only.

Each test changes only a thread it starts itself: Linux schedules threads one by one, so the test process keeps its
own priority.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from rapidfire_nb import _priority
from rapidfire_nb._priority import lower_thread_priority

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread scheduling is Linux's")


def _on_a_thread(fn: Callable[[], Any]) -> tuple[Any, int, int]:
    """``(fn(), the thread's scheduling policy, its nice value)``, read on that thread before it ends."""
    out: list[Any] = []

    def body() -> None:
        result = fn()
        tid = threading.get_native_id()
        out.extend([result, os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)])

    t = threading.Thread(target=body)
    t.start()
    t.join()
    return out[0], out[1], out[2]


def _mine() -> tuple[int, int]:
    return os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@linux
def test_a_background_thread_is_ten_nicer_and_the_caller_only() -> None:
    before = _mine()
    got, policy, nice = _on_a_thread(lower_thread_priority)
    assert got is True and policy == os.SCHED_OTHER and nice == min(19, before[1] + 10)
    assert _mine() == before


@linux
def test_nice_stops_at_19() -> None:
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    got, _policy, nice = _on_a_thread(lambda: lower_thread_priority(40))
    assert got is True and nice == 19 and base <= 19


@linux
def test_where_the_system_refuses_the_thread_runs_as_it_did(monkeypatch: Any) -> None:
    def refused(*_args: Any) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(_priority.os, "setpriority", refused)
    before = _mine()
    got, policy, nice = _on_a_thread(lower_thread_priority)
    assert got is False and (policy, nice) == before


@linux
def test_the_checkpoint_writer_thread_runs_ten_nicer_not_idle() -> None:
    """Not ``SCHED_IDLE``: beside busy processes an idle writer, starved while holding the interpreter lock, stalled
    training (``_priority``'s docstring)."""
    from rapidfire_nb.training.checkpoint import CheckpointWriter

    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    writer = CheckpointWriter()
    try:
        writer.flush()  # nothing queued; the thread has started
        for _ in range(200):
            if writer.priority:
                break
            threading.Event().wait(0.01)
        assert writer.priority == "nice"
        writers = [t for t in threading.enumerate() if t.name == "rapidfire-checkpoints" and t.native_id]
        assert writers
        for t in writers:
            assert os.sched_getscheduler(t.native_id or 0) == os.SCHED_OTHER
            assert os.getpriority(os.PRIO_PROCESS, t.native_id or 0) == min(19, base + 10)
        assert _mine() == (os.SCHED_OTHER, base)  # the process (and training) unchanged
    finally:
        writer.close()
