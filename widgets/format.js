// @ts-check
/**
 * Text formatting shared by the panel (widgets/panel.js) and the server page (app.js): numbers, counts, times,
 * hyperparameter names and values, run colours. Pure functions, no DOM; `fmtNum` follows
 * rapidfire_nb.view.fmt_num (the kernel's and the server's one number format).
 */

import { OP_KINDS } from "./op_kinds.js";

/** Run statuses (kernel_scheduler.RunStatus values), in the order the panel lists their counts. */
export const STATUSES = ["NEW", "ONGOING", "STOPPED", "COMPLETED", "FAILED", "DELETED", "INTERRUPTED"];
/** IC Op kinds (kernel_scheduler.OpKind values), in the order of the row buttons (the generated op_kinds.js). */
export const OPS = OP_KINDS.map((k) => k.name);
/** Op kind -> its button's text ("Clone…"). */
export const OP_LABEL = Object.fromEntries(OP_KINDS.map((k) => [k.name, k.label]));
/** Op kind -> its button's tooltip: what it does. */
export const OP_TITLE = Object.fromEntries(OP_KINDS.map((k) => [k.name, k.title]));

/** Whether an op of `kind` carries `changes` and `warm_start` (a clone). @param {string} kind */
export function takesChanges(kind) {
  return OP_KINDS.some((k) => k.name === kind && k.takes_changes);
}

/** The notice of a click before the kernel answers (kernel_scheduler.op_kinds: `requested`).
 * @param {string} kind @param {number} runId */
export function requestedText(kind, runId) {
  const k = OP_KINDS.find((x) => x.name === kind);
  if (k) return k.requested.replace("{run_id}", String(runId));
  return `${kind} requested for run ${runId} — applies at the end of its current chunk`;
}
/** The metrics shown first (and in the two plots at start) for a snapshot that names none (SFT's; the kernel
 * sends its trainer kind's as `panel_metrics`, `metric_columns` and `best_by`: rapidfire_nb.view.metrics_view). */
export const DEFAULT_METRICS = ["loss", "eval_loss"];

/** A metric column's title (rapidfire_nb.view.metrics_view.metric_title): Loss, Eval loss, Reward,
 * Eval rewards/accuracies. @param {string} name */
export function metricTitle(name) {
  if (name.startsWith("eval_") && name.length > 5) return `Eval ${name.slice(5).replace(/_/g, " ")}`;
  return name.charAt(0).toUpperCase() + name.slice(1).replace(/_/g, " ");
}
/** TensorBoard 2.x's Time Series run palette (its default view since 2.5: `DEFAULT_PALETTE` in
 * tensorflow/tensorboard tensorboard/webapp/util/colors.ts, the light theme's hex values: Slate, Cyan, Pink, Yellow,
 * Purple, Light Green, Orange), so that a run has one colour in the panel, the page, the static copy
 * (rapidfire_nb.panel.static.PALETTE) and TensorBoard, which colours runs in the order it lists them (run 1, 2, …:
 * first event first). Run n gets colour (n-1) mod 7. */
export const PALETTE = ["#425066", "#12b5cb", "#e52592", "#f9ab00", "#9334e6", "#7cb342", "#e8710a"];
/** The same palette's dark-theme values in TensorBoard (only Slate differs: Slate 400, readable on a dark page). */
export const PALETTE_DARK = ["#8e98a3", ...PALETTE.slice(1)];
/** Whether the page is dark (one theme per page: every panel on it shares this). */
let darkRuns = false;

/** Use the dark-theme run colours (view.setTheme, from the panel's background). @param {boolean} on
 * @returns {boolean} whether this changed them */
export function setDarkRunColors(on) {
  const changed = darkRuns !== !!on;
  darkRuns = !!on;
  return changed;
}

/** Whether a CSS colour ("#rgb", "#rrggbb", "rgb(r, g, b)", "rgba(...)") is dark (relative luminance under 0.4);
 * false when it cannot be read. @param {string} css */
export function isDarkColor(css) {
  const s = String(css || "").trim().toLowerCase();
  let rgb = null;
  const hex = /^#([0-9a-f]{3}|[0-9a-f]{6})$/.exec(s);
  if (hex) {
    const x = hex[1].length === 3 ? hex[1].split("").map((c) => c + c).join("") : hex[1];
    rgb = [0, 2, 4].map((i) => parseInt(x.slice(i, i + 2), 16));
  } else {
    const m = /^rgba?\(\s*([\d.]+)[\s,]+([\d.]+)[\s,]+([\d.]+)/.exec(s);
    if (m) rgb = [m[1], m[2], m[3]].map(Number);
  }
  if (!rgb) return false;
  const lin = rgb.map((v) => { const c = v / 255; return c <= 0.03928 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4); });
  return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2] < 0.4;
}
const HPARAM_SHORT = /** @type {Record<string, string>} */ ({
  learning_rate: "lr", per_device_train_batch_size: "batch", gradient_accumulation_steps: "grad acc",
  num_train_epochs: "epochs", max_steps: "max steps", "lora.r": "lora r", "lora.lora_alpha": "lora α",
  "lora.lora_dropout": "dropout", "lora.target_modules": "targets", model_name: "model",
  weight_decay: "wd", warmup_ratio: "warmup", lr_scheduler_type: "lr sched", max_length: "max len",
});

/** 4 significant digits; tiny/huge numbers as 1e-4 / 2.5e6; "–" for a missing value. @param {any} v */
export function fmtNum(v) {
  if (v === null || v === undefined || v === "") return "–";
  if (typeof v !== "number") return String(v);
  if (!Number.isFinite(v)) return String(v);
  if (Number.isInteger(v) && Math.abs(v) < 1e6) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) {
    const [m, e] = v.toExponential(3).split("e");
    return `${m.replace(/\.?0+$/, "")}e${Number(e)}`;
  }
  return String(Number(v.toPrecision(4)));
}

/** A metric value as the tables show it (rapidfire_nb.view.fmt_metric): 4 significant digits with trailing
 * zeros kept, so a column reads evenly (3.510 beside 3.136); exponent form as fmtNum; "–" for a missing or
 * non-finite value (a NaN is never shown as a number). @param {any} v */
export function fmtMetric(v) {
  if (v === null || v === undefined || v === "" || (typeof v === "number" && !Number.isFinite(v))) return "–";
  if (typeof v !== "number") return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return fmtNum(v);
  return v.toPrecision(4).replace(/\.$/, "");
}

/** Seconds as a short duration: 0:42, 12:05, 1:02:05 (fmtElapsed), "–" when unknown. @param {any} s */
export function fmtDuration(s) {
  return typeof s === "number" && Number.isFinite(s) ? fmtElapsed(s) : "–";
}

/**
 * The header's tqdm-like line (rapidfire_nb.view.clock.stats_text): "45% · 3.2 steps/s · 12 s/chunk · 1:23 left";
 * the percentage is of every run's full budget (100 only when every run has it), with "2 runs short of budget"
 * when runs were stopped short; `eta_s` is the smoothed one the view passes (widgets/eta.js).
 * @param {any} stats the snapshot's `stats` @returns {string}
 */
export function statsText(stats) {
  if (!stats) return "";
  const parts = [];
  if (typeof stats.percent === "number") parts.push(`${percentText(stats.percent)}%`);
  const short = stats.short_runs || 0;
  if (short) parts.push(`${short} run${short === 1 ? "" : "s"} short of budget`);
  const rate = stats.steps_per_s;
  if (rate) parts.push(rate >= 1 ? `${Number(rate.toPrecision(3))} steps/s` : `${Number((1 / rate).toPrecision(3))} s/step`);
  if (stats.s_per_chunk) parts.push(`${Number(stats.s_per_chunk.toPrecision(3))} s/chunk`);
  if (stats.training && typeof stats.eta_s === "number") parts.push(`${fmtElapsed(stats.eta_s)} left`);
  return parts.join(" · ");
}

/** A percentage rounded to a whole number, except that under 100 never reads "100" (rapidfire_nb.view.clock
 * .percent_text). @param {number} p */
export function percentText(p) {
  return p >= 99.5 && p < 100 ? "99" : String(Math.round(p));
}

/** An integer with thousands separators (1,234). @param {any} v */
export function fmtInt(v) {
  if (v === null || v === undefined) return "–";
  return typeof v === "number" ? Math.round(v).toLocaleString("en-US") : String(v);
}

/** A hyperparameter value: numbers by fmtNum, strings as they are, anything else as JSON. @param {any} v */
export function fmtHparam(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") return fmtNum(v);
  if (typeof v === "string") return v;
  return JSON.stringify(v);
}

/** Elapsed time as m:ss or h:mm:ss. @param {number} s seconds */
export function fmtElapsed(s) {
  s = Math.max(0, Math.floor(s));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  const mm = String(m).padStart(2, "0"), ss = String(sec).padStart(2, "0");
  return h ? `${h}:${mm}:${ss}` : `${m}:${ss}`;
}

/** Wall-clock time of day (24 h). @param {number|null|undefined} t unix seconds */
export function fmtClock(t) {
  if (!t) return "";
  return new Date(t * 1000).toLocaleTimeString("en-GB", { hour12: false });
}

/**
 * Text for a plotly label, tick or title: plotly reads a pseudo-HTML subset there (`<a href>`, `<b>`, `<br>`), so a
 * name or value holding `<a href=...>` would become a live link. `&`, `<` and `>` are written as entities, which
 * plotly shows as the characters themselves. @param {string} text
 */
export function plotlyText(text) {
  return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

/** A short column title for a hyperparameter name (lr, lora r, ...). @param {string} name */
export function shortHparam(name) {
  if (HPARAM_SHORT[name]) return HPARAM_SHORT[name];
  if (name.startsWith("model_kwargs.")) return name.slice("model_kwargs.".length);
  if (name.startsWith("lora.")) return "lora " + name.slice(5).replace(/^lora_/, "");
  return name.replace(/_/g, " ");
}

/** The colour of a run (its curve, swatch and legend entry; TensorBoard's dark value on a dark page).
 * @param {number|string} id */
export function runColor(id) {
  const pal = darkRuns ? PALETTE_DARK : PALETTE;
  const n = Number(id);
  if (Number.isInteger(n) && n > 0) return pal[(n - 1) % pal.length];
  let h = 0;
  for (const c of String(id)) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return pal[h % pal.length];
}

/**
 * Parse a clone-form value: JSON (numbers, true/false, null, lists, "quoted"), Python's True/False/None, else a
 * string; a field whose current value is a string keeps the text as typed.
 * @param {string} text @param {any} original
 */
export function parseValue(text, original) {
  const t = text.trim();
  if (typeof original === "string" && !/^".*"$/.test(t)) return t;
  if (t === "True") return true;
  if (t === "False") return false;
  if (t === "None") return null;
  try { return JSON.parse(t); } catch { return t; }
}
