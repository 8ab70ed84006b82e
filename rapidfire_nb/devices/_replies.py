"""The worker's answers as the kernel raises or passes them on (no torch)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rapidfire_nb.errors import ConfigError, StorageError

__all__ = ["RemoteTraceback", "event_sinks", "path_or_none", "remote_error", "report_storage"]

log = logging.getLogger(__name__)


class RemoteTraceback(Exception):
    """The worker's traceback, as the ``__cause__`` of the error raised in the kernel."""

    def __init__(self, trace: str) -> None:
        super().__init__(trace)
        self.trace = trace

    def __str__(self) -> str:
        return f"\n(in the worker process)\n{self.trace}"


def path_or_none(value: Any) -> Path | None:
    return None if value is None else Path(value)


def report_storage(sink: Callable[[StorageError], None] | None, failure: StorageError) -> None:
    if sink is not None:
        sink(failure)
    else:
        log.error("rapidfire_nb: %s", failure)


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


def event_sinks(
    metric_sink: Callable[[int, int, int, dict[str, float]], None],
    notes: Callable[[str], None] | None,
    on_final: Callable[[int, Path], None] | None,
    on_storage_error: Callable[[StorageError], None] | None,
    on_eval_metrics: Callable[[list[str]], None] | None,
) -> dict[str, Callable[..., None]]:
    """The kernel's callbacks by the name of the worker event they answer (``WorkerHost``'s ``metrics``, ``note``,
    ``final``, ``storage_error``, ``eval_metrics``; ``order`` is the proxy's own)."""
    return {
        "metrics": metric_sink,
        "note": notes or (lambda text: None),
        "final": lambda rid, path: (on_final or (lambda r, p: None))(rid, Path(path)),
        "storage_error": lambda where, reason: report_storage(on_storage_error, StorageError(where, reason)),
        "eval_metrics": on_eval_metrics or (lambda names: None),
    }
