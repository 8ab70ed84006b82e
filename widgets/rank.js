// @ts-check
/**
 * Comparing runs, MLflow-style: the run table sorted by any column, the best run for a metric, "stop all but the
 * best k" (one stop op per run), and a clone that would repeat an existing run's config. Pure functions over the
 * panel's state (widgets/state.js); no DOM. Unit-tested in node (tests/rapidfire_nb/js/rank.test.mjs).
 */

import { metricDirection } from "./curves.js";

/**
 * @typedef {import("./state.js").State} State
 * @typedef {import("./state.js").Run} Run
 * @typedef {{key: string, dir: 1|-1}} Sort
 */

/** The latest finite value of `metric` for each run. ``loss`` and ``eval_loss`` are the run table's own columns:
 * their values are the snapshot's (what the table shows, so the best run's star, "stop all but best" and the
 * sort never disagree with the cells; a run whose latest value is NaN has none); so are the trainer kind's
 * metrics a run carries in ``metrics`` (GRPO's reward). Other metrics come from the series store. @param {State} state @param {string} metric @returns {Map<number, number>} */
export function latestValues(state, metric) {
  /** @type {Map<number, number>} */ const out = new Map();
  if (metric === "loss" || metric === "eval_loss") {
    for (const r of state.snapshot?.runs || []) {
      const v = r[metric];
      if (typeof v === "number" && Number.isFinite(v)) out.set(r.run_id, v);
    }
    return out;
  }
  for (const [rid, s] of state.series.get(metric) || new Map()) {
    for (let i = s.value.length - 1; i >= 0; i--) {
      const v = s.value[i];
      if (v !== null && Number.isFinite(v)) { out.set(rid, v); break; }
    }
  }
  for (const r of state.snapshot?.runs || []) { // the trainer kind's metrics the table shows (run.metrics) win
    if (!r.metrics || !(metric in r.metrics)) continue;
    const v = r.metrics[metric];
    if (typeof v === "number" && Number.isFinite(v)) out.set(r.run_id, v); else out.delete(r.run_id);
  }
  return out;
}

/** A run's value in a sortable column (``run``, ``status``, ``device``, ``pack``, ``hp:<name>``, ``step``, ``chunks``, ``loss``,
 * ``eval_loss``, ``samples``, or ``m:<metric>``). @param {Run} run @param {string} key
 * @param {Map<number, number>} [metric] latest values of the metric column */
export function sortValue(run, key, metric) {
  if (key === "run") return run.run_id;
  if (key === "status") return run.status;
  if (key === "device") return run.device ?? null;
  if (key === "pack") return run.pack ?? null;
  if (key === "step") return run.completed_steps;
  if (key === "chunks") return run.chunks_done;
  if (key === "samples") return run.samples_seen;
  if (key === "loss" || key === "eval_loss") return run[key];
  if (key.startsWith("hp:")) {
    const v = (run.hparams || {})[key.slice(3)];
    return typeof v === "number" || typeof v === "string" || v === null || v === undefined ? v : JSON.stringify(v);
  }
  if (key.startsWith("m:")) return metric?.get(run.run_id) ?? null;
  return null;
}

/**
 * Runs sorted by a column; missing values (null, NaN) last whatever the direction; ties by run id.
 * @param {Run[]} runs @param {Sort} sort @param {Map<number, number>} [metric] @returns {Run[]}
 */
export function sortRuns(runs, sort, metric) {
  const missing = (/** @type {any} */ v) => v === null || v === undefined || (typeof v === "number" && !Number.isFinite(v));
  return [...runs].sort((a, b) => {
    const va = sortValue(a, sort.key, metric), vb = sortValue(b, sort.key, metric);
    if (missing(va) || missing(vb)) return missing(va) === missing(vb) ? a.run_id - b.run_id : missing(va) ? 1 : -1;
    const c = typeof va === "number" && typeof vb === "number" ? va - vb : String(va).localeCompare(String(vb));
    return c === 0 ? a.run_id - b.run_id : c * sort.dir;
  });
}

/** The next sort when a column title is clicked: a new column sorts ascending (metrics: best first), the same
 * column flips. @param {Sort} current @param {string} key @returns {Sort} */
export function nextSort(current, key) {
  if (current.key === key) return { key, dir: current.dir === 1 ? -1 : 1 };
  const metricKey = key === "loss" || key === "eval_loss" ? key : key.startsWith("m:") ? key.slice(2) : null;
  return { key, dir: metricKey && metricDirection(metricKey) === "max" ? -1 : 1 };
}

/**
 * Run ids ranked best first by `metric` (its direction: losses low, accuracies high), among `runs` that have a
 * value (DELETED and FAILED runs are not ranked: a failed run's last values are not a result). @param {Run[]} runs @param {Map<number, number>} values @param {string} metric @returns {number[]}
 */
export function rankRuns(runs, values, metric) {
  const sign = metricDirection(metric) === "max" ? -1 : 1;
  return runs.filter((r) => r.status !== "DELETED" && r.status !== "FAILED" && values.has(r.run_id))
    .sort((a, b) => sign * (/** @type {number} */ (values.get(a.run_id)) - /** @type {number} */ (values.get(b.run_id)))
      || a.run_id - b.run_id)
    .map((r) => r.run_id);
}

/** The best run for `metric` (none without values). @param {State} state @param {string} metric
 * @returns {number|null} */
export function bestRun(state, metric) {
  const ranked = rankRuns(state.snapshot?.runs || [], latestValues(state, metric), metric);
  return ranked.length ? ranked[0] : null;
}

/**
 * "Stop all but the best k": the runs still training (NEW/ONGOING, with a value for `metric`) that are not among
 * the best `k` of them; runs without a value yet are left alone (nothing to judge them by).
 * @param {State} state @param {string} metric @param {number} k
 * @returns {{stop: number[], keep: number[], unranked: number[]}}
 */
export function stopAllButBest(state, metric, k) {
  const active = (state.snapshot?.runs || []).filter((r) => r.status === "NEW" || r.status === "ONGOING");
  const values = latestValues(state, metric);
  const ranked = rankRuns(active, values, metric);
  const keep = ranked.slice(0, Math.max(0, Math.floor(k)));
  return { stop: ranked.slice(keep.length), keep, unranked: active.filter((r) => !values.has(r.run_id)).map((r) => r.run_id) };
}

/** The reason a "stop all but the best k" stop records (its ops log message, the run's stop_reason), e.g.
 * "stop all but best 2 by eval_loss". @param {number} k @param {string} metric @returns {string} */
export function bulkStopReason(k, metric) {
  return `stop all but best ${k} by ${metric}`;
}

/**
 * The first run (not DELETED) whose editable config equals the parent's with `changes` (a clone without
 * changes repeats its parent), or null. @param {State} state @param {Run} parent
 * @param {Record<string, any>} changes @returns {number|null}
 */
export function duplicateConfig(state, parent, changes) {
  const want = { ...(parent.editable || parent.hparams || {}), ...changes };
  const key = (/** @type {Record<string, any>} */ o) => JSON.stringify(Object.keys(o).sort().map((k) => [k, o[k]]));
  for (const r of state.snapshot?.runs || []) {
    if (r.status === "DELETED") continue;
    if (key({ ...(r.editable || r.hparams || {}) }) === key(want)) return r.run_id;
  }
  return null;
}
