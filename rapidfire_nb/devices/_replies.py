"""The worker's answers as the kernel raises or passes them on (no torch)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rapidfire_nb.errors import ConfigError, StorageError
from rapidfire_nb.spec.bundles import TrainingCallbacks

__all__ = ["RemoteTraceback", "event_sinks", "path_or_none", "remote_error"]


class RemoteTraceback(Exception):
    """The worker's traceback, as the ``__cause__`` of the error raised in the kernel."""

    def __init__(self, trace: str) -> None:
        super().__init__(trace)
        self.trace = trace

    def __str__(self) -> str:
        return f"\n(in the worker process)\n{self.trace}"


def path_or_none(value: Any) -> Path | None:
    return None if value is None else Path(value)


def remote_error(device: str, kind: str, name: str, message: str, trace: str) -> Exception:
    """The worker's exception as raised here: ConfigError and StorageError as such, others a RuntimeError."""
    if kind == "config":
        return ConfigError(message)
    if kind == "storage":
        return StorageError(name, message)
    error = RuntimeError(f"in worker {device}: {name}: {message}")
    if trace:
        error.__cause__ = RemoteTraceback(trace)  # shown above the error, as concurrent.futures does
    return error


def event_sinks(callbacks: TrainingCallbacks) -> dict[str, Callable[..., None]]:
    """The kernel's callbacks by the name of the worker event they answer (``WorkerHost``'s ``metrics``, ``note``,
    ``final``, ``storage_error``, ``eval_metrics``; ``order`` is the proxy's own, through
    ``callbacks.in_record_order``): each takes the event's fields as the worker sent them (a path as ``str``, a
    storage failure as ``where, reason``)."""
    return {
        "metrics": callbacks.metric_sink,
        "note": callbacks.notes,
        "final": lambda rid, path: callbacks.on_final(rid, Path(path)),
        "storage_error": lambda where, reason: callbacks.on_storage_error(StorageError(where, reason)),
        "eval_metrics": callbacks.on_eval_metrics,
    }
