"""The static copy's curves: metric series by run, the y scale and smoothing the live panel uses, and one SVG image
per metric (inlined by :mod:`rapidfire_nb.panel.static` as a ``data:`` URI, which no notebook sanitizer strips).

The y scale and the smoothing follow the front end's (``yScale`` and ``smooth`` in ``widgets/curves.js``): "auto" draws
a log scale when every value is positive and the largest is more than :data:`AUTO_LOG_SPAN` times the smallest, and
otherwise leaves outliers out of the range (5th to 95th percentile, padded) when the full range is more than 10 times
wider; "linear" and "log" are a user's choice. Standard library + :mod:`rapidfire_nb.view` only; colours come from
the caller (``run_color``).
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..view import fmt_num

__all__ = [
    "AUTO_LOG_SPAN",
    "YScale",
    "curve_series",
    "curve_svg",
    "nice_ticks",
    "scale_cue",
    "series_by_run",
    "smooth",
    "svg_img",
    "x_range",
    "y_scale",
]

#: A plot whose values span more than this factor (largest / smallest) is drawn on a log scale by "auto".
AUTO_LOG_SPAN = 10.0
_MUTED = "#8a8f98"  # readable on light and dark backgrounds
_LINE = "#8885"  # grey at 1/3 opacity
_MAX_POINTS = 240  # per run and curve (the copy stays small in the saved notebook)
FONT = "system-ui,-apple-system,'Segoe UI',Roboto,sans-serif"

Series = dict[int, list[tuple[float, float]]]


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


# ------------------------------------------------------------------------------------------------ series


def series_by_run(points: Iterable[Mapping[str, Any]], metric: str) -> Series:
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
) -> Series:
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


def x_range(all_series: Iterable[Series]) -> tuple[float, float] | None:
    """The steps spanned by every plot's curves, so that the plots of one copy line up (None without points)."""
    xs = [x for series in all_series for pts in series.values() for x, _ in pts]
    return (min(xs), max(xs)) if xs else None


def _thin(pts: list[tuple[float, float]], limit: int = _MAX_POINTS) -> list[tuple[float, float]]:
    if len(pts) <= limit:
        return pts
    stride = math.ceil(len(pts) / limit)
    return pts[::stride] + ([pts[-1]] if (len(pts) - 1) % stride else [])


def smooth(values: Sequence[float], weight: float) -> list[float]:
    """TensorBoard's smoothing (``smooth`` in widgets/curves.js): an exponential moving average debiased so the first
    points are not pulled towards 0, ``ema_i / (1 - weight^i)``; ``weight`` 0 (off) .. 0.999."""
    if not weight > 0:
        return list(values)
    w, last, out = min(weight, 0.999), 0.0, []
    for n, v in enumerate(values, start=1):
        last = last * w + (1 - w) * v
        out.append(last / (1 - w**n))
    return out


# ------------------------------------------------------------------------------------------------ scale


@dataclass(frozen=True)
class YScale:
    """One plot's y scale: ``kind`` "log" or "linear"; ``auto`` when chosen by the values (not the user);
    ``span`` largest / smallest value (auto log); ``range`` the linear range that leaves outliers out, and
    ``clipped`` how many values lie outside it."""

    kind: str = "linear"
    auto: bool = False
    span: float | None = None
    range: tuple[float, float] | None = None
    clipped: int = 0


def _quantile(ordered: Sequence[float], q: float) -> float:
    i = (len(ordered) - 1) * q
    lo = math.floor(i)
    return ordered[lo] + (ordered[lo + 1] - ordered[lo]) * (i - lo) if lo + 1 < len(ordered) else ordered[lo]


def y_scale(values: Iterable[float], choice: str = "auto") -> YScale:
    """The y scale of a plot of ``values`` (the front end's ``yScale``): ``choice`` "linear" or "log" wins, "auto"
    picks log for positive values spanning more than :data:`AUTO_LOG_SPAN`, else clips outliers (see the module)."""
    if choice in ("linear", "log"):
        return YScale(choice)
    vs = sorted(v for v in values if math.isfinite(v))
    if len(vs) < 2:
        return YScale()
    lo, hi = vs[0], vs[-1]
    if lo > 0 and hi / lo > AUTO_LOG_SPAN:
        return YScale("log", True, hi / lo)
    q05, q95 = _quantile(vs, 0.05), _quantile(vs, 0.95)
    if not q95 > q05 or hi - lo <= 10 * (q95 - q05):
        return YScale()
    pad = 0.05 * (q95 - q05)
    low, high = q05 - pad, q95 + pad
    return YScale("linear", True, None, (low, high), sum(1 for v in vs if v < low or v > high))


def scale_cue(scale: YScale) -> str:
    """The plot's cue (the front end's ``scaleCue``): ``log scale``, ``log scale · auto (values span 36×)``,
    ``outliers clipped · auto (3 points off the range)``; ``""`` for a plain linear axis."""
    if scale.kind == "log":
        return f"log scale · auto (values span {round(scale.span or 0)}×)" if scale.auto else "log scale"
    if scale.range is not None:
        return f"outliers clipped · auto ({scale.clipped} point{'' if scale.clipped == 1 else 's'} off the range)"
    return ""


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


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Ticks of a log axis over ``[lo, hi]`` (values > 0): 1, 2, 5 x powers of ten, only powers when too many."""
    ticks = [
        m * 10.0**k
        for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
        for m in (1, 2, 5)
    ]
    ticks = [t for t in ticks if lo <= t <= hi]
    return [t for t in ticks if math.log10(t).is_integer()] if len(ticks) > 7 else ticks


# ------------------------------------------------------------------------------------------------ SVG


@dataclass(frozen=True)
class _Frame:
    """The plot area of one image and its mapping of (step, value) to pixels."""

    width: int
    height: int
    x0: float
    x1: float
    y0: float
    y1: float
    log: bool
    left: int = 54
    right: int = 12
    top: int = 22
    bottom: int = 34

    def px(self, x: float) -> float:
        return self.left + (x - self.x0) / (self.x1 - self.x0) * (self.width - self.left - self.right)

    def py(self, y: float) -> float:
        v = math.log10(y) if self.log else y
        return self.top + (self.y1 - v) / (self.y1 - self.y0) * (self.height - self.top - self.bottom)


def _cross(x: float, y: float, color: str, run_id: int) -> str:
    """The ✂ mark at the last point of a pruned run's curve (an x, as the live panel's marker)."""
    d = f"M{x - 5:.0f},{y - 5:.0f}L{x + 5:.0f},{y + 5:.0f}M{x - 5:.0f},{y + 5:.0f}L{x + 5:.0f},{y - 5:.0f}"
    return f'<path data-rf-pruned="{run_id}" d="{d}" stroke="{color}" stroke-width="2.4" stroke-linecap="round"/>'


def _frame(
    series: Series, scale: YScale, size: tuple[int, int], x_range: tuple[float, float] | None
) -> _Frame:
    width, height = size
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [y for pts in series.values() for _, y in pts]
    x0, x1 = x_range or (min(xs), max(xs))
    x1 = x1 if x1 > x0 else x0 + 1
    if scale.kind == "log":
        lo, hi = math.log10(min(ys)), math.log10(max(ys))
        pad = (hi - lo) * 0.06 or 0.1
        return _Frame(width, height, x0, x1, lo - pad, hi + pad, True)
    y0, y1 = scale.range or (min(ys), max(ys))
    pad = 0.0 if scale.range else (y1 - y0) * 0.06 or abs(y0) * 0.05 or 1.0
    return _Frame(width, height, x0, x1, y0 - pad, y1 + pad, False)


def _axes(f: _Frame) -> list[str]:
    parts = []
    y_ticks = _log_ticks(10**f.y0, 10**f.y1) if f.log else nice_ticks(f.y0, f.y1, 4)
    for t in y_ticks:
        parts.append(
            f'<line x1="{f.left}" x2="{f.width - f.right}" y1="{f.py(t):.0f}" y2="{f.py(t):.0f}" stroke="{_LINE}"/>'
            f'<text x="{f.left - 6}" y="{f.py(t) + 3.5:.0f}" fill="{_MUTED}" text-anchor="end">{_e(fmt_num(t))}</text>'
        )
    for t in nice_ticks(f.x0, f.x1, 6, integer=True):
        parts.append(
            f'<text x="{f.px(t):.0f}" y="{f.height - f.bottom + 15}" fill="{_MUTED}" text-anchor="middle">'
            f"{int(round(t)):,}</text>"
        )
    bottom = f.height - f.bottom
    parts.append(
        f'<line x1="{f.left}" x2="{f.width - f.right}" y1="{bottom}" y2="{bottom}" stroke="{_MUTED}"/>'
        f'<text x="{(f.left + f.width - f.right) / 2}" y="{f.height - 4}" fill="{_MUTED}" text-anchor="middle">'
        "optimizer step</text>"
        f'<clipPath id="rf-plot"><rect x="{f.left}" y="{f.top - 4}" width="{f.width - f.left - f.right}" '
        f'height="{bottom - f.top + 8}"/></clipPath>'
    )
    return parts


def curve_svg(
    metric: str,
    series: Mapping[int, list[tuple[float, float]]],
    color: Callable[[int], str],
    *,
    size: tuple[int, int] = (460, 230),
    pruned: frozenset[int] = frozenset(),
    smoothing: float = 0.0,
    scale: str = "auto",
    x_range: tuple[float, float] | None = None,
) -> str:
    """One metric's curves as an SVG document: a polyline per run (a lone point as a dot), coloured by
    ``color(run_id)``; a run in ``pruned`` (run ids early stopping pruned) ends in a cross. ``smoothing`` (0 ..
    0.999) draws the smoothed curve over a faint raw one; ``scale`` "auto" / "linear" / "log" (:func:`y_scale`,
    whose cue follows the title; a log scale leaves values <= 0 out); ``x_range`` the steps every plot of the copy
    spans (:func:`x_range`; None: this plot's own)."""
    width, height = size
    chosen = y_scale((y for pts in series.values() for _, y in pts), scale)
    if chosen.kind == "log":
        series = {rid: [(x, y) for x, y in pts if y > 0] for rid, pts in series.items()}
        series = {rid: pts for rid, pts in series.items() if pts}
    cue = scale_cue(chosen)
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" data-rf-scale="{chosen.kind}" '
        f'viewBox="0 0 {width} {height}" font-family="{_e(FONT)}" font-size="11">'
        f'<text x="54" y="14" fill="{_MUTED}"><tspan font-weight="600">{_e(metric)}</tspan>'
        f"{'  ' + _e(cue) if cue else ''}</text>"
    )
    if not series:
        return head + (
            f'<text x="{width / 2}" y="{height / 2}" fill="{_MUTED}" text-anchor="middle">'
            f"no {_e(metric)} points</text></svg>"
        )
    f = _frame(dict(series), chosen, size, x_range)
    parts = [head, *_axes(f), '<g clip-path="url(#rf-plot)">']
    for rid in sorted(series):
        parts += _run_curve(rid, _thin(list(series[rid])), f, color(rid), rid in pruned, smoothing)
    parts.append("</g></svg>")
    return "".join(parts)


def _polyline(pts: Sequence[tuple[float, float]], f: _Frame, color: str, extra: str = "") -> str:
    coords = " ".join(f"{f.px(x):.0f},{f.py(y):.0f}" for x, y in pts)
    return (
        f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.8" '
        f'stroke-linejoin="round" stroke-linecap="round"{extra}/>'
    )


def _run_curve(
    rid: int, pts: list[tuple[float, float]], f: _Frame, color: str, pruned: bool, smoothing: float
) -> list[str]:
    """One run's polyline (a lone point: a dot; sparse points: dots too), a cross at its end when pruned; smoothed,
    the raw curve stays under it, faint."""
    if smoothing > 0 and len(pts) > 1:
        shown = list(zip([x for x, _ in pts], smooth([y for _, y in pts], smoothing), strict=True))
        raw = [_polyline(pts, f, color, ' stroke-opacity="0.25" data-rf-raw=""')]
    else:
        shown, raw = pts, []
    parts = [_cross(f.px(shown[-1][0]), f.py(shown[-1][1]), color, rid)] if pruned else []
    if len(pts) == 1:
        return [
            *parts,
            f'<circle cx="{f.px(pts[0][0]):.0f}" cy="{f.py(pts[0][1]):.0f}" r="3" fill="{color}"/>',
        ]
    parts += [*raw, _polyline(shown, f, color)]
    if len(pts) <= 12:  # sparse series (eval points): markers too
        parts += [f'<circle cx="{f.px(x):.0f}" cy="{f.py(y):.0f}" r="2.4" fill="{color}"/>' for x, y in shown]
    return parts


def svg_img(svg: str, alt: str, width: int, height: int) -> str:
    """An ``<img>`` whose source is ``svg`` as a base64 ``data:`` URI (kept by every notebook sanitizer)."""
    data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    return (
        f'<img src="data:image/svg+xml;base64,{data}" alt="{_e(alt)}" width="{width}" height="{height}" '
        'style="width:calc(50% - 8px);min-width:280px;max-width:100%;height:auto;margin:0;'
        'border:1px solid rgba(128,128,128,0.3);border-radius:6px">'
    )
