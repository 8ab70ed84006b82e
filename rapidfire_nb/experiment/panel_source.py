"""The panel source the kernel's panel reads (the contract in docs/ARCHITECTURE.md, "Panel source").

``panel_snapshot`` joins the store's rows with the live scheduler's snapshots; ``metrics_since`` pages through the
store's metric rows.
"""

from __future__ import annotations

import time
from typing import Any

from kernel_scheduler import RunSnapshot, RunStatus

from .recorder import NOT_EDITABLE

__all__ = ["metrics_since", "panel_snapshot", "progress_text"]


def panel_snapshot(name: str, store: Any, session: Any) -> dict[str, Any]:
    """JSON-able state for the panel (see docs/ARCHITECTURE.md); ``session`` is None when nothing trains here."""
    snaps = session.snapshots() if session is not None else {}
    columns = session.columns if session is not None else []
    latest = store.latest_metrics(["loss", "eval_loss"])
    runs = [_run_row(r, snaps.get(r["run_id"]), columns, latest.get(r["run_id"], {}), session)
            for r in store.runs()]
    return {
        "experiment": name,
        "started_at": session.started_at if session is not None else store.get_meta("created_at"),
        "now": time.time(), "progress": progress_text(store, session, snaps),
        "on_device": session.scheduler.on_device() if session is not None else None,
        "num_chunks": session.num_chunks if session is not None else 0, "hparam_columns": list(columns),
        "runs": runs,
        "ops": [{k: o.get(k) for k in ("op_id", "run_id", "kind", "state", "message", "requested_at",
                                       "applied_at")} for o in store.ops()],
        "metric_names": list(store.get_meta("metric_names", None) or []),
    }


def _run_row(r: dict[str, Any], s: RunSnapshot | None, columns: list[str], latest: dict[str, float],
             session: Any) -> dict[str, Any]:
    status = s.status if s else RunStatus(r["status"])
    hp = r.get("hparams") or {}
    legal = []
    if status in (RunStatus.NEW, RunStatus.ONGOING, RunStatus.INTERRUPTED):
        legal.append("stop")
    if status in (RunStatus.STOPPED, RunStatus.INTERRUPTED):
        legal.append("resume")
    if status is not RunStatus.DELETED:
        legal += ["delete", "clone"]
    return {
        "run_id": r["run_id"], "status": status.value, "on_device": bool(s and s.on_device),
        "hparams": {c: hp.get(c) for c in columns} or hp,
        "editable": {k: v for k, v in hp.items() if k not in NOT_EDITABLE},
        "completed_steps": (max(s.step, session.recorder.live_step(s.run_id)) if s and s.on_device else
                            s.step if s else r.get("completed_steps")),
        "total_steps": s.total_steps if s else r.get("total_steps"),
        "chunks_done": s.segments_done if s else r.get("chunks_done"),
        "num_segments": s.num_segments if s else r.get("num_segments"),
        "epoch": s.epoch if s and s.steps_per_epoch else r.get("epoch"),
        "samples_seen": s.samples_seen if s else r.get("samples_seen"),
        "loss": latest.get("loss"), "eval_loss": latest.get("eval_loss"),
        "error": s.error if s else r.get("error"), "parent_id": r.get("parent_id"),
        "warm_start": bool(r.get("warm_start")), "legal_ops": legal,
    }


def progress_text(store: Any, session: Any, snaps: dict[int, RunSnapshot]) -> str:
    """The header's progress: ``chunk 3/4 of epoch 1``, ``idle — 2/4 runs completed``, or the reattached text."""
    if session is None:  # reattached, nothing trains in this kernel yet
        runs = [r for r in store.runs() if r["status"] != RunStatus.DELETED.value]
        waiting = [r for r in runs if r["status"] in (RunStatus.INTERRUPTED.value, RunStatus.ONGOING.value)]
        done = sum(1 for r in runs if r["status"] == RunStatus.COMPLETED.value)
        text = f"not training in this kernel — {done}/{len(runs)} runs completed"
        if waiting:
            text += f"; {len(waiting)} interrupted (run_fit with the same arguments continues them)"
        return text
    active = [s for s in snaps.values() if s.status.in_rotation() and s.num_segments]
    if not active:
        shown = [s for s in snaps.values() if s.status is not RunStatus.DELETED]
        done = sum(1 for s in shown if s.status is RunStatus.COMPLETED)
        return f"idle — {done}/{len(shown)} runs completed"
    epoch, chunk = min(s.position for s in active)
    return f"chunk {chunk}/{session.num_chunks} of epoch {epoch}"


def metrics_since(store: Any, cursor: int) -> tuple[list[dict[str, Any]], int]:
    """Metric points after ``cursor`` (the store's row id) and the new cursor."""
    points, new = store.metrics_since(cursor)
    return [{k: p[k] for k in ("run_id", "step", "samples_seen", "name", "value")} for p in points], new
