"""The device thread: one long-lived OS thread per device that does all of an executor's torch work.

Why one thread: PyTorch's CPU kernels run on OpenMP (libgomp), which gives every OS thread that starts a parallel
region its own thread team, and spins idle team threads at full speed only while the process's OpenMP threads do
not outnumber the CPUs (``gomp_managed_threads > gomp_available_cpus`` switches every team to a throttled spin).
A thread per run therefore changed how fast *every* run's steps went (measured on 2 cores: 1.3-1.5x slower than
plain TRL on the main thread when quiet, while plain TRL's spinning team was 30x slower than ours under load).
Here every run's ``train()`` is a greenlet on the one device thread (:mod:`rapidfire_nb.training.worker`): one
team, as in a plain ``trainer.train()``, whatever the number of runs. Building models and trainers, saving and
loading weights happen on this thread too, so that rapidfire_nb itself starts no OpenMP team elsewhere.

:meth:`DeviceThread.call` queues a function and returns a Future at once (the scheduler's ``run_segment``);
:meth:`DeviceThread.run` waits for its result and re-raises its exception (``add_run``, ``save_final``,
``load_model``). Called from the device thread itself, or after :meth:`DeviceThread.close`, both run the
function inline on the calling thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from rapidfire_nb.errors import ConfigError

from .openmp import keep_team_on_this_thread

__all__ = ["DeviceThread"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class DeviceThread:
    """A ``Thread`` plus a queue of functions to run on it, in order.

    Args:
        name: the thread's name (``rapidfire-device-<n>``).

    Thread-safety: :meth:`call`, :meth:`run` and :meth:`close` may be called from any thread.
    """

    def __init__(self, name: str = "rapidfire-device") -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._closed = False
        self._thread.start()

    @property
    def on_thread(self) -> bool:
        """True when called from the device thread itself."""
        return threading.current_thread() is self._thread

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn()`` on the device thread after what is queued before it; its Future holds the outcome."""
        fut: Future[T] = Future()
        if self.on_thread or self._closed:
            _settle(fut, fn)  # after close (e.g. load_model once the experiment ended): on the calling thread
        else:
            self._queue.put((fn, fut))
        return fut

    def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` on the device thread and return its result (its exception is raised here).

        A ``ConfigError`` (bad input found while building a run) is raised without the device thread's frames:
        its message says what to fix, and a user should not read the thread plumbing above it first.
        """
        try:
            return self.call(fn).result()
        except ConfigError as exc:
            raise exc.with_traceback(None)  # noqa: B904 - the same exception, its cause kept

    def close(self, timeout: float | None = None) -> None:
        """Run what is queued, then stop the thread (joined); later calls run on the calling thread."""
        if self._thread.is_alive() and not self.on_thread:
            self._closed = True  # what comes later runs inline; what is queued runs first
            self._queue.put(None)
            self._thread.join(timeout)
        self._closed = True

    def _main(self) -> None:
        keep_team_on_this_thread()  # the one OpenMP team every run trains with (training/openmp.py)
        try:
            while True:
                item = self._queue.get()
                if item is None:
                    return
                fn, fut = item
                _settle(fut, fn)
        finally:
            keep_team_on_this_thread(False)


def _settle(fut: Future[T], fn: Callable[[], T]) -> None:
    if not fut.set_running_or_notify_cancel():
        return
    try:
        fut.set_result(fn())
    except BaseException as exc:  # a failing call never stops the device thread
        fut.set_exception(exc)
