"""The panel's static copy: its final state as self-contained HTML, readable with no kernel and no network.

When an experiment ends (or its kernel shuts down cleanly) the live widget gives way to this rendering, so the
saved notebook keeps it and GitHub, nbviewer or a colleague's JupyterLab show it. Everything is drawn here, in
Python: the header (progress, training time, tqdm-like numbers), the runs table (the best run by the snapshot's
``best_by`` highlighted; one line per run, long values cut with an ellipsis and whole in the cell's ``title``), each
stopped run's reason (the early-stopping policy's, a bulk stop's or the user's), the curves as SVG images inlined as
``data:`` URIs (:mod:`rapidfire_nb.panel.static_svg`), the plot settings they were drawn with and a collapsed ops
log ("how we got here"). No script, no plotly.js, no style sheet: inline styles only, and no ``<svg>`` element in
the HTML itself, because the sanitizer of an untrusted notebook (JupyterLab's, GitHub's) removes those but keeps
``<img>`` with a ``data:`` source and ``<details>``. Every string that comes from the user (names,
hyperparameters, errors, metric names, reasons, op messages) is escaped.

The plot settings are the snapshot's optional ``plot_settings`` (``{"metrics": [str], "smoothing": 0..0.999,
"y_scale": "auto"|"linear"|"log"}``, the live panel's when it reports them), else the live panel's defaults: the
snapshot's ``panel_metrics``, no smoothing, the "auto" y scale (``widgets/curves.js`` ``yScale``).

Standard library + :mod:`rapidfire_nb.view` / :mod:`rapidfire_nb.view.clock` only.
"""

from __future__ import annotations

import html
import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..view import fmt_metric, fmt_num
from ..view.clock import fmt_duration, stats_text
from ..view.metrics_view import metric_title, run_value, snapshot_best
from ..view.text import PRUNED, chunks_note, run_label, status_counts, status_label
from .static_svg import (
    FONT,
    curve_series,
    curve_svg,
    nice_ticks,
    scale_cue,
    series_by_run,
    svg_img,
    x_range,
    y_scale,
)

__all__ = [
    "PALETTE",
    "curve_series",
    "nice_ticks",
    "plot_settings",
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
_FONT = FONT
_MAX_OPS = 300  # ops listed in the ops log (the latest; the copy stays small in the saved notebook)
_SCALES = ("auto", "linear", "log")

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


# ------------------------------------------------------------------------------------------------ HTML

# explicit alignment everywhere: a notebook's own table styles (JupyterLab right-aligns cells) must not apply
_TD = (
    "padding:3px 8px;border-bottom:1px solid "
    + _LINE
    + ";white-space:nowrap;vertical-align:top;text-align:left"
)
_TH = _TD + ";text-align:left;font-weight:600;color:" + _MUTED + ";font-size:11px"
_NUM = ";text-align:right"
#: One line per cell: a value wider than this is cut with an ellipsis, whole in the cell's title (hover).
_CUT = "display:inline-block;max-width:{w};overflow:hidden;text-overflow:ellipsis;white-space:nowrap;vertical-align:top"


def _clipped(text: str, width: str = "12em") -> str:
    """``text`` on one line at most ``width`` wide, cut with an ellipsis; the whole text in its ``title``."""
    return f'<span style="{_CUT.format(w=width)}" title="{_e(text)}">{_e(text)}</span>'


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
    if run.get("run_name"):  # the name under the id, one line cut with an ellipsis (whole in its title)
        cell += (
            f'<br><span data-rf-run-name="" style="font-size:11px">{_clipped(str(run["run_name"]))}</span>'
        )
    if run.get("parent_id") is not None:
        how = " · warm" if run.get("warm_start") else ""
        cell += f'<br><span style="color:{_MUTED};font-size:10.5px">↳ run {_e(run["parent_id"])}{how}</span>'
    return cell


def _metric_columns(snapshot: Mapping[str, Any]) -> list[str]:
    """The table's metric columns: the snapshot's ``metric_columns`` (its trainer kind's, those zero or absent for
    every run left out), ``loss`` / ``eval_loss`` for a snapshot without them."""
    cols = snapshot.get("metric_columns")
    return [c for c in cols if isinstance(c, str)] if isinstance(cols, list) else ["loss", "eval_loss"]


def _status_cell(run: Mapping[str, Any]) -> str:
    """The status badge (✂ PRUNED for a run early stopping stopped); a stopped run's reason in its title."""
    label = status_label(run)
    why = run.get("stop_reason") if run.get("status") == "STOPPED" else None
    title = f' title="{_e(why)}"' if why else ""
    badge = _badge("✂ PRUNED" if label == PRUNED else label, _STATUS.get(label, _MUTED))
    return f'<td style="{_TD}" data-rf-status="{_e(label)}"{title}>{badge}</td>'


def _reason_row(run: Mapping[str, Any], span: int) -> str:
    """The row under a failed run (its error) or a stopped one (why: the policy's, a bulk stop's or the user's)."""
    rid, label = run["run_id"], status_label(run)
    style = f"{_TD};white-space:normal"
    if run.get("status") == "FAILED" and run.get("error"):
        return (
            f'<tr><td colspan="{span}" style="{style};color:{_STATUS["FAILED"]}">'
            f"run {_e(rid)} failed: {_e(run['error'])}</td></tr>"
        )
    if run.get("status") != "STOPPED" or not run.get("stop_reason"):
        return ""
    attr, what = (
        ("data-pruned-for", "✂ early stopping") if label == PRUNED else ("data-stopped-for", "stopped")
    )
    return (
        f'<tr {attr}="{_e(rid)}"><td colspan="{span}" style="{style};color:{_MUTED}">'
        f"run {_e(rid)} {what}: {_e(run['stop_reason'])}</td></tr>"
    )


def _chunks_cell(run: Mapping[str, Any], snapshot: Mapping[str, Any]) -> str:
    total = run.get("num_segments") or snapshot.get("num_chunks") or "-"
    text = f"{_e(run.get('chunks_done') or 0)}/{_e(total)}"
    note = chunks_note(run, snapshot.get("num_chunks"))
    return f'<td style="{_TD}{_NUM}"' + (f' title="{_e(note)}">{text} *' if note else f">{text}") + "</td>"


def device_text(run: Mapping[str, Any]) -> str:
    """The Device cell: the run's device (``cpu:0+cpu:1`` over several) and how it is sharded, ``-`` unknown."""
    device, sharding = run.get("device"), run.get("sharding")
    if not device:
        return "-"
    return f"{device} · {sharding}" if sharding else str(device)


def _pack_text(run: Mapping[str, Any]) -> str:
    """The Pack cell: the id of the pack the run trains in, ``-`` alone."""
    pack = run.get("pack")
    return str(pack) if isinstance(pack, int) else "-"


def _table(snapshot: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], best: int | None) -> str:
    cols = [c for c in snapshot.get("hparam_columns") or [] if isinstance(c, str)]
    device = any(r.get("device") for r in runs)  # several devices (run_fit(devices=...)): a Device column
    pack = any(isinstance(r.get("pack"), int) for r in runs)  # some run trains packed: a Pack column
    first = ["Run", "Status", *(["Device"] if device else []), *(["Pack"] if pack else [])]
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
        hl = ";background-color:rgba(234,179,8,0.16)" if run["run_id"] == best else ""
        hparams = run.get("hparams") or {}
        cells = [
            f'<td style="{_TD}">{_run_cell(run, run["run_id"] == best)}</td>',
            _status_cell(run),
            *([f'<td style="{_TD}" data-rf-device-cell="">{_e(device_text(run))}</td>'] if device else []),
            *([f'<td style="{_TD}" data-rf-pack-cell="">{_e(_pack_text(run))}</td>'] if pack else []),
            *(f'<td style="{_TD}{_NUM}">{_clipped(_hparam(hparams.get(c)))}</td>' for c in cols),
            f'<td style="{_TD}{_NUM}">{_e(run.get("completed_steps") or 0)}/{_e(run.get("total_steps") or 0)}</td>',
            _chunks_cell(run, snapshot),
            *(f'<td style="{_TD}{_NUM}">{_e(fmt_metric(run_value(run, m)))}</td>' for m in metrics),
            f'<td style="{_TD}{_NUM}">{_e(run.get("samples_seen") or 0)}</td>',
        ]
        rows.append(f'<tr data-run-id="{_e(run["run_id"])}" style="{hl[1:]}">{"".join(cells)}</tr>')
        rows.append(_reason_row(run, len(heads)))
    return (
        '<div style="overflow-x:auto;border:1px solid rgba(128,128,128,0.3);border-radius:6px;margin:6px 0">'
        f'<table style="border-collapse:collapse;width:100%;margin:0;font-size:12px;color:inherit"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _ops_log(snapshot: Mapping[str, Any]) -> str:
    """The ops log as a collapsed ``<details>``: every op (the latest :data:`_MAX_OPS`) with its time, run, kind,
    outcome and message, oldest first; "" without ops."""
    ops = [o for o in snapshot.get("ops") or [] if isinstance(o, Mapping)]
    if not ops:
        return ""
    ops.sort(key=lambda o: float(o.get("applied_at") or o.get("requested_at") or 0.0))
    left = len(ops) - _MAX_OPS
    rows = []
    for op in ops[-_MAX_OPS:]:
        at = op.get("applied_at") or op.get("requested_at")
        when = time.strftime("%H:%M:%S", time.localtime(float(at))) if isinstance(at, (int, float)) else "-"
        rid = op.get("run_id")
        cells = (when, "-" if rid is None else f"run {rid}", op.get("kind") or "-", op.get("state") or "-")
        rows.append(
            f'<tr data-rf-op="{_e(op.get("op_id") or "")}">'
            + "".join(f'<td style="{_TD}">{_e(c)}</td>' for c in cells)
            + f'<td style="{_TD};white-space:normal">{_e(op.get("message") or "")}</td></tr>'
        )
    earlier = f'<div style="color:{_MUTED}">{left} earlier ops left out</div>' if left > 0 else ""
    return (
        f'<details data-rf-ops="" style="margin:6px 0"><summary style="cursor:pointer;color:{_MUTED}">'
        f"Ops log · {len(ops)} op{'' if len(ops) == 1 else 's'} (how we got here)</summary>{earlier}"
        f'<table style="border-collapse:collapse;margin:4px 0;font-size:11.5px;color:inherit"><tbody>'
        f"{''.join(rows)}</tbody></table></details>"
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


def plot_settings(snapshot: Mapping[str, Any], metrics: Sequence[str] | None = None) -> dict[str, Any]:
    """The settings the copy's curves are drawn with: ``{"metrics": [str], "smoothing": float, "y_scale": "auto" |
    "linear" | "log", "from_panel": bool}``. The snapshot's ``plot_settings`` (the live panel's) where it has them
    (``from_panel``), else the live panel's defaults (``panel_metrics``; ``loss`` / ``eval_loss`` without them; no
    smoothing; "auto"); ``metrics`` given wins. Values of the wrong type fall back to the defaults."""
    given = snapshot.get("plot_settings")
    given = given if isinstance(given, Mapping) else {}
    picked = [m for m in given.get("metrics") or () if isinstance(m, str)]
    defaults = [m for m in snapshot.get("panel_metrics") or () if isinstance(m, str)] or ["loss", "eval_loss"]
    smoothing = given.get("smoothing")
    ok = isinstance(smoothing, (int, float)) and not isinstance(smoothing, bool) and math.isfinite(smoothing)
    scale = given.get("y_scale")
    return {
        "metrics": list(metrics) if metrics is not None else picked or defaults,
        "smoothing": min(max(float(smoothing), 0.0), 0.999) if ok else 0.0,  # type: ignore[arg-type]
        "y_scale": scale if scale in _SCALES else "auto",
        "from_panel": bool(given),
    }


def _curves(
    points: Sequence[Mapping[str, Any]], runs: Sequence[Mapping[str, Any]], settings: Mapping[str, Any]
) -> str:
    pruned = frozenset(int(r["run_id"]) for r in runs if status_label(r) == PRUNED)
    metrics = settings["metrics"]
    series = {m: curve_series(points, runs, m) for m in metrics}
    span = x_range(series.values())  # every plot over the same steps
    imgs, cues = [], []
    for metric in metrics:
        svg = curve_svg(
            metric,
            series[metric],
            run_color,
            pruned=pruned,
            smoothing=settings["smoothing"],
            scale=settings["y_scale"],
            x_range=span,
        )
        imgs.append(svg_img(svg, f"{metric} by optimizer step", 460, 230))
        values = [y for pts in series[metric].values() for _, y in pts]
        cue = scale_cue(y_scale(values, settings["y_scale"]))
        cues.append(f"{metric}: {cue or 'linear'}")
    legend = "".join(
        f'<span style="margin-right:12px;white-space:nowrap">{_swatch(r["run_id"])}{_clipped(run_label(r), "18em")}</span>'
        for r in runs
    )
    return (
        f'<div style="font-size:11.5px;margin:4px 0">{legend}</div>'
        f'<div style="display:flex;flex-wrap:wrap;gap:10px">{"".join(imgs)}</div>'
        f"{_settings_line(settings, cues)}"
    )


def _settings_line(settings: Mapping[str, Any], cues: Sequence[str]) -> str:
    """E.g. ``plots: loss, eval_loss · x: optimizer step · smoothing 0 · y scale auto (eval_loss: log scale · auto
    (values span 36×)) · the live panel's defaults``."""
    smoothing = settings["smoothing"]
    parts = [
        "plots: " + ", ".join(settings["metrics"]),
        "x: optimizer step",
        f"smoothing {fmt_num(smoothing)}" + (" (raw curves faint)" if smoothing > 0 else " (raw)"),
        f"y scale {settings['y_scale']} ({'; '.join(cues)})" if cues else f"y scale {settings['y_scale']}",
        "as the live panel had them" if settings["from_panel"] else "the live panel's defaults",
    ]
    return (
        f'<div data-rf-plot-settings="" style="color:{_MUTED};font-size:11px;margin-top:4px">'
        f"{_e(' · '.join(parts))}</div>"
    )


def render_html(
    snapshot: Mapping[str, Any],
    points: Sequence[Mapping[str, Any]],
    *,
    note: str = "",
    metrics: Sequence[str] | None = None,
) -> str:
    """The static copy of a panel: header, runs table with the stop reasons, curves, plot settings, ops log (see
    the module docstring).

    Args:
        snapshot: a panel snapshot (``docs/ARCHITECTURE.md``, "Panel source"), with ``plot_settings`` optionally.
        points: every metric point (``run_id``, ``step``, ``name``, ``value``).
        note: one line under the header (e.g. why this is a static copy).
        metrics: the curves drawn, one image each (None: :func:`plot_settings`' ``metrics``: the live panel's, else
            the snapshot's ``panel_metrics``, the trainer kind's default plots).

    Returns:
        One ``<div data-rf-static>`` element, self-contained.
    """
    runs = sorted(
        (r for r in snapshot.get("runs") or [] if r.get("status") != "DELETED"), key=lambda r: r["run_id"]
    )
    best = snapshot_best(snapshot, runs)  # the snapshot's best_by (GRPO: eval_reward, highest first)
    best_id = best[1] if best else None
    return (
        f'<div data-rf-static="" data-rf-experiment="{_e(snapshot.get("experiment", ""))}" '
        'style="box-sizing:border-box;max-width:960px;padding:10px 12px;border:1px solid rgba(128,128,128,0.35);'
        f'border-radius:8px;font-family:{_FONT};font-size:12.5px;line-height:1.4">'
        f"{_header(snapshot, runs, note)}{_table(snapshot, runs, best_id)}"
        f"{_curves(points, runs, plot_settings(snapshot, metrics))}{_ops_log(snapshot)}</div>"
    )


def render_text(snapshot: Mapping[str, Any]) -> str:
    """The ``text/plain`` form of the copy: the header line, one line per run (a stopped run's reason at its end)."""
    lines = [f"{snapshot.get('experiment', '')}: {snapshot.get('progress') or ''}".strip()]
    for run in sorted(snapshot.get("runs") or [], key=lambda r: r["run_id"]):
        if run.get("status") == "DELETED":
            continue
        why = run.get("stop_reason") if run.get("status") == "STOPPED" else None
        lines.append(
            f"  {run_label(run)}  {status_label(run)}{'  ' + run['device'] if run.get('device') else ''}  step {run.get('completed_steps') or 0}/"
            f"{run.get('total_steps') or 0}  "
            + "  ".join(f"{m} {fmt_metric(run_value(run, m))}" for m in _metric_columns(snapshot))
            + (f"  ({why})" if why else "")
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
