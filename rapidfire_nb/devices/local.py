"""WorkerExecutor: one device trained by a worker process on this machine (the kernel's side).

The process is a fresh interpreter (``rapidfire_nb.devices._child``) hosting a
:class:`~rapidfire_nb.training.host.WorkerHost` (today's ``TorchExecutor``) for its device: a GPU
(``env={"CUDA_VISIBLE_DEVICES": "1"}``) or a share of the CPU cores (``torch_threads``). This module imports no
torch. Started with ``subprocess`` rather than ``multiprocessing``'s spawn, which would re-run a script's
``__main__`` in the child; the pipe is a ``multiprocessing.connection`` pair all the same.

Threads (kernel side): the caller's (the scheduler thread; every method), one reader thread per worker
(``rapidfire-worker-<device>``: replies resolve their request's Future, events call the callbacks, which must
therefore be cheap and thread-safe: the recorder's queue), and whoever runs ``in_record_order``'s functions
(they send the ``ordered`` answer). One lock guards the connection's sends.

Death (SIGKILL, segfault, out of memory): the reader sees end of file; every pending ``run_segment`` Future
resolves with ``SegmentResult(device_lost=True)`` at the run's last known boundary, every other pending call
raises :class:`~rapidfire_nb.devices.errors.WorkerLost`, and so does every later call. No orphans: the child
dies with the thread that started it (``PR_SET_PDEATHSIG``; start workers from a long-lived thread), exits when
the pipe ends, and is killed by :meth:`WorkerExecutor.close` and at interpreter exit.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import logging
import pickle
import threading
import time
import weakref
from concurrent.futures import Future
from typing import Any

from kernel_scheduler import SegmentResult
from rapidfire_nb.errors import ConfigError
from rapidfire_nb.spec.bundles import TrainingCallbacks

from ._process import end_process, exit_reason, start_process
from ._remote import RemoteDevice
from ._replies import event_sinks, remote_error
from .errors import WorkerLost
from .settings import WorkerSettings
from .shipping import ship

__all__ = ["WorkerExecutor"]

log = logging.getLogger(__name__)

_LIVE: weakref.WeakSet[WorkerExecutor] = weakref.WeakSet()


class WorkerExecutor(RemoteDevice):
    """One device in a worker process. Methods are the ``TorchExecutor``'s, called from one thread (the
    scheduler's); each blocks until the worker answered, except :meth:`run_segment`.

    Args:
        settings: the worker's :class:`~rapidfire_nb.devices.settings.WorkerSettings` (datasets already shared).
        callbacks: the kernel's :class:`~rapidfire_nb.spec.bundles.TrainingCallbacks`, called on the reader thread
            (``rapidfire-worker-<device>``) as the worker's events arrive.
        start_timeout_s: seconds the worker may take to start (import torch/TRL, load the datasets) before the
            first call gives up (WorkerLost).

    Raises:
        ConfigError: ``create_model_fn`` cannot be sent to a process (before the process starts).
    """

    def __init__(
        self, settings: WorkerSettings, callbacks: TrainingCallbacks, start_timeout_s: float = 300.0
    ) -> None:
        fn_bytes = ship(settings.create_model_fn, "create_model_fn")
        self.device = settings.device
        self._sinks = event_sinks(callbacks)
        self._in_record_order = callbacks.in_record_order
        self._start_timeout_s = start_timeout_s
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # state: pending, dead, positions
        self._send_lock = threading.Lock()
        self._pending: dict[int, tuple[Future[Any], int | None]] = {}  # id -> (Future, run id of a segment)
        self._positions: dict[
            int, tuple[int, int]
        ] = {}  # run id -> (step, samples_seen) at its last boundary
        self._outstanding: set[int] = set()  # order tokens not answered yet
        self._death: str | None = None
        self._closing = False
        self._ready: Future[int] = Future()
        self._proc, self._conn = start_process(settings.env)
        _LIVE.add(self)
        self._send(("start", settings.with_model_fn(None), fn_bytes), shipped=True)
        self._reader = threading.Thread(
            target=self._read, name=f"rapidfire-worker-{self.device}", daemon=True
        )
        self._reader.start()

    # ------------------------------------------------------------------ devices
    @property
    def pid(self) -> int:
        """The worker process' id."""
        return self._proc.pid

    def wait_ready(self) -> int:
        """Block until the worker started; its pid.

        Raises:
            ConfigError: ``create_model_fn`` could not be loaded there (e.g. a module the worker cannot import).
            WorkerLost: the worker failed to start (the message holds its traceback), died, or took longer than
                ``start_timeout_s``.
        """
        try:
            return self._ready.result(self._start_timeout_s)
        except TimeoutError:
            self._kill()
            raise WorkerLost(
                f"worker {self.device} (pid {self.pid}) did not start within {self._start_timeout_s:g} s"
            ) from None

    # ------------------------------------------------------------------ Executor API

    def run_segment(self, run_id: int, stop_step: int) -> Future[SegmentResult]:
        """Train until global step ``stop_step``; the Future resolves at the boundary (never with an exception:
        a death gives ``device_lost=True``, a refused call ``error``)."""
        try:
            return self._request("run_segment", ship((run_id, stop_step), "run_segment"), segment_of=run_id)
        except WorkerLost as exc:
            done: Future[SegmentResult] = Future()
            done.set_result(self._lost_segment(run_id, str(exc)))
            return done

    def close(self, timeout_s: float = 60.0) -> None:
        """Ask the worker to close (queued checkpoints written), wait for it, then terminate / kill it.

        Waits up to 10 s first for order tokens the kernel has not answered (their checkpoints are written
        only once answered). Never raises; a second call does nothing.
        """
        if self._closing:
            return
        deadline = time.monotonic() + 10.0
        while self._outstanding and self._death is None and time.monotonic() < deadline:
            time.sleep(0.02)
        self._closing = True
        if self._death is None and self._ready.done() and self._ready.exception() is None:
            try:
                self._request("close", ship((), "close")).result(timeout_s)
            except Exception as exc:  # dead meanwhile, or a close that failed: killed below
                log.warning("rapidfire_nb: closing worker %s: %s", self.device, exc)
        self._kill(grace_s=10.0)
        self._reader.join(10.0)
        self._conn.close()
        _LIVE.discard(self)

    def kill(self) -> None:
        """Kill the worker now (SIGTERM, then SIGKILL): a gang's other ranks when one died
        (:class:`~rapidfire_nb.devices.gang.GangExecutor`). Its pending calls then resolve as for any death."""
        self._kill()

    # ------------------------------------------------------------------ requests
    def _invoke(self, method: str, payload: bytes) -> Any:
        return self._request(method, payload).result()

    def _request(self, method: str, payload: bytes, segment_of: int | None = None) -> Future[Any]:
        if method != "close":
            self.wait_ready()
        fut: Future[Any] = Future()
        with self._lock:
            if self._death is not None:
                raise WorkerLost(self._death)
            req_id = next(self._ids)
            self._pending[req_id] = (fut, segment_of)
        try:
            self._send((req_id, method, payload))
        except OSError:  # the worker is gone: the reader resolves the Future at end of file
            pass
        return fut

    def _send(self, msg: tuple[Any, ...], shipped: bool = False) -> None:
        import cloudpickle

        data = cloudpickle.dumps(msg) if shipped else pickle.dumps(msg)
        with self._send_lock:
            self._conn.send_bytes(data)

    def _answer(self, token: int) -> None:
        """The kernel recorded what came before order ``token``: tell the worker."""
        self._outstanding.discard(token)
        if self._death is None:
            try:
                self._send((None, "ordered", pickle.dumps((token,))))
            except OSError:
                pass

    # ------------------------------------------------------------------ reader thread
    def _read(self) -> None:
        while True:
            try:
                msg = pickle.loads(self._conn.recv_bytes())
            except (EOFError, OSError):
                break
            except Exception as exc:  # a message this side cannot load: the connection is unusable
                log.error("rapidfire_nb: worker %s sent an unreadable message: %s", self.device, exc)
                break
            try:
                self._handle(msg)
            except Exception:  # a failing callback never stops the reader
                log.exception("rapidfire_nb: worker %s: handling %s failed", self.device, msg[0])
        self._lost()

    def _handle(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "event":
            event = msg[1]
            if event[0] == "order":
                self._outstanding.add(event[1])
                self._in_record_order(functools.partial(self._answer, event[1]))
            else:
                self._sinks[event[0]](*event[1:])
            return
        if kind == "ready":
            self._ready.set_result(msg[1])
            return
        if kind == "start_error":
            self._ready.set_exception(ConfigError(msg[2]) if msg[1] == "config" else WorkerLost(msg[2]))
            return
        with self._lock:
            fut, segment_of = self._pending.pop(msg[1])
        if kind == "reply":
            if segment_of is not None:
                with self._lock:
                    self._positions[segment_of] = (msg[2].step, msg[2].samples_seen)
            fut.set_result(msg[2])
            return
        error = remote_error(self.device, *msg[2:])
        if segment_of is not None:  # a refused segment (finished or unknown run): reported, not raised
            step, seen = self._positions.get(segment_of, (0, 0))
            fut.set_result(SegmentResult(step, seen, error=str(error)))
        else:
            fut.set_exception(error)

    def _lost(self) -> None:
        """End of file: the worker exited (asked to, or died). Resolve everything pending."""
        how = self._exit_reason()
        text = f"worker {self.device} (pid {self.pid}) " + ("was closed" if self._closing else f"died: {how}")
        with self._lock:
            self._death = text
            pending, self._pending = self._pending, {}
        if not self._ready.done():
            self._ready.set_exception(WorkerLost(text))
        for fut, segment_of in pending.values():
            if segment_of is not None:
                fut.set_result(self._lost_segment(segment_of, text))
            else:
                fut.set_exception(WorkerLost(text))

    def _exit_reason(self) -> str:
        return exit_reason(self._proc)

    def _kill(self, grace_s: float = 0.0) -> None:
        end_process(self._proc, grace_s)


@atexit.register
def _kill_all() -> None:
    """At interpreter exit: no worker outlives the kernel."""
    for worker in list(_LIVE):
        worker._closing = True
        worker._kill()
