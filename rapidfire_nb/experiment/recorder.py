"""The recorder: the one place run events and metrics leave the scheduler and the training threads.

It writes the store (the source of truth), feeds the tracker (TensorBoard), prints one compact line per finished
chunk through a :class:`~rapidfire_nb.experiment.reporter.Reporter` (only failures while a live panel shows the
progress), keeps the training clock (:mod:`rapidfire_nb.clock`, written to meta ``clock`` when training starts
or stops), and polls the ops inbox for the scheduler.

Threads: ``on_run``/``poll_ops``/``on_heartbeat`` come from the scheduler thread; ``on_op`` from the scheduler
thread, or from the thread that submitted an op (its "queued" answer); ``on_metrics`` from the run's training
thread; ``record_clone``/``record_editable`` from the thread that submitted a clone. The recorder's own state
(metric names, live steps, reported chunks, hparam columns) is guarded by its lock; the store guards itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kernel_scheduler import Op, OpAck, RunSnapshot, RunStatus, SchedulerListener

from ..clock import CLOCK_META_KEY, TrainingClock
from ..view import chunk_line
from ..wire import json_type_name
from .clones import CloneRequest, record_clone
from .reporter import Reporter

__all__ = ["NOT_EDITABLE", "Recorder"]

#: hyperparameter columns that the panel, the magic and the server cannot change (functions: API only).
NOT_EDITABLE = ("formatting_func", "compute_metrics", "reward_funcs", "model_type")

HEARTBEAT_EVERY_S = 2.0


class Recorder(SchedulerListener):
    """Records one ``run_fit`` session's events.

    Args:
        store: the experiment's :class:`~rapidfire_nb.store.Store`.
        reporter: where the chunk lines and op outcomes are printed.
        tracker: the TensorBoard tracker (or a null one).
        num_chunks: chunks per epoch (for "chunk k/K of epoch e").
        columns: the hyperparameter columns shown (those that differ between the group's runs).
        checkpoint_dir: ``checkpoint_dir(run_id) -> Path | None``, the run's latest written checkpoint.
        inbox: ``inbox() -> ops``, the ops posted through the server since the last call.
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
        self.num_chunks = num_chunks
        self._checkpoint_dir = checkpoint_dir
        self._inbox = inbox
        self._lock = threading.Lock()
        self._columns = list(columns)
        self._last_beat = 0.0
        self._known_metrics: set[str] | None = (
            None  # metric names in the store's meta (this process writes them)
        )
        self._live_step: dict[
            int, int
        ] = {}  # latest logged step per run (the run on the device moves in a chunk)
        self._seen_segments: dict[int, int] = {}  # chunks already reported per run (a restart starts there)
        self._reported_end: set[int] = set()  # runs whose COMPLETED/FAILED line was printed (or predates us)
        beat = store.heartbeat()
        self._clock = TrainingClock(store.get_meta(CLOCK_META_KEY), beat["beat_at"] if beat else None)
        self._loop_thread: int | None = None  # the scheduler thread (its on_heartbeat tells)

    # ------------------------------------------------------------------ read by the facade and the panel
    @property
    def columns(self) -> list[str]:
        """The hyperparameter columns: the group's differing ones, then the fields clones changed."""
        with self._lock:
            return list(self._columns)

    def live_step(self, run_id: int) -> int:
        """The latest step run ``run_id`` logged (0 before its first log)."""
        return self._live_step.get(run_id, 0)

    # ------------------------------------------------------------------ scheduler events
    def on_run(self, snap: RunSnapshot) -> None:
        ckpt = self._checkpoint_dir(snap.run_id)
        self.store.upsert_run(
            snap.run_id,
            status=snap.status.value,
            total_steps=snap.total_steps,
            completed_steps=snap.step,
            chunks_done=snap.segments_done,
            num_segments=snap.num_segments,
            epoch=snap.epoch,
            samples_seen=snap.samples_seen,
            error=snap.error,
            last_checkpoint=str(ckpt) if ckpt else None,
        )
        if snap.status is RunStatus.DELETED:
            self.tracker.mark_deleted(snap.run_id)  # TensorBoard no longer lists it under its id
        if self._clock.observe(snap.run_id, snap.status, time.time()):  # scheduler thread only
            self.store.set_meta(CLOCK_META_KEY, self._clock.to_meta())
        if self._should_report(snap) and (snap.status is RunStatus.FAILED or self.reporter.wants_progress()):
            self.reporter.say(self.chunk_line(snap))  # under a live panel: failures only (it shows the rest)

    def _should_report(self, snap: RunSnapshot) -> bool:
        with self._lock:
            if snap.run_id not in self._seen_segments and snap.status is RunStatus.NEW:
                self._seen_segments[snap.run_id] = (
                    snap.segments_done
                )  # a warm clone starts at its parent's chunk
            prev = self._seen_segments.get(snap.run_id, 0)
            ended = (
                snap.status in (RunStatus.COMPLETED, RunStatus.FAILED)
                and snap.run_id not in self._reported_end
            )
            if snap.segments_done <= prev and not ended:
                return False
            self._seen_segments[snap.run_id] = max(prev, snap.segments_done)
            if ended:
                self._reported_end.add(snap.run_id)
            return True

    def known(self, run_id: int, segments_done: int, finished: bool) -> None:
        """A run restored from the store: its chunks so far (and its end) were reported by an earlier process."""
        with self._lock:
            self._seen_segments[run_id] = segments_done
            if finished:
                self._reported_end.add(run_id)

    def on_op(self, op: Op, ack: OpAck) -> None:
        payload = {k: v for k, v in op.payload.items() if k != "spec"}
        if not self.store.add_op(
            op.op_id,
            op.kind.value,
            op.run_id,
            payload,
            source=op.source,
            state=ack.state,
            message=ack.message,
            requested_at=op.requested_at,
        ):
            self.store.update_op(
                op.op_id, ack.state, ack.message, applied_at=time.time() if ack.state != "queued" else None
            )
        # the outcome decided later by the scheduler thread (the submitter already got the immediate answer:
        # its ack), for ops whose outcome nothing else shows (no live panel with its ops log; not the API's)
        later = self._loop_thread is not None and threading.get_ident() == self._loop_thread
        if ack.state != "queued" and op.source != "api" and later and self.reporter.wants_progress():
            self.reporter.say(f"op {op.kind.value} run {op.run_id}: {ack.state} — {ack.message}")

    def poll_ops(self) -> Sequence[Op]:
        return self._inbox()

    def on_heartbeat(self) -> None:
        self._loop_thread = threading.get_ident()
        now = time.monotonic()
        if now - self._last_beat > HEARTBEAT_EVERY_S:
            self._last_beat = now
            self.store.beat()

    # ------------------------------------------------------------------ clones
    def record_clone(self, child_id: int, parent_id: int, request: CloneRequest) -> None:
        """Store a clone accepted by the scheduler and show the fields it changed as columns."""
        record_clone(self.store, child_id, parent_id, request)
        with self._lock:
            for k, v in request.changes.items():
                if k not in self._columns and not callable(v):
                    self._columns.append(k)
            columns = list(self._columns)
        self.store.set_meta("hparam_columns", columns)  # the page and a restarted kernel show them

    def record_editable(self, specs: Mapping[int, Any]) -> None:
        """Record, per run, the hyperparameters the panel/server may change in a clone (name -> JSON type)."""
        fields = {
            str(rid): {k: json_type_name(v) for k, v in spec.hparams().items() if k not in NOT_EDITABLE}
            for rid, spec in specs.items()
        }
        self.store.set_meta("editable_fields", fields)

    # ------------------------------------------------------------------ metrics (training thread)
    def on_metrics(self, run_id: int, step: int, samples_seen: int, logs: Mapping[str, Any]) -> None:
        """One TRL log call of run ``run_id`` at ``step`` (``samples_seen`` rows): store rows, TensorBoard scalars."""
        now = time.time()
        self._live_step[run_id] = step  # each run's entry is written by its own training thread only
        numbers = {
            k: float(v) for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        if not numbers:
            return
        self.store.add_metrics(
            [
                {
                    "run_id": run_id,
                    "step": step,
                    "samples_seen": samples_seen,
                    "name": k,
                    "value": v,
                    "wall_time": now,
                }
                for k, v in numbers.items()
            ]
        )
        self._note_metric_names(numbers)
        self.tracker.log_scalars(
            run_id,
            step,
            {
                (k.replace("eval_", "eval/", 1) if k.startswith("eval_") else f"train/{k}"): logs[k]
                for k in numbers
            },
        )

    def _note_metric_names(self, numbers: Mapping[str, float]) -> None:
        with self._lock:
            if self._known_metrics is None:  # read once; afterwards only new names touch the store's meta
                self._known_metrics = set(self.store.get_meta("metric_names", None) or [])
            new = set(numbers) - self._known_metrics
            if not new:
                return
            self._known_metrics |= new
            names = sorted(self._known_metrics)
        self.store.set_meta("metric_names", names)

    # ------------------------------------------------------------------ messages
    def chunk_line(self, snap: RunSnapshot) -> str:
        """``run 2 · chunk 3/4 of epoch 1 done · step 12/16 · loss 1.234 · eval_loss 1.5`` (or completed/FAILED)."""
        latest = self.store.latest_metrics(["loss", "eval_loss"]).get(snap.run_id, {})
        return chunk_line(snap, latest, self.num_chunks)
