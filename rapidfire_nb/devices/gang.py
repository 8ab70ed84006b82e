"""GangExecutor: one composite device, ``k`` worker processes that train one run together (no torch).

A run with ``num_gpus=k`` trains on a gang: ``k`` worker processes of its own (accelerate's state is per process, so
a rank never shares its worker with other runs), one per part of a composite device such as ``"cpu:0+cpu:1"``
(:mod:`kernel_scheduler.gangs`), joined in one ``torch.distributed`` process group (gloo on CPU, NCCL on GPUs;
``rapidfire_nb.training.sharding`` joins it from the environment :func:`rank_env` gives each rank). Every call goes
to every rank at once (the ranks meet in collectives: a call made on one rank only would wait there until the
collective timeout); rank 0's answer is the gang's, and only rank 0's events reach the kernel's callbacks (the
other ranks' metrics are the same numbers: TRL gathers them).

Death: a rank that dies (killed, out of memory) takes its gang down at once: the other ranks are killed rather
than left waiting in a collective until ``RF_GANG_TIMEOUT_S``. The segment in flight resolves with
``device_lost=True`` and the composite device is dead (:meth:`GangExecutor.alive`) until :meth:`GangExecutor.revive`
starts ``k`` fresh ranks; the scheduler then resumes the run there from its latest boundary checkpoint.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, TypeVar

from kernel_scheduler import Executor, RunStart, SegmentResult, check_device

from .errors import WorkerLost

__all__ = ["GangExecutor", "free_port", "rank_env"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: seconds a collective may wait for a rank before the gang fails (gloo's own default is 30 minutes)
GANG_TIMEOUT_S = 60


def free_port() -> int:
    """A TCP port free on this machine now (the gang's rendezvous, ``MASTER_PORT``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_env(rank: int, size: int, port: int, gpus: Sequence[int | None]) -> dict[str, str]:
    """The environment rank ``rank`` of a gang of ``size`` starts with: torch.distributed's standard variables
    (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), the
    collective timeout ``RF_GANG_TIMEOUT_S`` (seconds) and, on GPUs, every GPU of the gang visible in gang order
    (rank ``r`` trains on ``cuda:r``; NCCL needs the peers visible).

    Args:
        rank: 0-based rank. size: the gang's width k. port: the rendezvous port (:func:`free_port`).
        gpus: per rank, the GPU index it trains on, or None (CPU ranks).
    """
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(size),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RF_GANG_TIMEOUT_S": os.environ.get("RF_GANG_TIMEOUT_S", str(GANG_TIMEOUT_S)),
    }
    if all(g is not None for g in gpus):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    return env


class GangExecutor(Executor):
    """One composite device: ``k`` rank workers behind the :class:`~kernel_scheduler.Executor` API.

    Args:
        name: the composite device's name (``"cpu:0+cpu:1"``).
        start_ranks: starts the ``k`` rank workers (each a :class:`~rapidfire_nb.devices._remote.RemoteDevice`
            with a ``kill()`` method; rank 0 first) with a fresh rendezvous port; called now and by
            :meth:`revive`.

    Called from the scheduler thread, as any executor; one thread per rank carries the blocking calls.
    """

    def __init__(self, name: str, start_ranks: Callable[[], Sequence[Any]]) -> None:
        self.device = name
        self._start_ranks = start_ranks
        self._ranks: list[Any] = list(start_ranks())
        self._threads = ThreadPoolExecutor(
            max_workers=len(self._ranks), thread_name_prefix=f"rapidfire-{name}"
        )
        self._lock = threading.Lock()
        self._death: str | None = None
        self._closed = False

    # ------------------------------------------------------------------ devices
    @property
    def devices(self) -> tuple[str, ...]:
        return (self.device,)

    @property
    def size(self) -> int:
        """The gang's width k (ranks)."""
        return len(self._ranks)

    def device_of(self, run_id: int) -> str:
        return self.device

    def alive(self, device: str | None = None) -> bool:
        """False once one rank died (every rank was then killed) or the gang was closed."""
        return self._death is None and not self._closed and all(r.alive() for r in self._ranks)

    def pids(self) -> list[int]:
        """The ranks' process ids, rank 0 first (tests, ``kill -9`` drills)."""
        return [r.pid for r in self._ranks]

    def revive(self, device: str | None = None) -> bool:
        """Start ``k`` fresh ranks in place of a dead gang (its runs then resume from their checkpoints); True
        when the gang is alive afterwards. Does nothing for a live or closed gang."""
        if self._closed:
            return False
        if self.alive():
            return True
        self._kill_all()
        for rank in self._ranks:
            rank.close()
        try:
            self._ranks = list(self._start_ranks())
        except Exception as exc:  # a start that fails leaves the gang dead; the runs stay interrupted
            log.warning("rapidfire_nb: restarting gang %s failed: %s", self.device, exc)
            return False
        with self._lock:
            self._death = None
        return True

    # ------------------------------------------------------------------ Executor API
    def add_run(
        self,
        run_id: int,
        spec: Any,
        warm_from: int | None = None,
        resume_from: str | Path | None = None,
        *,
        device: str | None = None,
    ) -> RunStart:
        """Build the run on every rank (they shard its model together); rank 0's plan and start position."""
        check_device(self, device)
        start: RunStart = self._all(lambda r: r.add_run(run_id, spec, warm_from, resume_from))
        return start

    def run_segment(self, run_id: int, stop_step: int) -> Future[SegmentResult]:
        """Every rank trains to ``stop_step``; resolves with rank 0's result once all ranks are back, or with
        ``device_lost`` as soon as one rank died (the others are killed)."""
        futures = [r.run_segment(run_id, stop_step) for r in self._ranks]
        out: Future[SegmentResult] = Future()
        pending = [len(futures)]

        def done(_f: Future[SegmentResult]) -> None:
            res = _f.result()
            if res.device_lost:
                self._lose(res.error or "a rank died")
            with self._lock:
                pending[0] -= 1
                last = pending[0] == 0
            if last:
                out.set_result(self._merge([f.result() for f in futures]))

        for fut in futures:
            fut.add_done_callback(done)
        return out

    def has_run(self, run_id: int) -> bool:
        return bool(self._all(lambda r: r.has_run(run_id)))

    def has_boundary(self, run_id: int) -> bool:
        return bool(self._all(lambda r: r.has_boundary(run_id)))

    def on_status(self, run_id: int, status: str) -> None:
        self._all(lambda r: r.on_status(run_id, status))

    def flush(self) -> None:
        self._all(lambda r: r.flush())

    def checkpoint_dir(self, run_id: int) -> Path | None:
        return self._ranks[0].checkpoint_dir(run_id)  # type: ignore[no-any-return]

    def final_dir(self, run_id: int) -> Path | None:
        return self._ranks[0].final_dir(run_id)  # type: ignore[no-any-return]

    def save_final(self, run_id: int) -> Path:
        return Path(self._all(lambda r: r.save_final(run_id)))

    def export_boundary(self, run_id: int) -> Path:
        return Path(self._all(lambda r: r.export_boundary(run_id)))

    def drop_run(self, run_id: int) -> None:
        self._all(lambda r: r.drop_run(run_id))

    def close(self) -> None:
        """Close every rank (in parallel: a rank's close may meet the others in a last collective)."""
        if self._closed:
            return
        self._closed = True
        wait([self._submit(lambda r: r.close(), r) for r in self._ranks])
        self._threads.shutdown(wait=False)

    # ------------------------------------------------------------------ internals
    def _all(self, call: Callable[[Any], T]) -> T:
        """``call(rank)`` on every rank at once; rank 0's answer. A rank's error is raised once every rank
        answered; a rank that died takes the gang down first (the others would wait in a collective)."""
        if self._death is not None:
            raise WorkerLost(self._death)
        futures = [self._submit(call, r) for r in self._ranks]
        wait(futures, return_when=FIRST_EXCEPTION)
        for index, fut in enumerate(futures):
            if fut.done() and isinstance(fut.exception(), WorkerLost):
                self._lose(f"rank {index}: {fut.exception()}")
        wait(futures)
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            lost = [e for e in errors if isinstance(e, WorkerLost)]
            raise (lost or errors)[0]  # type: ignore[misc]
        return futures[0].result()

    def _submit(self, call: Callable[[Any], T], rank: Any) -> Future[T]:
        """``call(rank)`` on the gang's threads; on a thread of its own once no pool takes work (at interpreter
        exit ``concurrent.futures`` refuses new work: a script's exit hook still parks and closes the gang)."""
        try:
            return self._threads.submit(call, rank)
        except RuntimeError:
            fut: Future[T] = Future()

            def run() -> None:
                try:
                    fut.set_result(call(rank))
                except BaseException as exc:
                    fut.set_exception(exc)

            threading.Thread(target=run, name=f"rapidfire-{self.device}-exit", daemon=True).start()
            return fut

    def _lose(self, why: str) -> None:
        """One rank died: kill the others at once (never leave them waiting in a collective)."""
        with self._lock:
            if self._death is not None:
                return
            self._death = f"gang {self.device} lost a rank: {why}"
        log.warning("rapidfire_nb: %s; killing its other ranks", self._death)
        self._kill_all()

    def _kill_all(self) -> None:
        for rank in self._ranks:
            rank.kill()

    def _merge(self, results: list[SegmentResult]) -> SegmentResult:
        lost = [r for r in results if r.device_lost]
        if lost:
            return SegmentResult(
                lost[0].step, lost[0].samples_seen, error=self._death or lost[0].error, device_lost=True
            )
        failed = [r for r in results if r.error is not None]
        return failed[0] if failed and results[0].error is None else results[0]
