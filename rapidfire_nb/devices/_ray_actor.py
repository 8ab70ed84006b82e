"""The body of a Ray device actor (``backend="ray"``): hosts a :class:`~rapidfire_nb.training.host.WorkerHost`.

Like :mod:`rapidfire_nb.devices._child` for a local worker, this runs in the worker (the actor process), the one
place of ``rapidfire_nb.devices`` that imports torch and the training layer (inside its methods); the kernel only
names the class to Ray (:func:`rapidfire_nb.devices.ray_backend._actor_class`).
"""

from __future__ import annotations

import os
from typing import Any

from .settings import WorkerSettings

__all__ = ["Actor"]


class Actor:
    """The actor's body (made a Ray actor class on first use, so that importing this module needs no Ray).

    A failure to start (``create_model_fn`` not loadable there, a dataset folder missing, torch failing) is kept
    and returned by :meth:`ready` rather than raised: an actor whose ``__init__`` raises is dead, and the kernel
    would read a Ray error instead of the cause.
    """

    def __init__(self, settings: WorkerSettings, fn_bytes: bytes) -> None:
        import queue

        self._events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._host: Any = None
        self._start_error: tuple[str, str] | None = None
        os.environ.update(settings.env)  # before torch: CUDA_VISIBLE_DEVICES="" on a CPU device, OMP threads
        try:
            import cloudpickle

            fn = cloudpickle.loads(fn_bytes)
        except Exception as exc:
            self._start_error = (
                "config",
                f"create_model_fn could not be loaded in Ray worker {settings.device}: {type(exc).__name__}: "
                f"{exc}; define it in the notebook (or in a module every Ray node can import: the actors get "
                "the kernel's sys.path)",
            )
            return
        try:
            import torch

            if settings.torch_threads:
                torch.set_num_threads(int(settings.torch_threads))
            from rapidfire_nb.training.host import WorkerHost

            self._host = WorkerHost(settings.with_model_fn(fn), self._events.put)
            from rapidfire_nb.training.openmp import release_thread_team

            release_thread_team()  # this thread's OpenMP team would throttle the device thread's
        except Exception:
            import traceback

            self._start_error = (
                "lost",
                f"Ray worker {settings.device} failed to start:\n{traceback.format_exc()}",
            )

    def ready(self) -> tuple[str, Any]:
        """``("ok", pid)``, or ``("config" | "lost", why)`` when the host could not start."""
        if self._start_error is not None:
            return self._start_error
        return ("ok", os.getpid())

    def call(self, method: str, payload: bytes) -> Any:
        """``WorkerHost.<method>(*args)``: ``("ok", value)`` or ``("error", kind, name, message, traceback)`` as
        :func:`~rapidfire_nb.devices._replies.remote_error` takes it (kind ``"config"``, ``"storage"`` (name: where)
        or ``"other"``)."""
        import cloudpickle

        from rapidfire_nb.errors import ConfigError as _ConfigError
        from rapidfire_nb.errors import StorageError as _StorageError

        try:
            args = cloudpickle.loads(payload)
        except Exception as exc:
            text = f"{method}'s arguments could not be loaded in the Ray worker: {type(exc).__name__}: {exc}"
            return ("error", "config", "ConfigError", text, "")
        try:
            return ("ok", getattr(self._host, method)(*args))
        except _ConfigError as exc:
            return ("error", "config", "ConfigError", str(exc), "")
        except _StorageError as exc:
            return ("error", "storage", exc.where, exc.reason, "")
        except Exception as exc:
            import traceback

            return ("error", "other", type(exc).__name__, str(exc), traceback.format_exc())

    def segment(self, key: int, run_id: int, stop_step: int) -> None:
        """Train a segment; its result goes out as the event ``("segment", key, result)``, after every event
        the segment emitted (so the kernel has recorded its metrics when the scheduler sees the result)."""
        self._events.put(("segment", key, self.call("run_segment", _dumps((run_id, stop_step)))))

    def drain(self, wait_s: float) -> list[tuple[Any, ...]]:
        """The events emitted since the last drain (waits up to ``wait_s`` seconds for the first)."""
        import queue

        out = []
        try:
            out.append(self._events.get(timeout=wait_s) if wait_s > 0 else self._events.get_nowait())
            while True:
                out.append(self._events.get_nowait())
        except queue.Empty:
            pass
        return out

    def ordered(self, token: int) -> None:
        if self._host is not None:
            self._host.ordered(token)


def _dumps(value: Any) -> bytes:
    import cloudpickle

    return bytes(cloudpickle.dumps(value))
