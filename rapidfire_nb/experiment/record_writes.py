"""What the recorder writes to the store, as plain functions of the store and the queued items.

No threads and no queue here: :class:`~rapidfire_nb.experiment.recorder.Recorder` calls these on its own thread
(the recorder thread owns every store write made during training), and tests call them with a fake store. The
bookkeeping classes (:class:`ChunkReports`, :class:`MetricNames`) are each owned by one recorder.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kernel_scheduler import Op, OpAck, RunSnapshot, RunStatus

from .. import meta_keys
from ..errors import StorageError
from ..redact import is_secret_key, redact
from ..view.wire import json_type_name
from .record_items import MetricsItem

__all__ = [
    "ADDED_RUNS_META_KEY",
    "EDITABLE_META_KEY",
    "METRIC_NAMES_META_KEY",
    "NOT_EDITABLE",
    "TRACKED_RUNS_META_KEY",
    "ChunkReports",
    "MetricNames",
    "check_store_file",
    "confirm_tracked",
    "forget_packs",
    "record_pack",
    "editable_fields",
    "logged_points",
    "metric_numbers",
    "metric_rows",
    "store_added",
    "store_new_run",
    "store_op",
    "store_run",
]

#: hyperparameter columns that the panel, the magic and the server cannot change (functions: API only).
NOT_EDITABLE = ("formatting_func", "compute_metrics", "reward_funcs", "model_type")

# The meta keys this module writes (each described in :mod:`rapidfire_nb.meta_keys`).
ADDED_RUNS_META_KEY = meta_keys.ADDED_RUNS
TRACKED_RUNS_META_KEY = meta_keys.TRACKED_RUNS
EDITABLE_META_KEY = meta_keys.EDITABLE_FIELDS
METRIC_NAMES_META_KEY = meta_keys.METRIC_NAMES


def editable_fields(specs: Mapping[int, Any]) -> dict[str, dict[str, str]]:
    """Per run (id as text), the hyperparameters the panel/server may change in a clone (name -> JSON type);
    functions and secrets are left out (a secret is not stored: it cannot be cloned). ``max_steps`` always: the
    budget of a clone, e.g. a warm one that continues a finished run, also where the run trains by epochs."""
    return {
        str(rid): {
            "max_steps": "int",
            **{
                k: json_type_name(v)
                for k, v in spec.hparams().items()
                if k not in NOT_EDITABLE and not is_secret_key(k)
            },
        }
        for rid, spec in specs.items()
    }


def check_store_file(store: Any) -> None:
    """Raise :class:`~rapidfire_nb.errors.StorageError` when the store's file is gone (one stat; done at each run
    event and heartbeat, ~2 s). A deleted experiment folder leaves SQLite writing into an unlinked file, which
    succeeds and saves nothing; so it is a storage failure. A store without a file ``path`` is not checked."""
    path = getattr(store, "path", None)
    if isinstance(path, Path) and not path.exists():
        raise StorageError(str(path), "the file is gone (the experiment folder was removed while training)")


def store_run(store: Any, snap: RunSnapshot, checkpoint: Path | None) -> None:
    """Write run ``snap.run_id``'s row: status, steps, chunks, epoch, rows seen, error, latest checkpoint."""
    store.upsert_run(
        snap.run_id,
        status=snap.status.value,
        total_steps=snap.total_steps,
        completed_steps=snap.step,
        chunks_done=snap.segments_done,
        num_segments=snap.num_segments,
        epoch=snap.epoch,
        samples_seen=snap.samples_seen,
        error=snap.error,
        last_checkpoint=str(checkpoint) if checkpoint else None,
    )


def store_op(store: Any, op: Op, ack: OpAck, now: float) -> None:
    """Add ``op`` to the ops log with ``ack``'s state, or update its state when it is there already (its
    ``applied_at`` is ``now``, unix seconds, unless it is still queued). The ``spec`` payload is left out and
    secrets are redacted."""
    payload = redact({k: v for k, v in op.payload.items() if k != "spec"})
    added = store.add_op(
        op.op_id,
        op.kind.value,
        op.run_id,
        payload,
        source=op.source,
        state=ack.state,
        message=ack.message,
        requested_at=op.requested_at,
    )
    if not added:
        store.update_op(op.op_id, ack.state, ack.message, applied_at=now if ack.state != "queued" else None)


def store_new_run(store: Any, snap: RunSnapshot, source: str, **fields: Any) -> None:
    """Write the first row of a run the store does not know: its status, its spec (config, hparams,
    fingerprint), ``source`` (``fit``, ``trial``, ...), no progress yet, and ``fields`` (e.g. ``total_steps``)."""
    spec = snap.spec
    store.upsert_run(
        snap.run_id,
        status=snap.status.value,
        config=spec.to_json(),
        hparams=spec.hparams(),
        fingerprint=spec.fingerprint(),
        source=source,
        completed_steps=0,
        chunks_done=0,
        epoch=0.0,
        samples_seen=0,
        **fields,
    )


def store_added(store: Any, snap: RunSnapshot, info: Mapping[str, Any]) -> None:
    """Write the row of a run the early-stopping policy added (``source`` from ``info``, default ``trial``) and
    keep ``info`` (redacted) in meta ``added_runs``: what a restarted kernel hands the policy back to rebuild it
    (``EarlyStoppingPolicy.restore_added``)."""
    store_new_run(store, snap, str(info.get("source") or "trial"), total_steps=0)
    added = dict(store.get_meta(meta_keys.ADDED_RUNS, {}) or {})
    added[str(snap.run_id)] = redact(dict(info))
    store.set_meta(meta_keys.ADDED_RUNS, added)


def confirm_tracked(store: Any, run_id: int) -> None:
    """Add ended run ``run_id`` to meta ``tracked_runs`` (sorted ids), if it is not there."""
    confirmed = list(store.get_meta(meta_keys.TRACKED_RUNS, []) or [])
    if run_id not in confirmed:
        store.set_meta(meta_keys.TRACKED_RUNS, sorted([*confirmed, run_id]))


def record_pack(store: Any, run_id: int, pack_id: int | None) -> None:
    """Keep run ``run_id``'s pack in meta ``packs`` (``{"3": 1}``: run 3 trains in pack 1); ``pack_id`` None: it left
    packing (its key removed). Written only when it changes; the panel, the page and ``get_runs_info()`` read it."""
    packs = dict(store.get_meta(meta_keys.PACKS, {}) or {})
    key = str(run_id)
    if packs.get(key) == pack_id:
        return
    if pack_id is None:
        packs.pop(key, None)
    else:
        packs[key] = int(pack_id)
    store.set_meta(meta_keys.PACKS, packs)


def forget_packs(store: Any, run_ids: Any) -> None:
    """Remove runs ``run_ids`` from meta ``packs`` (a new session's runs that train again: its executor says their
    packs afresh, so a pack of an earlier kernel is never shown for a run that now trains alone)."""
    packs = dict(store.get_meta(meta_keys.PACKS, {}) or {})
    kept = {k: v for k, v in packs.items() if k not in {str(r) for r in run_ids}}
    if kept != packs:
        store.set_meta(meta_keys.PACKS, kept)


def metric_numbers(logs: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of one log call (ints and floats, not bools), as floats; TRL's names."""
    return {k: float(v) for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def metric_rows(item: MetricsItem, numbers: Mapping[str, float]) -> list[dict[str, Any]]:
    """The store's metric rows of one log call: one per name in ``numbers``."""
    return [
        {
            "run_id": item.run_id,
            "step": item.step,
            "samples_seen": item.samples_seen,
            "name": k,
            "value": v,
            "wall_time": item.wall_time,
        }
        for k, v in numbers.items()
    ]


def logged_points(
    store: Any, run_id: int, step: int | None
) -> list[tuple[int, dict[str, float], float | None]]:
    """Run ``run_id``'s points in the store up to ``step`` (None: all) as the log calls that made them
    (``(step, {name: value}, wall_time)``; consecutive rows of one step and wall time were one call), oldest
    first."""
    rows, _ = store.metrics_since(0, run_id=run_id)
    calls: list[tuple[int, dict[str, float], float | None]] = []
    for row in rows:
        at, wall_time = int(row["step"]), row["wall_time"]
        if step is not None and at > step:
            continue
        if calls and calls[-1][0] == at and calls[-1][2] == wall_time:
            calls[-1][1][row["name"]] = row["value"]
        else:
            calls.append((at, {row["name"]: row["value"]}, wall_time))
    return calls


class ChunkReports:
    """Which chunk ends were reported (a chunk line) per run, so that each is reported once, across restarts."""

    def __init__(self) -> None:
        self._seen: dict[int, int] = {}  # run id -> chunks reported (a restart starts there)
        self._ended: set[int] = set()  # runs whose COMPLETED/FAILED line was reported

    def known(self, run_id: int, segments_done: int, finished: bool) -> None:
        """Run ``run_id``'s first ``segments_done`` chunks (and its end, if ``finished``) were reported already."""
        self._seen[run_id] = segments_done
        if finished:
            self._ended.add(run_id)

    def due(self, snap: RunSnapshot) -> bool:
        """True (once) when ``snap`` finished a chunk not reported yet, or ended (COMPLETED/FAILED); marks it."""
        if snap.run_id not in self._seen and snap.status is RunStatus.NEW:
            self._seen[snap.run_id] = snap.segments_done  # a warm clone starts at its parent's chunk
        prev = self._seen.get(snap.run_id, 0)
        ended = snap.status in (RunStatus.COMPLETED, RunStatus.FAILED) and snap.run_id not in self._ended
        if snap.segments_done <= prev and not ended:
            return False
        self._seen[snap.run_id] = max(prev, snap.segments_done)
        if ended:
            self._ended.add(snap.run_id)
        return True


class MetricNames:
    """The metric names in meta ``metric_names``: read from the store once, then written only when new ones come."""

    def __init__(self) -> None:
        self._known: set[str] | None = None

    def note(self, store: Any, names: set[str]) -> None:
        """Add ``names`` to meta ``metric_names`` (sorted) unless all are there."""
        if self._known is None:
            self._known = set(store.get_meta(meta_keys.METRIC_NAMES, None) or [])
        if names <= self._known:
            return
        self._known |= names
        store.set_meta(meta_keys.METRIC_NAMES, sorted(self._known))
