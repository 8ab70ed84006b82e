// @ts-check
/**
 * "Compare runs": a parallel-coordinates view (plotly.js `parcoords`) of every run that has a value for the
 * chosen metric: one axis per hyperparameter column (text values as categories) and one for the metric, each
 * line in its run's colour. Drawn only while its section is open. `parcoordsData` is pure (node-tested).
 *
 * Test hooks: details[data-rf-compare][open], [data-rf-parcoords][data-runs].
 */

import { h } from "./dom.js";
import { fmtHparam, plotlyText, runColor, shortHparam } from "./format.js";
import { latestValues } from "./rank.js";

/** @typedef {import("./state.js").State} State */

/**
 * The parcoords trace for the runs (not DELETED) with a value of `metric`.
 * @param {State} state @param {string} metric @returns {{trace: any, runIds: number[]}}
 */
export function parcoordsData(state, metric) {
  const values = latestValues(state, metric);
  const runs = (state.snapshot?.runs || []).filter((r) => r.status !== "DELETED" && values.has(r.run_id))
    .sort((a, b) => a.run_id - b.run_id);
  const cols = state.snapshot?.hparam_columns || [];
  const dims = cols.map((c) => {
    const raw = runs.map((r) => (r.hparams || {})[c]);
    if (raw.every((v) => typeof v === "number" && Number.isFinite(v))) {
      const logish = raw.every((v) => v > 0) && Math.max(...raw) / Math.min(...raw) >= 100;
      return logish
        ? { label: plotlyText(`${shortHparam(c)} (log10)`), values: raw.map((v) => Math.log10(v)), tickformat: ".3~g" }
        : { label: plotlyText(shortHparam(c)), values: raw, tickformat: ".3~g" };
    }
    const cats = [...new Set(raw.map((v) => fmtHparam(v)))].sort();
    return { label: plotlyText(shortHparam(c)), values: raw.map((v) => cats.indexOf(fmtHparam(v))),
      tickvals: cats.map((_, i) => i), ticktext: cats.map(plotlyText) };
  });
  dims.push({ label: plotlyText(metric), values: runs.map((r) => /** @type {number} */ (values.get(r.run_id))),
    tickformat: ".4~g" });
  const n = runs.length;
  const colorscale = n > 1 ? runs.flatMap((r, i) => [[i / n, runColor(r.run_id)], [(i + 1) / n, runColor(r.run_id)]])
    : [[0, runColor(runs[0]?.run_id ?? 1)], [1, runColor(runs[0]?.run_id ?? 1)]];
  return {
    runIds: runs.map((r) => r.run_id),
    trace: { type: "parcoords", dimensions: dims,
      line: { color: runs.map((_, i) => (i + 0.5) / Math.max(1, n)), colorscale, cmin: 0, cmax: 1 } },
  };
}

export class ComparePanel {
  /** @param {State} state @param {() => string} metric the chosen metric */
  constructor(state, metric) {
    this.state = state;
    this.metric = metric;
    /** @type {any} */ this.Plotly = null;
    this.plot = h("div", { class: "rf-parcoords", "data-rf-parcoords": "", "data-runs": "0" });
    this.note = h("div", { class: "rf-compare-note" });
    this.el = h("details", { class: "rf-compare", "data-rf-compare": "",
      ontoggle: () => this.draw("") },
    h("summary", {}, h("span", { text: "Compare runs " }),
      h("span", { class: "rf-compare-hint", text: "parallel coordinates: hyperparameters → metric" })),
    this.note, this.plot);
    this.key = "";
  }

  /** Redraw while open (when the runs, the metric or the theme changed). @param {string} themeKey */
  draw(themeKey) {
    const details = /** @type {HTMLDetailsElement} */ (this.el);
    if (!details.open || !this.Plotly) return;
    const metric = this.metric();
    const { trace, runIds } = parcoordsData(this.state, metric);
    const key = JSON.stringify([trace.dimensions, themeKey]);
    if (key === this.key) return;
    this.key = key;
    this.plot.dataset.runs = String(runIds.length);
    this.note.textContent = runIds.length ? `${runIds.length} runs with a ${metric} value (runs ${runIds.join(", ")}); ` +
      "drag along an axis to filter" : `no run has a ${metric} value yet`;
    const cs = getComputedStyle(this.el);
    const fg = cs.getPropertyValue("--rf-fg").trim() || "#333";
    this.Plotly.react(this.plot, runIds.length ? [{ ...trace, labelfont: { color: fg }, tickfont: { color: fg },
      rangefont: { color: fg } }] : [], { height: 260, margin: { l: 60, r: 50, t: 36, b: 16 },
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", font: { size: 11, color: fg } },
    { displaylogo: false, responsive: true, displayModeBar: false });
  }

  invalidate() { this.key = ""; }

  destroy() {
    if (this.Plotly) this.Plotly.purge(this.plot);
  }
}
