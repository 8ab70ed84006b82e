"""The one view of an experiment: the panel/page snapshot, each run's legal ops, and the text formats.

The kernel (``Experiment.panel_snapshot``), the server extension (``ExperimentsManager.snapshot``) and the
fake panel source (:mod:`rapidfire_nb.testing.fake_source`) build their snapshot here, from the same inputs:

* :class:`StoreRows` — what the experiment's store holds (meta, run rows, latest loss/eval_loss, ops log);
* :class:`KernelState` — in the kernel only: the scheduler's frozen :class:`~kernel_scheduler.RunSnapshot` s,
  the run on each device, each device's state and the live steps (the store records none of them).

The snapshot's shape is the "Panel source" contract of ``docs/ARCHITECTURE.md``. Legal ops come from
:func:`kernel_scheduler.ops.decide` (the rules the scheduler applies), statuses from
:class:`kernel_scheduler.RunStatus`. Numbers and progress lines are formatted once, in
:mod:`rapidfire_nb.view.text` (re-exported here); training time and tqdm-like numbers come from
:mod:`rapidfire_nb.view.clock`.

Standard library + :mod:`kernel_scheduler` + :mod:`rapidfire_nb.view.wire` only: no torch, no store import (a store
is read duck-typed by :meth:`StoreRows.read`), so the server extension may import it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

from kernel_scheduler import DEFAULT_DEVICE, OpKind, PendingOp, RunSnapshot, RunStatus, decide

from .. import meta_keys
from .clock import is_training, progress_stats, training_seconds
from .stops import StopInfo, stop_history
from .text import (
    best_run,
    chunk_line,
    chunk_position,
    early_stopping_text,
    final_summary,
    fmt_metric,
    fmt_num,
    format_chunk_line,
    position_text,
)
from .wire import json_type_name

__all__ = [
    "DEVICES_META_KEY",
    "DEVICE_STATES",
    "EARLY_STOPPING_META_KEY",
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
    "final_summary",
    "fmt_metric",
    "fmt_num",
    "format_chunk_line",
    "kernel_snapshot",
    "legal_ops",
    "op_hints",
    "pending_ops",
    "parse_status",
    "position_text",
    "progress_text",
    "reported_status",
    "run_device",
    "store_snapshot",
]

#: Meta keys of the early-stopping policy's progress and of run id -> device (:mod:`rapidfire_nb.meta_keys`).
EARLY_STOPPING_META_KEY = meta_keys.EARLY_STOPPING
DEVICES_META_KEY = meta_keys.DEVICES

#: A device's state in a snapshot's ``devices``: a run trains there, nothing does, its worker died, or (the server
#: page: the store does not record it) unknown.
DEVICE_STATES = ("training", "idle", "lost", "—")

#: Keys of one ops-log entry in a snapshot.
OP_FIELDS = ("op_id", "run_id", "kind", "state", "message", "requested_at", "applied_at")

#: JSON type names the kernel writes in meta ``editable_fields`` (``wire.json_type_name``).
FIELD_TYPES = ("bool", "int", "float", "str", "list", "null", "other")

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
        latest: run id -> latest ``loss`` / ``eval_loss`` (``store.latest_metrics``).
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
        """Read the rows a snapshot needs from ``store`` (a :class:`rapidfire_nb.store.Store`)."""
        return cls(
            meta=store.meta(), runs=store.runs(), latest=store.latest_metrics(_LATEST), ops=store.ops()
        )


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


def parse_status(value: Any) -> RunStatus | None:
    """``value`` as a :class:`RunStatus` (a member or its string value); None for anything else."""
    if isinstance(value, RunStatus):
        return value
    try:
        return RunStatus(value)
    except ValueError:
        return None


def reported_status(stored: str, writer_alive: bool) -> str:
    """Crash reconciliation as the server reports it: an ONGOING run whose writer is gone is INTERRUPTED.

    Args:
        stored: the status value in the store.
        writer_alive: whether a process holds the experiment (fresh heartbeat).

    Returns:
        The status value to show.
    """
    if stored == RunStatus.ONGOING.value and not writer_alive:
        return RunStatus.INTERRUPTED.value
    return stored


def legal_ops(
    status: RunStatus | str | None, *, accepting: bool = True, pending: Sequence[PendingOp] = ()
) -> list[str]:
    """The ops :func:`kernel_scheduler.ops.decide` would not reject for a run in ``status``, in OpKind order.

    Args:
        status: the run's status (member or value); None or an unknown value: no op.
        accepting: False when nobody would apply an op (the server without a live writer): no op.
        pending: the run's stop / resume / delete ops still queued (e.g. a stop waiting for the chunk boundary:
            a resume is then legal too, it cancels the stop).

    Returns:
        Op kind values, e.g. ``["stop", "delete", "clone"]``.
    """
    st = parse_status(status)
    if st is None or not accepting:
        return []
    return [
        k.value
        for k in OpKind
        if decide(k, st, False, 0).verdict != "reject" or decide(k, st, False, 0, pending).verdict != "reject"
    ]


def pending_ops(ops: Iterable[Mapping[str, Any]], run_id: Any) -> list[PendingOp]:
    """The queued stop / resume / delete ops of run ``run_id`` in an ops log (``store.ops()`` rows)."""
    kinds = {k.value: k for k in (OpKind.STOP, OpKind.RESUME, OpKind.DELETE)}
    return [
        PendingOp(kinds[o["kind"]], str(o.get("op_id")))
        for o in ops
        if o.get("run_id") == run_id and o.get("state") == "queued" and o.get("kind") in kinds
    ]


#: Why no op applies to any run: the experiment was ended in this kernel, or no kernel trains it (server).
ENDED_HINT = (
    "the experiment was ended; to continue: Experiment(name), then run_fit(...) with the same arguments"
)
NO_KERNEL_HINT = (
    "no kernel is running this experiment; ops are applied by the kernel that trains it: re-run its notebook "
    "(Experiment(name), then run_fit(...) with the same arguments)"
)


def op_hints(
    status: RunStatus | str | None, *, closed: str | None = None, pending: Sequence[PendingOp] = ()
) -> dict[str, str]:
    """Why each op a run's buttons offer is disabled: ``{op kind: reason}`` for the ops that are not legal.

    Args:
        status: the run's status (member or value).
        closed: the reason no op applies at all (e.g. :data:`ENDED_HINT`), or None.
        pending: the run's queued stop / resume / delete ops (as in :func:`legal_ops`).

    Returns:
        Op kind -> sentence (the reason :func:`kernel_scheduler.ops.decide` gives, or ``closed``).
    """
    st = parse_status(status)
    legal = set(legal_ops(st, pending=pending))
    out = {}
    for k in OpKind:
        if closed is not None:
            out[k.value] = closed
            continue
        decision = decide(k, st, False, 0)
        if decision.verdict == "reject" and k.value not in legal:
            out[k.value] = decision.reason.replace("run 0 is", "the run is").replace("run 0 ", "the run ")
    return out


def editable_fields(described: Any, run_id: int, hparams: Any) -> dict[str, str] | None:
    """The fields a clone of a run may change from the panel, the magic or the server: name -> JSON type.

    One rule for the snapshot's ``editable`` and for the server's op validation: the fields the kernel
    recorded for the run in meta ``editable_fields`` (its hyperparameters minus functions and ``model_type``);
    for a store written before those were recorded, the run's hyperparameters whose values are not object
    reprs (``"<function f>"``), typed by their current values.

    Args:
        described: meta ``editable_fields`` (``{str(run_id): {field: type name}}``), or None.
        run_id: the run.
        hparams: the run's stored hyperparameters.

    Returns:
        ``{field: type name}`` (unknown type names become ``"other"``), or None when the kernel recorded
        fields but none for this run.
    """
    if isinstance(described, Mapping):
        entry = described.get(str(run_id))
        if not isinstance(entry, Mapping):
            return None
        return {str(k): (v if v in FIELD_TYPES else "other") for k, v in entry.items()}
    if not isinstance(hparams, Mapping):
        return {}
    return {
        str(k): json_type_name(v)
        for k, v in hparams.items()
        if not (isinstance(v, str) and v.startswith("<"))
    }


def _editable_values(described: Any, run_id: int, hparams: Mapping[str, Any]) -> dict[str, Any]:
    fields = editable_fields(described, run_id, hparams)
    if fields is None:
        fields = editable_fields(None, run_id, hparams) or {}
    return {k: v for k, v in hparams.items() if k in fields}


def device_status(statuses: Iterable[RunStatus | str], writer_alive: bool, ended: bool = False) -> str:
    """The server page's device chip: what the store can tell about the device (not the run on it).

    Args:
        statuses: the runs' (reported) statuses.
        writer_alive: whether a kernel holds the experiment.
        ended: whether its kernel ended it (``experiment.end()``; meta ``ended_at``).

    Returns:
        ``"experiment ended"``, ``"no kernel running"``, ``"training (kernel alive)"`` (a live writer with
        NEW/ONGOING runs trains one of them) or ``"device idle (kernel alive)"``.
    """
    if ended:
        return "experiment ended"
    if not writer_alive:
        return "no kernel running"
    if any((st := parse_status(s)) is not None and st.in_rotation() for s in statuses):
        return "training (kernel alive)"
    return "device idle (kernel alive)"


def _natural(name: str) -> tuple[str, int, str]:
    """Sort key of a device name: ``cpu:2`` before ``cpu:10``."""
    head, _, tail = name.rpartition(":")
    return (head, int(tail), "") if tail.isdigit() else (name, -1, "")


def _stored_devices(meta: Mapping[str, Any]) -> dict[int, str]:
    """Run id -> device, from meta ``devices`` (empty when the experiment trained on one device)."""
    stored = meta.get(meta_keys.DEVICES)
    if not isinstance(stored, Mapping):
        return {}
    out = {}
    for rid, dev in stored.items():
        if isinstance(dev, str) and dev and dev != DEFAULT_DEVICE and str(rid).isdigit():
            out[int(rid)] = dev
    return out


def run_device(snap: RunSnapshot | None, stored: Mapping[int, str], run_id: int) -> str | None:
    """The device a run trains on: the scheduler's (unless the single in-kernel :data:`DEFAULT_DEVICE`), else
    the one stored in meta ``devices``; None when unknown or the experiment uses one device."""
    if snap is not None and snap.device and snap.device != DEFAULT_DEVICE:
        return snap.device
    return stored.get(run_id)


def device_list(
    states: Mapping[str, str], running: Mapping[str, int], stored: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """The header's devices: one ``{"name", "state", "run_id"}`` per device, state one of :data:`DEVICE_STATES`.

    Args:
        states: the kernel's device -> ``"training"`` / ``"idle"`` / ``"lost"`` (in its device order); empty on
            the server page or with one device.
        running: device -> id of the run training there (a device in it is ``"training"``).
        stored: device names the store knows (meta ``devices``): added, in natural order, with state ``"—"``.

    Returns:
        A list (empty with one device: the header shows its single "run N on device" chip then).
    """
    out = []
    for name, state in states.items():
        rid = running.get(name)
        st = "training" if rid is not None else state if state in ("idle", "lost") else "idle"
        out.append({"name": name, "state": st, "run_id": rid})
    for name in sorted(set(stored) - set(states), key=_natural):
        out.append({"name": name, "state": "—", "run_id": None})
    return out


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
        "status": status,
        "on_device": bool(snap is not None and snap.on_device),
        "device": device,
        "hparams": {c: hp.get(c) for c in columns} or dict(hp),
        "editable": _editable_values(rows.meta.get(meta_keys.EDITABLE_FIELDS), run_id, hp),
        **_progress_fields(row, snap, live_step),
        "loss": latest.get("loss"),
        "eval_loss": latest.get("eval_loss"),
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
    stored = _stored_devices(rows.meta)
    runs = []
    for row in rows.runs:
        snap = live.get(row["run_id"])
        status = snap.status.value if snap is not None else str(row.get("status"))
        live_step = kernel.live_steps.get(row["run_id"])
        device = run_device(snap, stored, row["run_id"])
        entry = _run_entry(
            row, rows, kernel.hparam_columns, status, snap, live_step, kernel.accepting, ENDED_HINT, device
        )
        runs.append(entry)
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
    apply them). Extra keys: ``writer_alive``, ``ended``, ``last_beat`` (unix s), ``source: "store"`` and
    ``device_status`` (:func:`device_status`).

    Args:
        name: the experiment's name.
        rows: the store's rows.
        writer_alive: whether a kernel holds the experiment (fresh heartbeat).
        last_beat: unix seconds of its last heartbeat, if any.
        now: unix seconds stamped as ``now`` (default: the clock).
    """
    columns = [c for c in (rows.meta.get(meta_keys.HPARAM_COLUMNS) or []) if isinstance(c, str)]
    num_chunks = rows.meta.get(meta_keys.NUM_CHUNKS) or 0
    ended = rows.meta.get(meta_keys.ENDED_AT) is not None
    accepting = writer_alive and not ended
    stored = _stored_devices(rows.meta)
    runs = [
        _run_entry(
            r,
            rows,
            columns,
            reported_status(str(r.get("status")), writer_alive),
            accepting=accepting,
            device=stored.get(r["run_id"]),
        )
        for r in rows.runs
    ]
    statuses = [parse_status(r["status"]) for r in runs]
    positions = [
        chunk_position(int(r.get("chunks_done") or 0), num_chunks) if num_chunks else None for r in runs
    ]
    trainer = ENDED if ended else ALIVE if writer_alive else GONE
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
