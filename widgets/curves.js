// @ts-check
/**
 * The curves' data, TensorBoard-style: what each run's trace holds for an x axis (optimizer step, samples seen
 * or wall-clock time), EMA smoothing, a log scale, a warm clone's curve joined to its parent at the branch step,
 * identical curves told apart, and whole-number ticks on count axes. Pure functions, no DOM, no plotly: node
 * unit-tests them (tests/rapidfire_nb/js/curves.test.mjs); widgets/plots.js turns them into traces.
 */

/**
 * @typedef {import("./state.js").Series} Series
 * @typedef {import("./state.js").Run} Run
 * @typedef {"step"|"samples"|"wall"} XAxis
 * @typedef {{x: number[], y: number[], step: number[], samples: number[], raw: number[], joined: boolean}} Curve
 */

/**
 * TensorBoard's smoothing: an exponential moving average, debiased so that the first points are not pulled
 * towards 0 (`smoothed_i = ema_i / (1 - weight^i)`). Missing values stay missing and do not move the average.
 * @param {(number|null)[]} values @param {number} weight 0 (off) .. 0.999
 * @returns {(number|null)[]}
 */
export function smooth(values, weight) {
  if (!(weight > 0)) return values.slice();
  const w = Math.min(weight, 0.999);
  let last = 0, n = 0;
  return values.map((v) => {
    if (v === null || v === undefined || !Number.isFinite(v)) return null;
    last = last * w + (1 - w) * v;
    n += 1;
    return last / (1 - Math.pow(w, n));
  });
}

/**
 * One run's curve for `xAxis`: finite values only (positive only on a log scale), x in the axis' unit (wall
 * time as ms since the epoch), a warm clone prefixed with its parent's point at the branch step (the parent's
 * last point before the clone's first step), smoothed by `weight`.
 * @param {Series} s the run's series @param {{xAxis: XAxis, weight?: number, log?: boolean,
 *   parent?: Series|null}} opts
 * @returns {Curve}
 */
export function curve(s, { xAxis, weight = 0, log = false, parent = null }) {
  /** @type {{step: number, samples: number, wall: number, value: number}[]} */ const pts = [];
  const take = (/** @type {Series} */ src, /** @type {number} */ i) => {
    const v = src.value[i];
    if (v === null || v === undefined || !Number.isFinite(v) || (log && v <= 0)) return null;
    return { step: src.step[i], samples: src.samples[i], wall: (src.wall?.[i] ?? NaN) * 1000, value: v };
  };
  for (let i = 0; i < s.value.length; i++) { const p = take(s, i); if (p) pts.push(p); }
  let joined = false;
  if (parent && pts.length) {
    let best = -1;
    for (let i = 0; i < parent.step.length; i++) {
      if (parent.step[i] < pts[0].step && take(parent, i) && (best < 0 || parent.step[i] >= parent.step[best])) best = i;
    }
    const p = best >= 0 ? take(parent, best) : null;
    if (p) { pts.unshift(p); joined = true; }
  }
  const raw = pts.map((p) => p.value);
  const y = /** @type {number[]} */ (smooth(raw, weight));
  return { x: pts.map((p) => p[xAxis]), y, step: pts.map((p) => p.step), samples: pts.map((p) => p.samples),
    raw, joined };
}

/**
 * Where a pruned run's curve ends: its last plotted point (x, y as drawn, smoothed or not, and the step), for the
 * ✂ marker; null for a run early stopping did not prune (state.isPruned) or a curve without points.
 * @param {Curve} c @param {Run|undefined} run @returns {{x: number, y: number, step: number}|null}
 */
export function pruneMarker(c, run) {
  if (!run || run.status !== "STOPPED" || !run.pruned || !c.x.length) return null;
  const i = c.x.length - 1;
  return { x: c.x[i], y: c.y[i], step: c.step[i] };
}

/** The parent series a warm clone's curve joins, or null. @param {Run|undefined} run
 * @param {Map<number, Series>} byRun */
export function parentSeries(run, byRun) {
  if (!run || !run.warm_start || run.parent_id === null || run.parent_id === undefined) return null;
  return byRun.get(run.parent_id) || null;
}

/**
 * Runs whose curve repeats an earlier run's exactly (identical clones would hide each other): run id -> the
 * earlier run id. @param {Map<number, Curve>} curves @returns {Map<number, number>}
 */
export function duplicateCurves(curves) {
  /** @type {Map<string, number>} */ const seen = new Map();
  /** @type {Map<number, number>} */ const dup = new Map();
  for (const id of [...curves.keys()].sort((a, b) => a - b)) {
    const c = /** @type {Curve} */ (curves.get(id));
    if (c.raw.length < 2) continue;
    const key = `${c.step.join(",")}|${c.raw.join(",")}`;
    const first = seen.get(key);
    if (first === undefined) seen.set(key, id); else dup.set(id, first);
  }
  return dup;
}

/**
 * A whole-number tick spacing of about `count` ticks over [lo, hi] (1, 2 or 5 times a power of ten, >= 1):
 * optimizer steps and samples are counts, never 1.5.
 * @param {number} lo @param {number} hi @param {number} [count]
 */
export function integerDtick(lo, hi, count = 6) {
  const span = hi - lo;
  if (!(span > 0)) return 1;
  const raw = span / count;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((v) => v >= raw) || 10 * mag;
  return Math.max(1, Math.round(step));
}

/** Metrics that are better when higher (accuracy, reward, margin, ...); the rest (losses) when lower.
 * @param {string} name @returns {"max"|"min"} */
export function metricDirection(name) {
  const n = name.toLowerCase();
  if (n.includes("loss") || n.includes("perplexity") || n.includes("error")) return "min";
  return /acc|reward|margin|f1|bleu|rouge|precision|recall|score|auc|win/.test(n) ? "max" : "min";
}

/** A plot's y range spans more than this factor (largest / smallest value): "auto" draws it on a log scale. */
export const AUTO_LOG_SPAN = 10;

/**
 * The y scale of one plot. "log" and "linear" are the user's explicit choice and win; "auto" (the default) picks a
 * log scale when every value is positive and the largest is more than {@link AUTO_LOG_SPAN} times the smallest
 * (DPO's `ipo` loss ≈ 25 beside sigmoid's ≈ 0.7); where a log scale cannot show the values (zero or negative:
 * rewards, margins), it ignores outliers in the range as TensorBoard's "Ignore outliers in chart scaling" does: the
 * range is the 5th to 95th percentile of the values, padded by 5 % of that span on each side, when the full range is
 * more than 10 times wider. `auto` says the scale or the range was chosen here (the plot shows a cue), `span` the
 * largest / smallest value (log) and `clipped` how many values lie outside the range.
 * @param {(number|null)[][]} valueLists the raw values of each curve drawn (non-finite ones are ignored)
 * @param {"auto"|"linear"|"log"} choice
 * @returns {{type: "log"|"linear", auto: boolean, span: number|null, range: [number, number]|null, clipped: number}}
 */
export function yScale(valueLists, choice) {
  const none = { span: null, range: null, clipped: 0 };
  if (choice === "log" || choice === "linear") return { type: choice, auto: false, ...none };
  const vs = valueLists.flat().filter((v) => typeof v === "number" && Number.isFinite(v)).sort((a, b) => a - b);
  if (vs.length < 2) return { type: "linear", auto: false, ...none };
  const lo = vs[0], hi = vs[vs.length - 1];
  if (lo > 0 && hi / lo > AUTO_LOG_SPAN) return { type: "log", auto: true, ...none, span: hi / lo };
  const q05 = quantile(vs, 0.05), q95 = quantile(vs, 0.95);
  if (!(q95 > q05) || hi - lo <= 10 * (q95 - q05)) return { type: "linear", auto: false, ...none };
  const pad = 0.05 * (q95 - q05);
  const range = /** @type {[number, number]} */ ([q05 - pad, q95 + pad]);
  return { type: "linear", auto: true, span: null, range, clipped: vs.filter((v) => v < range[0] || v > range[1]).length };
}

/** The `q` quantile of sorted values, interpolated linearly (d3.quantile's). @param {number[]} sorted @param {number} q */
export function quantile(sorted, q) {
  const i = (sorted.length - 1) * q, lo = Math.floor(i);
  return lo + 1 < sorted.length ? sorted[lo] + (sorted[lo + 1] - sorted[lo]) * (i - lo) : sorted[lo];
}

/**
 * One x range for every plot of a view (the union of their curves' x values), padded by 2 % of its span so that
 * the end markers are not cut: a loss logged every step and an eval loss logged every 50 steps line up. Null
 * without two distinct finite x values (plotly's own autorange then).
 * @param {Curve[]} curves every curve of every plot @returns {[number, number]|null}
 */
export function sharedXRange(curves) {
  let lo = Infinity, hi = -Infinity;
  for (const c of curves) for (const x of c.x) if (Number.isFinite(x)) { lo = Math.min(lo, x); hi = Math.max(hi, x); }
  if (!(hi > lo)) return null;
  const pad = 0.02 * (hi - lo);
  return [lo - pad, hi + pad];
}

/**
 * The cue a plot shows while its y axis is not the plain linear one: "log scale" (the user's choice), "log scale ·
 * auto (values span 36×)", or "outliers clipped · auto (3 points off the range)"; "" for a plain linear axis.
 * @param {ReturnType<typeof yScale>} scale @returns {string}
 */
export function scaleCue(scale) {
  if (scale.type === "log") {
    return scale.auto ? `log scale · auto (values span ${Math.round(/** @type {number} */ (scale.span))}×)` : "log scale";
  }
  if (scale.range) return `outliers clipped · auto (${scale.clipped} point${scale.clipped === 1 ? "" : "s"} off the range)`;
  return "";
}

/**
 * The message that tells the kernel a view's plot settings when they changed since `lastKey` (else null): the
 * static copy written when the experiment ends draws its curves with them (rapidfire_nb/panel/pull.py
 * `plot_settings_request` checks the message). Smoothing is clamped to the slider's 0..0.99.
 * @param {string} lastKey the key last sent ("" none) @param {string[]} metrics the plots' metrics, in order
 * @param {number} smoothing @param {"auto"|"linear"|"log"} yScale
 * @returns {{key: string, msg: {type: "plot_settings", metrics: string[], smoothing: number, y_scale: string}}|null}
 */
export function plotSettingsChange(lastKey, metrics, smoothing, yScale) {
  const s = Number.isFinite(smoothing) ? Math.min(Math.max(smoothing, 0), 0.99) : 0;
  const msg = { type: /** @type {const} */ ("plot_settings"), metrics: [...metrics], smoothing: s, y_scale: yScale };
  const key = JSON.stringify(msg);
  return key === lastKey ? null : { key, msg };
}
