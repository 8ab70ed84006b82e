// @ts-check
/**
 * "Compare runs": a parallel-coordinates view (plotly.js `parcoords`) of every run that has a value for the
 * chosen metric: a first axis with the run ids (so each line can be followed to its run), one axis per
 * hyperparameter column (text and list values as short categories: `["q_proj","v_proj"]` reads "q,v", the full
 * text in the key under the plot and in the hover line) and one for the metric, each line in its run's colour;
 * the best run at full strength and starred, the others lighter (plotly draws every parcoords line 1 px wide: it
 * has no per-line width, so the best run stands out by contrast). Hovering a line names its run and its values
 * in the line under the plot. Drawn only while its section is open. `parcoordsData` is pure (node-tested).
 *
 * Test hooks: details[data-rf-compare][open], [data-rf-parcoords][data-runs][data-best],
 * [data-rf-parcoords-hover], [data-rf-parcoords-key].
 */

import { h } from "./dom.js";
import { fmtHparam, fmtNum, plotlyText, runColor, shortHparam } from "./format.js";
import { latestValues } from "./rank.js";

/** @typedef {import("./state.js").State} State */

/** A category label's longest length on an axis (longer ones end with "…"; the key gives the full text). */
export const CATEGORY_CHARS = 12;

/**
 * A short category label: a list of names joined by "," without the suffix they share when it follows "_"
 * (`["q_proj","v_proj"]` -> "q,v", `["q","v"]` -> "q,v"), any text cut to `max` characters with "…".
 * @param {any} v a hyperparameter value @param {number} [max] @returns {string}
 */
export function shortCategory(v, max = CATEGORY_CHARS) {
  let text;
  if (Array.isArray(v) && v.length && v.every((x) => typeof x === "string")) {
    const m = v.length > 1 ? /_[^_]+$/.exec(v[0]) : null;
    const suffix = m && v.every((x) => x.endsWith(m[0]) && x.length > m[0].length) ? m[0] : "";
    text = v.map((x) => x.slice(0, x.length - suffix.length)).join(",");
  } else {
    text = fmtHparam(v);
  }
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/** A colour with an alpha ("#rrggbb" -> "rgba(r,g,b,a)"). @param {string} hex @param {number} alpha */
function withAlpha(hex, alpha) {
  const n = parseInt(hex.slice(1), 16);
  return `rgba(${(n >> 16) & 255},${(n >> 8) & 255},${n & 255},${alpha})`;
}

/** One hyperparameter column's axis. @param {string} c @param {any[]} raw its value for each run */
function hparamDim(c, raw) {
  if (raw.every((v) => typeof v === "number" && Number.isFinite(v))) {
    const logish = raw.every((v) => v > 0) && Math.max(...raw) / Math.min(...raw) >= 100;
    return logish
      ? { label: plotlyText(`${shortHparam(c)} (log10)`), values: raw.map((v) => Math.log10(v)), tickformat: ".3~g" }
      : { label: plotlyText(shortHparam(c)), values: raw, tickformat: ".3~g" };
  }
  const full = [...new Set(raw.map((v) => fmtHparam(v)))].sort();
  const short = full.map((f) => shortCategory(raw.find((v) => fmtHparam(v) === f)));
  return { label: plotlyText(shortHparam(c)), values: raw.map((v) => full.indexOf(fmtHparam(v))),
    tickvals: full.map((_, i) => i), ticktext: short.map(plotlyText) };
}

/**
 * The parcoords trace for the runs (not DELETED) with a value of `metric`; `best` (the best run's id) is drawn at
 * full strength with a ★ on the run axis, the others at 45 % opacity. `key` lists the shortened categories with
 * their full text, `hover[i]` describes run `runIds[i]`.
 * @param {State} state @param {string} metric @param {number|null} [best]
 * @returns {{trace: any, runIds: number[], key: {column: string, short: string, full: string}[], hover: string[]}}
 */
export function parcoordsData(state, metric, best = null) {
  const values = latestValues(state, metric);
  const runs = (state.snapshot?.runs || []).filter((r) => r.status !== "DELETED" && values.has(r.run_id))
    .sort((a, b) => a.run_id - b.run_id);
  const cols = state.snapshot?.hparam_columns || [];
  const ids = runs.map((r) => r.run_id);
  const dims = [{ label: "run", values: ids, tickvals: ids, ticktext: ids.map((id) => (id === best ? `${id} ★` : String(id))) }];
  /** @type {{column: string, short: string, full: string}[]} */ const key = [];
  for (const c of cols) {
    const raw = runs.map((r) => (r.hparams || {})[c]);
    const dim = hparamDim(c, raw);
    dims.push(dim);
    for (const v of raw) {
      const full = fmtHparam(v), short = shortCategory(v);
      if (dim.ticktext && short !== full && !key.some((k) => k.column === shortHparam(c) && k.full === full)) {
        key.push({ column: shortHparam(c), short, full });
      }
    }
  }
  dims.push({ label: plotlyText(metric), values: runs.map((r) => /** @type {number} */ (values.get(r.run_id))),
    tickformat: ".4~g" });
  const n = runs.length;
  const color = (/** @type {number} */ id) => (best === null || id === best ? runColor(id) : withAlpha(runColor(id), 0.45));
  const colorscale = n > 1 ? runs.flatMap((r, i) => [[i / n, color(r.run_id)], [(i + 1) / n, color(r.run_id)]])
    : [[0, runColor(runs[0]?.run_id ?? 1)], [1, runColor(runs[0]?.run_id ?? 1)]];
  const named = (/** @type {any} */ r) => (r.run_name ? ` (${r.run_name})` : ""); // next to the id; shown as text
  const hover = runs.map((r) => [`run ${r.run_id}${named(r)}${r.run_id === best ? " ★ best" : ""}`,
    ...cols.map((c) => `${shortHparam(c)} ${fmtHparam((r.hparams || {})[c])}`),
    `${metric} ${fmtNum(values.get(r.run_id))}`].join(" · "));
  return {
    runIds: ids, key, hover,
    trace: { type: "parcoords", dimensions: dims,
      line: { color: runs.map((_, i) => (i + 0.5) / Math.max(1, n)), colorscale, cmin: 0, cmax: 1 } },
  };
}

/** The note over the plot: how many runs have the metric (wording without "a eval_loss"). @param {number[]} runIds
 * @param {string} metric @param {number|null} best */
export function compareNote(runIds, metric, best) {
  if (!runIds.length) return `no run has logged ${metric} yet`;
  const runs = runIds.length === 1 ? `run ${runIds[0]} has` : `${runIds.length} runs (${runIds.join(", ")}) have`;
  const star = best !== null && runIds.includes(best) ? `; ★ run ${best} is the best` : "";
  return `${runs} logged ${metric}${star}; drag along an axis to filter, hover a line for its run`;
}

export class ComparePanel {
  /** @param {State} state @param {() => string} metric the chosen metric @param {() => number|null} [best] the
   * best run by it */
  constructor(state, metric, best = () => null) {
    this.state = state;
    this.metric = metric;
    this.best = best;
    /** @type {any} */ this.Plotly = null;
    this.plot = h("div", { class: "rf-parcoords", "data-rf-parcoords": "", "data-runs": "0" });
    this.note = h("div", { class: "rf-compare-note" });
    this.hoverEl = h("div", { class: "rf-parcoords-hover", "data-rf-parcoords-hover": "", text: "\u00a0" });
    this.keyEl = h("div", { class: "rf-parcoords-key", "data-rf-parcoords-key": "" });
    this.el = h("details", { class: "rf-compare", "data-rf-compare": "",
      ontoggle: () => this.draw("") },
    h("summary", {}, h("span", { text: "Compare runs " }),
      h("span", { class: "rf-compare-hint", text: "parallel coordinates: hyperparameters → metric" })),
    this.note, this.plot, this.hoverEl, this.keyEl);
    this.key = "";
    /** @type {string[]} */ this.hover = [];
    this.hooked = false;
  }

  /** Redraw while open (when the runs, the metric, the best run or the theme changed). @param {string} themeKey */
  draw(themeKey) {
    const details = /** @type {HTMLDetailsElement} */ (this.el);
    if (!details.open || !this.Plotly) return;
    const metric = this.metric(), best = this.best();
    const { trace, runIds, key, hover } = parcoordsData(this.state, metric, best);
    const drawKey = JSON.stringify([trace.dimensions, trace.line.colorscale, themeKey]);
    if (drawKey === this.key) return;
    this.key = drawKey;
    this.hover = hover;
    this.plot.dataset.runs = String(runIds.length);
    this.plot.dataset.best = best === null ? "" : String(best);
    this.note.textContent = compareNote(runIds, metric, best);
    this.keyEl.replaceChildren(...key.map((k) => h("span", { class: "rf-parcoords-key-item", title: k.full },
      h("b", { text: `${k.column} ${k.short}` }), ` = ${k.full}`)));
    const cs = getComputedStyle(this.el);
    const fg = cs.getPropertyValue("--rf-fg").trim() || "#333";
    const muted = cs.getPropertyValue("--rf-fg-muted").trim() || "#666";
    // titles above the range labels: labels 12 px at the top margin's edge, range labels 9 px and muted
    this.Plotly.react(this.plot, runIds.length ? [{ ...trace, labelfont: { color: fg, size: 12 },
      tickfont: { color: fg, size: 10 }, rangefont: { color: muted, size: 9 } }] : [],
    { height: 300, margin: { l: 44, r: 56, t: 52, b: 28 }, paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)", font: { size: 11, color: fg } },
    { displaylogo: false, responsive: true, displayModeBar: false });
    this.hookHover();
  }

  /** The hover line: the run under the pointer and its values (plotly emits parcoords hovers with a dataIndex). */
  hookHover() {
    const div = /** @type {any} */ (this.plot);
    if (this.hooked || typeof div.on !== "function") return;
    this.hooked = true;
    div.on("plotly_hover", (/** @type {any} */ e) => {
      const i = e?.dataIndex ?? e?.points?.[0]?.dataIndex;
      if (typeof i === "number" && this.hover[i]) this.hoverEl.textContent = this.hover[i];
    });
    div.on("plotly_unhover", () => { this.hoverEl.textContent = "\u00a0"; });
  }

  invalidate() { this.key = ""; }

  destroy() {
    if (this.Plotly) this.Plotly.purge(this.plot);
  }
}
