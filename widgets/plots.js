// @ts-check
/**
 * The panel's curves: plotly.js loaded once per page (from bytes the kernel sends, never inlined in the module),
 * and the plot cards of one view, drawn from the model's series store (widgets/state.js).
 */

import { h } from "./dom.js";
import { DEFAULT_METRICS, runColor } from "./format.js";
import { metricOrder } from "./state.js";

export const PLOT_HEIGHT = 260;
const PLOTLY_KEY = "__rapidfire_nb_plotly__";
const PLOT_CONFIG = { displaylogo: false, responsive: false, displayModeBar: "hover",
  modeBarButtonsToRemove: ["lasso2d", "select2d", "autoScale2d", "toggleSpikelines"] };

/**
 * @typedef {{promise: Promise<any>, resolve: (p: any) => void, reject: (e: any) => void,
 *   requestedAt: number, loading: boolean, done: boolean, askedBy: WeakSet<object>}} PlotlyLoader
 * @typedef {{metric: string, card: HTMLElement, div: HTMLElement, select: HTMLSelectElement,
 *   empty: HTMLElement, traceKey: string, drawn: Map<number, number>, initialized: boolean}} PlotSlot
 * @typedef {{xAxis: "step"|"samples", showDeleted: boolean, hiddenRuns: Set<number>, themeKey: string}} PlotView
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
    const card = h("div", { class: "rf-card", "data-metric": metric },
      h("div", { class: "rf-card-head" }, select), h("div", { class: "rf-plot-box" }, div, empty));
    /** @type {PlotSlot} */
    const slot = { metric, card, div, select, empty, traceKey: "", drawn: new Map(), initialized: false };
    select.addEventListener("change", () => {
      slot.metric = select.value; card.dataset.metric = slot.metric; slot.traceKey = ""; onChange();
    });
    this.el.append(card);
    return slot;
  }

  /** Next draw redraws every trace (structure, axis or theme changed). @param {boolean} [points] also forget
   * what was drawn (the series store was replaced) */
  invalidate(points = false) {
    for (const s of this.slots) { s.traceKey = ""; if (points) s.drawn = new Map(); }
  }

  refreshMetricOptions() {
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
    for (const slot of this.slots) total += this.drawSlot(slot, view);
    this.el.dataset.points = String(total);
  }

  /** @param {PlotSlot} slot @param {PlotView} view @returns {number} points plotted in this slot */
  drawSlot(slot, view) {
    const byRun = this.state.series.get(slot.metric) || new Map();
    const runInfo = new Map((this.state.snapshot?.runs || []).map((r) => [r.run_id, r]));
    const deleted = (/** @type {number} */ id) => runInfo.get(id)?.status === "DELETED";
    const runIds = [...byRun.keys()].filter((id) => (view.showDeleted || !deleted(id)) && !view.hiddenRuns.has(id))
      .sort((a, b) => a - b);
    // markers for sparse series (eval metrics, or the first points of a run); the mode is part of the key
    const markers = (/** @type {number} */ id) => slot.metric.startsWith("eval_") || byRun.get(id).value.length < 3;
    const traceKey = `${view.xAxis}|${slot.metric}|${view.themeKey}|` + runIds.map((id) =>
      `${id}:${deleted(id) ? "d" : ""}:${markers(id) ? "m" : ""}`).join(",");
    let total = 0;
    for (const id of runIds) total += byRun.get(id).value.length;
    slot.empty.textContent = `no ${slot.metric} points yet`;
    slot.empty.hidden = total > 0;
    if (traceKey === slot.traceKey && slot.initialized) {
      this.extend(slot, byRun, runIds, view.xAxis);
      return total;
    }
    const data = runIds.map((id) => this.trace(slot, byRun.get(id), id, view.xAxis, deleted(id), markers(id)));
    this.Plotly.react(slot.div, data, this.layout(slot.metric, view.xAxis), PLOT_CONFIG);
    slot.initialized = true;
    slot.traceKey = traceKey;
    return total;
  }

  /** Append only what is new (Plotly.extendTraces). @param {PlotSlot} slot @param {Map<number, Series>} byRun
   * @param {number[]} runIds @param {"step"|"samples"} xAxis */
  extend(slot, byRun, runIds, xAxis) {
    /** @type {any} */ const upd = { x: [], y: [], customdata: [] };
    const idx = /** @type {number[]} */ ([]);
    runIds.forEach((id, i) => {
      const s = /** @type {Series} */ (byRun.get(id));
      const from = slot.drawn.get(id) || 0;
      if (s.value.length > from) {
        upd.x.push(s[xAxis].slice(from)); upd.y.push(s.value.slice(from));
        upd.customdata.push(s.step.slice(from).map((st, j) => [st, s.samples[from + j]]));
        idx.push(i);
        slot.drawn.set(id, s.value.length);
      }
    });
    if (idx.length) this.Plotly.extendTraces(slot.div, upd, idx);
  }

  /** One run's trace. @param {PlotSlot} slot @param {Series} s @param {number} id @param {"step"|"samples"} xAxis
   * @param {boolean} deleted @param {boolean} markers */
  trace(slot, s, id, xAxis, deleted, markers) {
    slot.drawn.set(id, s.value.length);
    const fmtY = slot.metric === "learning_rate" ? ".2~e" : ".4~g";
    return {
      type: "scatter", mode: markers ? "lines+markers" : "lines", name: deleted ? `run ${id} (deleted)` : `run ${id}`,
      x: s[xAxis].slice(), y: s.value.slice(), customdata: s.step.map((st, j) => [st, s.samples[j]]),
      line: { color: runColor(id), width: 2, dash: deleted ? "dot" : "solid" },
      marker: { size: 5, color: runColor(id) }, opacity: deleted ? 0.35 : 1, connectgaps: true,
      hoverlabel: { bordercolor: runColor(id) },
      hovertemplate: `<b>run ${id}</b><br>step %{customdata[0]:,}` +
        (xAxis === "samples" ? " · %{customdata[1]:,} samples" : "") +
        `<br>${slot.metric} %{y:${fmtY}}<extra></extra>`,
    };
  }

  /** The layout of a card (Plotly.react keeps zoom through uirevision). @param {string} metric
   * @param {"step"|"samples"} xAxis */
  layout(metric, xAxis) {
    const t = themeColors(this.el);
    const fmtY = metric === "learning_rate" ? ".2~e" : ".4~g";
    return {
      height: PLOT_HEIGHT, autosize: true, margin: { l: 48, r: 14, t: 10, b: 38 },
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: t.font, size: 11, color: t.fg },
      xaxis: { title: { text: xAxis === "step" ? "optimizer step" : "samples seen", font: { size: 11, color: t.muted },
        standoff: 4 }, gridcolor: t.grid, zeroline: false, linecolor: t.border,
      tickformat: xAxis === "samples" ? "~s" : "", automargin: true },
      yaxis: { gridcolor: t.grid, zeroline: false, linecolor: t.border, tickformat: fmtY, automargin: true },
      showlegend: false, hovermode: "closest",
      hoverlabel: { bgcolor: t.bg, bordercolor: t.border, font: { color: t.fg, family: t.font, size: 11 } },
      uirevision: `${metric}|${xAxis}`,
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
