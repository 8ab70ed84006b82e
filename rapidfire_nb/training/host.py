"""WorkerHost: one device's :class:`~rapidfire_nb.training.executor.TorchExecutor`, inside a worker process.

The worker-side half of a device that runs in its own process (``rapidfire_nb.devices.local`` serves it over a
pipe; a Ray actor can host the same object). It knows no transport: every method blocks until done and may be
called from any thread, several at once (a segment trains while the kernel asks for another run's boundary);
callbacks to the kernel leave through ``emit(event)``, one tuple each, in the order they happen:

* ``("metrics", run_id, step, samples_seen, logs)`` — every TRL log call (``logs``: name -> float);
* ``("note", text)`` — a user-facing note;
* ``("final", run_id, path)`` — a run's final weights were saved into ``path`` (str);
* ``("storage_error", where, reason)`` — a checkpoint or final-weights write failed (``errors.StorageError``);
* ``("eval_metrics", names)`` — generation metric names first logged;
* ``("order", token)`` — the executor's ``in_record_order``: the host keeps the function under ``token`` (int)
  and runs it when the kernel calls :meth:`WorkerHost.ordered` with that token, i.e. once the kernel recorded
  every event emitted before it. So a boundary checkpoint reaches the writer only after the metrics of the steps
  before it are in the store, as in one process.

The run's events of a segment are emitted before :meth:`run_segment` returns.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernel_scheduler import RunStart, SegmentResult
from rapidfire_nb._atomic import is_complete_dir
from rapidfire_nb.spec.bundles import TrainingCallbacks

from .checkpoint import write_snapshot
from .executor import TorchExecutor
from .sharding import join_gang, leave_gang
from .warm_start import saved_state

__all__ = ["Emit", "WorkerHost", "emitting_callbacks"]

Emit = Callable[[tuple[Any, ...]], None]

ORDER_TIMEOUT_S = 600.0  # export_boundary waits this long for the kernel to record what came before


def emitting_callbacks(emit: Emit, in_order: Callable[[Callable[[], None]], None]) -> TrainingCallbacks:
    """The worker's own callbacks: each sends its event to the kernel through ``emit`` (see the module for the
    event tuples); ``in_order`` keeps a function until the kernel answers its order token."""
    return TrainingCallbacks(
        metric_sink=lambda rid, step, seen, logs: emit(("metrics", rid, step, seen, dict(logs))),
        notes=lambda text: emit(("note", text)),
        on_final=lambda rid, path: emit(("final", rid, str(path))),
        on_storage_error=lambda failure: emit(("storage_error", failure.where, failure.reason)),
        in_record_order=in_order,
        on_eval_metrics=lambda names: emit(("eval_metrics", list(names))),
    )


class WorkerHost:
    """Hosts one device's executor.

    Args:
        settings: a ``rapidfire_nb.devices.WorkerSettings`` (its group's ``create_model_fn`` a callable here).
        emit: sends one event tuple to the kernel (thread-safe; called from the device, writer and request
            threads).

    Raises:
        FileNotFoundError: a dataset folder is missing.
    """

    def __init__(self, settings: Any, emit: Emit) -> None:
        from datasets import load_from_disk

        self.settings = settings
        self._emit = emit
        self._tokens = itertools.count(1)
        self._waiting: dict[int, Callable[[], None]] = {}
        self._lock = threading.Lock()
        self._export_lock = threading.Lock()
        # a gang's rank (RANK / WORLD_SIZE / MASTER_* set by the device layer) joins its process group first; only
        # rank 0's events reach the kernel, so the other ranks write their checkpoint shares without an order token
        gang = join_gang()
        self._order = self._in_order if gang is None or gang.rank == 0 else _at_once
        train = load_from_disk(settings.train_path)  # memory-mapped Arrow, shared with the other workers
        evald = load_from_disk(settings.eval_path) if settings.eval_path else None
        self.executor = TorchExecutor(
            settings.group, train, evald, Path(settings.exp_dir), emitting_callbacks(emit, self._order)
        )

    # ------------------------------------------------------------------ the executor's calls
    def add_run(
        self, run_id: int, spec: Any, warm_from: int | None = None, resume_from: str | Path | None = None
    ) -> RunStart:
        """Build the run's trainer (see ``TorchExecutor.add_run``). Raises ConfigError on bad input."""
        return self.executor.add_run(
            run_id, spec, warm_from, Path(resume_from) if resume_from is not None else None
        )

    def run_segment(self, run_id: int, stop_step: int) -> SegmentResult:
        """Train ``run_id`` until global optimizer step ``stop_step`` (or its end); blocks until then.

        Raises:
            KeyError: unknown run. RuntimeError: the run has finished.
        """
        return self.executor.run_segment(run_id, stop_step).result()

    def has_run(self, run_id: int) -> bool:
        return self.executor.has_run(run_id)

    def has_boundary(self, run_id: int) -> bool:
        return self.executor.has_boundary(run_id)

    def on_status(self, run_id: int, status: str) -> None:
        self.executor.on_status(run_id, status)

    def flush(self) -> None:
        """Wait until every checkpoint handed to the writer is on disk."""
        self.executor.flush()

    def checkpoint_dir(self, run_id: int) -> Path | None:
        return self.executor.checkpoint_dir(run_id)

    def final_dir(self, run_id: int) -> Path | None:
        return self.executor.final_dir(run_id)

    def save_final(self, run_id: int) -> Path:
        """Save the run's weights into ``runs/<id>/final`` (after the segment in progress, if any)."""
        return self.executor.save_final(run_id)

    def export_boundary(self, run_id: int) -> Path:
        """The run's latest boundary as a complete, resumable ``runs/<id>/checkpoint-<step>`` folder.

        For moving a parked run to another device (``add_run(resume_from=...)`` there). First waits until the
        kernel recorded every event emitted so far (an order token), so the folder is never ahead of the
        metrics in the store; then reuses the writer's folder of that step, or writes it now from the in-memory
        snapshot (atomically, on the calling thread: another run may train on the device thread meanwhile). A run
        this process did not build (a fresh worker, e.g. a gang revived after a rank died) answers with its latest
        readable checkpoint on disk (what :meth:`has_boundary` found).

        Raises:
            KeyError: unknown run (no checkpoint on disk either). RuntimeError: the run has no boundary yet, or
                the kernel did not answer the order token within ``ORDER_TIMEOUT_S`` seconds. OSError: the write
                failed.
        """
        run = self.executor.runs.get(run_id)
        if run is None:  # not built here (a fresh worker: a revived gang): as has_boundary says
            saved = saved_state(self.executor.run_dir(run_id))
            if saved is None:
                raise KeyError(run_id)
            return saved
        snap = run.last
        if snap is None:
            raise RuntimeError(f"run {run_id} has no chunk boundary to export")
        recorded = threading.Event()
        self._order(recorded.set)
        if not recorded.wait(ORDER_TIMEOUT_S):
            raise RuntimeError(f"run {run_id}: the kernel did not record the events before its export")
        self.executor.flush()  # the writer's checkpoint of this step, if it was due, is on disk now
        target = run.run_dir / f"checkpoint-{snap.step}"
        with self._export_lock:
            if self.executor.checkpoint_dir(run_id) == target and is_complete_dir(target):
                return target
            write_snapshot(snap, target)
        return target

    def drop_run(self, run_id: int) -> None:
        """Forget a run that moved to another device: its paused ``train()`` and its adapter are released (on
        the device thread, after the segment in progress); returns at once. Its run folder stays."""
        self.executor.drop_run(run_id)

    def ordered(self, token: int) -> None:
        """The kernel recorded everything emitted before ``token``: run the function kept under it."""
        with self._lock:
            fn = self._waiting.pop(token, None)
        if fn is not None:
            fn()

    def close(self) -> None:
        """Release the runs, write the queued checkpoints, stop the device thread (functions still waiting for
        an order token are dropped: their checkpoints would be ahead of the store)."""
        with self._lock:
            self._waiting.clear()
        self.executor.close()
        leave_gang()  # a gang's rank leaves its process group (nothing for another worker)

    # ------------------------------------------------------------------ internals
    def _in_order(self, fn: Callable[[], None]) -> None:
        with self._lock:
            token = next(self._tokens)
            self._waiting[token] = fn
        self._emit(("order", token))


def _at_once(fn: Callable[[], None]) -> None:
    fn()
