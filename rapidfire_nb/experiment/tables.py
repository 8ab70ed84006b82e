"""The experiment's results as pandas tables: one row per run, one row per logged step, the ops log.

Read from the store (the source of truth), with the live scheduler's snapshots (the freshest statuses) when this
process trains the experiment. pandas is imported when a table is made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kernel_scheduler import DEFAULT_DEVICE, RunSnapshot, RunStatus

from .. import meta_keys
from ..view.devices_view import run_sharding, stored_packs
from ..view.metrics_view import best_run, metric_choice, resolve_metrics
from ..view.stops import stop_history
from ..view.text import run_labels

__all__ = ["ops_table", "results_table", "runs_table"]

_PROGRESS_COLUMNS = ["completed_steps", "total_steps", "chunks_done", "epoch", "loss", "eval_loss"]


def runs_table(
    store: Any, live: Mapping[int, RunSnapshot], columns: Sequence[str], include_deleted: bool
) -> Any:
    """``get_runs_info()``: columns ``run_id[, run_name], status, <hparams...>, completed_steps, total_steps,
    chunks_done, epoch, loss, eval_loss, <generation metrics...>, checkpoint_dir, error, stop_reason[, device][,
    sharding][, pack][, tags], config``.

    ``run_name`` (after ``run_id``, when any run shown has a name) is the run's name (``RFModelConfig(run_name=...)``,
    a template filled per run, ``"<parent> (clone)"`` for a clone; shown whole), None for a run without one;
    ``tags`` (before ``config``, when any run shown has tags) its tags, a list (``[]`` when none). Both are labels
    read from the stored config: the row's key stays ``run_id``. Like ``device``, they are left out when no run uses
    them, so a table without names reads as before.

    ``config`` (each run's whole config as a dict, rapidfireai's column) comes last: printed, pandas cuts a dict
    to the column width, and in front it pushed the values compared off the screen.

    The trainer kind's metric columns come after ``eval_loss`` (GRPO ``reward`` / ``eval_reward``, DPO
    ``rewards/accuracies``...; those zero or absent for every run left out, as in the panel:
    :func:`rapidfire_nb.view.metrics_view.resolve_metrics`), and ``table.attrs["best_by"]`` is the ranking the
    panel and ``end()`` use: ``{"metric", "mode": "min"|"max", "run_id": the best run or None}``.

    The generation metrics are those in the store's meta ``eval_metric_names`` (``compute_metrics``' values of
    runs that evaluate by generating, e.g. ``eval_rougeL``; GRPO's ``eval_reward`` and
    ``eval_rewards/<function>/mean``): each run's latest value, missing (NaN) where a run logged none.

    ``stop_reason`` says why a STOPPED run stopped: the early-stopping policy's reason (``"pruned at chunk 2/8:
    eval_loss 2.71 not in the best 4 of 8 at this rung (cutoff 2.43)"``) or ``"stopped by the user (panel)"``;
    None for the other statuses.

    Displayed, ``stop_reason`` reads whole and ``error`` is cut at a word (pandas cuts every text at 50 characters:
    "...not in th..."); the values are whole either way (:class:`~.frames.RunsFrame`, a DataFrame).

    ``device`` (after ``stop_reason``, only when the experiment trained on several devices: ``run_fit(devices=...)``)
    is the device each run trains on, e.g. ``"cpu:1"`` or ``"cuda:3"`` (store meta ``devices``), or the devices of a
    run over several, joined by ``+`` (``"cuda:0+cuda:1"``, ``num_gpus=2``).

    ``sharding`` (after it, only when some run trains over several devices) is ``"fsdp"`` (PyTorch FSDP2: its
    training args set ``fsdp``), ``"ddp"`` (data-parallel) or None (one device), read from the stored config.

    ``pack`` (after it, only when some run trains packed: ``run_fit(packing=...)``) is the id of the pack a run
    trains in (the pack's smallest run id: one forward/backward per step for all of them), None for a run that trains
    alone; ints and None in an object column, never a NaN (store meta ``packs``).

    Args:
        live: the scheduler's snapshots by run id (empty when nothing trains in this process).
        columns: this process's hyperparameter columns (added after the stored ones).
        include_deleted: keep DELETED runs.
    """
    from .frames import RunsFrame  # pandas, imported when a table is made

    generated = [
        str(n) for n in store.get_meta(meta_keys.EVAL_METRIC_NAMES, []) or [] if n not in _PROGRESS_COLUMNS
    ]
    choice = metric_choice(store.meta())  # the trainer kind's metrics (GRPO: reward, DPO: reward accuracies)
    latest = store.latest_metrics(list(dict.fromkeys(["loss", "eval_loss", *generated, *choice.names])))
    picked = resolve_metrics(choice, latest, store.get_meta(meta_keys.METRIC_NAMES, []) or [])
    kind_cols = [n for n in picked["metric_columns"] if n not in _PROGRESS_COLUMNS and n not in generated]
    generated = [*kind_cols, *generated]
    stops = stop_history(store.ops())
    devices = dict(store.get_meta(meta_keys.DEVICES, {}) or {})
    devices.update({str(rid): s.device for rid, s in live.items() if s.device and s.device != DEFAULT_DEVICE})
    packs = stored_packs(store.meta())
    cols = list(store.get_meta(meta_keys.HPARAM_COLUMNS, []) or [])
    cols += [c for c in columns if c not in cols]
    rows = []
    for r in store.runs():
        r = _with_live(r, live.get(r["run_id"]))
        if r["status"] == RunStatus.DELETED.value and not include_deleted:
            continue
        rows.append(_row(r, cols, latest.get(r["run_id"], {}), generated, stops.get(r["run_id"]), devices))
    named, tagged = any(row["run_name"] for row in rows), any(row["tags"] for row in rows)
    tail = [*_PROGRESS_COLUMNS, *generated, "checkpoint_dir", "error", "stop_reason"]
    sharded = any(row["sharding"] for row in rows)
    tail += ["device"] if devices else []
    tail += ["sharding"] if sharded else []
    tail += ["pack"] if packs else []
    tail += ["tags"] if tagged else []
    head = ["run_id", "run_name", "status"] if named else ["run_id", "status"]
    table = RunsFrame(rows, columns=[*head, *cols, *tail, "config"])
    best = best_run(table.to_dict("records"), picked["best_by"]["metric"], picked["best_by"]["mode"])
    table.attrs["best_by"] = {**picked["best_by"], "run_id": best[0] if best else None}
    for col in cols:  # a hyperparameter some runs leave out: None beside its ints, never 2.0 beside a NaN
        values = [row.get(col) for row in rows]
        if any(v is None for v in values) and any(v is not None for v in values):
            import pandas as pd

            table[col] = pd.Series(values, index=table.index, dtype=object)
    if packs:  # ints and None in an object column (from [1, None] pandas would make floats and a NaN)
        import pandas as pd

        table["pack"] = pd.Series(
            [packs.get(int(r)) for r in table["run_id"]], index=table.index, dtype=object
        )
    for name in (
        *(["run_name"] if named else []),
        "checkpoint_dir",
        "error",
        "stop_reason",
        *(["device"] if devices else []),
        *(["sharding"] if sharded else []),
    ):  # text columns: None stays None, never NaN
        table[name] = table[name].astype(object).where(table[name].notna(), None)
    return table


def _row(
    r: Mapping[str, Any],
    cols: Sequence[str],
    latest: Mapping[str, Any],
    generated: Sequence[str],
    stop: Any,
    devices: Mapping[str, Any],
) -> dict[str, Any]:
    """One run's row of :func:`runs_table` (``r``: its store row with the live view over it; ``stop``: its
    :class:`~rapidfire_nb.view.stops.StopInfo` or None); every column, ``run_name`` and ``tags`` included."""
    hp = r.get("hparams") or {}
    labels = run_labels(r.get("config"))
    row = {"run_id": r["run_id"], "run_name": labels["run_name"], "status": r["status"]}
    row.update({c: hp.get(c) for c in cols})
    row.update(
        completed_steps=r.get("completed_steps"),
        total_steps=r.get("total_steps"),
        chunks_done=r.get("chunks_done"),
        epoch=r.get("epoch"),
        loss=latest.get("loss"),
        eval_loss=latest.get("eval_loss"),
    )
    row.update({name: latest.get(name) for name in generated})
    row.update(checkpoint_dir=r.get("checkpoint_dir"), error=r.get("error"))
    row["stop_reason"] = (
        r.get("stop_reason", stop.reason if stop is not None else None)
        if r["status"] == RunStatus.STOPPED.value
        else None
    )
    if devices:
        row["device"] = devices.get(str(r["run_id"]))
    row["sharding"] = run_sharding(r.get("config"))
    row["tags"] = labels["tags"]
    row["config"] = r.get("config")
    return row


def _with_live(row: dict[str, Any], snap: RunSnapshot | None) -> dict[str, Any]:
    """The store's ``row`` of a run with the scheduler's view over it (the freshest: e.g. a clone applied a moment
    ago), or ``row`` itself when this process does not train the run (``snap`` None)."""
    if snap is None:
        return row
    return {
        **row,
        "status": snap.status.value,
        "completed_steps": snap.step,
        "total_steps": snap.total_steps,
        "chunks_done": snap.segments_done,
        "epoch": snap.epoch if snap.steps_per_epoch else row.get("epoch"),
        "error": snap.error,
        "stop_reason": snap.stop_reason,
    }


def results_table(store: Any, live: Mapping[int, RunSnapshot], include_deleted: bool) -> Any:
    """``get_results()``: one row per (run_id, step), ``samples_seen`` (rows) and one column per metric name.

    Returns:
        A DataFrame sorted by ``run_id, step``; empty (columns ``run_id, step, samples_seen``) before the first
        logged step.
    """
    import pandas as pd

    points, _ = store.metrics_since(0)
    if not include_deleted:
        deleted = {
            r["run_id"]
            for r in store.runs()
            if (live[r["run_id"]].status if r["run_id"] in live else RunStatus(r["status"]))
            is RunStatus.DELETED
        }
        points = [p for p in points if p["run_id"] not in deleted]
    if not points:
        return pd.DataFrame(columns=["run_id", "step", "samples_seen"])
    df = pd.DataFrame(points)
    wide = df.pivot_table(index=["run_id", "step"], columns="name", values="value", aggfunc="last")
    samples = df.groupby(["run_id", "step"])["samples_seen"].max()
    wide.insert(0, "samples_seen", samples)
    wide = wide.reset_index()
    wide.columns.name = None
    return wide.sort_values(["run_id", "step"]).reset_index(drop=True)


def ops_table(store: Any) -> Any:
    """Every op with its outcome (op_id, run_id, kind, source, state, message, ...)."""
    import pandas as pd

    return pd.DataFrame(store.ops())
