// @ts-check
/**
 * The panel's state and the reducer that folds the kernel's messages into it (protocol: rapidfire_nb/panel/widget.py).
 *
 * One state per widget model (anywidget's `initialize`), shared by every view of it (`render`): the series
 * store (metric -> run -> points), the latest snapshot (runs, ops log), the metric names, the op notices and the
 * clicks waiting for an answer. No DOM, no timers, no network and no clock: the caller passes the time, so the
 * module runs (and is unit-tested) in node. `reduce` updates the state it is given and returns what changed.
 */

import { DEFAULT_METRICS, requestedText as opRequestedText } from "./format.js";
import { createSeq, sequence } from "./pull.js";

/**
 * @typedef {{run_id: number, status: string, on_device: boolean, device?: string|null, pack?: number|null,
 *   sharding?: string|null, hparams: Record<string, any>,
 *   completed_steps: number, total_steps: number, chunks_done: number, num_segments?: number,
 *   chunks_note?: string|null, epoch?: number,
 *   samples_seen: number, loss: number|null, eval_loss: number|null, metrics?: Record<string, number|null>,
 *   error: string|null, stop_reason?: string|null, pruned?: boolean,
 *   parent_id: number|null,
 *   warm_start: boolean, legal_ops: string[], op_hints?: Record<string, string>,
 *   editable?: Record<string, any>}} Run
 * @typedef {{op_id: string, run_id: number, kind: string, state: string, message: string,
 *   requested_at: number, applied_at: number|null, new_run_id?: number|null}} OpRecord
 * @typedef {{experiment: string, started_at: number, now?: number, progress: string, on_device: number|null,
 *   num_chunks: number, hparam_columns: string[], runs: Run[], ops: OpRecord[], metric_names: string[],
 *   device_status?: string, elapsed_s?: number, training?: boolean, ended?: boolean, writer_alive?: boolean,
 *   source?: string, stats?: Stats, early_stopping?: string|null, devices?: Device[],
 *   device_runs?: Record<string, number>, panel_metrics?: string[], metric_columns?: string[],
 *   best_by?: {metric: string, mode: string}}} Snapshot
 * @typedef {{name: string, state: string, run_id: number|null}} Device
 * @typedef {{name: string, text: string, state: string, runId: number|null, title: string}} DeviceChip
 * @typedef {{percent: number|null, steps_per_s: number|null, s_per_chunk: number|null, eta_s: number|null,
 *   training: boolean}} Stats
 * @typedef {{names: string[], run: number[], step: number[], samples: number[], name: number[],
 *   value: (number|null)[], wall?: (number|null)[]}} EncodedPoints
 * @typedef {{step: number[], samples: number[], value: (number|null)[], wall: (number|null)[]}} Series
 * @typedef {{text: string, state: string, serial: number, fading: boolean}} Notice
 * @typedef {{snapshot: Snapshot|null, series: Map<string, Map<number, Series>>, metricNames: Set<string>,
 *   live: boolean, clockOffset: number, notices: Map<string, Notice>, pending: Map<string, string>,
 *   acked: Set<string>, serial: number, frozenHtml: string|null, seq: import("./pull.js").Seq}} State
 * @typedef {{redraw?: boolean, snapshot?: boolean, full?: boolean, points?: boolean, notices?: boolean,
 *   table?: boolean, plotly?: any, frozen?: boolean}} Change
 */

/** Notices shown at once (the oldest goes first). */
export const MAX_NOTICES = 4;

/** @returns {State} an empty state (no snapshot yet). */
export function createState() {
  return {
    snapshot: null, series: new Map(), metricNames: new Set(DEFAULT_METRICS), live: false, clockOffset: 0,
    notices: new Map(), pending: new Map(), acked: new Set(), serial: 0, frozenHtml: null, seq: createSeq(),
  };
}

/** The notice of a click before any answer. @param {string} kind @param {number} runId */
export function requestedText(kind, runId) {
  return opRequestedText(kind, runId);
}

/** @param {{kind: string, run_id: number, message?: string}} op */
function appliedText(op) {
  return `✓ ${op.message || `${op.kind} applied to run ${op.run_id}`}`;
}

/** @param {{kind: string, run_id: number, message?: string}} op */
function rejectedText(op) {
  return `✗ ${op.kind} for run ${op.run_id} rejected: ${op.message}`;
}

/**
 * Fold one kernel message into `state`.
 * @param {State} state @param {any} msg @param {number} nowMs the browser clock (Date.now())
 * @param {any[]} [buffers] the message's binary buffers
 * @returns {Change} what changed (what the views redraw)
 */
export function reduce(state, msg, nowMs, buffers = []) {
  if (!msg || typeof msg !== "object") return {};
  if (typeof msg.now === "number") state.clockOffset = msg.now * 1000 - nowMs;
  switch (msg.type) {
    case "snapshot":
      sequence(state.seq, msg);
      if (msg.reset) state.series = new Map();
      ingest(state, msg.points);
      return { redraw: true, points: true, ...applySnapshot(state, msg.snapshot) };
    case "points": // points already held (a pull's answer and a push crossed) are not added twice
      if (!sequence(state.seq, msg).points) return {};
      ingest(state, msg.points);
      return { points: true };
    case "update": {
      const take = sequence(state.seq, msg);
      if (take.points && msg.points) ingest(state, msg.points);
      const points = take.points && !!msg.points;
      if (msg.snapshot && take.snapshot) return { points, ...applySnapshot(state, msg.snapshot) };
      return points ? { points } : {};
    }
    case "ack":
      return onAck(state, msg.ack || {});
    case "plotly":
      return buffers && buffers.length ? { plotly: buffers[0] } : {};
    case "error":
      notice(state, `error:${msg.message}`, `panel: ${msg.message}`, "rejected");
      return { notices: true };
    case "frozen": // the experiment ended: the static copy replaces the live view
      state.frozenHtml = typeof msg.html === "string" ? msg.html : "";
      return { frozen: true };
    default:
      return {};
  }
}

/** Append columnar points to the series store. @param {State} state @param {EncodedPoints|null|undefined} enc */
export function ingest(state, enc) {
  if (!enc || !enc.run) return;
  for (let i = 0; i < enc.run.length; i++) {
    const name = enc.names[enc.name[i]];
    let byRun = state.series.get(name);
    if (!byRun) { byRun = new Map(); state.series.set(name, byRun); }
    const rid = enc.run[i];
    let s = byRun.get(rid);
    if (!s) { s = { step: [], samples: [], value: [], wall: [] }; byRun.set(rid, s); }
    s.step.push(enc.step[i]); s.samples.push(enc.samples[i]); s.value.push(enc.value[i]);
    s.wall.push(enc.wall ? enc.wall[i] : null);
    state.metricNames.add(name);
  }
}

/** @param {State} state @param {Snapshot} snap @returns {Change} */
function applySnapshot(state, snap) {
  const first = !state.live;
  const prev = state.snapshot;
  state.live = true;
  // the ops log is sent only when it changed: keep the last one
  const next = Array.isArray(snap.ops) ? snap : { ...snap, ops: prev ? prev.ops : [] };
  state.snapshot = next;
  for (const m of [...(next.metric_names || []), ...(next.panel_metrics || [])]) state.metricNames.add(m);
  let notices = false;
  for (const op of next.ops) { // confirm ops whose click notice is shown
    const n = state.notices.get(op.op_id);
    if (n && n.state !== op.state && op.state !== "queued") {
      notice(state, op.op_id, op.state === "applied" ? appliedText(op) : rejectedText(op), op.state);
      notices = true;
    }
  }
  const logged = new Set(next.ops.map((o) => o.op_id)); // a pending click is done once its op is logged
  for (const [key, opId] of [...state.pending]) if (logged.has(opId)) state.pending.delete(key);
  return { snapshot: true, full: first || !prev, notices };
}

/** @param {State} state @param {any} ack @returns {Change} */
function onAck(state, ack) {
  state.acked.add(ack.op_id);
  state.pending.delete(`${ack.kind}:${ack.run_id}`);
  const inLog = (state.snapshot?.ops || []).find((o) => o.op_id === ack.op_id);
  if (inLog && inLog.state !== "queued") return { table: true }; // its outcome is already shown
  if (ack.state === "rejected") notice(state, ack.op_id, rejectedText(ack), "rejected");
  else if (ack.state === "applied") notice(state, ack.op_id, appliedText(ack), "applied");
  else notice(state, ack.op_id, ack.message || requestedText(ack.kind, ack.run_id), "queued");
  return { notices: true, table: true };
}

/**
 * Show or update the notice line of one op (at most MAX_NOTICES; the oldest goes).
 * @param {State} state @param {string} id @param {string} text @param {string} noticeState
 */
export function notice(state, id, text, noticeState) {
  state.serial += 1;
  const old = state.notices.get(id);
  if (old) Object.assign(old, { text, state: noticeState, serial: state.serial, fading: false });
  else state.notices.set(id, { text, state: noticeState, serial: state.serial, fading: false });
  while (state.notices.size > MAX_NOTICES) state.notices.delete(/** @type {string} */ (state.notices.keys().next().value));
}

/** A notice is final once applied or rejected (it then fades). @param {Notice} n */
export function isFinal(n) {
  return n.state === "applied" || n.state === "rejected";
}

/** The notices, newest first. @param {State} state @returns {[string, Notice][]} */
export function noticesNewestFirst(state) {
  return [...state.notices].reverse();
}

/** Start fading notice `id` if it is still the one with `serial`. @param {State} state @param {string} id
 * @param {number} serial @returns {boolean} whether it changed */
export function fadeNotice(state, id, serial) {
  const n = state.notices.get(id);
  if (!n || n.serial !== serial) return false;
  n.fading = true;
  return true;
}

/** Remove notice `id` if it is still the one with `serial`. @param {State} state @param {string} id
 * @param {number} serial @returns {boolean} whether it changed */
export function dismissNotice(state, id, serial) {
  const n = state.notices.get(id);
  if (!n || n.serial !== serial) return false;
  state.notices.delete(id);
  return true;
}

/** A click was sent: its buttons wait for the answer. @param {State} state @param {string} kind
 * @param {number} runId @param {string} opId */
export function clickSent(state, kind, runId, opId) {
  state.pending.set(`${kind}:${runId}`, opId);
  notice(state, opId, requestedText(kind, runId), "sent");
}

/** A click could not be sent (no kernel connection). @param {State} state @param {string} kind
 * @param {number} runId @param {string} opId */
export function clickFailed(state, kind, runId, opId) {
  state.pending.delete(`${kind}:${runId}`);
  notice(state, opId, `✗ could not send ${kind} for run ${runId}: the kernel is not connected`, "rejected");
}

/** The op went through the server's inbox (the kernel was busy). @param {State} state
 * @param {{op_id: string, kind: string, run_id: number}} op @returns {boolean} whether a notice changed */
export function postedToServer(state, op) {
  if (state.acked.has(op.op_id)) return false;
  notice(state, op.op_id, `${requestedText(op.kind, op.run_id)} (kernel busy: sent through the server)`, "queued");
  return true;
}

/** Give up waiting for a click's answer. @param {State} state @param {string} kind @param {number} runId
 * @param {string} opId @returns {boolean} whether it was still pending */
export function expireClick(state, kind, runId, opId) {
  const key = `${kind}:${runId}`;
  if (state.pending.get(key) !== opId) return false;
  state.pending.delete(key);
  return true;
}

/** Whether a click on `kind` for run `runId` waits for its answer. @param {State} state @param {string} kind
 * @param {number} runId */
export function isPending(state, kind, runId) {
  return state.pending.has(`${kind}:${runId}`);
}

/** Runs in run id order, DELETED ones only with `showDeleted`. @param {State} state @param {boolean} showDeleted */
export function visibleRuns(state, showDeleted) {
  const runs = [...(state.snapshot?.runs || [])].sort((a, b) => a.run_id - b.run_id);
  return showDeleted ? runs : runs.filter((r) => r.status !== "DELETED");
}

/** Status -> number of runs; a pruned run (STOPPED by the early-stopping policy) counts as PRUNED, apart from
 * the user's stops. @param {State} state @returns {Record<string, number>} */
export function statusCounts(state) {
  /** @type {Record<string, number>} */ const counts = {};
  for (const r of state.snapshot?.runs || []) {
    const key = isPruned(r) ? "PRUNED" : r.status;
    counts[key] = (counts[key] || 0) + 1;
  }
  return counts;
}

/** Whether early stopping pruned `run` (it keeps its STOPPED status; PRUNED is a mark). @param {Run} run */
export function isPruned(run) {
  return run.status === "STOPPED" && !!run.pruned;
}

/** The first `n` words of a text, "…" after them when cut. @param {string} text @param {number} [n] */
export function firstWords(text, n = 4) {
  const words = String(text || "").trim().split(/\s+/).filter(Boolean);
  return words.length > n ? `${words.slice(0, n).join(" ")}…` : words.join(" ");
}

/**
 * What a run's Status cell shows in place of its status badge: ✂ PRUNED for a run the early-stopping policy
 * stopped (the reason's first words inline, all of it in the tooltip), STOPPING… while a stop waits in the ops
 * log (`state` "queued") for the run's chunk boundary, and WAITING "for run N" (its chunk boundary) for a warm clone
 * not built yet (its parent's clone op queued); null: the status itself. `why` is shown inline after the badge
 * (cut with an ellipsis), `title` on hover.
 * @param {Snapshot|null|undefined} snap @param {Run} run
 * @returns {{key: string, text: string, title: string, why: string}|null} key: "pruned" | "stopping" | "waiting"
 */
export function runMark(snap, run) {
  if (isPruned(run)) {
    const reason = run.stop_reason || "pruned by early stopping";
    return { key: "pruned", text: "✂ PRUNED", title: `run ${run.run_id} ✂ pruned by early stopping: ${reason}`,
      why: run.stop_reason ? firstWords(run.stop_reason) : "" };
  }
  const queued = (snap?.ops || []).filter((o) => o.state === "queued");
  if ((run.status === "ONGOING" || run.status === "NEW") &&
    queued.some((o) => o.kind === "stop" && o.run_id === run.run_id)) {
    return { key: "stopping", text: "STOPPING…", why: "",
      title: `run ${run.run_id}: a stop is queued; it applies at the end of the run's current chunk (Resume cancels it)` };
  }
  const parent = run.parent_id;
  if (run.status === "NEW" && run.warm_start && parent !== null && parent !== undefined && !run.completed_steps &&
    queued.some((o) => o.kind === "clone" && o.run_id === parent)) {
    return { key: "waiting", text: "WAITING", why: `for run ${parent}`,
      title: `run ${run.run_id} waits for run ${parent}'s chunk boundary: a warm clone, built from run ${parent}'s ` +
        "state at the end of its current chunk" };
  }
  return null;
}

/**
 * The header's early-stopping line: the snapshot's (the kernel words it, e.g. "Optuna: 11 of 24 trials asked ·
 * 5 pruned · 3 running"), "" without a policy or a snapshot. @param {Snapshot|null|undefined} snap
 * @returns {string}
 */
export function earlyStoppingText(snap) {
  const text = snap?.early_stopping;
  return typeof text === "string" ? text.trim() : "";
}

/**
 * The header's device chips, one per device when the experiment trains on several (`run_fit(devices=...)`):
 * "cpu:0 · run 3", "cpu:1 · idle", "cuda:2 · lost" (its worker died), "cpu:0 · —" (the server page: the store
 * does not record what a device does). Empty with one device (the header's single "run N on device" chip).
 * @param {Snapshot|null|undefined} snap @returns {DeviceChip[]}
 */
export function deviceChips(snap) {
  const devices = Array.isArray(snap?.devices) ? snap.devices : [];
  return devices.map((d) => {
    const runId = d.state === "training" && typeof d.run_id === "number" ? d.run_id : null;
    const what = runId !== null ? `run ${runId}` : d.state === "training" ? "training" : d.state || "—";
    const title = runId !== null ? `${d.name}: run ${runId} is training there`
      : d.state === "lost" ? `${d.name}: its worker died; its runs continue on the other devices`
        : d.state === "idle" ? `${d.name}: nothing trains there now`
          : `${d.name}: what it does now is known only to the kernel that trains the experiment`;
    return { name: d.name, text: `${d.name} · ${what}`, state: runId !== null ? "training" : d.state || "—", runId, title };
  });
}

/** Whether the run table shows a Device column: some run has a device (several devices). @param {Snapshot|null|undefined} snap */
export function hasDeviceColumn(snap) {
  return (snap?.runs || []).some((r) => typeof r.device === "string" && r.device !== "");
}

/** Whether the run table shows a Pack column: some run trains packed (`run_fit(packing=...)`).
 * @param {Snapshot|null|undefined} snap */
export function hasPackColumn(snap) {
  return (snap?.runs || []).some((r) => typeof r.pack === "number");
}

/**
 * The metrics the kernel chose for the experiment's trainer kind (rapidfire_nb.view.metrics_view): the default
 * plots (`panel_metrics`: GRPO reward / eval_reward), the table's metric columns (`metric_columns`: those zero or
 * absent for every run left out) and the metric the runs are ranked by (`best_by`); SFT's for a snapshot without
 * them. @param {Snapshot|null|undefined} snap @returns {{plots: string[], columns: string[], best: string}}
 */
export function kindMetrics(snap) {
  const names = (/** @type {any} */ v) => (Array.isArray(v) ? v.filter((x) => typeof x === "string") : null);
  const plots = names(snap?.panel_metrics);
  return {
    plots: plots && plots.length ? plots : DEFAULT_METRICS,
    columns: names(snap?.metric_columns) || DEFAULT_METRICS,
    best: typeof snap?.best_by?.metric === "string" ? snap.best_by.metric : "eval_loss",
  };
}

/**
 * The metric of each of `n` plots: the one the user picked, else the kind's default for that plot (SFT's loss /
 * eval_loss when the kernel names none). @param {Snapshot|null|undefined} snap @param {(string|null)[]} picked
 * @returns {string[]}
 */
export function plotMetrics(snap, picked) {
  const plots = kindMetrics(snap).plots;
  return picked.map((p, i) => p || plots[i] || DEFAULT_METRICS[i] || DEFAULT_METRICS[0]);
}

/** Metric names, the kind's plots and columns first (loss and eval_loss for SFT), then alphabetical.
 * @param {State} state @returns {string[]} */
export function metricOrder(state) {
  const first = [...new Set([...kindMetrics(state.snapshot).plots, ...kindMetrics(state.snapshot).columns])];
  return [...state.metricNames].sort((a, b) => {
    const ia = first.indexOf(a), ib = first.indexOf(b);
    if (ia !== -1 || ib !== -1) return (ia === -1 ? 99 : ia) - (ib === -1 ? 99 : ib);
    return a.localeCompare(b);
  });
}
