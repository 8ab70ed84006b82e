"""The panel's static copy: its final state as self-contained HTML, readable with no kernel and no network.

When an experiment ends (or its kernel shuts down cleanly) the live widget gives way to this rendering, so the
saved notebook keeps it and GitHub, nbviewer or a colleague's JupyterLab show it. Everything is drawn here, in
Python: the header (progress, training time, tqdm-like numbers), the runs table (the best run by ``eval_loss``
highlighted) and the ``loss`` / ``eval_loss`` curves as SVG images inlined as ``data:`` URIs. No script, no
plotly.js, no style sheet: inline styles only, and no ``<svg>`` element in the HTML itself, because the
sanitizer of an untrusted notebook (JupyterLab's, GitHub's) removes those but keeps ``<img>`` with a ``data:``
source. Every string that comes from the user (names, hyperparameters, errors, metric names) is escaped.

Standard library + :mod:`rapidfire_nb.view` / :mod:`rapidfire_nb.view.clock` only.
"""

from __future__ import annotations

import base64
import html
import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..view import fmt_metric, fmt_num
from ..view.clock import fmt_duration, stats_text
from ..view.metrics_view import metric_title, run_value, snapshot_best
from ..view.text import PRUNED, status_counts, status_label

__all__ = [
    "PALETTE",
    "curve_series",
    "nice_ticks",
    "render_html",
    "render_text",
    "run_color",
    "series_by_run",
    "short_hparam",
    "static_bundle",
]

#: TensorBoard 2.x's Time Series run palette (tensorboard/webapp/util/colors.ts ``DEFAULT_PALETTE``, light theme):
#: run n gets colour (n-1) mod 7, as in TensorBoard (runs listed first event first) and in the live panel
#: (``PALETTE`` in widgets/format.js).
PALETTE = ("#425066", "#12b5cb", "#e52592", "#f9ab00", "#9334e6", "#7cb342", "#e8710a")
_STATUS = {
    "NEW": "#64748b",
    "ONGOING": "#2563eb",
    "STOPPED": "#b45309",
    "COMPLETED": "#15803d",
    "FAILED": "#dc2626",
    "DELETED": "#6b7280",
    "INTERRUPTED": "#9333ea",
    PRUNED: "#b45309",  # a mark: the run's status stays STOPPED (view.text.status_label)
}
_MUTED = "#8a8f98"  # readable on light and dark backgrounds
_LINE = "#8885"  # grey at 1/3 opacity: visible on light and dark backgrounds
_MAX_POINTS = 240  # per run and curve (the copy stays small in the saved notebook)
_FONT = "system-ui,-apple-system,'Segoe UI',Roboto,sans-serif"


_HPARAM_SHORT = {  # the live panel's column titles (shortHparam in widgets/format.js)
    "learning_rate": "lr",
    "per_device_train_batch_size": "batch",
    "gradient_accumulation_steps": "grad acc",
    "num_train_epochs": "epochs",
    "max_steps": "max steps",
    "lora.r": "lora r",
    "lora.lora_alpha": "lora α",
    "lora.lora_dropout": "dropout",
    "lora.target_modules": "targets",
    "model_name": "model",
    "weight_decay": "wd",
    "warmup_ratio": "warmup",
    "lr_scheduler_type": "lr sched",
    "max_length": "max len",
}


def short_hparam(name: str) -> str:
    """A short column title for a hyperparameter (``lr``, ``lora r``, ...), as the live panel shows it."""
    if name in _HPARAM_SHORT:
        return _HPARAM_SHORT[name]
    if name.startswith("model_kwargs."):
        return name[len("model_kwargs.") :]
    if name.startswith("lora."):
        return "lora " + name[5:].removeprefix("lora_")
    return name.replace("_", " ")


def _e(value: Any) -> str:
    """Escape a value for HTML/XML text and attributes."""
    return html.escape(str(value), quote=True)


def run_color(run_id: Any) -> str:
    """The colour of run ``run_id`` (the live panel's ``runColor``)."""
    try:
        n = int(run_id)
    except (TypeError, ValueError):
        n = 1
    return PALETTE[(n - 1) % len(PALETTE)] if n > 0 else PALETTE[0]


# ------------------------------------------------------------------------------------------------ series


def series_by_run(points: Iterable[Mapping[str, Any]], metric: str) -> dict[int, list[tuple[float, float]]]:
    """Run id -> ``[(step, value)]`` of ``metric``, by step; missing and non-finite values are left out."""
    out: dict[int, dict[float, float]] = {}
    for p in points:
        value, step = p.get("value"), p.get("step")
        if (
            p.get("name") != metric
            or not isinstance(value, (int, float))
            or not isinstance(step, (int, float))
        ):
            continue
        if math.isfinite(value):
            out.setdefault(int(p["run_id"]), {})[float(step)] = float(value)
    return {rid: sorted(steps.items()) for rid, steps in out.items()}


def curve_series(
    points: Iterable[Mapping[str, Any]], runs: Sequence[Mapping[str, Any]], metric: str
) -> dict[int, list[tuple[float, float]]]:
    """:func:`series_by_run` of the runs shown (not DELETED), a warm clone's curve joined to its parent: it
    starts at the parent's point at the branch step (the parent's last point before the clone's first)."""
    shown = {int(r["run_id"]) for r in runs if r.get("status") != "DELETED"}
    series = series_by_run(points, metric)
    out = {rid: pts for rid, pts in series.items() if rid in shown}
    for run in runs:
        own, parent = series.get(int(run["run_id"])), run.get("parent_id")
        if not own or not run.get("warm_start") or parent is None:
            continue
        before = [pt for pt in series.get(int(parent), []) if pt[0] < own[0][0]]
        if before and int(run["run_id"]) in out:
            out[int(run["run_id"])] = [before[-1], *own]
    return out


def _thin(pts: list[tuple[float, float]], limit: int = _MAX_POINTS) -> list[tuple[float, float]]:
    if len(pts) <= limit:
        return pts
    stride = math.ceil(len(pts) / limit)
    return pts[::stride] + ([pts[-1]] if (len(pts) - 1) % stride else [])


# ------------------------------------------------------------------------------------------------ SVG


def nice_ticks(lo: float, hi: float, count: int = 5, integer: bool = False) -> list[float]:
    """About ``count`` round tick values covering ``[lo, hi]`` (1, 2 or 5 times a power of ten); whole numbers
    only when ``integer`` (optimizer steps)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi < lo:
        return []
    if hi == lo:
        return [lo]
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1.0, round(step))
    first = math.ceil(lo / step - 1e-9) * step
    ticks, k = [], 0
    while first + k * step <= hi + step * 1e-9:
        ticks.append(round(first + k * step, 12))
        k += 1
    return ticks


def _axis_text(value: float, integer: bool) -> str:
    return f"{int(round(value)):,}" if integer else fmt_num(value)


def _cross(x: float, y: float, color: str, run_id: int) -> str:
    """The ✂ mark at the last point of a pruned run's curve (an x, as the live panel's marker)."""
    d = f"M{x - 5:.0f},{y - 5:.0f}L{x + 5:.0f},{y + 5:.0f}M{x - 5:.0f},{y + 5:.0f}L{x + 5:.0f},{y - 5:.0f}"
    return f'<path data-rf-pruned="{run_id}" d="{d}" stroke="{color}" stroke-width="2.4" stroke-linecap="round"/>'


def _curve_svg(
    metric: str,
    series: Mapping[int, list[tuple[float, float]]],
    width: int,
    height: int,
    pruned: frozenset[int] = frozenset(),
) -> str:
    """One metric's curves (one polyline per run; a lone point as a dot) as an SVG document; the curve of a run in
    ``pruned`` (run ids early stopping pruned) ends in a cross."""
    left, right, top, bottom = 54, 12, 22, 34
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [y for pts in series.values() for _, y in pts]
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="{_e(_FONT)}" font-size="11">'
        f'<text x="{left}" y="14" fill="{_MUTED}" font-weight="600">{_e(metric)}</text>'
    )
    if not xs:
        return head + (
            f'<text x="{width / 2}" y="{height / 2}" fill="{_MUTED}" text-anchor="middle">'
            f"no {_e(metric)} points</text></svg>"
        )
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    pad = (y1 - y0) * 0.06 or abs(y0) * 0.05 or 1.0
    y0, y1 = y0 - pad, y1 + pad
    x1 = x1 if x1 > x0 else x0 + 1
    px = lambda x: left + (x - x0) / (x1 - x0) * (width - left - right)  # noqa: E731
    py = lambda y: top + (y1 - y) / (y1 - y0) * (height - top - bottom)  # noqa: E731
    parts = [head]
    for t in nice_ticks(y0, y1, 4):
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{py(t):.0f}" y2="{py(t):.0f}" stroke="{_LINE}"/>'
            f'<text x="{left - 6}" y="{py(t) + 3.5:.0f}" fill="{_MUTED}" text-anchor="end">'
            f"{_e(_axis_text(t, False))}</text>"
        )
    for t in nice_ticks(x0, x1, 6, integer=True):
        parts.append(
            f'<text x="{px(t):.0f}" y="{height - bottom + 15}" fill="{_MUTED}" text-anchor="middle">'
            f"{_e(_axis_text(t, True))}</text>"
        )
    parts.append(
        f'<line x1="{left}" x2="{width - right}" y1="{height - bottom}" y2="{height - bottom}" stroke="{_MUTED}"/>'
        f'<text x="{(left + width - right) / 2}" y="{height - 4}" fill="{_MUTED}" text-anchor="middle">'
        "optimizer step</text>"
    )
    for rid in sorted(series):
        parts += _run_curve(rid, _thin(series[rid]), px, py, rid in pruned)
    parts.append("</svg>")
    return "".join(parts)


def _run_curve(rid: int, pts: list[tuple[float, float]], px: Any, py: Any, pruned: bool) -> list[str]:
    """One run's polyline (a lone point: a dot; sparse points: dots too), a cross at its end when pruned."""
    color = run_color(rid)
    parts = [_cross(px(pts[-1][0]), py(pts[-1][1]), color, rid)] if pruned else []
    if len(pts) == 1:
        return [*parts, f'<circle cx="{px(pts[0][0]):.0f}" cy="{py(pts[0][1]):.0f}" r="3" fill="{color}"/>']
    coords = " ".join(f"{px(x):.0f},{py(y):.0f}" for x, y in pts)
    parts.append(
        f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.8" '
        'stroke-linejoin="round" stroke-linecap="round"/>'
    )
    if len(pts) <= 12:  # sparse series (eval points): markers too
        parts += [f'<circle cx="{px(x):.0f}" cy="{py(y):.0f}" r="2.4" fill="{color}"/>' for x, y in pts]
    return parts


def _svg_img(svg: str, alt: str, width: int, height: int) -> str:
    data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    return (
        f'<img src="data:image/svg+xml;base64,{data}" alt="{_e(alt)}" width="{width}" height="{height}" '
        'style="width:calc(50% - 8px);min-width:280px;max-width:100%;height:auto;margin:0;'
        'border:1px solid rgba(128,128,128,0.3);border-radius:6px">'
    )


# ------------------------------------------------------------------------------------------------ HTML

# explicit alignment everywhere: a notebook's own table styles (JupyterLab right-aligns cells) must not apply
_TD = (
    "padding:3px 8px;border-bottom:1px solid "
    + _LINE
    + ";white-space:nowrap;vertical-align:top;text-align:left"
)
_TH = _TD + ";text-align:left;font-weight:600;color:" + _MUTED + ";font-size:11px"
_NUM = ";text-align:right"


def _badge(text: str, color: str) -> str:
    return (
        f'<span style="padding:0 5px;border:1px solid {color};border-radius:4px;color:{color};font-size:10px;'
        f'font-weight:600">{_e(text)}</span>'
    )


def _swatch(run_id: Any) -> str:
    return (
        f'<span style="display:inline-block;width:10px;height:10px;border-radius:3px;margin-right:6px;'
        f'background:{run_color(run_id)}"></span>'
    )


def _hparam(value: Any) -> str:
    """A hyperparameter as the live panel shows it (``fmtHparam``): numbers by fmt_num, text as is, else JSON."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return fmt_num(value)
    if isinstance(value, str):
        return value
    try:
        return "-" if value is None else json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def _run_cell(run: Mapping[str, Any], best: bool) -> str:
    rid = run["run_id"]
    cell = f"{_swatch(rid)}<b>run {_e(rid)}</b>" + (" ★" if best else "")
    if run.get("parent_id") is not None:
        how = " · warm" if run.get("warm_start") else ""
        cell += f'<br><span style="color:{_MUTED};font-size:10.5px">↳ run {_e(run["parent_id"])}{how}</span>'
    return cell


def _metric_columns(snapshot: Mapping[str, Any]) -> list[str]:
    """The table's metric columns: the snapshot's ``metric_columns`` (its trainer kind's, those zero or absent for
    every run left out), ``loss`` / ``eval_loss`` for a snapshot without them."""
    cols = snapshot.get("metric_columns")
    return [c for c in cols if isinstance(c, str)] if isinstance(cols, list) else ["loss", "eval_loss"]


def _table(snapshot: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], best: int | None) -> str:
    cols = [c for c in snapshot.get("hparam_columns") or [] if isinstance(c, str)]
    device = any(r.get("device") for r in runs)  # several devices (run_fit(devices=...)): a Device column
    first = ["Run", "Status", *(["Device"] if device else [])]
    metrics = _metric_columns(snapshot)
    heads = [*first, *cols, "Step", "Chunks", *(metric_title(m) for m in metrics), "Samples"]
    fixed = {*first, "Step", "Chunks", *(metric_title(m) for m in metrics), "Samples"}
    head = "".join(
        f'<th style="{_TH}{"" if h in first else _NUM}" title="{_e(h)}">'
        f"{_e(h if h in fixed else short_hparam(h))}</th>"
        for h in heads
    )
    rows = []
    for run in runs:
        status = str(run.get("status"))
        label = status_label(run)  # ✂ PRUNED for a run early stopping stopped
        hl = ";background-color:rgba(234,179,8,0.16)" if run["run_id"] == best else ""
        total = run.get("num_segments") or snapshot.get("num_chunks") or "-"
        cells = [
            f'<td style="{_TD}">{_run_cell(run, run["run_id"] == best)}</td>',
            f'<td style="{_TD}" data-rf-status="{_e(label)}">'
            f"{_badge('✂ PRUNED' if label == PRUNED else label, _STATUS.get(label, _MUTED))}</td>",
            *(
                [f'<td style="{_TD}" data-rf-device-cell="">{_e(run.get("device") or "-")}</td>']
                if device
                else []
            ),
            *(
                f'<td style="{_TD}{_NUM};white-space:normal;word-break:break-word">'
                f"{_e(_hparam((run.get('hparams') or {}).get(c)))}</td>"
                for c in cols
            ),
            f'<td style="{_TD}{_NUM}">{_e(run.get("completed_steps") or 0)}/{_e(run.get("total_steps") or 0)}</td>',
            f'<td style="{_TD}{_NUM}">{_e(run.get("chunks_done") or 0)}/{_e(total)}</td>',
            *(f'<td style="{_TD}{_NUM}">{_e(fmt_metric(run_value(run, m)))}</td>' for m in metrics),
            f'<td style="{_TD}{_NUM}">{_e(run.get("samples_seen") or 0)}</td>',
        ]
        rows.append(f'<tr data-run-id="{_e(run["run_id"])}" style="{hl[1:]}">{"".join(cells)}</tr>')
        if status == "FAILED" and run.get("error"):
            rows.append(
                f'<tr><td colspan="{len(heads)}" style="{_TD};white-space:normal;color:{_STATUS["FAILED"]}">'
                f"run {_e(run['run_id'])} failed: {_e(run['error'])}</td></tr>"
            )
        elif label == PRUNED and run.get("stop_reason"):
            rows.append(
                f'<tr data-pruned-for="{_e(run["run_id"])}"><td colspan="{len(heads)}" style="{_TD};'
                f'white-space:normal;color:{_MUTED}">run {_e(run["run_id"])} ✂ early stopping: '
                f"{_e(run['stop_reason'])}</td></tr>"
            )
    return (
        '<div style="overflow-x:auto;border:1px solid rgba(128,128,128,0.3);border-radius:6px;margin:6px 0">'
        f'<table style="border-collapse:collapse;width:100%;margin:0;font-size:12px;color:inherit"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _device_chips(snapshot: Mapping[str, Any]) -> list[str]:
    """One chip per device with several devices (``cpu:0 · run 3``, ``cpu:1 · idle``, ``cpu:2 · lost``)."""
    out = []
    for d in snapshot.get("devices") or []:
        rid = d.get("run_id") if d.get("state") == "training" else None
        out.append(f"{d.get('name')} · {'run ' + str(rid) if rid is not None else d.get('state') or '—'}")
    return out


def _header(snapshot: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], note: str) -> str:
    counts = status_counts(runs)  # "2 pruned" apart from "1 stopped"
    chips = [
        f"training time {fmt_duration(snapshot.get('elapsed_s'))}",
        str(snapshot.get("progress") or ""),
        str(snapshot.get("early_stopping") or ""),
        stats_text(snapshot.get("stats") or {}),
        *_device_chips(snapshot),
        ", ".join(f"{n} {st.lower()}" for st, n in counts.items()),
    ]
    chip = (
        '<span style="display:inline-block;margin:0 6px 4px 0;padding:1px 8px;border:1px solid '
        f'{_LINE};border-radius:999px;font-size:11.5px">'
    )
    return (
        '<div style="display:flex;flex-wrap:wrap;align-items:baseline;gap:4px 12px">'
        f'<span style="font-size:15px;font-weight:600">{_e(snapshot.get("experiment", ""))}</span>'
        f"<span>{''.join(f'{chip}{_e(c)}</span>' for c in chips if c)}</span></div>"
        f'<div style="color:{_MUTED};font-size:11.5px">{_e(note)}</div>'
    )


def _curves(
    points: Sequence[Mapping[str, Any]], runs: Sequence[Mapping[str, Any]], metrics: Sequence[str]
) -> str:
    imgs = []
    pruned = frozenset(int(r["run_id"]) for r in runs if status_label(r) == PRUNED)
    for metric in metrics:
        series = curve_series(points, runs, metric)
        svg = _curve_svg(metric, series, 460, 230, pruned)
        imgs.append(_svg_img(svg, f"{metric} by optimizer step", 460, 230))
    legend = "".join(
        f'<span style="margin-right:12px;white-space:nowrap">{_swatch(r["run_id"])}run {_e(r["run_id"])}</span>'
        for r in runs
    )
    return (
        f'<div style="font-size:11.5px;margin:4px 0">{legend}</div>'
        f'<div style="display:flex;flex-wrap:wrap;gap:10px">{"".join(imgs)}</div>'
    )


def render_html(
    snapshot: Mapping[str, Any],
    points: Sequence[Mapping[str, Any]],
    *,
    note: str = "",
    metrics: Sequence[str] | None = None,
) -> str:
    """The static copy of a panel: header, runs table, curves (see the module docstring).

    Args:
        snapshot: a panel snapshot (``docs/ARCHITECTURE.md``, "Panel source").
        points: every metric point (``run_id``, ``step``, ``name``, ``value``).
        note: one line under the header (e.g. why this is a static copy).
        metrics: the curves drawn, one image each (None: the snapshot's ``panel_metrics``, the trainer kind's
            default plots; ``loss`` / ``eval_loss`` for a snapshot without them).

    Returns:
        One ``<div data-rf-static>`` element, self-contained.
    """
    runs = sorted(
        (r for r in snapshot.get("runs") or [] if r.get("status") != "DELETED"), key=lambda r: r["run_id"]
    )
    best = snapshot_best(snapshot, runs)  # the snapshot's best_by (GRPO: eval_reward, highest first)
    best_id = best[1] if best else None
    if metrics is None:
        metrics = [m for m in snapshot.get("panel_metrics") or () if isinstance(m, str)] or [
            "loss",
            "eval_loss",
        ]
    return (
        f'<div data-rf-static="" data-rf-experiment="{_e(snapshot.get("experiment", ""))}" '
        'style="box-sizing:border-box;max-width:960px;padding:10px 12px;border:1px solid rgba(128,128,128,0.35);'
        f'border-radius:8px;font-family:{_FONT};font-size:12.5px;line-height:1.4">'
        f"{_header(snapshot, runs, note)}{_table(snapshot, runs, best_id)}"
        f"{_curves(points, runs, metrics)}</div>"
    )


def render_text(snapshot: Mapping[str, Any]) -> str:
    """The ``text/plain`` form of the copy: the header line and one line per run."""
    lines = [f"{snapshot.get('experiment', '')}: {snapshot.get('progress') or ''}".strip()]
    for run in sorted(snapshot.get("runs") or [], key=lambda r: r["run_id"]):
        if run.get("status") == "DELETED":
            continue
        lines.append(
            f"  run {run['run_id']}  {status_label(run)}{'  ' + run['device'] if run.get('device') else ''}  step {run.get('completed_steps') or 0}/"
            f"{run.get('total_steps') or 0}  "
            + "  ".join(f"{m} {fmt_metric(run_value(run, m))}" for m in _metric_columns(snapshot))
        )
    return "\n".join(lines)


def static_bundle(
    snapshot: Mapping[str, Any], points: Sequence[Mapping[str, Any]], *, note: str | None = None
) -> dict[str, str]:
    """``{"text/html": ..., "text/plain": ...}``, the display data that replaces a live panel."""
    if note is None:
        when = time.strftime(
            "%Y-%m-%d %H:%M:%S %Z", time.localtime(float(snapshot.get("now") or time.time()))
        )
        note = f"Final state at {when}: a static copy of the live panel, readable without a kernel."
    return {"text/html": render_html(snapshot, points, note=note), "text/plain": render_text(snapshot)}
