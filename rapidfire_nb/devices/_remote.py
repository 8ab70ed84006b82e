"""RemoteDevice: the Executor methods of one device whose ``TorchExecutor`` lives in a worker (no torch).

A local worker process (:class:`~rapidfire_nb.devices.local.WorkerExecutor`) and a Ray actor
(:class:`~rapidfire_nb.devices.ray_backend.RayWorkerExecutor`) differ only in how a call reaches the worker's
:class:`~rapidfire_nb.training.host.WorkerHost` and how its death shows; the calls themselves are the same: each
ships its arguments (:func:`~rapidfire_nb.devices.shipping.ship`) and waits for the answer through the subclass'
:meth:`RemoteDevice._invoke`. Each run's last known position is kept here, so that a segment lost with its worker
reports where the run stood.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernel_scheduler import Executor, RunStart, SegmentResult, check_device

from ._replies import path_or_none
from .shipping import ship

__all__ = ["RemoteDevice"]


class RemoteDevice(Executor):
    """One device in a worker; subclasses set ``device``, ``_death``, ``_lock`` and ``_positions`` in their
    ``__init__`` and implement :meth:`_invoke` (and ``run_segment``, ``close``)."""

    device: str
    _death: str | None
    _lock: threading.Lock
    _positions: dict[int, tuple[int, int]]  # run id -> (step, samples_seen) at its last known boundary
    _sinks: dict[str, Callable[..., None]]  # event name -> the kernel's callback (``_replies.event_sinks``)

    def _invoke(self, method: str, payload: bytes) -> Any:
        """Call ``WorkerHost.<method>`` with the shipped arguments and return its answer (blocking).

        Raises:
            ConfigError: the worker found bad input. WorkerLost: the worker died.
        """
        raise NotImplementedError

    # ------------------------------------------------------------------ devices
    @property
    def devices(self) -> tuple[str, ...]:
        return (self.device,)

    def device_of(self, run_id: int) -> str:
        return self.device

    def alive(self, device: str | None = None) -> bool:
        """False once the worker died (or was closed)."""
        return self._death is None

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
        """Build the run's trainer in the worker; its plan and start position (see ``TorchExecutor.add_run``).

        ``device``: this worker's device or ``None`` (ValueError for another name).

        Raises:
            ConfigError: the spec cannot be sent (a loaded model in ``formatting_func``'s closure...) or the
                worker found bad input. WorkerLost: the worker died.
        """
        check_device(self, device)
        args = (run_id, spec, warm_from, str(resume_from) if resume_from is not None else None)
        start: RunStart = self._invoke("add_run", ship(args, f"run {run_id}'s config"))
        with self._lock:
            self._positions[run_id] = (start.step, start.samples_seen)
        return start

    def has_run(self, run_id: int) -> bool:
        return bool(self._invoke("has_run", ship((run_id,), "has_run")))

    def has_boundary(self, run_id: int) -> bool:
        return bool(self._invoke("has_boundary", ship((run_id,), "has_boundary")))

    def on_status(self, run_id: int, status: str) -> None:
        """Tell the worker (a COMPLETED or STOPPED run's final weights are saved there before this returns)."""
        self._invoke("on_status", ship((run_id, status), "on_status"))
        if status in ("COMPLETED", "STOPPED"):
            # The worker's own "final" event can reach the kernel after this answer (a Ray actor's events are
            # drained apart from its answers), so wait() could return before the store has the run's
            # checkpoint_dir (seen once in a CI run on a loaded machine). Handing it on here keeps it in order;
            # the event's later repeat writes the same path.
            final = self.final_dir(run_id)
            if final is not None:
                self._sinks["final"](run_id, str(final))

    def flush(self) -> None:
        """Wait until the checkpoints the kernel already let through (answered order tokens) are on disk."""
        self._invoke("flush", ship((), "flush"))

    def checkpoint_dir(self, run_id: int) -> Path | None:
        return path_or_none(self._invoke("checkpoint_dir", ship((run_id,), "checkpoint_dir")))

    def final_dir(self, run_id: int) -> Path | None:
        return path_or_none(self._invoke("final_dir", ship((run_id,), "final_dir")))

    def save_final(self, run_id: int) -> Path:
        return Path(self._invoke("save_final", ship((run_id,), "save_final")))

    def export_boundary(self, run_id: int) -> Path:
        """The run's latest boundary as a complete ``runs/<id>/checkpoint-<step>`` folder (``WorkerHost``'s)."""
        return Path(self._invoke("export_boundary", ship((run_id,), "export_boundary")))

    def drop_run(self, run_id: int) -> None:
        """Let the worker release the run (it moved to another device)."""
        self._invoke("drop_run", ship((run_id,), "drop_run"))
        with self._lock:
            self._positions.pop(run_id, None)

    # ------------------------------------------------------------------ internals
    def _lost_segment(self, run_id: int, text: str) -> SegmentResult:
        """The result of a segment lost with its worker: where the run last stood, ``device_lost``."""
        step, seen = self._positions.get(run_id, (0, 0))
        return SegmentResult(step, seen, error=text, device_lost=True)
