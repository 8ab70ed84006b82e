"""TensorBoard event files, one subdirectory per run: ``<log_root>/run-<run_id>``.

The folder keeps the run id (the one identity; a name may change, be long or repeat): a named run's name (and tags)
is written as the text summary ``run_name`` of its folder (TensorBoard's Text tab: ``run-3 / run_name``), beside its
hyperparameters' table (``hparams``).

Uses TensorBoard's own event-file writer and protos (no TensorFlow, no torch), imported when a
:class:`TensorBoardTracker` is created. View with ``tensorboard --logdir <log_root>`` or, on Colab,
``%tensorboard --logdir <log_root>``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rapidfire_nb.redact import redact

from .base import BackendTracker

if TYPE_CHECKING:
    from rapidfire_nb.tracking.base import TrackedRun

__all__ = ["HPARAMS_TAG", "NAME_TAG", "NullTracker", "TensorBoardTracker"]

HPARAMS_TAG = "hparams"
"""Tag of the text summary holding a run's hyperparameters."""
NAME_TAG = "run_name"
"""Tag of the text summary holding a named run's name and tags (``"**run 3**: baseline"``)."""


def _import_tensorboard() -> Any:
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2  # type: ignore[import-untyped]
        from tensorboard.plugins.text import metadata as text_metadata  # type: ignore[import-untyped]
        from tensorboard.summary.writer.event_file_writer import EventFileWriter  # type: ignore[import-untyped]
    except ImportError as exc:  # pragma: no cover - tensorboard is a dependency
        raise ImportError(
            "TensorBoard logging needs the 'tensorboard' package: pip install 'tensorboard>=2.15' "
            "(or turn TensorBoard logging off)."
        ) from exc

    class _TB:
        Event = event_pb2.Event
        SessionLog = event_pb2.SessionLog
        Summary = summary_pb2.Summary
        TensorProto = tensor_pb2.TensorProto
        DT_STRING = types_pb2.DT_STRING
        text_metadata_for = staticmethod(text_metadata.create_summary_metadata)
        Writer = EventFileWriter

    return _TB


def _format_value(value: Any) -> str:
    text = repr(value) if isinstance(value, float) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _hparams_markdown(hparams: Mapping[str, Any]) -> str:
    lines = ["| hyperparameter | value |", "| --- | --- |"]
    lines += [f"| {_format_value(k)} | {_format_value(v)} |" for k, v in sorted(hparams.items())]
    return "\n".join(lines)


class TensorBoardTracker:
    """Writes each run's metrics as TensorBoard scalars under ``<log_root>/run-<run_id>``.

    The run id is the same number as everywhere else (store, panel). Thread-safe: every method takes
    one lock. Each run's writer is opened on first use; the writer's own background thread flushes
    every ``flush_secs`` seconds, and :meth:`flush` / :meth:`close` flush at once.

    Args:
        log_root: folder holding one subdirectory per run (created when needed).
        flush_secs: how often buffered events reach the disk on their own.
    """

    name = "tensorboard"
    metric_style = "split"

    def __init__(self, log_root: str | os.PathLike[str], *, flush_secs: float = 5.0) -> None:
        self._tb = _import_tensorboard()
        self.log_root = Path(log_root)
        self._flush_secs = flush_secs
        self._lock = threading.Lock()
        self._writers: dict[int, Any] = {}
        self._deleted: set[int] = set()
        self._closed = False

    def run_dir(self, run_id: int) -> Path:
        """The folder holding ``run_id``'s event files."""
        return self.log_root / f"run-{int(run_id)}"

    def _writer(self, run_id: int) -> Any | None:
        """The run's open writer (caller holds the lock); None once the run is deleted."""
        if self._closed:
            raise RuntimeError("TensorBoardTracker is closed")
        if run_id in self._deleted:
            return None
        writer = self._writers.get(run_id)
        if writer is None:
            writer = self._tb.Writer(
                str(self.run_dir(run_id)), max_queue_size=100, flush_secs=self._flush_secs
            )
            self._writers[run_id] = writer
        return writer

    def log_scalars(
        self, run_id: int, step: int, scalars: Mapping[str, Any], wall_time: float | None = None
    ) -> None:
        """Write one scalar per item of ``scalars`` at ``step``, tagged with the given names.

        TRL's metric names are used as they are (``train/loss``, ``eval/loss``, ...). Values that are
        not numbers (strings, None, lists) are skipped; NaN and infinities are written as they are.
        Nothing is written for a run after :meth:`mark_deleted`.
        """
        tb = self._tb
        values = []
        for tag, value in scalars.items():
            if value is None or isinstance(value, (str, bytes, bool)):
                continue
            try:  # int, float, numpy scalars, 0-d tensors
                number = float(value)
            except (TypeError, ValueError, RuntimeError):
                continue
            values.append(tb.Summary.Value(tag=str(tag), simple_value=number))
        if not values:
            return
        event = tb.Event(
            wall_time=time.time() if wall_time is None else float(wall_time),
            step=int(step),
            summary=tb.Summary(value=values),
        )
        with self._lock:
            writer = self._writer(int(run_id))
            if writer is not None:
                writer.add_event(event)

    def log_hparams(self, run_id: int, hparams: Mapping[str, Any], step: int = 0) -> None:
        """Write the run's hyperparameters as a markdown table (TensorBoard's Text tab, tag ``hparams``); secret-like
        values (``hub_token``, ...) as ``<redacted>``."""
        self._log_text(
            run_id, HPARAMS_TAG, _hparams_markdown(redact(hparams)), "hyperparameters of this run", step
        )

    def log_name(self, run: TrackedRun) -> None:
        """Write a named run's name (and tags) as the text summary ``run_name`` (Text tab); nothing for a run without
        a name (its folder ``run-<id>`` says it all)."""
        if not run.run_name:
            return
        text = f"**run {run.run_id}**: {_format_value(run.run_name)}"
        if run.tags:
            text += "  \ntags: " + ", ".join(_format_value(t) for t in run.tags)
        self._log_text(run.run_id, NAME_TAG, text, "the run's name, a label next to its id")

    def _log_text(self, run_id: int, tag: str, text: str, description: str, step: int = 0) -> None:
        """One text summary (TensorBoard's Text tab) of run ``run_id`` under ``tag``."""
        tb = self._tb
        tensor = tb.TensorProto(dtype=tb.DT_STRING, string_val=[text.encode("utf-8")])
        tensor.tensor_shape.dim.add(size=1)
        value = tb.Summary.Value(tag=tag, metadata=tb.text_metadata_for(tag, description), tensor=tensor)
        event = tb.Event(wall_time=time.time(), step=int(step), summary=tb.Summary(value=[value]))
        with self._lock:
            writer = self._writer(int(run_id))
            if writer is not None:
                writer.add_event(event)

    def start_run(self, run: TrackedRun, status: str) -> None:
        """Write the run's hyperparameters (:meth:`log_hparams`) and its name (:meth:`log_name`), unless it was deleted
        (its folder was renamed)."""
        if status != "DELETED":
            self.log_hparams(run.run_id, run.params)
            self.log_name(run)

    def set_status(self, run_id: int, status: str, error: str | None = None, at: float | None = None) -> None:
        """TensorBoard has no run status: nothing to write (a deleted run is :meth:`mark_deleted`)."""
        return None

    def continue_from(self, run_id: int, step: int) -> None:
        """Mark that ``run_id`` continues from ``step`` (a restart from its chunk checkpoint at ``step``).

        Writes a ``SessionLog(START)`` event at ``step + 1``; TensorBoard then drops this run's earlier events with a
        step above ``step`` — what a process that died after that checkpoint had logged — so each step is shown
        once. Source: TensorBoard's event accumulator, ``_CheckForRestartAndMaybePurge`` (``purge_orphaned_data``,
        on by default; event files of version 2, which this writer produces).
        """
        tb = self._tb
        event = tb.Event(
            wall_time=time.time(), step=int(step) + 1, session_log=tb.SessionLog(status=tb.SessionLog.START)
        )
        with self._lock:
            writer = self._writer(int(run_id))
            if writer is not None:
                writer.add_event(event)

    def restore_points(
        self, run_id: int, step: int, points: Sequence[tuple[int, Mapping[str, Any], float | None]]
    ) -> None:
        """Write again every point a restarted run holds in the store up to its checkpoint at ``step``.

        A process killed after a checkpoint was written may not have flushed the points before it (the event
        writer flushes every ``flush_secs`` seconds, 5 by default); the restart continues after the checkpoint and
        would never log them again. So a ``SessionLog(START)`` at step 0 hides everything earlier event files hold
        for this run (TensorBoard's restart purge, see :meth:`continue_from`; it drops scalars, not the
        hyperparameters' text), then ``points`` are written from the store: each step once, with the values and
        wall times recorded.

        Args:
            run_id: the run (its folder ``run-<id>``).
            step: the checkpoint's optimizer step; points above it are skipped.
            points: ``(step, {tag: value}, wall_time)`` per log call, in the order logged (the store's, with
                TensorBoard's tags).
        """
        tb = self._tb
        start = tb.Event(wall_time=time.time(), step=0, session_log=tb.SessionLog(status=tb.SessionLog.START))
        with self._lock:
            writer = self._writer(int(run_id))
            if writer is None:
                return
            writer.add_event(start)
        for at, scalars, wall_time in points:
            if at <= step:
                self.log_scalars(run_id, at, scalars, wall_time)

    def describe(self) -> str | None:
        """No line at start: ``%rapidfire tensorboard`` (or ``tensorboard --logdir <log_root>``) shows it."""
        return None

    def end_batch(self) -> None:
        """Nothing to do: the writer's own thread batches the events."""
        return None

    def flush(self) -> None:
        """Write everything buffered to disk."""
        with self._lock:
            for writer in self._writers.values():
                writer.flush()

    def close(self) -> None:
        """Flush and close every run's writer. Idempotent; the tracker cannot be used afterwards."""
        with self._lock:
            self._closed = True
            writers, self._writers = list(self._writers.values()), {}
            for writer in writers:
                writer.close()

    def mark_deleted(self, run_id: int) -> Path | None:
        """Close ``run_id``'s writer and rename its folder to ``deleted-run-<run_id>``.

        Later calls for this run write nothing. Returns the new folder, or None if the run never
        wrote anything.
        """
        run_id = int(run_id)
        with self._lock:
            self._deleted.add(run_id)
            writer = self._writers.pop(run_id, None)
            if writer is not None:
                writer.close()
            source = self.run_dir(run_id)
            if not source.is_dir():
                return None
            target = self.log_root / f"deleted-run-{run_id}"
            n = 1
            while target.exists():
                n += 1
                target = self.log_root / f"deleted-run-{run_id}-{n}"
            os.replace(source, target)
            return target

    def __enter__(self) -> TensorBoardTracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NullTracker(BackendTracker):
    """Stands in for a tracker when tracking is off: every method of :class:`~.base.Tracker` and of
    :class:`~.base.Trackers` (what the recorder calls) does nothing (:class:`~.base.BackendTracker`'s defaults)."""

    name = "none"

    def open(self) -> None:
        return None  # nothing to make (a TrackerSet makes its backends here)

    def log_metrics(
        self, run_id: int, step: int, metrics: Mapping[str, float], wall_time: float | None = None
    ) -> None:
        return None  # what the recorder calls on its one tracker (a TrackerSet maps the names per backend)

    def __enter__(self) -> NullTracker:
        return self

    def __exit__(self, *exc: object) -> None:
        return None
