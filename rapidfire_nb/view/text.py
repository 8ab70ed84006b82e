"""The text formats of an experiment: numbers, metric values, chunk positions and the text-progress lines.

One number format for the kernel's lines, the text progress of scripts, the static copy of the panel and the
front end (``fmtNum`` / ``fmtMetric`` in ``widgets/format.js`` follow :func:`fmt_num` / :func:`fmt_metric`).
Re-exported by :mod:`rapidfire_nb.view`. Standard library, :mod:`kernel_scheduler` and :mod:`rapidfire_nb.view.clock` only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from kernel_scheduler import RunSnapshot, RunStatus

from .clock import fmt_duration
from .metrics_view import best_run, snapshot_best

__all__ = [
    "best_run",
    "chunk_line",
    "chunk_position",
    "chunks_note",
    "cut_at_word",
    "early_stopping_text",
    "final_summary",
    "fmt_metric",
    "fmt_num",
    "format_chunk_line",
    "position_text",
    "run_label",
    "run_labels",
    "status_counts",
    "status_label",
]

_LATEST = ("loss", "eval_loss")


def run_labels(config: Any) -> dict[str, Any]:
    """A run's name and tags from its stored config (``LeafConfig.to_json()``, the store's ``config`` column).

    Returns:
        ``{"run_name": str | None, "tags": [str, ...]}``; a config recorded before runs had names (or malformed)
        gives ``None`` and ``[]``.
    """
    config = config if isinstance(config, Mapping) else {}
    name, tags = config.get("run_name"), config.get("tags")
    return {
        "run_name": name if isinstance(name, str) and name else None,
        "tags": [t for t in tags if isinstance(t, str)] if isinstance(tags, (list, tuple)) else [],
    }


def run_label(run: Mapping[str, Any]) -> str:
    """``"run 3"``, or ``"run 3 · baseline"`` for a run named ``baseline`` (a snapshot's run entry): the id first,
    the name a label next to it."""
    name = run.get("run_name")
    return f"run {run.get('run_id')}" + (f" · {name}" if isinstance(name, str) and name else "")


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


def fmt_metric(value: Any) -> str:
    """A metric value (loss, eval_loss, ...) as the tables show it: 4 significant digits, trailing zeros kept
    so that a column reads evenly (``3.510`` beside ``3.136``); exponent form as :func:`fmt_num`; ``-`` for None
    or a non-finite value (a NaN is never shown as a number)."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-" if value is None else str(value)
    if not math.isfinite(value):
        return "-"
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return fmt_num(float(value))
    return f"{value:#.4g}".rstrip(".")


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


def cut_at_word(text: str, limit: int) -> str:
    """``text`` whole when it has at most ``limit`` characters, else cut at the last space before the limit (at the
    limit when there is none in its second half) and ended with ``…``; the result has at most ``limit`` characters."""
    if len(text) <= limit:
        return text
    head = text[: max(limit - 1, 0)]
    space = head.rfind(" ")
    return (head[:space] if space >= limit // 2 else head).rstrip(" ,;:·") + "…"


def chunks_note(run: Mapping[str, Any], num_chunks: Any) -> str | None:
    """Why a run's chunk count is not a whole number of epochs' chunks, or None when it is.

    A run's chunks over all epochs (``num_segments``) end where its step budget ends: a ``max_steps`` (or a
    fractional ``num_train_epochs``) that ends inside an epoch leaves that epoch's later chunks out, so a run can
    show ``Chunks 0/1`` while the experiment has 2 chunks per epoch (the GRPO tutorial's CPU settings: 4 steps of 8
    per epoch for ``num_generations`` 4, one prompt a step).

    Args:
        run: a snapshot run (``num_segments``, ``total_steps``).
        num_chunks: the experiment's chunks per epoch.

    Returns:
        E.g. ``"1 chunk in all, with 2 chunks per epoch: its step budget (4 steps: max_steps, or a fractional
        num_train_epochs) ends in chunk 1/2 of epoch 1"``.
    """
    total, steps = _count(run.get("num_segments")), run.get("total_steps")
    per_epoch = _count(num_chunks)
    if not total or not per_epoch or total % per_epoch == 0:
        return None
    num_chunks = per_epoch
    epoch, chunk = chunk_position(total - 1, num_chunks)
    budget = f"{steps} steps: " if isinstance(steps, int) and steps > 0 else ""
    return (
        f"{total} chunk{'' if total == 1 else 's'} in all, with {num_chunks} chunks per epoch: its step budget "
        f"({budget}max_steps, or a fractional num_train_epochs) ends in chunk {chunk}/{num_chunks} of epoch {epoch}"
    )


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
        elapsed: training seconds (shown as ``h:mm:ss``).

    Returns:
        E.g. ``[demo 0:01:23]  run 2  chunk 3/4  step 60/80  loss 0.8123  eval_loss 0.9012  lr=1e-4``; a run's
        trainer-kind metrics (``run["metrics"]``: GRPO ``reward 0.75``) follow its losses.
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
        parts.append(status_label(run))  # a pruned run: PRUNED
    chunks = run.get("chunks_done")
    # a later epoch: "chunk 1/4 of epoch 2" (not "chunk 5/4")
    if isinstance(chunks, int) and num_chunks and chunks > num_chunks:
        parts.append(position_text(*chunk_position(chunks - 1, num_chunks), num_chunks))
    elif chunks is not None:
        parts.append(f"chunk {chunks}/{num_chunks}" if num_chunks else f"chunks {chunks}")
    if run.get("total_steps"):
        parts.append(f"step {run.get('completed_steps', 0)}/{run.get('total_steps')}")
    parts += [f"{key} {fmt_num(run.get(key))}" for key in _LATEST if run.get(key) is not None]
    metrics = run.get("metrics")
    kind: Mapping[str, Any] = metrics if isinstance(metrics, Mapping) else {}
    parts += [
        f"{k} {fmt_num(v)}" for k, v in kind.items() if k not in _LATEST and v is not None
    ]  # GRPO: reward
    if run.get("samples_seen") is not None:
        parts.append(f"samples {run.get('samples_seen')}")
    hparams = run.get("hparams") or {}
    parts += [f"{_short_col(col)}={fmt_num(hparams[col])}" for col in hparam_columns if col in hparams]
    return "  ".join(p for p in parts if p)


#: The mark a pruned run wears in place of its status (it keeps the status STOPPED, source ``early_stopping``).
PRUNED = "PRUNED"
#: The order of the counts ("3 completed, 1 stopped, 2 pruned"): a pruned run counts apart from the user's stops.
_COUNT_ORDER = (*(s.value for s in RunStatus if s is not RunStatus.STOPPED), RunStatus.STOPPED.value, PRUNED)


def status_label(run: Mapping[str, Any]) -> str:
    """What a snapshot run's status reads as: ``"PRUNED"`` for a STOPPED run the early-stopping policy stopped
    (``run["pruned"]``), else its status (``"STOPPED"`` for a user's stop). The panel's ``runMark``
    (widgets/state.js) shows the same ✂ PRUNED badge."""
    status = str(run.get("status"))
    return PRUNED if status == RunStatus.STOPPED.value and run.get("pruned") else status


def status_counts(runs: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Label (:func:`status_label`) -> number of runs, most first (ties: the order of the statuses, PRUNED after
    STOPPED); e.g. ``{"COMPLETED": 3, "PRUNED": 2, "STOPPED": 1}``."""
    counts: dict[str, int] = {}
    for run in runs:
        label = status_label(run)
        counts[label] = counts.get(label, 0) + 1
    rank = {s: i for i, s in enumerate(_COUNT_ORDER)}
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], rank.get(kv[0], len(rank)))))


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def pruning_saved(runs: Iterable[Mapping[str, Any]]) -> str:
    """What early stopping saved: `` (saved 96 of 192 steps)`` — the steps the pruned runs did not train (their
    ``total_steps - completed_steps``) out of every run's full budget (DELETED runs left out); ``""`` when nothing
    was pruned or the numbers are unknown."""
    runs = [r for r in runs if r.get("status") != RunStatus.DELETED.value]
    budget = sum(_count(r.get("total_steps")) or 0 for r in runs)
    saved = sum(
        max(0, (_count(r.get("total_steps")) or 0) - (_count(r.get("completed_steps")) or 0))
        for r in runs
        if r.get("pruned")
    )
    return f" (saved {saved:,} of {budget:,} steps)" if budget > 0 and saved > 0 else ""


def early_stopping_text(
    progress: Mapping[str, Any] | None, runs: Iterable[Mapping[str, Any]] = ()
) -> str | None:
    """The header's early-stopping line, from the policy's progress (``EarlyStoppingPolicy.progress()``).

    Args:
        progress: the policy's progress dict (the scheduler's, or meta ``early_stopping``); None or ``{}``: no
            policy, or it was switched off.
        runs: the snapshot's run entries (their ``pruned`` flags count the runs a rung policy stopped).

    Returns:
        ``"Optuna: 11 of 24 trials asked · 5 pruned · 3 running"`` for a search, ``"successive halving (η=2) on
        eval_loss: 4 pruned (saved 96 of 192 steps), next rung at chunk 4"`` for a rung policy (``"no rung left"``
        once none is ahead; what pruning saved: :func:`pruning_saved`),
        the policy's label for any other; None without a progress dict. Values of the wrong type are left out,
        never raised on (the dict may come from an older store).
    """
    if not isinstance(progress, Mapping) or not progress:
        return None
    label = progress.get("label")
    label = label if isinstance(label, str) and label else "early stopping"
    name = progress.get("name")
    name = name if isinstance(name, str) and name else label
    runs = [r for r in runs if r.get("status") != RunStatus.DELETED.value]  # a deleted run is not counted
    pruned_runs = sum(1 for r in runs if r.get("pruned"))
    kind = progress.get("kind")
    if kind == "search" and _count(progress.get("trials")) is not None:
        text = f"{name}: {progress['trials']}"
        budget = _count(progress.get("budget"))
        text += f" of {budget} trials asked" if budget is not None else " trials asked"
        pruned = _count(progress.get("pruned"))
        text += f" · {pruned_runs if pruned is None else pruned} pruned"
        running = _count(progress.get("running"))
        return text + (f" · {running} running" if running is not None else "")
    if kind == "rungs":
        metric = progress.get("metric")
        text = f"{name} on {metric}" if isinstance(metric, str) and metric else name
        rung = _count(progress.get("next_rung"))
        ahead = f"next rung at chunk {rung}" if rung is not None else "no rung left"
        return f"{text}: {pruned_runs} pruned{pruning_saved(runs)}, {ahead}"
    return label


def final_summary(snapshot: Mapping[str, Any]) -> str:
    """The line printed when an experiment ends, e.g. ``experiment 'sft' ended: 4 runs (3 completed, 1 pruned);
    best eval_loss 0.8123 (run 2); training time 1:23``: the best run by the snapshot's ``best_by`` (its trainer
    kind's metric, e.g. ``best eval_reward 0.7500 (run 2)`` for GRPO; :mod:`rapidfire_nb.view.metrics_view`)."""
    runs = [r for r in snapshot.get("runs") or [] if r.get("status") != RunStatus.DELETED.value]
    parts = ", ".join(f"{n} {st.lower()}" for st, n in status_counts(runs).items())
    text = (
        f"experiment {snapshot.get('experiment', '')!r} ended: {len(runs)} run{'' if len(runs) == 1 else 's'}"
    )
    text += f" ({parts})" if parts else ""
    best = snapshot_best(snapshot, runs)
    if best is not None:
        text += f"; best {best[0]} {fmt_metric(best[2])} (run {best[1]})"
    if snapshot.get("elapsed_s") is not None:
        text += f"; training time {fmt_duration(snapshot['elapsed_s'])}"
    return text
