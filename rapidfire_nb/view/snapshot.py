"""The one view of an experiment: the panel/page snapshot, each run's legal ops, and the text formats.

The kernel (``Experiment.panel_snapshot``), the server extension (``ExperimentsManager.snapshot``) and the
fake panel source (:mod:`rapidfire_nb.testing.fake_source`) build their snapshot here, from the same inputs:

* :class:`StoreRows` — what the experiment's store holds (meta, run rows, latest loss/eval_loss, ops log);
* :class:`KernelState` — in the kernel only: the scheduler's frozen :class:`~kernel_scheduler.RunSnapshot` s,
  the run on each device, each device's state and the live steps (the store records none of them).

The snapshot's shape is the "Panel source" contract of ``docs/ARCHITECTURE.md``. Each run's legal ops, op hints
and editable fields come from :mod:`rapidfire_nb.view.ops_view` (the rules the scheduler applies), its device and
the header's devices from :mod:`rapidfire_nb.view.devices_view` (all re-exported here). Numbers and progress lines
are formatted once, in :mod:`rapidfire_nb.view.text` (re-exported here); training time and tqdm-like numbers come
from :mod:`rapidfire_nb.view.clock`.

Standard library + :mod:`kernel_scheduler` + :mod:`rapidfire_nb.meta_keys` only: no torch, no store import (a store
is read duck-typed by :meth:`StoreRows.read`), so the server extension may import it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

from kernel_scheduler import RunSnapshot, RunStatus

from .. import meta_keys
from .clock import is_training, progress_stats, training_seconds
from .devices_view import DEVICE_STATES, device_list, device_status, placed_as, run_device, stored_devices
from .meta_check import checked_meta
from .metrics_view import metric_choice, resolve_metrics, run_value
from .ops_view import (
    ELSEWHERE_HINT,
    ENDED_HINT,
    FIELD_TYPES,
    NO_KERNEL_HINT,
    editable_fields,
    editable_values,
    legal_ops,
    op_hints,
    op_kinds_js,
    parse_status,
    pending_ops,
    reported_status,
)
from .stops import StopInfo, stop_history
from .text import (
    best_run,
    chunk_line,
    chunk_position,
    chunks_note,
    early_stopping_text,
    final_summary,
    fmt_metric,
    fmt_num,
    format_chunk_line,
    position_text,
    run_labels,
)

__all__ = [
    "DEVICES_META_KEY",
    "DEVICE_STATES",
    "EARLY_STOPPING_META_KEY",
    "ELSEWHERE_HINT",
    "ENDED_HINT",
    "FIELD_TYPES",
    "KernelState",
    "OP_FIELDS",
    "NO_KERNEL_HINT",
    "StoreRows",
    "best_run",
    "chunk_line",
    "chunk_position",
    "device_list",
    "device_status",
    "early_stopping_text",
    "editable_fields",
    "editable_values",
    "final_summary",
    "fmt_metric",
    "fmt_num",
    "format_chunk_line",
    "kernel_snapshot",
    "legal_ops",
    "op_hints",
    "op_kinds_js",
    "pending_ops",
    "parse_status",
    "position_text",
    "progress_text",
    "reopened_snapshot",
    "reported_status",
    "run_device",
    "run_value",
    "stored_devices",
    "store_snapshot",
]

#: Meta keys of the early-stopping policy's progress and of run id -> device (:mod:`rapidfire_nb.meta_keys`).
EARLY_STOPPING_META_KEY = meta_keys.EARLY_STOPPING
DEVICES_META_KEY = meta_keys.DEVICES

#: Keys of one ops-log entry in a snapshot.
OP_FIELDS = ("op_id", "run_id", "kind", "state", "message", "requested_at", "applied_at")

#: Who trains the experiment, as :func:`progress_text` words it.
HERE, NOT_HERE, ALIVE, GONE, ENDED = "here", "not_here", "alive", "gone", "ended"

_LATEST = ("loss", "eval_loss")
_PROGRESS_KEYS = ("completed_steps", "total_steps", "chunks_done", "num_segments", "epoch", "samples_seen")


class _Store(Protocol):
    """The read methods of :class:`rapidfire_nb.store.Store` that :meth:`StoreRows.read` calls."""

    def meta(self) -> dict[str, Any]: ...

    def runs(self) -> list[dict[str, Any]]: ...

    def latest_metrics(self, names: Iterable[str]) -> dict[int, dict[str, float]]: ...

    def ops(self) -> list[dict[str, Any]]: ...


# ------------------------------------------------------------------------------------------------ inputs


@dataclass(frozen=True)
class StoreRows:
    """What an experiment's store says, read at one moment.

    Attributes:
        meta: the store's meta table (``created_at`` unix s, ``num_chunks``, ``hparam_columns``,
            ``metric_names``, ``editable_fields``, ...).
        runs: run rows (``store.runs()``), ordered by run id.
        latest: run id -> latest ``loss`` / ``eval_loss`` and the trainer kind's metrics
            (``store.latest_metrics``; :func:`rapidfire_nb.view.metrics_view.metric_choice`).
        ops: the ops log (``store.ops()``), oldest first.
    """

    meta: Mapping[str, Any]
    runs: Sequence[Mapping[str, Any]]
    latest: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    ops: Sequence[Mapping[str, Any]] = ()

    @cached_property
    def stops(self) -> Mapping[int, StopInfo]:
        """Run id -> why it stopped (:func:`rapidfire_nb.view.stops.stop_history` of :attr:`ops`)."""
        return stop_history(self.ops)

    @classmethod
    def read(cls, store: _Store) -> StoreRows:
        """Read the rows a snapshot needs from ``store`` (a :class:`rapidfire_nb.store.Store`), malformed meta
        values left out (:func:`rapidfire_nb.view.meta_check.checked_meta`)."""
        meta = checked_meta(store.meta())[0]
        names = tuple(
            dict.fromkeys((*_LATEST, *metric_choice(meta).names))
        )  # the kind's metrics too (rewards, accuracies...)
        return cls(meta=meta, runs=store.runs(), latest=store.latest_metrics(names), ops=store.ops())


@dataclass(frozen=True)
class KernelState:
    """What only the kernel that trains the experiment knows.

    Attributes:
        started_at: unix seconds of ``run_fit`` (None: not started in this kernel; the store's ``created_at``
            is shown then).
        num_chunks: chunks per epoch (0 before ``run_fit``).
        hparam_columns: the hyperparameters that differ between runs (shown as table columns).
        runs: the scheduler's frozen snapshots; None when nothing trains in this kernel (no scheduler).
        on_device: run id training right now (the first device's, with several), or None.
        devices: with several devices (``run_fit(devices=...)``; empty with one): device name -> ``"training"``,
            ``"idle"`` or ``"lost"`` (its worker died), in the scheduler's device order.
        device_runs: device -> id of the run training there right now (devices with no segment left out).
        live_steps: latest logged optimizer step per run (the run on the device moves within a chunk).
        accepting: False once the experiment was ended (no op would be applied: no legal op).
        early_stopping: the scheduler's early-stopping progress (``Scheduler.early_stopping_progress()``: None
            without a policy); used while ``runs`` is given, else the store's meta ``early_stopping`` is shown.
    """

    started_at: float | None
    num_chunks: int
    hparam_columns: Sequence[str]
    runs: Sequence[RunSnapshot] | None = None
    on_device: int | None = None
    devices: Mapping[str, str] = field(default_factory=dict)
    device_runs: Mapping[str, int] = field(default_factory=dict)
    live_steps: Mapping[int, int] = field(default_factory=dict)
    accepting: bool = True
    early_stopping: Mapping[str, Any] | None = None


# ------------------------------------------------------------------------------------------------ rules


# ------------------------------------------------------------------------------------------------ formatting


def progress_text(
    runs: Iterable[tuple[RunStatus | None, tuple[int, int] | None]], num_chunks: int, trainer: str
) -> str:
    """The header's progress line.

    Args:
        runs: per run its status and the ``(epoch, chunk)`` it trains next (None when not planned).
        num_chunks: chunks per epoch.
        trainer: who trains: ``"here"`` (the scheduler of this kernel), ``"not_here"`` (this kernel has no
            scheduler; statuses as stored), ``"alive"`` (the server: a live writer), ``"gone"`` (no writer),
            ``"ended"`` (its kernel ended it).

    Returns:
        ``"chunk c/K of epoch e"`` for the furthest-behind run in rotation while training, else a count of
        completed runs worded for ``trainer``.
    """
    items = list(runs)
    if trainer in (HERE, ALIVE):
        active = [pos for st, pos in items if st is not None and st.in_rotation() and pos is not None]
        if active:
            epoch, chunk = min(active)
            return position_text(epoch, chunk, num_chunks)
    shown = [st for st, _ in items if st is not RunStatus.DELETED]
    done = sum(1 for st in shown if st is RunStatus.COMPLETED)
    text = f"{done}/{len(shown)} runs completed"
    if trainer == ENDED:
        return f"experiment ended — {text}; re-run Experiment(...) and run_fit(...) to continue it"
    if trainer == GONE:
        return f"no kernel is running this experiment — {text}"
    if trainer == NOT_HERE:
        waiting = sum(1 for st in shown if st in (RunStatus.INTERRUPTED, RunStatus.ONGOING))
        text = f"not training in this kernel — {text}"
        if waiting:
            text += f"; {waiting} interrupted (run_fit with the same arguments continues them)"
        else:
            text += "; to stop, resume or clone runs: run_fit(...) with the same arguments first"
        return text
    return f"idle — {text}"


# ------------------------------------------------------------------------------------------------ snapshots


def _progress_fields(
    row: Mapping[str, Any], snap: RunSnapshot | None, live_step: int | None
) -> dict[str, Any]:
    """Steps, chunks, epoch and samples of one run: the scheduler's when it has the run, else the store's."""
    if snap is None:
        return {k: row.get(k) for k in _PROGRESS_KEYS}
    return {
        "completed_steps": max(snap.step, live_step or 0) if snap.on_device else snap.step,
        "total_steps": snap.total_steps,
        "chunks_done": snap.segments_done,
        "num_segments": snap.num_segments,
        "epoch": snap.epoch if snap.steps_per_epoch else row.get("epoch"),
        "samples_seen": snap.samples_seen,
    }


def _run_entry(
    row: Mapping[str, Any],
    rows: StoreRows,
    columns: Sequence[str],
    status: str,
    snap: RunSnapshot | None = None,
    live_step: int | None = None,
    accepting: bool = True,
    closed_hint: str = NO_KERNEL_HINT,
    device: str | None = None,
) -> dict[str, Any]:
    run_id = row["run_id"]
    hp = row.get("hparams")
    hp = hp if isinstance(hp, Mapping) else {}
    latest = rows.latest.get(run_id, {})
    closed = None if accepting else closed_hint
    pending = pending_ops(rows.ops, run_id)
    return {
        "run_id": run_id,
        **run_labels(row.get("config")),  # run_name (None: shown by its id alone) and tags
        "status": status,
        "on_device": bool(snap is not None and snap.on_device),
        "device": device,
        **placed_as(rows.meta, run_id, row.get("config")),  # pack (None: alone), sharding (None: one device)
        "hparams": {c: hp.get(c) for c in columns} or dict(hp),
        "editable": editable_values(rows.meta.get(meta_keys.EDITABLE_FIELDS), run_id, hp),
        **_progress_fields(row, snap, live_step),
        "loss": latest.get("loss"),
        "eval_loss": latest.get("eval_loss"),
        "metrics": {n: latest[n] for n in metric_choice(rows.meta).names if n in latest},
        "error": snap.error if snap is not None else row.get("error"),
        **_stop_fields(rows.stops.get(run_id), snap, status),
        "parent_id": row.get("parent_id"),
        "warm_start": bool(row.get("warm_start")),
        "legal_ops": legal_ops(status, accepting=accepting, pending=pending),
        "op_hints": op_hints(status, closed=closed, pending=pending),
    }


def _stop_fields(stop: StopInfo | None, snap: RunSnapshot | None, status: str) -> dict[str, Any]:
    """``stop_reason`` (why a STOPPED run stopped, else None) and ``pruned`` (the early-stopping policy did it)."""
    if status != RunStatus.STOPPED.value:
        return {"stop_reason": None, "pruned": False}
    if snap is not None:
        return {"stop_reason": snap.stop_reason, "pruned": snap.pruned}
    return {"stop_reason": stop.reason if stop else None, "pruned": bool(stop and stop.pruned)}


def _common(
    name: str, rows: StoreRows, started_at: Any, num_chunks: int, columns: Sequence[str], now: float | None
) -> dict[str, Any]:
    return {
        "experiment": name,
        "started_at": started_at,
        "now": time.time() if now is None else now,
        "num_chunks": num_chunks,
        "hparam_columns": list(columns),
        "ops": [{k: o.get(k) for k in OP_FIELDS} for o in rows.ops],
        "metric_names": list(rows.meta.get(meta_keys.METRIC_NAMES) or []),
        **resolve_metrics(
            metric_choice(rows.meta),
            rows.latest,
            rows.meta.get(meta_keys.METRIC_NAMES) or (),
            settled=any(int(r.get("chunks_done") or 0) > 0 for r in rows.runs),
        ),
    }


def _timing(
    rows: StoreRows, out: Mapping[str, Any], alive: bool, last_beat: float | None = None
) -> dict[str, Any]:
    """Training time (``elapsed_s``, frozen while nothing trains), ``training`` and the tqdm-like ``stats``."""
    clock = rows.meta.get(meta_keys.CLOCK)
    elapsed = training_seconds(clock, float(out["now"]), writer_alive=alive, last_beat=last_beat)
    training = is_training(clock, alive)
    return {
        "elapsed_s": elapsed,
        "training": training,
        "stats": progress_stats(out["runs"], elapsed, training),
    }


def kernel_snapshot(
    name: str, rows: StoreRows, kernel: KernelState, now: float | None = None
) -> dict[str, Any]:
    """The snapshot the kernel's panel shows: the store's runs, overlaid with the scheduler's live state.

    Args:
        name: the experiment's name.
        rows: the store's rows.
        kernel: what the kernel knows (its scheduler's snapshots, the run on each device, live steps).
        now: unix seconds stamped as ``now`` (default: the clock).

    Returns:
        The JSON-able snapshot of ``docs/ARCHITECTURE.md`` "Panel source" (runs also carry ``editable``).
    """
    live = {s.run_id: s for s in kernel.runs} if kernel.runs is not None else {}
    stored = stored_devices(rows.meta)
    runs = []
    for row in rows.runs:
        snap = live.get(row["run_id"])
        status = snap.status.value if snap is not None else str(row.get("status"))
        if snap is not None and snap.pruned and row.get("status") != status:
            # pruned: shown once the store has the eval point it was decided on (written just before it)
            status = str(row.get("status"))
        live_step = kernel.live_steps.get(row["run_id"])
        device = run_device(snap, stored, row["run_id"])
        entry = _run_entry(
            row, rows, kernel.hparam_columns, status, snap, live_step, kernel.accepting, ENDED_HINT, device
        )
        runs.append({**entry, "chunks_note": chunks_note(entry, kernel.num_chunks)})
    if kernel.runs is None:
        progress = progress_text(
            ((parse_status(r.get("status")), None) for r in rows.runs), kernel.num_chunks, NOT_HERE
        )
    else:
        progress = progress_text(
            ((s.status, s.position if s.num_segments else None) for s in kernel.runs), kernel.num_chunks, HERE
        )
    started = kernel.started_at or rows.meta.get(meta_keys.CREATED_AT)
    out = _common(name, rows, started, kernel.num_chunks, kernel.hparam_columns, now)
    stopper = kernel.early_stopping if kernel.runs is not None else rows.meta.get(meta_keys.EARLY_STOPPING)
    out = {
        **out,
        "progress": progress,
        "on_device": kernel.on_device,
        "device_runs": dict(kernel.device_runs) if kernel.devices else {},
        "devices": device_list(kernel.devices, kernel.device_runs, stored.values() if kernel.devices else ()),
        "runs": runs,
        "early_stopping": early_stopping_text(stopper, runs),
    }
    return {**out, **_timing(rows, out, kernel.runs is not None), "ended": not kernel.accepting}


def store_snapshot(
    name: str, rows: StoreRows, writer_alive: bool, last_beat: float | None = None, now: float | None = None
) -> dict[str, Any]:
    """The snapshot the server page shows, from the store alone.

    Differences from :func:`kernel_snapshot`: ``on_device`` is None, no run is on the device and
    ``device_runs`` is empty (the store does not record it); ``devices`` are the names meta ``devices`` holds,
    their state ``"—"``; ONGOING runs of a dead writer are INTERRUPTED (:func:`reported_status`); without a
    live writer, or once the experiment has ended (meta ``ended_at``), ``legal_ops`` are empty (nothing would
    apply them) and ``op_hints`` say why (:data:`NO_KERNEL_HINT`, :data:`ENDED_HINT`). Extra keys:
    ``writer_alive``, ``ended``, ``last_beat`` (unix s), ``source: "store"`` and ``device_status``
    (:func:`device_status`).

    Args:
        name: the experiment's name.
        rows: the store's rows.
        writer_alive: whether a kernel holds the experiment (fresh heartbeat).
        last_beat: unix seconds of its last heartbeat, if any.
        now: unix seconds stamped as ``now`` (default: the clock).
    """
    ended = rows.meta.get(meta_keys.ENDED_AT) is not None
    trainer = ENDED if ended else ALIVE if writer_alive else GONE
    hint = ENDED_HINT if ended else NO_KERNEL_HINT
    return _from_store(name, rows, writer_alive, writer_alive and not ended, hint, trainer, last_beat, now)


def reopened_snapshot(
    name: str, rows: StoreRows, *, ended: bool = False, elsewhere: bool = False, now: float | None = None
) -> dict[str, Any]:
    """The snapshot of a panel opened in a kernel that does not train the experiment (after a restart, or before
    ``run_fit``): the page's snapshot (:func:`store_snapshot`: hyperparameter columns, editable fields, ops
    log, stop reasons, pruning marks, as stored), with no legal op (this kernel would apply none).

    Args:
        name: the experiment's name.
        rows: the store's rows.
        ended: ``end()`` ran (in this kernel, or meta ``ended_at`` is set).
        elsewhere: another live kernel trains it (its statuses are shown as stored, ONGOING kept).
        now: unix seconds stamped as ``now`` (default: the clock).

    Returns:
        The snapshot; every run's ``op_hints`` say why its buttons are disabled (:data:`ENDED_HINT`,
        :data:`ELSEWHERE_HINT` or :data:`NO_KERNEL_HINT`), and ``progress`` says once how to continue.
    """
    ended = ended or rows.meta.get(meta_keys.ENDED_AT) is not None
    hint = ENDED_HINT if ended else ELSEWHERE_HINT if elsewhere else NO_KERNEL_HINT
    trainer = ENDED if ended else NOT_HERE
    return _from_store(name, rows, elsewhere and not ended, False, hint, trainer, None, now)


def _from_store(
    name: str,
    rows: StoreRows,
    writer_alive: bool,
    accepting: bool,
    closed_hint: str,
    trainer: str,
    last_beat: float | None,
    now: float | None,
) -> dict[str, Any]:
    """:func:`store_snapshot` / :func:`reopened_snapshot`: ``accepting`` False leaves every run without a
    legal op, ``closed_hint`` in its ``op_hints``; ``trainer`` words the progress (:func:`progress_text`)."""
    columns = [c for c in (rows.meta.get(meta_keys.HPARAM_COLUMNS) or []) if isinstance(c, str)]
    num_chunks = rows.meta.get(meta_keys.NUM_CHUNKS) or 0
    ended = trainer == ENDED
    stored = stored_devices(rows.meta)
    runs = [
        _run_entry(
            r,
            rows,
            columns,
            reported_status(str(r.get("status")), writer_alive),
            accepting=accepting,
            closed_hint=closed_hint,
            device=stored.get(r["run_id"]),
        )
        for r in rows.runs
    ]
    runs = [{**r, "chunks_note": chunks_note(r, num_chunks)} for r in runs]  # why not whole epochs' chunks
    statuses = [parse_status(r["status"]) for r in runs]
    positions = [
        chunk_position(int(r.get("chunks_done") or 0), num_chunks) if num_chunks else None for r in runs
    ]
    progress = progress_text(zip(statuses, positions, strict=True), num_chunks, trainer)
    out = _common(name, rows, rows.meta.get(meta_keys.CREATED_AT), num_chunks, columns, now)
    out = {
        **out,
        "runs": runs,
        "early_stopping": early_stopping_text(rows.meta.get(meta_keys.EARLY_STOPPING), runs),
    }
    return {
        **out,
        **_timing(rows, out, writer_alive, last_beat),
        "progress": progress,
        "on_device": None,
        "device_runs": {},
        "devices": device_list({}, {}, stored.values()),
        "writer_alive": writer_alive,
        "ended": ended,
        "last_beat": last_beat,
        "source": "store",
        "device_status": device_status((r["status"] for r in runs), writer_alive, ended),
    }
