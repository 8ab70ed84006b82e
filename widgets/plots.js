// @ts-check
/**
 * The panel's curves: plotly.js loaded once per page (from bytes the kernel sends, never inlined in the module),
 * and the plot cards of one view, drawn from the model's series store (widgets/state.js) through the pure
 * trace data of widgets/curves.js: x axis step / samples seen / wall time, EMA smoothing (the raw curve stays,
 * faint, as in TensorBoard), log scale, a warm clone joined to its parent, identical curves dashed, whole-number
 * step ticks, the value of every run at the hovered step, and a ✂ marker where early stopping cut a pruned run.
 * Every plot of a view has the same x range (a user's zoom on one is kept); the y scale is the user's (linear or log)
 * or, by default, chosen per plot (curves.yScale: a log scale when the values span more than 10×, outliers left out
 * of the range where a log scale cannot show them), with a cue in the card's head whenever it is not plain linear.
 *
 * Test hooks: .rf-card[data-metric][data-scale][data-scale-auto], [data-rf-scale-cue].
 */

import {
  curve, duplicateCurves, integerDtick, parentSeries, pruneMarker, scaleCue, sharedXRange, yScale,
} from "./curves.js";
import { h } from "./dom.js";
import { DEFAULT_METRICS, plotlyText, runColor } from "./format.js";
import { metricOrder, plotMetrics } from "./state.js";

export const PLOT_HEIGHT = 260;
const PLOTLY_KEY = "__rapidfire_nb_plotly__";
const PLOT_CONFIG = { displaylogo: false, responsive: false, displayModeBar: "hover",
  modeBarButtonsToRemove: ["lasso2d", "select2d", "autoScale2d", "toggleSpikelines"] };

/**
 * @typedef {{promise: Promise<any>, resolve: (p: any) => void, reject: (e: any) => void,
 *   requestedAt: number, loading: boolean, done: boolean, askedBy: WeakSet<object>}} PlotlyLoader
 * @typedef {{metric: string, card: HTMLElement, div: HTMLElement, select: HTMLSelectElement,
 *   empty: HTMLElement, cue: HTMLElement, initialized: boolean, picked: string|null, zoomed: boolean,
 *   xRange: [number, number]|null, xKey: string}} PlotSlot
 * @typedef {{xAxis: "step"|"samples"|"wall", showDeleted: boolean, hiddenRuns: Set<number>, themeKey: string,
 *   smoothing: number, yScale: "auto"|"linear"|"log"}} PlotView
 * @typedef {import("./state.js").State} State
 * @typedef {import("./state.js").Series} Series
 */

/** The page's one plotly.js loader (shared by every panel through globalThis). @returns {PlotlyLoader} */
export function plotlyLoader() {
  const g = /** @type {any} */ (globalThis);
  if (!g[PLOTLY_KEY]) {
    /** @type {any} */ let resolve, reject;
    const promise = new Promise((res, rej) => { resolve = res; reject = rej; });
    g[PLOTLY_KEY] = { promise, resolve, reject, requestedAt: 0, loading: false, done: false, askedBy: new WeakSet() };
    if (g.Plotly && g.Plotly.newPlot) { g[PLOTLY_KEY].done = true; resolve(g.Plotly); }
  }
  return g[PLOTLY_KEY];
}

/** @param {string} url */
function injectScript(url) {
  return new Promise((resolve, reject) => {
    const s = document.createElement("script");
    s.src = url; s.onload = resolve; s.onerror = reject;
    document.head.appendChild(s);
  });
}

/** Load plotly.js from the kernel's `plotly` message buffer (once per page). @param {any} buf DataView |
 * ArrayBuffer | Uint8Array */
export async function loadPlotlyFromBuffer(buf) {
  const L = plotlyLoader();
  if (L.loading || L.done) return;
  L.loading = true;
  const bytes = buf instanceof ArrayBuffer ? new Uint8Array(buf)
    : new Uint8Array(buf.buffer, buf.byteOffset || 0, buf.byteLength);
  const url = URL.createObjectURL(new Blob([bytes], { type: "text/javascript" }));
  const g = /** @type {any} */ (globalThis);
  try {
    try { await import(/* webpackIgnore: true */ url); } catch (e) { /* not importable here */ }
    if (!(g.Plotly && g.Plotly.newPlot)) await injectScript(url);
    if (!(g.Plotly && g.Plotly.newPlot)) throw new Error("plotly.js did not define window.Plotly");
    L.done = true;
    L.resolve(g.Plotly);
  } catch (e) {
    L.loading = false;
    console.error("rapidfire_nb: could not load plotly.js", e);
  } finally {
    URL.revokeObjectURL(url);
  }
}

/** The CSS variables of the panel's theme. @param {HTMLElement} root */
function themeColors(root) {
  const cs = getComputedStyle(root);
  const v = (/** @type {string} */ n, /** @type {string} */ d) => cs.getPropertyValue(n).trim() || d;
  return { fg: v("--rf-fg", "#333"), muted: v("--rf-fg-muted", "#666"), grid: v("--rf-grid", "#e5e5e5"),
    bg: v("--rf-bg", "#fff"), border: v("--rf-border", "#ddd"), font: v("--rf-font", "sans-serif") };
}

/** The ✂ marker at the last point of a pruned run's curve (its hover says why).
 * @param {{x: number, y: number, step: number}} cut @param {number} id @param {string|null|undefined} reason */
function pruneTrace(cut, id, reason) {
  const why = plotlyText(reason || "pruned by early stopping");
  return { type: "scatter", mode: "markers", x: [cut.x], y: [cut.y], name: `run ${id} pruned`, showlegend: false,
    marker: { symbol: "x-thin-open", size: 11, color: runColor(id), line: { width: 2.5, color: runColor(id) } },
    meta: { run: id, pruned: true },
    hovertemplate: `<b>run ${id}</b> ✂ pruned at step ${cut.step}: ${why}<extra></extra>` };
}

/** The plot cards of one view (two metric pickers over the model's series store). */
export class PlotArea {
  /** @param {State} state @param {() => void} onChange called when a picker changes */
  constructor(state, onChange) {
    this.state = state;
    this.el = h("div", { class: "rf-plots", "data-rf-plots": "", "data-points": "0" });
    /** @type {any} */ this.Plotly = null;
    /** @type {PlotSlot[]} */ this.slots = DEFAULT_METRICS.map((m) => this.makeSlot(m, onChange));
  }

  /** @param {string} metric @param {() => void} onChange */
  makeSlot(metric, onChange) {
    const select = /** @type {HTMLSelectElement} */ (h("select", { class: "rf-metric", title: "metric",
      "aria-label": "metric" }));
    const div = h("div", { class: "rf-plot", style: { height: `${PLOT_HEIGHT}px` } });
    const empty = h("div", { class: "rf-plot-empty", text: "loading plotly.js…" });
    const cue = h("span", { class: "rf-scale-cue", "data-rf-scale-cue": "", hidden: true });
    const card = h("div", { class: "rf-card", "data-metric": metric },
      h("div", { class: "rf-card-head" }, select, cue), h("div", { class: "rf-plot-box" }, div, empty));
    /** @type {PlotSlot} */
    const slot = { metric, card, div, select, empty, cue, initialized: false, picked: null, zoomed: false, xRange: null,
      xKey: "" };
    select.addEventListener("change", () => {
      slot.metric = slot.picked = select.value; card.dataset.metric = slot.metric; onChange();
    });
    this.el.append(card);
    return slot;
  }

  refreshMetricOptions() {
    // a plot the user did not pick shows the trainer kind's default (GRPO: reward, eval_reward)
    plotMetrics(this.state.snapshot, this.slots.map((p) => p.picked)).forEach((m, i) => {
      const slot = this.slots[i];
      if (slot.metric !== m) { slot.metric = m; slot.card.dataset.metric = m; }
    });
    const names = metricOrder(this.state);
    for (const p of this.slots) {
      const current = [...p.select.options].map((o) => o.value).join("\u0000");
      if (current !== names.join("\u0000")) {
        p.select.replaceChildren(...names.map((n) => h("option", { value: n, text: n })));
      }
      p.select.value = p.metric;
    }
  }

  /** Draw every card (once plotly.js is loaded). @param {PlotView} view */
  draw(view) {
    this.refreshMetricOptions();
    if (!this.Plotly) return;
    let total = 0;
    const drawn = this.slots.map((slot) => ({ slot, ...this.curves(slot, view) }));
    const xRange = view.xAxis === "wall" ? null : sharedXRange(drawn.flatMap((d) => [...d.curves.values()]));
    for (const d of drawn) total += this.drawSlot(d, view, xRange);
    this.el.dataset.points = String(total);
  }

  /** The curves of one card and its y scale. @param {PlotSlot} slot @param {PlotView} view */
  curves(slot, view) {
    const byRun = this.state.series.get(slot.metric) || new Map();
    const runInfo = new Map((this.state.snapshot?.runs || []).map((r) => [r.run_id, r]));
    const deleted = (/** @type {number} */ id) => runInfo.get(id)?.status === "DELETED";
    const ids = [...byRun.keys()].filter((id) => (view.showDeleted || !deleted(id)) && !view.hiddenRuns.has(id))
      .sort((a, b) => a - b);
    const scale = yScale(ids.map((id) => /** @type {Series} */ (byRun.get(id)).value), view.yScale);
    /** @type {Map<number, import("./curves.js").Curve>} */ const curves = new Map();
    for (const id of ids) {
      curves.set(id, curve(byRun.get(id), { xAxis: view.xAxis, weight: view.smoothing, log: scale.type === "log",
        parent: parentSeries(runInfo.get(id), byRun) }));
    }
    return { curves, deleted, runInfo, scale };
  }

  /** @param {{slot: PlotSlot, curves: Map<number, import("./curves.js").Curve>, deleted: (id: number) => boolean,
   *   runInfo: Map<number, any>, scale: ReturnType<typeof yScale>}} drawn
   * @param {PlotView} view @param {[number, number]|null} xRange the views' shared x range
   * @returns {number} points plotted in this slot */
  drawSlot({ slot, curves, deleted, runInfo, scale }, view, xRange) {
    const dups = duplicateCurves(curves);
    let total = 0;
    /** @type {any[]} */ const raw = [], data = [], marks = [];
    for (const [id, c] of curves) {
      total += c.raw.length - (c.joined ? 1 : 0);
      if (view.smoothing > 0) raw.push(this.rawTrace(c, id));
      data.push(this.trace(slot, c, id, deleted(id), dups.get(id), view));
      const cut = pruneMarker(c, runInfo.get(id));
      if (cut) marks.push(pruneTrace(cut, id, runInfo.get(id)?.stop_reason));
    }
    slot.empty.textContent = `no ${slot.metric} points yet`;
    slot.empty.hidden = total > 0;
    slot.card.dataset.smoothed = String(view.smoothing > 0);
    this.showScale(slot, scale, total > 0);
    if (slot.xKey !== `${slot.metric}|${view.xAxis}`) { slot.zoomed = false; slot.xKey = `${slot.metric}|${view.xAxis}`; }
    if (!slot.zoomed) slot.xRange = xRange; // a user's zoom keeps the range plotly was last given (uirevision)
    const layout = this.layout(slot.metric, view, curves, total > 0, scale);
    if (slot.xRange) layout.xaxis = { ...layout.xaxis, range: slot.xRange, autorange: false };
    this.Plotly.react(slot.div, [...raw, ...data, ...marks], layout, PLOT_CONFIG);
    if (!slot.initialized) this.watchZoom(slot);
    slot.initialized = true;
    return total;
  }

  /** The card's scale cue: "log scale", "log scale · auto (values span 36×)", "outliers clipped · auto (…)".
   * @param {PlotSlot} slot @param {ReturnType<typeof yScale>} scale @param {boolean} hasData */
  showScale(slot, scale, hasData) {
    const text = hasData ? scaleCue(scale) : "";
    slot.card.dataset.scale = scale.type;
    slot.card.dataset.scaleAuto = String(scale.auto);
    if (slot.cue.textContent !== text) slot.cue.textContent = text;
    slot.cue.hidden = !text;
    slot.cue.title = scale.auto ? "chosen because the values span a wide range; pick linear or log above to override"
      : "the y scale you picked (auto chooses by the values' range)";
  }

  /** Follow the user's zoom on the x axis of a card (a double click, autorange, gives it back to the shared range).
   * @param {PlotSlot} slot */
  watchZoom(slot) {
    const div = /** @type {any} */ (slot.div);
    if (typeof div.on !== "function") return;
    div.on("plotly_relayout", (/** @type {any} */ e) => {
      if (!e) return;
      if (e["xaxis.autorange"]) { slot.zoomed = false; return; }
      if (e["xaxis.range[0]"] !== undefined || e["xaxis.range"]) {
        const r = (e["xaxis.range"] || [e["xaxis.range[0]"], e["xaxis.range[1]"]]).map(Number);
        slot.zoomed = r.every(Number.isFinite); // a date axis (wall time) keeps plotly's own zoom
        if (slot.zoomed) slot.xRange = [r[0], r[1]];
      }
    });
  }

  /** The faint unsmoothed curve under a smoothed one. @param {import("./curves.js").Curve} c @param {number} id */
  rawTrace(c, id) {
    return { type: "scatter", mode: "lines", x: c.x, y: c.raw, name: `run ${id} (raw)`, hoverinfo: "skip",
      showlegend: false, line: { color: runColor(id), width: 1 }, opacity: 0.25, meta: { run: id, raw: true } };
  }

  /** One run's trace. @param {PlotSlot} slot @param {import("./curves.js").Curve} c @param {number} id
   * @param {boolean} deleted @param {number|undefined} dupOf @param {PlotView} view */
  trace(slot, c, id, deleted, dupOf, view) {
    const sparse = slot.metric.startsWith("eval_") || c.y.length < 3;
    const name = deleted ? `run ${id} (deleted)` : dupOf ? `run ${id} (= run ${dupOf})` : `run ${id}`;
    return {
      type: "scatter", mode: sparse ? "lines+markers" : "lines", name, x: c.x, y: c.y,
      customdata: c.step.map((st, j) => [st, c.samples[j], c.raw[j]]),
      line: { color: runColor(id), width: 2, dash: deleted ? "dot" : dupOf ? "dash" : "solid" },
      marker: { size: 5, color: runColor(id) }, opacity: deleted ? 0.35 : 1, connectgaps: true,
      meta: { run: id, joined: c.joined },
      hovertemplate: `<b>run ${id}</b> %{y:.4r}` + (view.smoothing > 0 ? " (raw %{customdata[2]:.4r})" : "") +
        (view.xAxis !== "step" ? " · step %{customdata[0]:,}" : "") + "<extra></extra>",
    };
  }

  /** The x axis of a card. @param {PlotView} view @param {Map<number, any>} curves @param {any} t */
  xaxis(view, curves, t) {
    const base = { gridcolor: t.grid, zeroline: false, linecolor: t.border, automargin: true,
      title: { text: view.xAxis === "step" ? "optimizer step" : view.xAxis === "samples" ? "samples seen"
        : "wall time", font: { size: 11, color: t.muted }, standoff: 4 } };
    if (view.xAxis === "wall") return { ...base, type: "date" };
    const xs = [...curves.values()].flatMap((c) => c.x).filter((x) => Number.isFinite(x));
    const lo = xs.length ? Math.min(...xs) : 0, hi = xs.length ? Math.max(...xs) : 1;
    return { ...base, type: "linear", tickmode: "linear", tick0: 0, dtick: integerDtick(lo, hi),
      tickformat: view.xAxis === "samples" ? "~s" : ",d", hoverformat: ",d" };
  }

  /** The layout of a card (Plotly.react keeps zoom through uirevision). @param {string} metric
   * @param {PlotView} view @param {Map<number, any>} curves @param {boolean} hasData
   * @param {ReturnType<typeof yScale>} scale @returns {any} */
  layout(metric, view, curves, hasData, scale) {
    const t = themeColors(this.el);
    const lr = metric === "learning_rate";
    return {
      height: PLOT_HEIGHT, autosize: true, margin: { l: 52, r: 14, t: 10, b: 38 },
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: t.font, size: 11, color: t.fg },
      xaxis: { ...this.xaxis(view, curves, t), visible: hasData },
      yaxis: { gridcolor: t.grid, zeroline: false, linecolor: t.border, automargin: true, visible: hasData,
        type: scale.type, exponentformat: lr ? "e" : "B", tickformat: lr ? "" : undefined,
        ...(scale.range ? { range: scale.range, autorange: false } : {}) },
      showlegend: false, hovermode: "x unified",
      hoverlabel: { bgcolor: t.bg, bordercolor: t.border, font: { color: t.fg, family: t.font, size: 11 } },
      uirevision: `${metric}|${view.xAxis}|${scale.type}|${scale.range ? "clip" : ""}`,
    };
  }

  resize() {
    if (!this.Plotly) return;
    for (const p of this.slots) if (p.initialized && p.div.offsetWidth) this.Plotly.Plots.resize(p.div);
  }

  destroy() {
    if (this.Plotly) for (const p of this.slots) this.Plotly.purge(p.div);
  }
}
