"""Which metrics an experiment is shown and compared by: its trainer kind's (GRPO: rewards, DPO: reward accuracy and
margin, SFT: losses; :class:`rapidfire_nb.schema.trainer_kinds.KindMetrics`) or ``run_fit(..., panel_metrics=[...],
best_by=...)``'s, resolved against what the runs have logged.

One choice for every window: the snapshot's ``panel_metrics`` (the panel's two default plots), ``metric_columns``
(the run table's metric columns) and ``best_by`` (the best-run star, ``end()``'s summary, ``get_runs_info()`` and
the static copy). Standard library, :mod:`rapidfire_nb.meta_keys` and the torch-free trainer-kind table only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import meta_keys
from ..schema.trainer_kinds import TRAINER_KINDS, KindMetrics, metric_mode

__all__ = [
    "MetricChoice",
    "best_run",
    "metric_choice",
    "metric_title",
    "resolve_metrics",
    "run_value",
    "snapshot_best",
]


@dataclass(frozen=True)
class MetricChoice:
    """An experiment's metric candidates before they meet the logged values.

    Attributes:
        plots: per default plot, its candidates (the first one logged wins).
        columns: the table's candidate metric columns, in order.
        best_by: the ranking candidates (the first with a value for some run ranks).
    """

    plots: tuple[tuple[str, ...], ...]
    columns: tuple[str, ...]
    best_by: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        """Every name a snapshot reads the latest value of (each once, in order)."""
        return tuple(dict.fromkeys((*(n for p in self.plots for n in p), *self.columns, *self.best_by)))


def metric_choice(meta: Mapping[str, Any]) -> MetricChoice:
    """The choice for a store's meta: its ``trainer_type``'s defaults (SFT's for an unknown or missing one),
    overridden by meta ``panel_metrics`` (``{"plots": [...] | None, "best_by": str | None}``, run_fit's)."""
    kind = str(meta.get(meta_keys.TRAINER_TYPE) or "SFT").upper()
    facts: KindMetrics = TRAINER_KINDS[kind].metrics if kind in TRAINER_KINDS else KindMetrics()
    plots: tuple[tuple[str, ...], ...] = facts.plots
    columns, best = facts.columns, facts.best_by
    chosen = meta.get(meta_keys.PANEL_METRICS)
    if isinstance(chosen, Mapping):
        names = [n for n in chosen.get("plots") or () if isinstance(n, str)]
        if names:
            plots = tuple((n,) for n in names)
            columns = tuple(dict.fromkeys((*names, *columns)))
        if isinstance(chosen.get("best_by"), str):
            best = (chosen["best_by"],)
            columns = tuple(dict.fromkeys((*columns, best[0])))
    return MetricChoice(plots, columns, best)


#: Below this a column's values count as zero (GRPO's loss is 0.0 in training and ~1e-9 at evaluation).
_ZERO = 1e-6


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def resolve_metrics(
    choice: MetricChoice, latest: Mapping[int, Mapping[str, Any]], logged: Iterable[str], settled: bool = True
) -> dict[str, Any]:
    """The choice met with the logged values.

    Args:
        choice: :func:`metric_choice`.
        latest: run id -> metric name -> latest value (the store's).
        logged: every metric name the store holds (meta ``metric_names``).
        settled: some run has ended a chunk (then evaluated): a metric still absent will not come. Before that, a
            plot's column with no value yet keeps its place (no column appears and vanishes during chunk 1).

    Returns:
        ``{"panel_metrics": [plot 1, plot 2], "metric_columns": [...], "best_by": {"metric", "mode"}}``: each plot
        its first logged candidate (else its first); the columns with a finite value of at least 1e-6 in absolute
        value for some run (GRPO's loss columns, 0 and ~1e-9, are left out), and until ``settled`` the plots'
        columns without a value yet; ranking by the first candidate some run has a finite value for (else the
        first), ``mode`` ``"max"`` or ``"min"``.
    """
    known = set(logged)
    plots = [next((n for n in cands if n in known), cands[0]) for cands in choice.plots]
    values = [row for row in latest.values() if isinstance(row, Mapping)]

    def some(name: str, nonzero: bool = False) -> bool:
        return any(_finite(row.get(name)) and (not nonzero or abs(row[name]) >= _ZERO) for row in values)

    waiting = not settled or not any(
        some(c) for c in choice.columns
    )  # nothing decided yet for absent columns
    columns = [c for c in choice.columns if some(c, nonzero=True) or (waiting and c in plots and not some(c))]
    best = next((n for n in choice.best_by if some(n)), choice.best_by[0])
    return {
        "panel_metrics": plots,
        "metric_columns": columns or [c for c in choice.columns if c in plots],
        "best_by": {"metric": best, "mode": metric_mode(best)},
    }


def run_value(run: Mapping[str, Any], metric: str) -> Any:
    """A snapshot run's latest ``metric``: its ``metrics`` entry, else its own key (``loss``, ``eval_loss``)."""
    metrics = run.get("metrics")
    if isinstance(metrics, Mapping) and metric in metrics:
        return metrics[metric]
    return run.get(metric)


def best_run(
    runs: Iterable[Mapping[str, Any]], metric: str = "eval_loss", mode: str | None = None
) -> tuple[int, float] | None:
    """``(run_id, value)`` of the best run by ``metric`` among the runs that are not DELETED or FAILED (a failed
    run's last values are not a result; finite values only).

    Args:
        runs: snapshot run entries (values read by :func:`run_value`).
        metric: the metric.
        mode: ``"min"`` (lowest best) or ``"max"``; None: :func:`metric_mode` of ``metric``.

    Returns:
        The best run and its value; ties go to the lower run id; None when no run has a value.
    """
    sign = -1.0 if (mode or metric_mode(metric)) == "max" else 1.0
    best: tuple[int, float] | None = None
    for run in runs:
        value = run_value(run, metric)
        if run.get("status") in ("DELETED", "FAILED") or not _finite(value):
            continue
        if best is None or sign * value < sign * best[1]:
            best = (int(run["run_id"]), float(value))
    return best


def snapshot_best(
    snapshot: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]
) -> tuple[str, int, float] | None:
    """``(metric, run_id, value)`` of the best run by the snapshot's ``best_by`` (``eval_loss`` then ``loss`` for a
    snapshot without one), or None when no run has a value."""
    chosen = snapshot.get("best_by")
    if isinstance(chosen, Mapping) and isinstance(chosen.get("metric"), str):
        found = best_run(runs, chosen["metric"], chosen.get("mode"))
        return (chosen["metric"], *found) if found else None
    for metric in ("eval_loss", "loss"):
        found = best_run(runs, metric, "min")
        if found:
            return (metric, *found)
    return None


def metric_title(name: str) -> str:
    """A metric column's title: ``Loss``, ``Eval loss``, ``Reward``, ``Eval rewards/accuracies`` (``metricTitle`` in
    ``widgets/format.js`` is the same rule)."""
    if name.startswith("eval_") and len(name) > 5:
        return "Eval " + name[5:].replace("_", " ")
    return name[:1].upper() + name[1:].replace("_", " ")
