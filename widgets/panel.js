// @ts-check
/**
 * rapidfire_nb live panel — the front end of `rapidfire_nb.panel.RunPanel` (an anywidget).
 *
 * Plain ES module, no build step. Protocol (see rapidfire_nb/panel.py):
 *   view -> kernel: {type:"hello"} on every render, {type:"need_plotly"} once per page,
 *                   {type:"op", op_id, kind, run_id, changes, warm_start} per click (op_id made once per click).
 *   kernel -> view: {type:"snapshot", reset, snapshot, points, now}, {type:"points", points},
 *                   {type:"update", snapshot|null, points|null, now}, {type:"ack", ack},
 *                   {type:"plotly"} + one buffer (plotly.min.js), {type:"error", message}.
 * Synced trait: `summary` (header only). Test hooks: data-rf-panel, tr[data-run-id][data-status][data-on-device],
 * [data-points] on the plots container, button[data-op].
 */

/**
 * @typedef {{run_id: number, status: string, on_device: boolean, hparams: Record<string, any>,
 *   completed_steps: number, total_steps: number, chunks_done: number, num_segments?: number, epoch?: number,
 *   samples_seen: number,
 *   loss: number|null, eval_loss: number|null, error: string|null, parent_id: number|null,
 *   warm_start: boolean, legal_ops: string[]}} Run
 * @typedef {{op_id: string, run_id: number, kind: string, state: string, message: string,
 *   requested_at: number, applied_at: number|null, new_run_id?: number|null}} OpRecord
 * @typedef {{experiment: string, started_at: number, now?: number, progress: string, on_device: number|null,
 *   num_chunks: number, hparam_columns: string[], runs: Run[], ops: OpRecord[], metric_names: string[],
 *   device_status?: string}} Snapshot
 * @typedef {{names: string[], run: number[], step: number[], samples: number[], name: number[],
 *   value: (number|null)[]}} EncodedPoints
 * @typedef {{step: number[], samples: number[], value: (number|null)[]}} Series
 * @typedef {{metric: string, card: HTMLElement, div: HTMLElement, select: HTMLSelectElement,
 *   empty: HTMLElement, traceKey: string, drawn: Map<number, number>, initialized: boolean}} PlotSlot
 * @typedef {{text: string, state: string, el: HTMLElement, timer?: any}} Notice
 * @typedef {{get: (k: string) => any, on: (e: string, f: Function) => void, off: (e: string, f: Function) => void,
 *   send: (content: any, callbacks?: any, buffers?: any[]) => void}} Model
 */

const STATUSES = ["NEW", "ONGOING", "STOPPED", "COMPLETED", "FAILED", "DELETED", "INTERRUPTED"];
const OPS = /** @type {const} */ (["stop", "resume", "delete", "clone"]);
const OP_LABEL = { stop: "Stop", resume: "Resume", delete: "Delete", clone: "Clone…" };
const svg = (/** @type {string} */ body) => `<svg viewBox="0 0 16 16" width="13" height="13" fill="none" ` +
  `stroke="currentColor" stroke-width="1.5" stroke-linecap="round" stroke-linejoin="round">${body}</svg>`;
const OP_ICON = {
  stop: svg('<rect x="4" y="4" width="8" height="8" rx="1.2" fill="currentColor" stroke="none"/>'),
  resume: svg('<path d="M5 3.5v9l7.5-4.5z" fill="currentColor" stroke="none"/>'),
  delete: svg('<path d="M3 4.5h10M6.5 4.5V3h3v1.5M4.5 4.5l.6 8.5h5.8l.6-8.5M7 7v4M9 7v4"/>'),
  clone: svg('<rect x="5.5" y="5.5" width="7.5" height="7.5" rx="1.3"/><path d="M10.5 3.5V3H3v7.5h.5"/>'),
};
const OP_TITLE = {
  stop: "Stop after the current chunk (all state kept; Resume continues it)",
  resume: "Put the run back into the rotation",
  delete: "Remove the run (hidden unless 'show deleted' is on)",
  clone: "Start a new run from this one's config, with changes",
};
/** Tableau 10: distinct, readable on light and dark backgrounds. Run n gets colour n-1 (stable). */
const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
  "#9c755f", "#bab0ac"];
const DEFAULT_METRICS = ["loss", "eval_loss"];
const PLOT_HEIGHT = 260;
const PLOTLY_KEY = "__rapidfire_nb_plotly__";
const CLOCK_SVG = '<svg viewBox="0 0 16 16" width="12" height="12" fill="none" stroke="currentColor" ' +
  'stroke-width="1.6" stroke-linecap="round"><circle cx="8" cy="8" r="6.2"/><path d="M8 4.6V8l2.3 1.5"/></svg>';
const HPARAM_SHORT = /** @type {Record<string, string>} */ ({
  learning_rate: "lr", per_device_train_batch_size: "batch", gradient_accumulation_steps: "grad acc",
  num_train_epochs: "epochs", max_steps: "max steps", "lora.r": "lora r", "lora.lora_alpha": "lora α",
  "lora.lora_dropout": "dropout", "lora.target_modules": "targets", model_name: "model",
  weight_decay: "wd", warmup_ratio: "warmup", lr_scheduler_type: "lr sched", max_length: "max len",
});

// ---------------------------------------------------------------------------------------------------------
// formatting helpers
// ---------------------------------------------------------------------------------------------------------

/** @param {any} v 4 significant digits; tiny/huge numbers as 1e-4 / 2.5e+6. */
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

/** @param {any} v */
function fmtInt(v) {
  if (v === null || v === undefined) return "–";
  return typeof v === "number" ? Math.round(v).toLocaleString("en-US") : String(v);
}

/** @param {any} v */
function fmtHparam(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") return fmtNum(v);
  if (typeof v === "string") return v;
  return JSON.stringify(v);
}

/** @param {number} s seconds */
function fmtElapsed(s) {
  s = Math.max(0, Math.floor(s));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  const mm = String(m).padStart(2, "0"), ss = String(sec).padStart(2, "0");
  return h ? `${h}:${mm}:${ss}` : `${m}:${ss}`;
}

/** @param {number|null|undefined} t unix seconds */
function fmtClock(t) {
  if (!t) return "";
  return new Date(t * 1000).toLocaleTimeString("en-GB", { hour12: false });
}

/** @param {string} name */
function shortHparam(name) {
  if (HPARAM_SHORT[name]) return HPARAM_SHORT[name];
  if (name.startsWith("model_kwargs.")) return name.slice("model_kwargs.".length);
  if (name.startsWith("lora.")) return "lora " + name.slice(5).replace(/^lora_/, "");
  return name.replace(/_/g, " ");
}

/** @param {number|string} id */
export function runColor(id) {
  const n = Number(id);
  if (Number.isInteger(n) && n > 0) return PALETTE[(n - 1) % PALETTE.length];
  let h = 0;
  for (const c of String(id)) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return PALETTE[h % PALETTE.length];
}

function newOpId() {
  const c = globalThis.crypto;
  if (c && typeof c.randomUUID === "function") return c.randomUUID();
  const b = new Uint8Array(16);
  if (c && c.getRandomValues) c.getRandomValues(b); else for (let i = 0; i < 16; i++) b[i] = Math.random() * 256;
  b[6] = (b[6] & 0x0f) | 0x40; b[8] = (b[8] & 0x3f) | 0x80;
  const x = Array.from(b, (v) => v.toString(16).padStart(2, "0")).join("");
  return `${x.slice(0, 8)}-${x.slice(8, 12)}-${x.slice(12, 16)}-${x.slice(16, 20)}-${x.slice(20)}`;
}

/** @param {string} kind @param {number} runId */
function requestedText(kind, runId) {
  if (kind === "clone") return `clone of run ${runId} requested — the new run joins at the next chunk boundary`;
  if (kind === "resume") return `resume requested for run ${runId} — it rejoins the rotation at the next chunk`;
  return `${kind} requested for run ${runId} — applies at the end of its current chunk`;
}

/**
 * Parse a form value: JSON (numbers, true/false, null, lists, "quoted"), Python's True/False/None, else a string.
 * @param {string} text @param {any} original
 */
function parseValue(text, original) {
  const t = text.trim();
  if (typeof original === "string" && !/^".*"$/.test(t)) return t;
  if (t === "True") return true;
  if (t === "False") return false;
  if (t === "None") return null;
  try { return JSON.parse(t); } catch { return t; }
}

/**
 * Tiny DOM helper.
 * @param {string} tag @param {Record<string, any>} [attrs] @param {...(Node|string|null|undefined|false)} kids
 * @returns {HTMLElement}
 */
function h(tag, attrs = {}, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "style" && typeof v === "object") Object.assign(el.style, v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const kid of kids) if (kid !== null && kid !== undefined && kid !== false) el.append(kid);
  return el;
}

// ---------------------------------------------------------------------------------------------------------
// plotly.js: loaded once per page from bytes the kernel sends (never inlined here)
// ---------------------------------------------------------------------------------------------------------

/**
 * @typedef {{promise: Promise<any>, resolve: (p: any) => void, reject: (e: any) => void,
 *   requestedAt: number, loading: boolean, done: boolean, askedBy: WeakSet<object>}} PlotlyLoader
 * @returns {PlotlyLoader}
 */
function plotlyLoader() {
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

/** @param {any} buf DataView | ArrayBuffer | Uint8Array */
async function loadPlotlyFromBuffer(buf) {
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

// ---------------------------------------------------------------------------------------------------------
// the view
// ---------------------------------------------------------------------------------------------------------

class PanelView {
  /** @param {Model} model @param {HTMLElement} el */
  constructor(model, el) {
    this.model = model;
    this.el = el;
    /** @type {Snapshot|null} */ this.snapshot = null;
    /** @type {Map<string, Map<number, Series>>} metric -> run -> series */ this.series = new Map();
    /** @type {Set<string>} */ this.metricNames = new Set(DEFAULT_METRICS);
    this.xAxis = /** @type {"step"|"samples"} */ ("step");
    this.showDeleted = false;
    /** @type {Set<number>} runs hidden from the curves by a click on their legend entry */
    this.hiddenRuns = new Set();
    this.live = false;
    this.clockOffset = 0; // kernel clock - browser clock (ms)
    /** @type {Map<string, Notice>} */ this.notices = new Map();
    /** @type {Map<string, string>} "kind:run" -> op_id of a click not yet acknowledged */ this.pending = new Map();
    /** @type {Set<string>} op ids the kernel acknowledged over the comm */ this.acked = new Set();
    /** @type {Map<number, {tr: HTMLElement, cells: Record<string, HTMLElement>, buttons: Record<string,
     *   HTMLButtonElement>, errorTr: HTMLElement, stepText: HTMLElement, stepFill: HTMLElement, runKey: string,
     *   statusKey: string, formTr: HTMLElement|null}>} */
    this.rows = new Map();
    this.hparamKey = "";
    this.legendKey = "";
    this.opsKey = null;
    /** @type {any} */ this.Plotly = null;
    this.plotFrame = 0;
    this.themeKey = "";
    this.disposed = false;
    this.build();
  }

  // -- skeleton ------------------------------------------------------------------------------------------
  build() {
    this.titleEl = h("span", { class: "rf-title" });
    this.elapsedText = h("span", { text: "–" });
    const clock = h("span", { class: "rf-icon", "aria-hidden": "true" });
    clock.innerHTML = CLOCK_SVG;
    this.elapsedEl = h("span", { class: "rf-chip rf-elapsed", title: "elapsed since run_fit" }, clock,
      this.elapsedText);
    this.progressEl = h("span", { class: "rf-chip rf-progress", title: "chunk progress" });
    this.deviceEl = h("span", { class: "rf-chip rf-device" });
    this.countsEl = h("div", { class: "rf-counts" });
    const header = h("div", { class: "rf-header" },
      h("div", { class: "rf-heading" }, h("span", { class: "rf-logo", "aria-hidden": "true" }), this.titleEl),
      h("div", { class: "rf-chips" }, this.elapsedEl, this.progressEl, this.deviceEl));
    this.noticesEl = h("div", { class: "rf-notices", "aria-live": "polite" });
    this.statusLine = h("div", { class: "rf-waiting", text: "Connecting to the kernel…" });

    this.theadRow = h("tr");
    this.tbody = h("tbody");
    this.table = h("table", { class: "rf-table" }, h("thead", {}, this.theadRow), this.tbody);

    this.stepBtn = h("button", { class: "rf-seg-btn rf-on", "data-x": "step", text: "step",
      onclick: () => this.setXAxis("step") });
    this.samplesBtn = h("button", { class: "rf-seg-btn", "data-x": "samples", text: "samples seen",
      onclick: () => this.setXAxis("samples") });
    this.deletedBox = /** @type {HTMLInputElement} */ (h("input", { type: "checkbox", "data-rf-show-deleted": "",
      onchange: () => { this.showDeleted = this.deletedBox.checked; this.renderAll(); } }));
    this.deletedLabel = h("span", { text: "show deleted" });
    const toolbar = h("div", { class: "rf-toolbar" },
      h("div", { class: "rf-counts-wrap" }, this.countsEl),
      h("label", { class: "rf-check", title: "Bring deleted runs back, greyed, in the table and the curves" },
        this.deletedBox, this.deletedLabel),
      h("div", { class: "rf-seg", role: "group", "aria-label": "x axis" },
        h("span", { class: "rf-seg-label", text: "x axis" }), this.stepBtn, this.samplesBtn));

    this.legendEl = h("div", { class: "rf-legend", "data-rf-legend": "", role: "group",
      "aria-label": "runs shown in the curves" });
    this.plotsEl = h("div", { class: "rf-plots", "data-rf-plots": "", "data-points": "0" });
    /** @type {PlotSlot[]} */
    this.plots = DEFAULT_METRICS.map((m) => this.makePlotSlot(m));

    this.opsCount = h("span", { class: "rf-ops-count", text: "0" });
    this.opsList = h("ol", { class: "rf-ops-list" });
    this.opsEl = h("details", { class: "rf-ops", open: true },
      h("summary", {}, h("span", { text: "Ops log " }), this.opsCount), this.opsList);

    this.root = h("div", { class: "rf-panel", "data-rf-panel": "" },
      header, this.noticesEl, this.statusLine,
      h("div", { class: "rf-table-wrap" }, this.table),
      toolbar, this.legendEl, this.plotsEl, this.opsEl);
    this.el.replaceChildren(this.root);
    this.renderHeader();
    this.renderTable();
  }

  /** @param {string} metric */
  makePlotSlot(metric) {
    const select = /** @type {HTMLSelectElement} */ (h("select", { class: "rf-metric", title: "metric",
      "aria-label": "metric" }));
    const div = h("div", { class: "rf-plot", style: { height: `${PLOT_HEIGHT}px` } });
    const empty = h("div", { class: "rf-plot-empty", text: "loading plotly.js…" });
    const card = h("div", { class: "rf-card", "data-metric": metric },
      h("div", { class: "rf-card-head" }, select), h("div", { class: "rf-plot-box" }, div, empty));
    /** @type {PlotSlot} */
    const slot = { metric, card, div, select, empty, traceKey: "", drawn: new Map(), initialized: false };
    select.addEventListener("change", () => {
      slot.metric = select.value; card.dataset.metric = slot.metric; slot.traceKey = ""; this.schedulePlot();
    });
    this.plotsEl.append(card);
    return slot;
  }

  // -- messages ------------------------------------------------------------------------------------------
  /** @param {any} msg @param {any[]} [buffers] */
  onMessage(msg, buffers) {
    if (!msg || typeof msg !== "object") return;
    if (typeof msg.now === "number") this.clockOffset = msg.now * 1000 - Date.now();
    switch (msg.type) {
      case "snapshot":
        if (msg.reset) this.series = new Map();
        for (const p of this.plots) { p.traceKey = ""; p.drawn = new Map(); }
        this.ingest(msg.points);
        this.applySnapshot(msg.snapshot);
        break;
      case "points":
        this.ingest(msg.points);
        this.schedulePlot();
        break;
      case "update":
        if (msg.points) this.ingest(msg.points);
        if (msg.snapshot) this.applySnapshot(msg.snapshot); else this.schedulePlot();
        break;
      case "ack":
        this.onAck(msg.ack || {});
        break;
      case "plotly":
        if (buffers && buffers.length) loadPlotlyFromBuffer(buffers[0]);
        break;
      case "error":
        this.notice(`error:${msg.message}`, `panel: ${msg.message}`, "rejected");
        break;
      default:
    }
  }

  /** @param {EncodedPoints|null|undefined} enc */
  ingest(enc) {
    if (!enc || !enc.run) return;
    const n = enc.run.length;
    for (let i = 0; i < n; i++) {
      const name = enc.names[enc.name[i]];
      let byRun = this.series.get(name);
      if (!byRun) { byRun = new Map(); this.series.set(name, byRun); }
      const rid = enc.run[i];
      let s = byRun.get(rid);
      if (!s) { s = { step: [], samples: [], value: [] }; byRun.set(rid, s); }
      s.step.push(enc.step[i]); s.samples.push(enc.samples[i]); s.value.push(enc.value[i]);
      this.metricNames.add(name);
    }
  }

  /** @param {Snapshot} snap */
  applySnapshot(snap) {
    const first = !this.live;
    this.live = true;
    this.statusLine.hidden = true;
    const prev = this.snapshot;
    if (!Array.isArray(snap.ops)) snap.ops = prev ? prev.ops : []; // sent only when the ops log changed
    this.snapshot = snap;
    for (const m of snap.metric_names || []) {
      this.metricNames.add(m);
    }
    // confirm ops that were acknowledged in this view
    for (const op of snap.ops || []) {
      const n = this.notices.get(op.op_id);
      if (n && n.state !== op.state && op.state !== "queued") {
        const text = op.state === "applied" ? `✓ ${op.message || `${op.kind} applied to run ${op.run_id}`}`
          : `✗ ${op.kind} for run ${op.run_id} rejected: ${op.message}`;
        this.notice(op.op_id, text, op.state);
      }
    }
    // a pending click is done once its op shows up in the ops log
    const logged = new Set((snap.ops || []).map((o) => o.op_id));
    for (const [key, opId] of [...this.pending]) if (logged.has(opId)) this.pending.delete(key);
    this.renderAll(first || !prev);
  }

  /** @param {any} ack */
  onAck(ack) {
    this.acked.add(ack.op_id);
    this.pending.delete(`${ack.kind}:${ack.run_id}`);
    const opInLog = (this.snapshot?.ops || []).find((o) => o.op_id === ack.op_id);
    if (opInLog && opInLog.state !== "queued") return; // its outcome is already shown
    if (ack.state === "rejected") {
      this.notice(ack.op_id, `✗ ${ack.kind} for run ${ack.run_id} rejected: ${ack.message}`, "rejected");
    } else if (ack.state === "applied") {
      this.notice(ack.op_id, `✓ ${ack.message || `${ack.kind} applied to run ${ack.run_id}`}`, "applied");
    } else {
      this.notice(ack.op_id, ack.message || requestedText(ack.kind, ack.run_id), "queued");
    }
    this.renderTable();
  }

  /** Show or update the acknowledgement line of one op. @param {string} id @param {string} text @param {string} state */
  notice(id, text, state) {
    let n = this.notices.get(id);
    if (!n) {
      const el = h("div", { class: "rf-notice", "data-op-id": id });
      this.noticesEl.prepend(el);
      n = { text, state, el };
      this.notices.set(id, n);
    }
    n.text = text; n.state = state;
    n.el.textContent = text;
    n.el.className = `rf-notice rf-notice-${state}`;
    n.el.dataset.state = state;
    clearTimeout(n.timer);
    if (state === "applied" || state === "rejected") {
      const note = n;
      note.timer = setTimeout(() => {
        note.el.classList.add("rf-fade");
        setTimeout(() => { note.el.remove(); this.notices.delete(id); }, 400);
      }, state === "applied" ? 6000 : 12000);
    }
    while (this.noticesEl.children.length > 4) {
      const last = /** @type {HTMLElement} */ (this.noticesEl.lastElementChild);
      this.notices.delete(last.dataset.opId || "");
      last.remove();
    }
  }

  // -- ops -----------------------------------------------------------------------------------------------
  /** @param {string} kind @param {number} runId @param {Record<string, any>} [changes] @param {boolean} [warm] */
  sendOp(kind, runId, changes = {}, warm = false) {
    const opId = newOpId(); // once per click: the kernel applies an op_id at most once
    const key = `${kind}:${runId}`;
    this.pending.set(key, opId);
    if (!safeSend(this.model, { type: "op", op_id: opId, kind, run_id: runId, changes, warm_start: warm })) {
      this.pending.delete(key);
      this.notice(opId, `✗ could not send ${kind} for run ${runId}: the kernel is not connected`, "rejected");
      this.renderTable();
      return;
    }
    this.notice(opId, requestedText(kind, runId), "sent");
    this.renderTable();
    // The kernel answers comm messages only while no cell runs. If no ack comes, send the same op (same op_id:
    // applied once) through the Jupyter server extension's ops inbox, which the scheduler thread polls.
    setTimeout(() => {
      if (!this.acked.has(opId)) this.postOpToServer({ op_id: opId, kind, run_id: runId, changes, warm_start: warm });
    }, COMM_ACK_TIMEOUT_MS);
    setTimeout(() => {
      if (this.pending.get(key) === opId) { this.pending.delete(key); this.renderTable(); }
    }, 15000);
  }

  /**
   * Fallback path for an op while the kernel is busy in a long cell: POST it to
   * `<baseUrl>rapidfire/api/experiments/<name>/ops` (authenticated by the page's cookie + XSRF token).
   * @param {{op_id: string, kind: string, run_id: number, changes: Record<string, any>, warm_start: boolean}} op
   */
  async postOpToServer(op) {
    const name = this.snapshot?.experiment;
    const cfgEl = typeof document !== "undefined" ? document.getElementById("jupyter-config-data") : null;
    if (!name || !cfgEl) return; // no Jupyter server page (VS Code, Colab): the op waits for the kernel
    try {
      const baseUrl = JSON.parse(cfgEl.textContent || "{}").baseUrl || "/";
      const xsrf = (document.cookie.match(/(?:^|;\s*)_xsrf=([^;]+)/) || [])[1];
      const body = op.kind === "clone" ? op : { op_id: op.op_id, kind: op.kind, run_id: op.run_id };
      const res = await fetch(`${baseUrl}rapidfire/api/experiments/${encodeURIComponent(name)}/ops`, {
        method: "POST", credentials: "same-origin",
        headers: { "Content-Type": "application/json", ...(xsrf ? { "X-XSRFToken": decodeURIComponent(xsrf) } : {}) },
        body: JSON.stringify(body),
      });
      if (res.ok && !this.acked.has(op.op_id)) {
        this.notice(op.op_id, `${requestedText(op.kind, op.run_id)} (kernel busy: sent through the server)`, "queued");
      }
    } catch (_err) {
      /* server extension not reachable: the comm message is still queued in the kernel */
    }
  }

  /** @param {Run} run */
  toggleCloneForm(run) {
    const row = this.rows.get(run.run_id);
    if (!row) return;
    if (row.formTr) { row.formTr.remove(); row.formTr = null; this.renderTable(); return; }
    const inputs = /** @type {Record<string, HTMLInputElement>} */ ({});
    const fields = h("div", { class: "rf-form-grid" });
    for (const [k, v] of Object.entries(run.hparams || {})) {
      const input = /** @type {HTMLInputElement} */ (h("input", { type: "text", name: k,
        value: typeof v === "string" ? v : fmtHparam(v), spellcheck: "false" }));
      inputs[k] = input;
      fields.append(h("label", { class: "rf-field", title: k }, h("span", { text: k }), input));
    }
    const extra = /** @type {HTMLInputElement} */ (h("input", { type: "text", name: "__extra", spellcheck: "false",
      placeholder: "field=value, e.g. lora.lora_dropout=0.1; max_steps=50" }));
    const warm = /** @type {HTMLInputElement} */ (h("input", { type: "checkbox", name: "warm_start" }));
    const error = h("span", { class: "rf-form-error" });
    const submit = () => {
      /** @type {Record<string, any>} */ const changes = {};
      for (const [k, input] of Object.entries(inputs)) {
        const orig = run.hparams[k];
        if (input.value.trim() === (typeof orig === "string" ? orig : fmtHparam(orig))) continue;
        const val = parseValue(input.value, orig);
        if (JSON.stringify(val) !== JSON.stringify(orig)) changes[k] = val;
      }
      const parts = extra.value.split(/\s*[;\n]\s*|,\s*(?=[\w.\-/]+\s*=)/).filter((s) => s.trim());
      for (const part of parts) {
        const eq = part.indexOf("=");
        if (eq <= 0) { error.textContent = `"${part}" is not field=value`; return; }
        const k = part.slice(0, eq).trim();
        changes[k] = parseValue(part.slice(eq + 1), run.hparams[k]);
      }
      this.sendOp("clone", run.run_id, changes, warm.checked);
      row.formTr?.remove(); row.formTr = null;
      this.renderTable();
    };
    const form = h("form", { class: "rf-form", "data-clone-form": run.run_id,
      onsubmit: (/** @type {Event} */ e) => { e.preventDefault(); submit(); } },
      h("div", { class: "rf-form-title" },
        h("span", { class: "rf-swatch", style: { background: runColor(run.run_id) } }),
        h("span", { text: `Clone run ${run.run_id} — edit hyperparameters (only changed fields are sent)` })),
      fields,
      h("label", { class: "rf-field rf-field-wide" }, h("span", { text: "other fields" }), extra),
      h("div", { class: "rf-form-actions" },
        h("label", { class: "rf-check", title: "Start from this run's current weights instead of from scratch" },
          warm, h("span", { text: "warm start (from run " + run.run_id + "'s current weights)" })),
        error,
        h("span", { class: "rf-spacer" }),
        h("button", { type: "button", class: "rf-btn", text: "Cancel", onclick: () => this.toggleCloneForm(run) }),
        h("button", { type: "submit", class: "rf-btn rf-btn-primary", "data-op": "clone-submit", text: "Submit" })));
    row.formTr = h("tr", { class: "rf-form-row" }, h("td", { colspan: this.colCount() }, form));
    this.renderTable();
    const firstInput = /** @type {HTMLInputElement|undefined} */ (Object.values(inputs)[0]);
    firstInput?.focus();
  }

  // -- rendering -----------------------------------------------------------------------------------------
  /** @param {boolean} [full] */
  renderAll(full = false) {
    this.renderHeader();
    this.renderTable();
    this.renderLegend();
    this.renderOps();
    if (full) for (const p of this.plots) p.traceKey = "";
    this.schedulePlot();
  }

  summary() {
    /** @type {any} */ const s = this.model.get("summary") || {};
    const snap = this.snapshot;
    if (!snap) return s;
    return { ...s, experiment: snap.experiment, started_at: snap.started_at, progress: snap.progress,
      on_device: snap.on_device };
  }

  renderHeader() {
    const s = this.summary();
    this.titleEl.textContent = s.experiment || "experiment";
    this.titleEl.title = s.experiment || "";
    this.progressEl.textContent = s.progress || "–";
    this.progressEl.hidden = !s.progress;
    this.deviceEl.replaceChildren();
    if (s.on_device !== null && s.on_device !== undefined) {
      this.deviceEl.append(h("span", { class: "rf-dot rf-pulse", style: { background: runColor(s.on_device) } }),
        `run ${s.on_device} on device`);
      this.deviceEl.classList.remove("rf-idle");
    } else {
      // the server page's snapshots (from the store) cannot name the run on the device; they say what they can
      this.deviceEl.append(this.snapshot?.device_status || "device idle");
      this.deviceEl.classList.add("rf-idle");
    }
    this.tick();
  }

  /** Elapsed time: ticks with the kernel's clock while live and active; frozen otherwise. */
  tick() {
    const s = /** @type {any} */ (this.model.get("summary") || {});
    const started = this.snapshot?.started_at ?? s.started_at;
    if (!started) { this.elapsedText.textContent = "–"; return; }
    const active = this.snapshot ? this.isActive(this.snapshot) : false;
    const now = this.live && active ? (Date.now() + this.clockOffset) / 1000
      : (this.snapshot?.now ?? s.updated_at ?? started);
    this.elapsedText.textContent = fmtElapsed(now - started);
  }

  /** @param {Snapshot} snap */
  isActive(snap) {
    return snap.on_device !== null && snap.on_device !== undefined
      || (snap.runs || []).some((r) => r.status === "NEW" || r.status === "ONGOING");
  }

  colCount() {
    return 8 + (this.snapshot?.hparam_columns?.length || 0);
  }

  visibleRuns() {
    const runs = [...(this.snapshot?.runs || [])].sort((a, b) => a.run_id - b.run_id);
    return this.showDeleted ? runs : runs.filter((r) => r.status !== "DELETED");
  }

  renderTable() {
    const snap = this.snapshot;
    const cols = snap?.hparam_columns || [];
    const key = cols.join("\u0000");
    if (key !== this.hparamKey || !this.theadRow.children.length) {
      this.hparamKey = key;
      const th = (/** @type {string} */ t, /** @type {string} */ cls = "", /** @type {string} */ title = "") =>
        h("th", { class: cls, title: title || null, text: t });
      this.theadRow.replaceChildren(
        th("Run", "rf-col-run"), th("Status", "rf-col-status"),
        ...cols.map((c) => th(shortHparam(c), "rf-num rf-col-hp", c)),
        th("Step", "rf-num rf-col-step", "completed / total optimizer steps"),
        th("Chunks", "rf-num", "chunks done / chunks in total (all epochs)"),
        th("Loss", "rf-num", "latest train loss"), th("Eval loss", "rf-num", "latest eval_loss"),
        th("Samples", "rf-num", "samples seen"), th("", "rf-col-actions"));
      for (const row of this.rows.values()) { row.tr.remove(); row.errorTr.remove(); row.formTr?.remove(); }
      this.rows.clear(); // rebuilt with the new columns
    }
    const runs = this.visibleRuns();
    const wanted = /** @type {HTMLElement[]} */ ([]);
    for (const run of runs) {
      let row = this.rows.get(run.run_id);
      if (!row) { row = this.makeRow(run, cols); this.rows.set(run.run_id, row); }
      this.updateRow(row, run, cols);
      wanted.push(row.tr);
      if (run.status === "FAILED" && run.error) wanted.push(row.errorTr);
      if (row.formTr) {
        /** @type {HTMLElement} */ (row.formTr.firstElementChild).setAttribute("colspan", String(this.colCount()));
        wanted.push(row.formTr);
      }
    }
    if (!runs.length) {
      wanted.push(h("tr", { class: "rf-empty-row" }, h("td", { colspan: this.colCount(),
        text: snap ? "No runs to show." : "Waiting for the experiment…" })));
    }
    // keep existing nodes in place (focus in a clone form survives); insert or remove only what changed
    wanted.forEach((node, i) => {
      if (this.tbody.children[i] !== node) this.tbody.insertBefore(node, this.tbody.children[i] || null);
    });
    while (this.tbody.children.length > wanted.length) /** @type {Element} */ (this.tbody.lastElementChild).remove();
    const counts = /** @type {Record<string, number>} */ ({});
    for (const r of snap?.runs || []) counts[r.status] = (counts[r.status] || 0) + 1;
    const total = (snap?.runs || []).length;
    this.countsEl.replaceChildren(h("span", { class: "rf-count-total", text: `${total} run${total === 1 ? "" : "s"}` }),
      ...STATUSES.filter((s) => counts[s]).map((s) =>
        h("span", { class: `rf-count rf-st-${s.toLowerCase()}`, text: `${counts[s]} ${s.toLowerCase()}` })));
    const nDeleted = counts.DELETED || 0;
    this.deletedLabel.textContent = nDeleted ? `show deleted (${nDeleted})` : "show deleted";
  }

  /** @param {Run} run @param {string[]} cols */
  makeRow(run, cols) {
    /** @type {Record<string, HTMLElement>} */ const cells = {};
    const td = (/** @type {string} */ name, /** @type {string} */ cls = "") => (cells[name] = h("td", { class: cls }));
    const tr = h("tr", { class: "rf-run-row" });
    tr.append(td("run", "rf-col-run"), td("status", "rf-col-status"),
      ...cols.map((c) => td(`hp:${c}`, "rf-num rf-col-hp")),
      td("step", "rf-num rf-col-step"), td("chunks", "rf-num"), td("loss", "rf-num"), td("eval", "rf-num"),
      td("samples", "rf-num"), td("actions", "rf-col-actions"));
    /** @type {Record<string, HTMLButtonElement>} */ const buttons = {};
    for (const op of OPS) {
      const icon = h("span", { class: "rf-op-icon", "aria-hidden": "true" });
      icon.innerHTML = OP_ICON[op];
      buttons[op] = /** @type {HTMLButtonElement} */ (h("button", { type: "button", class: `rf-btn rf-op rf-op-${op}`,
        "data-op": op, "data-run-id": run.run_id, title: `${OP_LABEL[op]} run ${run.run_id}: ${OP_TITLE[op]}`,
        "aria-label": `${OP_LABEL[op]} run ${run.run_id}`,
        onclick: () => {
          const cur = (this.snapshot?.runs || []).find((r) => r.run_id === run.run_id) || run;
          if (op === "clone") this.toggleCloneForm(cur); else this.sendOp(op, run.run_id);
        } }, icon, h("span", { class: "rf-op-label", text: OP_LABEL[op] })));
      cells.actions.append(buttons[op]);
    }
    const errorTr = h("tr", { class: "rf-error-row", "data-error-for": run.run_id },
      h("td", { colspan: this.colCount() }));
    const stepText = h("span");
    const stepFill = h("span", { class: "rf-bar-fill" });
    cells.step.append(stepText, h("span", { class: "rf-bar" }, stepFill));
    return { tr, cells, buttons, errorTr, stepText, stepFill, runKey: "", statusKey: "",
      formTr: /** @type {HTMLElement|null} */ (null) };
  }

  /** @param {any} row @param {Run} run @param {string[]} cols */
  updateRow(row, run, cols) {
    const { tr, cells, buttons } = row;
    tr.dataset.runId = String(run.run_id);
    tr.dataset.status = run.status;
    tr.dataset.onDevice = String(!!run.on_device);
    tr.classList.toggle("rf-deleted", run.status === "DELETED");
    tr.classList.toggle("rf-failed", run.status === "FAILED");
    tr.classList.toggle("rf-active", !!run.on_device);
    const runKey = `${run.parent_id}|${run.warm_start}`;
    if (row.runKey !== runKey) {
      row.runKey = runKey;
      const origin = run.parent_id !== null && run.parent_id !== undefined
        ? h("span", { class: "rf-origin", title: run.warm_start ? "cloned with warm start" : "cloned from scratch",
          text: `↳ run ${run.parent_id}${run.warm_start ? " · warm" : ""}` }) : null;
      setKids(cells.run, h("span", { class: "rf-swatch", style: { background: runColor(run.run_id) } }),
        h("span", { class: "rf-run-id", text: `run ${run.run_id}` }), origin);
    }
    const statusKey = `${run.status}|${!!run.on_device}`;
    if (row.statusKey !== statusKey) {
      row.statusKey = statusKey;
      setKids(cells.status,
        h("span", { class: `rf-badge rf-st-${run.status.toLowerCase()}`, "data-badge": run.status, text: run.status }),
        run.on_device ? h("span", { class: "rf-badge rf-on-device", "data-badge": "on-device", text: "on device" })
          : null);
    }
    for (const c of cols) {
      const v = run.hparams ? run.hparams[c] : undefined;
      const text = fmtHparam(v);
      setText(cells[`hp:${c}`], text, typeof v === "string" && v.length > 14 ? v : `${c} = ${JSON.stringify(v)}`);
    }
    const frac = run.total_steps ? Math.min(1, run.completed_steps / run.total_steps) : 0;
    setText(row.stepText, `${fmtInt(run.completed_steps)}/${fmtInt(run.total_steps)}`);
    row.stepFill.style.width = `${(frac * 100).toFixed(1)}%`;
    cells.step.classList.toggle("rf-bar-failed", run.status === "FAILED");
    cells.step.classList.toggle("rf-bar-done", run.status === "COMPLETED");
    const nChunks = this.snapshot?.num_chunks;
    // chunks over the whole run (all epochs): chunks_done / num_segments; older snapshots: per-epoch count
    const nTotal = run.num_segments || nChunks;
    setText(cells.chunks, nTotal ? `${run.chunks_done}/${nTotal}` : String(run.chunks_done ?? "–"));
    setText(cells.loss, fmtNum(run.loss));
    setText(cells.eval, fmtNum(run.eval_loss));
    setText(cells.samples, fmtInt(run.samples_seen));
    const legal = new Set(run.legal_ops || []);
    for (const op of OPS) {
      const b = buttons[op];
      const pending = this.pending.has(`${op}:${run.run_id}`);
      b.disabled = !legal.has(op) || pending;
      b.classList.toggle("rf-pending", pending);
      b.classList.toggle("rf-open", op === "clone" && !!row.formTr);
    }
    if (run.status === "FAILED" && run.error) {
      const cell = /** @type {HTMLElement} */ (row.errorTr.firstElementChild);
      cell.setAttribute("colspan", String(this.colCount()));
      if (cell.textContent !== `run ${run.run_id} failed: ${run.error}`) {
        setKids(cell, h("span", { class: "rf-error-label", text: `run ${run.run_id} failed: ` }),
          h("span", { class: "rf-error-text", text: run.error }));
      }
    }
  }

  renderLegend() {
    const runs = this.visibleRuns();
    const key = runs.map((r) => `${r.run_id}:${r.status === "DELETED"}:${this.hiddenRuns.has(r.run_id)}`).join(",");
    if (key === this.legendKey) return;
    this.legendKey = key;
    this.legendEl.replaceChildren(...runs.map((r) => {
      const off = this.hiddenRuns.has(r.run_id);
      return h("button", { type: "button", class: `rf-legend-item${off ? " rf-legend-off" : ""}` +
        `${r.status === "DELETED" ? " rf-legend-deleted" : ""}`, "data-run-id": r.run_id,
        "aria-pressed": String(!off), title: off ? `show run ${r.run_id} in the curves` : `hide run ${r.run_id}`,
        onclick: () => {
          if (this.hiddenRuns.has(r.run_id)) this.hiddenRuns.delete(r.run_id); else this.hiddenRuns.add(r.run_id);
          this.renderLegend();
          this.schedulePlot();
        } },
      h("span", { class: "rf-legend-line", style: { background: runColor(r.run_id) } }), `run ${r.run_id}`);
    }));
  }

  renderOps() {
    const ops = [...(this.snapshot?.ops || [])];
    const key = ops.map((o) => `${o.op_id}:${o.state}:${o.message}`).join("|");
    if (key === this.opsKey) return; // unchanged: keep the list (scroll position, selection)
    this.opsKey = key;
    this.opsCount.textContent = String(ops.length);
    this.opsEl.hidden = ops.length === 0;
    const items = ops.slice(-100).reverse().map((op) => h("li", { class: `rf-op-item rf-op-${op.state}`,
      "data-op-id": op.op_id, "data-state": op.state },
      h("span", { class: "rf-op-time", text: fmtClock(op.applied_at || op.requested_at) }),
      h("span", { class: "rf-op-what" }, h("span", { class: "rf-swatch rf-swatch-sm",
        style: { background: runColor(op.run_id) } }), `${op.kind} run ${op.run_id}`),
      h("span", { class: `rf-badge rf-state-${op.state}`, text: op.state }),
      h("span", { class: "rf-op-msg", text: op.message || "" })));
    this.opsList.replaceChildren(...items);
  }

  /** @param {"step"|"samples"} x */
  setXAxis(x) {
    if (x === this.xAxis) return;
    this.xAxis = x;
    this.stepBtn.classList.toggle("rf-on", x === "step");
    this.samplesBtn.classList.toggle("rf-on", x === "samples");
    for (const p of this.plots) p.traceKey = "";
    this.schedulePlot();
  }

  // -- plots -----------------------------------------------------------------------------------------------
  schedulePlot() {
    if (this.plotFrame || this.disposed) return;
    this.plotFrame = requestAnimationFrame(() => { this.plotFrame = 0; this.drawPlots(); });
  }

  refreshMetricOptions() {
    const names = [...this.metricNames].sort((a, b) => {
      const ia = DEFAULT_METRICS.indexOf(a), ib = DEFAULT_METRICS.indexOf(b);
      if (ia !== -1 || ib !== -1) return (ia === -1 ? 99 : ia) - (ib === -1 ? 99 : ib);
      return a.localeCompare(b);
    });
    for (const p of this.plots) {
      const current = [...p.select.options].map((o) => o.value).join("\u0000");
      if (current !== names.join("\u0000")) {
        p.select.replaceChildren(...names.map((n) => h("option", { value: n, text: n })));
      }
      p.select.value = p.metric;
    }
  }

  themeColors() {
    const cs = getComputedStyle(this.root);
    const v = (/** @type {string} */ n, /** @type {string} */ d) => cs.getPropertyValue(n).trim() || d;
    return { fg: v("--rf-fg", "#333"), muted: v("--rf-fg-muted", "#666"), grid: v("--rf-grid", "#e5e5e5"),
      bg: v("--rf-bg", "#fff"), border: v("--rf-border", "#ddd"), font: v("--rf-font", "sans-serif") };
  }

  drawPlots() {
    if (this.disposed) return;
    this.refreshMetricOptions();
    const Plotly = this.Plotly;
    if (!Plotly) return;
    let total = 0;
    for (const slot of this.plots) total += this.drawPlot(Plotly, slot);
    this.plotsEl.dataset.points = String(total);
  }

  /** @param {any} Plotly @param {PlotSlot} slot @returns {number} points plotted in this slot */
  drawPlot(Plotly, slot) {
    const byRun = this.series.get(slot.metric) || new Map();
    const runInfo = new Map((this.snapshot?.runs || []).map((r) => [r.run_id, r]));
    const runIds = [...byRun.keys()].filter((id) => {
      const st = runInfo.get(id)?.status;
      return (this.showDeleted || st !== "DELETED") && !this.hiddenRuns.has(id);
    }).sort((a, b) => a - b);
    const isEval = slot.metric.startsWith("eval_");
    // markers for sparse series (eval metrics, or the first points of a run); the mode is part of the key
    const withMarkers = (/** @type {number} */ id) => isEval || /** @type {Series} */ (byRun.get(id)).value.length < 3;
    const traceKey = `${this.xAxis}|${slot.metric}|${this.themeKey}|` + runIds.map((id) =>
      `${id}:${runInfo.get(id)?.status === "DELETED" ? "d" : ""}:${withMarkers(id) ? "m" : ""}`).join(",");
    const xKey = this.xAxis === "step" ? "step" : "samples";
    let total = 0;
    for (const id of runIds) total += /** @type {Series} */ (byRun.get(id)).value.length;
    slot.empty.textContent = `no ${slot.metric} points yet`;
    slot.empty.hidden = total > 0;
    if (traceKey === slot.traceKey && slot.initialized) {
      // append only what is new (Plotly.extendTraces)
      /** @type {any} */ const upd = { x: [], y: [], customdata: [] };
      const idx = /** @type {number[]} */ ([]);
      runIds.forEach((id, i) => {
        const s = /** @type {Series} */ (byRun.get(id));
        const from = slot.drawn.get(id) || 0;
        if (s.value.length > from) {
          upd.x.push(s[xKey].slice(from)); upd.y.push(s.value.slice(from));
          upd.customdata.push(s.step.slice(from).map((st, j) => [st, s.samples[from + j]]));
          idx.push(i);
          slot.drawn.set(id, s.value.length);
        }
      });
      if (idx.length) Plotly.extendTraces(slot.div, upd, idx);
      return total;
    }
    // structure changed: full redraw (Plotly.react keeps zoom through uirevision)
    const t = this.themeColors();
    const xTitle = this.xAxis === "step" ? "optimizer step" : "samples seen";
    const fmtY = slot.metric === "learning_rate" ? ".2~e" : ".4~g";
    const data = runIds.map((id) => {
      const s = /** @type {Series} */ (byRun.get(id));
      const deleted = runInfo.get(id)?.status === "DELETED";
      slot.drawn.set(id, s.value.length);
      return {
        type: "scatter", mode: withMarkers(id) ? "lines+markers" : "lines",
        name: deleted ? `run ${id} (deleted)` : `run ${id}`,
        x: s[xKey].slice(), y: s.value.slice(), customdata: s.step.map((st, j) => [st, s.samples[j]]),
        line: { color: runColor(id), width: 2, dash: deleted ? "dot" : "solid" },
        marker: { size: 5, color: runColor(id) }, opacity: deleted ? 0.35 : 1, connectgaps: true,
        hoverlabel: { bordercolor: runColor(id) },
        hovertemplate: `<b>run ${id}</b><br>step %{customdata[0]:,}` +
          (this.xAxis === "samples" ? " · %{customdata[1]:,} samples" : "") +
          `<br>${slot.metric} %{y:${fmtY}}<extra></extra>`,
      };
    });
    const layout = {
      height: PLOT_HEIGHT, autosize: true, margin: { l: 48, r: 14, t: 10, b: 38 },
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: t.font, size: 11, color: t.fg },
      xaxis: { title: { text: xTitle, font: { size: 11, color: t.muted }, standoff: 4 }, gridcolor: t.grid,
        zeroline: false, linecolor: t.border, tickformat: this.xAxis === "samples" ? "~s" : "", automargin: true },
      yaxis: { gridcolor: t.grid, zeroline: false, linecolor: t.border, tickformat: fmtY, automargin: true },
      showlegend: false, hovermode: "closest",
      hoverlabel: { bgcolor: t.bg, bordercolor: t.border, font: { color: t.fg, family: t.font, size: 11 } },
      uirevision: `${slot.metric}|${this.xAxis}`,
    };
    const config = { displaylogo: false, responsive: false, displayModeBar: "hover",
      modeBarButtonsToRemove: ["lasso2d", "select2d", "autoScale2d", "toggleSpikelines"] };
    Plotly.react(slot.div, data, layout, config);
    slot.initialized = true;
    slot.traceKey = traceKey;
    return total;
  }

  /** @param {any} Plotly */
  onPlotly(Plotly) {
    if (this.disposed) return;
    this.Plotly = Plotly;
    for (const p of this.plots) p.traceKey = "";
    this.schedulePlot();
  }

  resizePlots() {
    if (!this.Plotly) return;
    for (const p of this.plots) if (p.initialized && p.div.offsetWidth) this.Plotly.Plots.resize(p.div);
  }

  destroy() {
    this.disposed = true;
    if (this.plotFrame) cancelAnimationFrame(this.plotFrame);
    for (const n of this.notices.values()) clearTimeout(n.timer);
    if (this.Plotly) for (const p of this.plots) this.Plotly.purge(p.div);
  }
}

/** @param {HTMLElement} el @param {...(Node|string|null|undefined)} kids */
function setKids(el, ...kids) {
  el.replaceChildren(...kids.filter((k) => k !== null && k !== undefined));
}

/** @param {HTMLElement} el @param {string} text @param {string} [title] */
function setText(el, text, title) {
  if (el.textContent !== text) el.textContent = text;
  if (title !== undefined && el.title !== title) el.title = title;
}

/** Send a custom message; false when the widget has no live kernel connection (e.g. a reopened notebook).
 * @param {Model} model @param {any} content */
function safeSend(model, content) {
  try {
    model.send(content);
    return true;
  } catch (e) {
    console.warn("rapidfire_nb: could not reach the kernel", e);
    return false;
  }
}

function themeKey() {
  const b = document.body;
  return `${b.dataset.jpThemeLight ?? ""}|${b.dataset.jpThemeName ?? ""}|${b.className.includes("vscode-dark")}`;
}

const COMM_ACK_TIMEOUT_MS = 2500;

export default {
  /** @param {{model: Model, el: HTMLElement}} ctx */
  render({ model, el }) {
    const view = new PanelView(model, el);
    view.themeKey = themeKey();
    const onMsg = (/** @type {any} */ msg, /** @type {any[]} */ buffers) => view.onMessage(msg, buffers);
    const onSummary = () => view.renderHeader();
    model.on("msg:custom", onMsg);
    model.on("change:summary", onSummary);
    safeSend(model, { type: "hello" });

    // plotly.js: one load per page, shared by every panel through a promise on globalThis
    const L = plotlyLoader();
    // each model asks at most once; another panel asks only if the pending request is old (its kernel may be gone)
    const askPlotly = () => {
      if (L.done || L.loading || view.disposed || L.askedBy.has(model)) return;
      if (Date.now() - L.requestedAt > 15000) {
        L.requestedAt = Date.now();
        L.askedBy.add(model);
        safeSend(model, { type: "need_plotly" });
      }
    };
    askPlotly();
    const retry = setInterval(askPlotly, 5000); // if the kernel that was asked never answers, ask ours
    L.promise.then((P) => { clearInterval(retry); view.onPlotly(P); });

    const ticker = setInterval(() => view.tick(), 1000);
    const waiting = setTimeout(() => {
      if (!view.live) {
        view.statusLine.textContent = "Waiting for the kernel… This panel is live only while the kernel that " +
          "runs the experiment is connected; call experiment.panel() there to show it again.";
      }
    }, 6000);
    let resizeFrame = 0;
    const ro = new ResizeObserver(() => {
      if (resizeFrame) return;
      resizeFrame = requestAnimationFrame(() => { resizeFrame = 0; view.resizePlots(); });
    });
    ro.observe(view.plotsEl);
    const mo = new MutationObserver(() => {
      const k = themeKey();
      if (k !== view.themeKey) { view.themeKey = k; for (const p of view.plots) p.traceKey = ""; view.schedulePlot(); }
    });
    mo.observe(document.body, { attributes: true, attributeFilter: ["data-jp-theme-light", "data-jp-theme-name",
      "class"] });

    return () => {
      model.off("msg:custom", onMsg);
      model.off("change:summary", onSummary);
      clearInterval(ticker); clearInterval(retry); clearTimeout(waiting);
      if (resizeFrame) cancelAnimationFrame(resizeFrame);
      ro.disconnect(); mo.disconnect();
      view.destroy();
    };
  },
};
