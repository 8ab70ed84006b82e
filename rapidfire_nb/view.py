"""The one view of an experiment: the panel/page snapshot, each run's legal ops, and the text formats.

The kernel (``Experiment.panel_snapshot``), the server extension (``ExperimentsManager.snapshot``) and the
fake panel source (:mod:`rapidfire_nb.testing.fake_source`) build their snapshot here, from the same inputs:

* :class:`StoreRows` — what the experiment's store holds (meta, run rows, latest loss/eval_loss, ops log);
* :class:`KernelState` — in the kernel only: the scheduler's frozen :class:`~kernel_scheduler.RunSnapshot` s,
  the run on the device and its live step (the store records neither).

The snapshot's shape is the "Panel source" contract of ``docs/ARCHITECTURE.md``. Legal ops come from
:func:`kernel_scheduler.ops.decide` (the rules the scheduler applies), statuses from
:class:`kernel_scheduler.RunStatus`. Numbers and progress are formatted once, here (the front end's
``fmtNum`` in ``widgets/format.js`` follows :func:`fmt_num`).

Standard library + :mod:`kernel_scheduler` + :mod:`rapidfire_nb.wire` only: no torch, no store import (a store
is read duck-typed by :meth:`StoreRows.read`), so the server extension may import it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kernel_scheduler import OpKind, RunSnapshot, RunStatus, decide

from .wire import json_type_name

__all__ = [
    "FIELD_TYPES",
    "KernelState",
    "OP_FIELDS",
    "StoreRows",
    "chunk_line",
    "chunk_position",
    "device_status",
    "editable_fields",
    "fmt_num",
    "format_chunk_line",
    "kernel_snapshot",
    "legal_ops",
    "parse_status",
    "position_text",
    "progress_text",
    "reported_status",
    "store_snapshot",
]

#: Keys of one ops-log entry in a snapshot.
OP_FIELDS = ("op_id", "run_id", "kind", "state", "message", "requested_at", "applied_at")

#: JSON type names the kernel writes in meta ``editable_fields`` (``wire.json_type_name``).
FIELD_TYPES = ("bool", "int", "float", "str", "list", "null", "other")

#: Who trains the experiment, as :func:`progress_text` words it.
HERE, NOT_HERE, ALIVE, GONE = "here", "not_here", "alive", "gone"

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
        on_device: run id training right now, or None.
        live_steps: latest logged optimizer step per run (the run on the device moves within a chunk).
    """

    started_at: float | None
    num_chunks: int
    hparam_columns: Sequence[str]
    runs: Sequence[RunSnapshot] | None = None
    on_device: int | None = None
    live_steps: Mapping[int, int] = field(default_factory=dict)


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


def legal_ops(status: RunStatus | str | None, *, accepting: bool = True) -> list[str]:
    """The ops :func:`kernel_scheduler.ops.decide` would not reject for a run in ``status``, in OpKind order.

    Args:
        status: the run's status (member or value); None or an unknown value: no op.
        accepting: False when nobody would apply an op (the server without a live writer): no op.

    Returns:
        Op kind values, e.g. ``["stop", "delete", "clone"]``.
    """
    st = parse_status(status)
    if st is None or not accepting:
        return []
    return [k.value for k in OpKind if decide(k, st, False, 0).verdict != "reject"]


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


def device_status(statuses: Iterable[RunStatus | str], writer_alive: bool) -> str:
    """The server page's device chip: what the store can tell about the device (not the run on it).

    Args:
        statuses: the runs' (reported) statuses.
        writer_alive: whether a kernel holds the experiment.

    Returns:
        ``"no kernel running"``, ``"training (kernel alive)"`` (a live writer with NEW/ONGOING runs trains one
        of them) or ``"device idle (kernel alive)"``.
    """
    if not writer_alive:
        return "no kernel running"
    if any((st := parse_status(s)) is not None and st.in_rotation() for s in statuses):
        return "training (kernel alive)"
    return "device idle (kernel alive)"


# ------------------------------------------------------------------------------------------------ formatting


def fmt_num(value: Any) -> str:
    """One number as the panel, the text lines and the front end (``fmtNum``) show it.

    4 significant digits; below 1e-3 or from 1e5 on (in absolute value) as ``1e-4`` / ``2.5e6``; ints,
    non-finite floats and non-numbers unchanged (``str``); None as ``-``.
    """
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or not math.isfinite(value):
        return str(value)
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        mantissa, exp = f"{value:.3e}".split("e")
        mantissa = mantissa.rstrip("0").rstrip(".")
        return f"{mantissa}e{int(exp)}"
    return f"{value:.4g}"


def chunk_position(index: int, num_chunks: int) -> tuple[int, int]:
    """``(epoch, chunk)``, both 1-based, of the chunk with 0-based ``index`` over all epochs.

    Args:
        index: chunks before it (over all epochs).
        num_chunks: chunks per epoch (>= 1).
    """
    return index // num_chunks + 1, index % num_chunks + 1


def position_text(epoch: int, chunk: int, num_chunks: int) -> str:
    """E.g. ``"chunk 3/4 of epoch 1"``."""
    return f"chunk {chunk}/{num_chunks} of epoch {epoch}"


def progress_text(
    runs: Iterable[tuple[RunStatus | None, tuple[int, int] | None]], num_chunks: int, trainer: str
) -> str:
    """The header's progress line.

    Args:
        runs: per run its status and the ``(epoch, chunk)`` it trains next (None when not planned).
        num_chunks: chunks per epoch.
        trainer: who trains: ``"here"`` (the scheduler of this kernel), ``"not_here"`` (this kernel has no
            scheduler; statuses as stored), ``"alive"`` (the server: a live writer), ``"gone"`` (no writer).

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
    if trainer == GONE:
        return f"no kernel is running this experiment — {text}"
    if trainer == NOT_HERE:
        waiting = sum(1 for st in shown if st in (RunStatus.INTERRUPTED, RunStatus.ONGOING))
        text = f"not training in this kernel — {text}"
        if waiting:
            text += f"; {waiting} interrupted (run_fit with the same arguments continues them)"
        return text
    return f"idle — {text}"


def chunk_line(snap: RunSnapshot, latest: Mapping[str, Any], num_chunks: int) -> str:
    """The line the kernel prints into the ``run_fit`` cell when a run ends a chunk, fails or completes.

    Args:
        snap: the run's snapshot after the chunk.
        latest: its latest ``loss`` / ``eval_loss`` (missing ones are left out; NaN is shown as ``nan``).
        num_chunks: chunks per epoch.

    Returns:
        E.g. ``"run 2 · chunk 3/4 of epoch 1 done · step 60/80 · loss 0.8123"``.
    """
    parts = [f"run {snap.run_id}"]
    if snap.status is RunStatus.FAILED:
        parts.append(f"FAILED: {snap.error}")
        return " · ".join(parts)
    if snap.status is RunStatus.COMPLETED:
        parts.append("completed")
    elif snap.segments_done and num_chunks:
        parts.append(position_text(*chunk_position(snap.segments_done - 1, num_chunks), num_chunks) + " done")
    parts.append(f"step {snap.step}/{snap.total_steps}")
    for key in _LATEST:
        value = latest.get(key)
        if value is not None:  # a NaN is shown as nan, never left out (a hidden NaN eval loss looked fine)
            parts.append(f"{key} {fmt_num(value)}")
    return " · ".join(parts)


_SHORT_COLUMNS = {
    "learning_rate": "lr",
    "per_device_train_batch_size": "bs",
    "gradient_accumulation_steps": "ga",
    "num_train_epochs": "epochs",
    "lora.r": "r",
    "lora.lora_alpha": "alpha",
    "lora.lora_dropout": "dropout",
}


def _short_col(name: str) -> str:
    return _SHORT_COLUMNS.get(name) or name.split(".")[-1]


def format_chunk_line(
    run: Mapping[str, Any],
    *,
    num_chunks: int | None = None,
    hparam_columns: Iterable[str] = (),
    experiment: str = "",
    elapsed: float | None = None,
) -> str:
    """One compact text-progress line for a snapshot run after a chunk (or a status change).

    Args:
        run: one entry of a snapshot's ``runs``.
        num_chunks: chunks per epoch.
        hparam_columns: hyperparameters to show (short names: ``lr``, ``r``, ...).
        experiment: the name in the prefix.
        elapsed: seconds since ``run_fit`` (shown as ``h:mm:ss``).

    Returns:
        E.g. ``[demo 0:01:23]  run 2  chunk 3/4  step 60/80  loss 0.8123  eval_loss 0.9012  lr=1e-4``.
    """
    prefix = experiment
    if elapsed is not None:
        secs = int(elapsed)
        prefix = f"{prefix} {secs // 3600}:{secs % 3600 // 60:02d}:{secs % 60:02d}".strip()
    parts = [f"[{prefix}]" if prefix else "", f"run {run.get('run_id')}"]
    status = run.get("status")
    if status == RunStatus.FAILED.value:
        parts.append(f"FAILED: {run.get('error') or 'unknown error'}")
        return "  ".join(p for p in parts if p)
    if status not in (RunStatus.ONGOING.value, RunStatus.NEW.value, None):
        parts.append(str(status))
    chunks = run.get("chunks_done")
    if chunks is not None:
        parts.append(f"chunk {chunks}/{num_chunks}" if num_chunks else f"chunks {chunks}")
    if run.get("total_steps"):
        parts.append(f"step {run.get('completed_steps', 0)}/{run.get('total_steps')}")
    parts += [f"{key} {fmt_num(run.get(key))}" for key in _LATEST if run.get(key) is not None]
    if run.get("samples_seen") is not None:
        parts.append(f"samples {run.get('samples_seen')}")
    hparams = run.get("hparams") or {}
    parts += [f"{_short_col(col)}={fmt_num(hparams[col])}" for col in hparam_columns if col in hparams]
    return "  ".join(p for p in parts if p)


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
) -> dict[str, Any]:
    run_id = row["run_id"]
    hp = row.get("hparams")
    hp = hp if isinstance(hp, Mapping) else {}
    latest = rows.latest.get(run_id, {})
    return {
        "run_id": run_id,
        "status": status,
        "on_device": bool(snap is not None and snap.on_device),
        "hparams": {c: hp.get(c) for c in columns} or dict(hp),
        "editable": _editable_values(rows.meta.get("editable_fields"), run_id, hp),
        **_progress_fields(row, snap, live_step),
        "loss": latest.get("loss"),
        "eval_loss": latest.get("eval_loss"),
        "error": snap.error if snap is not None else row.get("error"),
        "parent_id": row.get("parent_id"),
        "warm_start": bool(row.get("warm_start")),
        "legal_ops": legal_ops(status, accepting=accepting),
    }


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
        "metric_names": list(rows.meta.get("metric_names") or []),
    }


def kernel_snapshot(
    name: str, rows: StoreRows, kernel: KernelState, now: float | None = None
) -> dict[str, Any]:
    """The snapshot the kernel's panel shows: the store's runs, overlaid with the scheduler's live state.

    Args:
        name: the experiment's name.
        rows: the store's rows.
        kernel: what the kernel knows (its scheduler's snapshots, the run on the device, live steps).
        now: unix seconds stamped as ``now`` (default: the clock).

    Returns:
        The JSON-able snapshot of ``docs/ARCHITECTURE.md`` "Panel source" (runs also carry ``editable``).
    """
    live = {s.run_id: s for s in kernel.runs} if kernel.runs is not None else {}
    runs = []
    for row in rows.runs:
        snap = live.get(row["run_id"])
        status = snap.status.value if snap is not None else str(row.get("status"))
        runs.append(
            _run_entry(row, rows, kernel.hparam_columns, status, snap, kernel.live_steps.get(row["run_id"]))
        )
    if kernel.runs is None:
        progress = progress_text(
            ((parse_status(r.get("status")), None) for r in rows.runs), kernel.num_chunks, NOT_HERE
        )
    else:
        progress = progress_text(
            ((s.status, s.position if s.num_segments else None) for s in kernel.runs), kernel.num_chunks, HERE
        )
    started = kernel.started_at or rows.meta.get("created_at")
    out = _common(name, rows, started, kernel.num_chunks, kernel.hparam_columns, now)
    return {**out, "progress": progress, "on_device": kernel.on_device, "runs": runs}


def store_snapshot(
    name: str, rows: StoreRows, writer_alive: bool, last_beat: float | None = None, now: float | None = None
) -> dict[str, Any]:
    """The snapshot the server page shows, from the store alone.

    Differences from :func:`kernel_snapshot`: ``on_device`` is None and no run is on the device (the store
    does not record it); ONGOING runs of a dead writer are INTERRUPTED (:func:`reported_status`); without a
    live writer ``legal_ops`` are empty (nothing would apply them). Extra keys: ``writer_alive``,
    ``last_beat`` (unix s), ``source: "store"`` and ``device_status`` (:func:`device_status`).

    Args:
        name: the experiment's name.
        rows: the store's rows.
        writer_alive: whether a kernel holds the experiment (fresh heartbeat).
        last_beat: unix seconds of its last heartbeat, if any.
        now: unix seconds stamped as ``now`` (default: the clock).
    """
    columns = [c for c in (rows.meta.get("hparam_columns") or []) if isinstance(c, str)]
    num_chunks = rows.meta.get("num_chunks") or 0
    runs = [
        _run_entry(
            r, rows, columns, reported_status(str(r.get("status")), writer_alive), accepting=writer_alive
        )
        for r in rows.runs
    ]
    statuses = [parse_status(r["status"]) for r in runs]
    positions = [
        chunk_position(int(r.get("chunks_done") or 0), num_chunks) if num_chunks else None for r in runs
    ]
    progress = progress_text(
        zip(statuses, positions, strict=True), num_chunks, ALIVE if writer_alive else GONE
    )
    out = _common(name, rows, rows.meta.get("created_at"), num_chunks, columns, now)
    return {
        **out,
        "progress": progress,
        "on_device": None,
        "runs": runs,
        "writer_alive": writer_alive,
        "last_beat": last_beat,
        "source": "store",
        "device_status": device_status((r["status"] for r in runs), writer_alive),
    }
