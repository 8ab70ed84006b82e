"""Background threads' scheduling (rapidfire_nb/_priority.py): the checkpoint writer idles, the others are nicer.

Each test changes only a thread it starts itself: Linux schedules threads one by one, so the test process keeps its
own priority.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb import _priority
from rapidfire_nb._priority import idle_thread_priority, lower_thread_priority

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


@linux
def test_the_idle_priority_is_linux_sched_idle_for_the_calling_thread_only() -> None:
    before = (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
    got, policy, _nice = _on_a_thread(idle_thread_priority)
    assert got == "idle" and policy == os.SCHED_IDLE
    assert (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())) == before


@linux
def test_where_sched_idle_is_refused_the_thread_is_made_as_nice_as_it_can_be(monkeypatch: Any) -> None:
    def refused(*_args: Any) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(_priority.os, "sched_setscheduler", refused)
    got, policy, nice = _on_a_thread(idle_thread_priority)
    assert got == "nice" and policy == os.SCHED_OTHER and nice == 19


@linux
def test_the_recorders_priority_is_ten_nicer() -> None:
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    got, policy, nice = _on_a_thread(lower_thread_priority)
    assert got is True and policy == os.SCHED_OTHER and nice == min(19, base + 10)


@linux
def test_the_checkpoint_writer_thread_runs_idle(tmp_path: Path) -> None:
    from rapidfire_nb.training.checkpoint import CheckpointWriter

    writer = CheckpointWriter()
    try:
        writer.flush()  # nothing queued; the thread has started
        for _ in range(200):
            if writer.priority:
                break
            threading.Event().wait(0.01)
        assert writer.priority == "idle"
        writers = [t for t in threading.enumerate() if t.name == "rapidfire-checkpoints" and t.native_id]
        assert writers and all(os.sched_getscheduler(t.native_id or 0) == os.SCHED_IDLE for t in writers)
        assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the process (and training) unchanged
    finally:
        writer.close()
