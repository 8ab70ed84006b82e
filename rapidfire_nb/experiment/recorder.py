"""The recorder: the one place run events and metrics leave the scheduler and the training threads.

It writes the store (the source of truth), feeds the trackers (a :class:`~rapidfire_nb.tracking.fanout.TrackerSet`:
TensorBoard, MLflow, Trackio, W&B: metrics, each run's start and every status change), prints one compact line per
finished chunk through a :class:`~rapidfire_nb.experiment.reporter.Reporter` (only failures while a live panel
shows the progress), keeps the training clock (:mod:`rapidfire_nb.view.clock`, written to meta ``clock`` when training
starts or stops), and polls the ops inbox for the scheduler.

Nothing is written on the thread that reports an event: ``on_metrics`` (a run's training thread, every TRL log
call), ``on_run`` and ``on_op`` (the scheduler thread; ``on_op`` also from the thread that submitted an op) and
``record_clone``/``record_editable``/``on_final`` only put an item on a bounded in-memory queue: a small frozen
dataclass per kind of event (:mod:`~rapidfire_nb.experiment.record_items`). One recorder thread
(``rapidfire-recorder``) takes the items in order and writes them in batches, each by the method its type maps to
in the dispatch table; the metric rows of consecutive log calls go to the store in one transaction. The store
writes are plain functions (:mod:`~rapidfire_nb.experiment.record_writes`). The panel and the server read what is
written, at most a fraction of a second behind.

Tracker calls are handed on to a second thread, ``rapidfire-trackers``, in order, once the store write before
them is done (:class:`~rapidfire_nb.experiment.record_trackers.TrackerFeed`): a slow or hanging backend never holds
back the store. :meth:`Recorder.flush` waits for the store writes of everything reported before it, and with
``trackers=True`` (``wait()`` once training is done, ``end()``) for the trackers too.

Thread ownership: the recorder thread owns every store write made during training, the chunk lines, the metric
names, the training clock, each run's last status told to the trackers and the reported-chunk bookkeeping; the
trackers' thread owns the trackers (opened there too) and hands items back to the recorder's queue (an ended
run's points are all written: meta ``tracked_runs``); ``poll_ops`` (the ops inbox, read by the scheduler thread
about once a second) is the one store access outside it. Each run's live step (the step it last logged) is written
by that run's training thread only. The hyperparameter columns are a tuple replaced by the recorder thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kernel_scheduler import (
    DEFAULT_DEVICE,
    EARLY_STOPPING,
    Op,
    OpAck,
    OpKind,
    RunSnapshot,
    RunStatus,
    SchedulerListener,
)

from .. import meta_keys
from .._priority import lower_thread_priority
from ..errors import StorageError, storage_error
from ..view import DEVICES_META_KEY, chunk_line
from ..view.clock import TrainingClock
from . import record_writes as writes
from .clones import CloneRequest, record_clone
from .record_items import (
    AddedItem,
    BeatItem,
    CloneItem,
    EarlyStoppingItem,
    EditableItem,
    FinalItem,
    FlushItem,
    InOrderItem,
    MetricsItem,
    NoteItem,
    OpItem,
    RecordItem,
    RewoundItem,
    RunItem,
    StopItem,
    TrackedItem,
    TrackRunsItem,
)
from .record_trackers import TrackerFeed
from .record_writes import ADDED_RUNS_META_KEY, NOT_EDITABLE, TRACKED_RUNS_META_KEY
from .reporter import Reporter

__all__ = ["ADDED_RUNS_META_KEY", "DEVICES_META_KEY", "NOT_EDITABLE", "TRACKED_RUNS_META_KEY", "Recorder"]

log = logging.getLogger(__name__)

HEARTBEAT_EVERY_S = 2.0
"""Seconds between two heartbeats written to the store while the scheduler runs."""
INBOX_EVERY_S = 1.0
"""Seconds between two reads of the ops inbox (ops posted through the server)."""
QUEUE_ITEMS = 100_000
"""Bound of the recorder's queue (items); a producer blocks only if the disk falls this far behind."""
BATCH_ITEMS = 2_000
"""Items written per batch (one store transaction for the metric rows among them)."""
BATCH_DELAY_S = 0.2
"""Seconds the recorder waits after an item arrives before writing, so that one batch takes every item of that
time: it wakes a few times a second, not once per logged step (each wake-up takes the interpreter lock from the
training thread). ``flush()`` cuts the wait short."""

NOT_DISPATCHED = (MetricsItem, FlushItem, StopItem)
"""Item types the dispatch table leaves out: metric items are batched (consecutive ones: one transaction), a flush
marker is released even after a failed write, and a stop item ends the recorder thread."""


class Recorder(SchedulerListener):
    """Records one ``run_fit`` session's events, on its own thread.

    Args:
        store: the experiment's :class:`~rapidfire_nb.store.Store`.
        reporter: where the chunk lines and op outcomes are printed.
        tracker: the trackers (a :class:`~rapidfire_nb.tracking.fanout.TrackerSet`, or a null tracker).
        num_chunks: chunks per epoch (for "chunk k/K of epoch e").
        columns: the hyperparameter columns shown (those that differ between the group's runs).
        checkpoint_dir: ``checkpoint_dir(run_id) -> Path | None``, the run's latest written checkpoint.
        inbox: ``inbox() -> ops``, the ops posted through the server since the last call.

    Call :meth:`start` once (with the hook that ties the thread's output to the notebook cell) and
    :meth:`close` at the end; events reported before :meth:`start` are written once it starts.
    """

    def __init__(
        self,
        store: Any,
        reporter: Reporter,
        tracker: Any,
        num_chunks: int,
        columns: Sequence[str],
        checkpoint_dir: Callable[[int], Path | None],
        inbox: Callable[[], Sequence[Op]],
    ) -> None:
        self.store = store
        self.reporter = reporter
        self.tracker = tracker
        self._feed = TrackerFeed(tracker, self._hand_back)  # tracker calls: on their thread, after the write
        self.num_chunks = num_chunks
        self._checkpoint_dir = checkpoint_dir
        self._inbox = inbox
        self._columns: tuple[str, ...] = tuple(columns)
        self._queue: queue.Queue[RecordItem] = queue.Queue(maxsize=QUEUE_ITEMS)
        self._thread = threading.Thread(target=self._main, name="rapidfire-recorder", daemon=True)
        self._on_thread_start: Callable[[], None] | None = None
        self._closed = threading.Event()
        self._hurry = threading.Event()  # set by flush()/close(): write what is queued now
        self._last_beat = 0.0  # scheduler thread
        self._scheduler_thread: threading.Thread | None = None  # set by its first on_heartbeat
        self._beat_written = 0.0  # recorder thread: monotonic time of the latest heartbeat written
        self._last_inbox = 0.0  # scheduler thread
        self._metric_names = writes.MetricNames()  # recorder thread
        # the latest logged step per run; each key written by its run's training thread
        self._live_step: dict[int, int] = {}
        self._reports = writes.ChunkReports()  # recorder thread: the chunks reported per run
        self._devices: dict[str, str] = dict(store.get_meta(meta_keys.DEVICES, {}) or {})  # recorder thread
        # (run id, spec, parent id, warm start) -> TrackedRun, for a clone's tracker run
        self.tracked_run: Callable[[int, Any, int | None, bool], Any] | None = None
        self.write_seconds = 0.0  # recorder thread: time spent writing (benchmark)
        self.failed: StorageError | None = None  # recorder thread: the disk failure that stopped the writes
        # called once, on the recorder thread, when a write fails for the disk
        self.on_storage_error: Callable[[StorageError], None] | None = None
        self._errors_seen: set[str] = set()
        beat = store.heartbeat()
        self._clock = TrainingClock(store.get_meta(meta_keys.CLOCK), beat["beat_at"] if beat else None)
        self._loop_thread: int | None = None  # the scheduler thread (its on_heartbeat tells)
        self._writers: dict[type, Callable[[Any], None]] = self._dispatch_table()

    def _dispatch_table(self) -> dict[type, Callable[[Any], None]]:
        """Item type -> what writes it on the recorder thread (every type but :data:`NOT_DISPATCHED`)."""
        return {
            RunItem: self._write_run,
            OpItem: self._write_op,
            CloneItem: self._write_clone,
            AddedItem: self._write_added,
            RewoundItem: self._write_rewound,
            BeatItem: self._write_beat,
            FinalItem: lambda item: self.store.upsert_run(item.run_id, checkpoint_dir=item.folder),
            NoteItem: lambda item: self.reporter.say(item.text),
            EarlyStoppingItem: lambda item: self.store.set_meta(meta_keys.EARLY_STOPPING, item.progress),
            EditableItem: lambda item: self.store.set_meta(meta_keys.EDITABLE_FIELDS, item.fields),
            InOrderItem: lambda item: item.fn(),
            TrackedItem: lambda item: writes.confirm_tracked(self.store, item.run_id),
            TrackRunsItem: lambda item: self._feed.open_runs(self.store, item.runs, item.continued),
        }

    # ------------------------------------------------------------------ lifecycle
    def start(self, on_thread_start: Callable[[], None] | None = None) -> None:
        """Start the recorder thread (``on_thread_start`` runs on it first, e.g. ipykernel's thread parent)."""
        self._on_thread_start = on_thread_start
        self._feed.start(on_thread_start)
        self._thread.start()

    def flush(self, timeout: float | None = None, trackers: bool = True) -> bool:
        """Wait until every event reported before this call is written to the store (events reported while it
        waits are not waited for: training goes on meanwhile); with ``trackers``, the trackers' buffered points of
        those events too (they write once per window otherwise, :data:`~rapidfire_nb.tracking.fanout.WRITE_EVERY_S`).

        Args:
            timeout: seconds; ``None`` waits as long as needed.
            trackers: also make every tracker write what it holds (MLflow/Trackio requests: tens of ms).

        Returns:
            True when it is written; False on timeout, when the recorder thread is not running, or after a failed
            write (the disk: nothing more is written).
        """
        if not self._thread.is_alive():
            return self._queue.unfinished_tasks == 0
        done = threading.Event()
        self._put(FlushItem(done, trackers))
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done.is_set():
            self._hurry.set()
            left = None if deadline is None else deadline - time.monotonic()
            if (left is not None and left <= 0) or not self._thread.is_alive() or self.failed is not None:
                return False
            done.wait(0.1 if left is None else min(0.1, left))
        return self.failed is None

    def close(self) -> None:
        """Write everything queued, then stop the recorder thread and the trackers' thread (joined)."""
        if self._thread.is_alive():
            self.flush()
            self._closed.set()
            self._queue.put(StopItem())
            self._hurry.set()
            self._thread.join()
        elif self._thread.ident is None and self._queue.unfinished_tasks:  # never started: write inline
            self._closed.set()
            self._write_batch(self._drain())
        self._feed.close()  # every tracker call handed over has run (the trackers are closed after this)

    # ------------------------------------------------------------------ read by the facade and the panel
    @property
    def columns(self) -> list[str]:
        """The hyperparameter columns: the group's differing ones, then the fields clones changed."""
        return list(self._columns)

    def live_step(self, run_id: int) -> int:
        """The latest step run ``run_id`` logged (0 before its first log)."""
        return self._live_step.get(run_id, 0)

    # ------------------------------------------------------------------ events (any thread: enqueue only)
    def on_run(self, snap: RunSnapshot) -> None:
        self._put(RunItem(snap, time.time()))

    def on_op(self, op: Op, ack: OpAck) -> None:
        # an outcome the scheduler thread decides later (the submitter already got the immediate answer, its ack)
        later = self._loop_thread is not None and threading.get_ident() == self._loop_thread
        self._put(OpItem(op, ack, later))

    def on_added(self, snap: RunSnapshot, info: Mapping[str, Any]) -> None:
        """A run the early-stopping policy added (a search's new trial): stored like a clone, ``source`` from
        ``info`` (e.g. ``trial``)."""
        self._put(AddedItem(snap, dict(info)))

    def on_note(self, text: str) -> None:
        """A sentence from the scheduler (early stopping, a worker that died, a run moved): printed in the cell."""
        self._put(NoteItem(text))

    def on_rewound(self, snap: RunSnapshot, step: int) -> None:
        """Run ``snap.run_id`` continues from its checkpoint at ``step`` (its worker died): the metric rows it
        logged after ``step`` are dropped from the store, and the trackers continue from ``step``."""
        self._put(RewoundItem(snap.run_id, step))

    def on_early_stopping(self, progress: Mapping[str, Any]) -> None:
        """The early-stopping policy's progress changed: stored as meta ``early_stopping`` (the server page and a
        kernel without the scheduler build the header's line from it, :func:`rapidfire_nb.view.early_stopping_text`)."""
        self._put(EarlyStoppingItem(dict(progress)))

    def on_metrics(self, run_id: int, step: int, samples_seen: int, logs: Mapping[str, Any]) -> None:
        """One TRL log call of run ``run_id`` at ``step`` (``samples_seen`` rows), from its training thread."""
        self._live_step[run_id] = step
        self._put(MetricsItem(run_id, step, samples_seen, dict(logs), time.time()))

    def on_final(self, run_id: int, folder: Path) -> None:
        """Run ``run_id``'s final weights were saved in ``folder``."""
        self._put(FinalItem(run_id, str(folder)))

    def in_order(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the recorder thread once everything reported before it is written (a boundary
        checkpoint is handed to its writer this way: never ahead of the store); not at all once a write failed."""
        self._put(InOrderItem(fn))

    def record_clone(self, child_id: int, parent_id: int, request: CloneRequest) -> None:
        """Store a clone accepted by the scheduler and show the fields it changed as columns."""
        self._put(CloneItem(child_id, parent_id, request))

    def record_editable(self, specs: Mapping[int, Any]) -> None:
        """Record, per run, the hyperparameters the panel/server may change in a clone (name -> JSON type)."""
        self._put(EditableItem(writes.editable_fields(specs)))

    def track_runs(self, runs: Sequence[tuple[Any, RunStatus]], continued: Mapping[int, int]) -> None:
        """Open the trackers and start tracking ``runs`` (``(TrackedRun, status)``), on the recorder thread.

        Args:
            runs: every run of the session with its status as registered.
            continued: run id -> the step it continues from (its earlier points above it are not shown twice).
        """
        self._put(TrackRunsItem(list(runs), dict(continued)))

    def known(self, run_id: int, segments_done: int, finished: bool) -> None:
        """A run restored from the store: its chunks so far (and its end) were reported by an earlier process.

        Called on the caller's thread while the session is built, before :meth:`start`.
        """
        self._reports.known(run_id, segments_done, finished)

    # ------------------------------------------------------------------ scheduler thread
    def poll_ops(self) -> Sequence[Op]:
        now = time.monotonic()
        if now - self._last_inbox < INBOX_EVERY_S:
            return ()
        self._last_inbox = now
        return self._inbox()

    def on_heartbeat(self) -> None:
        """Every turn of the scheduler loop: a heartbeat is due every ``HEARTBEAT_EVERY_S`` (the recorder thread
        also beats on its own while the scheduler thread lives: :meth:`_beat_if_due`)."""
        if self._scheduler_thread is None:
            self._scheduler_thread = threading.current_thread()
        self._loop_thread = threading.get_ident()
        now = time.monotonic()
        if now - self._last_beat > HEARTBEAT_EVERY_S:
            self._last_beat = now
            self._put(BeatItem())

    # ------------------------------------------------------------------ the recorder thread
    def _put(self, item: RecordItem) -> None:
        if self._closed.is_set() and not isinstance(item, StopItem):
            log.debug("rapidfire recorder: %s after close, dropped", type(item).__name__)
            return
        self._queue.put(item)

    def _drain(self, first: RecordItem | None = None) -> list[RecordItem]:
        items = [first] if first is not None else []
        while len(items) < BATCH_ITEMS:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return items

    def _main(self) -> None:
        lower_thread_priority()  # the store and TensorBoard wait; training does not
        if self._on_thread_start is not None:
            self._on_thread_start()
        while True:
            try:
                first = self._queue.get(timeout=HEARTBEAT_EVERY_S)
            except queue.Empty:
                self._beat_if_due()
                continue
            self._hurry.wait(BATCH_DELAY_S)  # let a batch gather (flush/close cut this short)
            self._hurry.clear()
            items = self._drain(first)
            stop = any(isinstance(item, StopItem) for item in items)
            self._write_batch([item for item in items if not isinstance(item, StopItem)])
            for _ in items:
                self._queue.task_done()
            if stop:
                return
            self._beat_if_due()

    def _beat_if_due(self) -> None:
        """Liveness that does not depend on what the scheduler thread does: while that thread lives (building a
        clone's trainer may hold it for minutes), the recorder thread writes the heartbeat itself once
        ``HEARTBEAT_EVERY_S`` passed without one, so the server never calls a live kernel dead."""
        loop = self._scheduler_thread
        if loop is None or not loop.is_alive() or self.failed is not None or self._closed.is_set():
            return
        if time.monotonic() - self._beat_written >= HEARTBEAT_EVERY_S:
            self._write_batch([BeatItem()])

    def _write_batch(self, items: list[RecordItem]) -> None:
        """Write ``items`` in order, each by its writer in the dispatch table; consecutive metric items become
        one store transaction."""
        t0 = time.perf_counter()
        metrics: list[MetricsItem] = []
        for item in items:
            if isinstance(item, MetricsItem):
                metrics.append(item)
                continue
            if metrics:
                self._guard(self._write_metrics, metrics)
                metrics = []
            if isinstance(item, FlushItem):
                self._release(item)  # not skipped after a failed write: its caller goes on (and sees it)
            else:
                self._guard(self._writers[type(item)], item)
        if metrics:
            self._guard(self._write_metrics, metrics)
        self._feed.end_batch()  # buffered tracker points: written once per window (the TrackerSet decides)
        self.write_seconds += time.perf_counter() - t0

    def _release(self, item: FlushItem) -> None:
        """Everything before ``item`` is written: its caller goes on (with ``trackers``, once they wrote it all)."""
        if item.trackers:
            self._feed.release(item.done)  # the trackers' thread sets it once they wrote it all
        else:
            item.done.set()

    def _guard(self, fn: Callable[..., None], *args: Any) -> None:
        if self.failed is not None:
            return  # the disk failed: nothing more is written (a resume drops what came after its checkpoint)
        try:
            fn(*args)
        except Exception as exc:  # the recorder must outlive a bad write; the store keeps what it has
            failure = storage_error(exc, getattr(exc, "filename", None) or str(self.store.path))
            if failure is not None:
                self.failed = failure
                if self.on_storage_error is not None:
                    self.on_storage_error(failure)
                return
            key = f"{type(exc).__name__}: {exc}"
            if key not in self._errors_seen:  # each distinct error once, not once per step
                self._errors_seen.add(key)
                log.exception("rapidfire recorder: a write failed")

    # ------------------------------------------------------------------ writers (the dispatch table's values)
    def _write_run(self, item: RunItem) -> None:
        snap, at = item.snap, item.at
        writes.check_store_file(self.store)
        writes.store_run(self.store, snap, self._checkpoint_dir(snap.run_id))
        if snap.device not in ("", DEFAULT_DEVICE) and self._devices.get(str(snap.run_id)) != snap.device:
            self._devices[str(snap.run_id)] = snap.device  # the server page and restarts read it
            self.store.set_meta(meta_keys.DEVICES, dict(self._devices))
        self._feed.status(snap, at)  # told once per change
        if self._clock.observe(snap.run_id, snap.status, at):  # training starts or stops (unix s)
            self.store.set_meta(meta_keys.CLOCK, self._clock.to_meta())
        if self._reports.due(snap) and (snap.status is RunStatus.FAILED or self.reporter.wants_progress()):
            self.reporter.say(self.chunk_line(snap))  # under a live panel: failures only (it shows the rest)

    def _write_op(self, item: OpItem) -> None:
        op, ack = item.op, item.ack
        writes.store_op(self.store, op, ack, time.time())
        if op.source == EARLY_STOPPING and op.kind is OpKind.STOP and ack.state == "applied":
            # like a failure, said under a live panel too: "run 8 pruned at chunk 1/8: eval_loss 2.71 not in ..."
            self.reporter.say(f"run {op.run_id} {op.payload.get('reason') or 'stopped by early stopping'}")
            return
        # said for ops whose outcome nothing else shows (no live panel with its ops log; not the API's)
        if ack.state != "queued" and op.source != "api" and item.later and self.reporter.wants_progress():
            self.reporter.say(f"op {op.kind.value} run {op.run_id}: {ack.state} — {ack.message}")

    def _write_rewound(self, item: RewoundItem) -> None:
        self.store.delete_metrics_after(item.run_id, item.step)
        self._feed.continue_from(item.run_id, item.step)

    def _write_beat(self, item: BeatItem) -> None:
        writes.check_store_file(self.store)
        self.store.beat()
        self._beat_written = time.monotonic()

    def _hand_back(self, item: RecordItem) -> None:
        """From the trackers' thread: an item for this thread (put even while closing: close waits for it)."""
        self._queue.put(item)

    def _write_added(self, item: AddedItem) -> None:
        snap, info = item.snap, item.info
        writes.store_added(self.store, snap, info)
        if self.tracked_run is not None:  # its tracker runs start now, as a clone's do when it is recorded
            self._feed.start_added(self.tracked_run(snap.run_id, snap.spec, None, False), snap.status)
        if "trial" in info:
            self.reporter.say(f"run {snap.run_id}: Optuna trial {info['trial']} joins the rotation")

    def _write_clone(self, item: CloneItem) -> None:
        child_id, request = item.child_id, item.request
        record_clone(self.store, child_id, item.parent_id, request)
        if self.tracked_run is not None:
            tracked = self.tracked_run(child_id, request.spec, item.parent_id, request.warm_start)
            self._feed.start_clone(tracked)
        added = [k for k, v in request.changes.items() if k not in self._columns and not callable(v)]
        if added:
            self._columns = (*self._columns, *added)
        # the page and a restarted kernel show them
        self.store.set_meta(meta_keys.HPARAM_COLUMNS, list(self._columns))

    def _write_metrics(self, items: list[MetricsItem]) -> None:
        rows: list[dict[str, Any]] = []
        for item in items:
            numbers = writes.metric_numbers(item.logs)
            rows += writes.metric_rows(item, numbers)
            if numbers:  # TRL's names: each tracker maps them to its own
                self._feed.log_metrics(item.run_id, item.step, numbers, item.wall_time)
        if not rows:
            return
        self.store.add_metrics(rows)
        self._metric_names.note(self.store, {r["name"] for r in rows})

    # ------------------------------------------------------------------ messages
    def chunk_line(self, snap: RunSnapshot) -> str:
        """``run 2 · chunk 3/4 of epoch 1 done · step 12/16 · loss 1.234 · eval_loss 1.5`` (or completed/FAILED)."""
        latest = self.store.latest_metrics(["loss", "eval_loss"]).get(snap.run_id, {})
        return chunk_line(snap, latest, self.num_chunks)
