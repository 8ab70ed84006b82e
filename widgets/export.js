// @ts-check
/**
 * CSV export of the runs table and of every logged metric, from the panel's state (the panel and the server
 * page alike). `runsCsv` / `metricsCsv` are pure (node-tested); `download` hands a text to the browser as a file.
 */

import { kindMetrics } from "./state.js";

/** @typedef {import("./state.js").State} State */

/** One CSV field (RFC 4180: quoted when it holds a comma, a quote or a line break). @param {any} v */
export function csvField(v) {
  if (v === null || v === undefined || (typeof v === "number" && !Number.isFinite(v))) return "";
  const s = typeof v === "object" ? JSON.stringify(v) : String(v);
  return /[",\r\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
}

/** @param {any[][]} rows */
function csv(rows) {
  return rows.map((r) => r.map(csvField).join(",")).join("\r\n") + "\r\n";
}

/**
 * The runs table: one row per run (DELETED ones too, with their status; the device with several devices), every hyperparameter the snapshot
 * carries (the differing columns first), progress, the latest loss / eval_loss and the trainer kind's other metric
 * columns (state.kindMetrics: GRPO reward, eval_reward).
 * @param {State} state @returns {string}
 */
export function runsCsv(state) {
  const snap = state.snapshot;
  const runs = [...(snap?.runs || [])].sort((a, b) => a.run_id - b.run_id);
  const cols = [...(snap?.hparam_columns || [])];
  for (const r of runs) for (const k of Object.keys({ ...(r.editable || {}), ...(r.hparams || {}) })) {
    if (!cols.includes(k)) cols.push(k);
  }
  const device = runs.some((r) => typeof r.device === "string" && r.device !== ""); // several devices
  const kind = kindMetrics(snap).columns.filter((m) => m !== "loss" && m !== "eval_loss"); // GRPO: reward...
  const head = ["run_id", "status", ...(device ? ["device"] : []), "parent_id", "warm_start", ...cols,
    "completed_steps", "total_steps", "chunks_done", "samples_seen", "loss", "eval_loss", ...kind, "error"];
  return csv([head, ...runs.map((r) => {
    const hp = { ...(r.editable || {}), ...(r.hparams || {}) };
    return [r.run_id, r.status, ...(device ? [r.device] : []), r.parent_id, r.warm_start, ...cols.map((c) => hp[c]),
      r.completed_steps, r.total_steps, r.chunks_done, r.samples_seen, r.loss, r.eval_loss,
      ...kind.map((m) => (r.metrics || {})[m]), r.error];
  })]);
}

/**
 * Every metric point, one row per (run, step) as `get_results()` has it: run_id, step, samples_seen,
 * wall_time (unix s), then one column per metric name.
 * @param {State} state @returns {string}
 */
export function metricsCsv(state) {
  const names = [...state.series.keys()].sort();
  /** @type {Map<string, any[]>} */ const rows = new Map();
  names.forEach((name, j) => {
    for (const [rid, s] of /** @type {Map<number, any>} */ (state.series.get(name))) {
      for (let i = 0; i < s.step.length; i++) {
        const key = `${rid}|${s.step[i]}`;
        let row = rows.get(key);
        if (!row) { row = [rid, s.step[i], s.samples[i], s.wall?.[i] ?? null, ...names.map(() => null)]; rows.set(key, row); }
        row[4 + j] = s.value[i];
        if (row[3] === null && s.wall?.[i] !== undefined) row[3] = s.wall[i];
      }
    }
  });
  const body = [...rows.values()].sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  return csv([["run_id", "step", "samples_seen", "wall_time", ...names], ...body]);
}

/** A file name from the experiment's name: `<name>-<what>.csv`. @param {string|undefined} experiment
 * @param {string} what */
export function csvName(experiment, what) {
  return `${String(experiment || "experiment").replace(/[^\w.-]+/g, "_")}-${what}.csv`;
}

/** Offer `text` as a downloaded file (a Blob URL clicked through a hidden link). @param {string} name
 * @param {string} text @returns {string} the name */
export function download(name, text) {
  const url = URL.createObjectURL(new Blob([text], { type: "text/csv;charset=utf-8" }));
  const a = document.createElement("a");
  a.href = url; a.download = name; a.style.display = "none";
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
  return name;
}
