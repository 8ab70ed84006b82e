// @ts-check
/**
 * rapidfire_nb experiments page (served by the server extension at <base_url>/rapidfire/).
 *
 * Lists the experiments under the server's experiments root and shows one at a time with the notebook
 * panel's own front end (widgets/panel.js, served as rapidfire/static/panel.js), fed by the REST API through
 * a shim model that speaks the panel's message protocol (see rapidfire_nb/panel.py):
 *   view -> "kernel": {type:"hello"} -> a full {type:"snapshot"} (+ {type:"points"} pages),
 *                     {type:"op", ...} -> POST .../ops -> {type:"ack"}, {type:"need_plotly"} -> {type:"plotly"}.
 *   polling: GET .../snapshot + GET .../metrics?cursor=N&seen=M&format=columnar -> {type:"update"} (~1 s while
 *            a kernel is alive, ~5 s otherwise, ~10 s in a background tab); {reset: true} (points deleted by a
 *            resume from an older checkpoint) -> a full reload.
 * When panel.js is missing or has no default render(), a small built-in view (runs table + loss curves) is
 * used instead. No kernel is needed: everything is read from the experiment stores.
 *
 * Test hooks: [data-rf-page], tr[data-rf-experiment][data-rf-selected], [data-rf-view="panel"|"basic"]
 * [data-rf-experiment-view=<name>], and the panel's own data-* attributes.
 */

/** @typedef {{get: (k: string) => any, set: (k: string, v: any) => void, save_changes: () => void,
 *   on: (e: string, f: Function) => void, off: (e: string, f: Function) => void,
 *   send: (content: any, callbacks?: any, buffers?: any[]) => void}} ShimModel */

const cfgEl = /** @type {HTMLElement} */ (document.getElementById("rf-page-config"));
/** @type {{baseUrl: string, apiUrl: string, staticUrl: string, xsrfToken: string, version: string,
 *   root: string, panelJs: boolean, plotlyJs: boolean}} */
const cfg = JSON.parse(cfgEl.textContent || "{}");
const urlToken = new URLSearchParams(location.search).get("token");
const enc = encodeURIComponent;
const STATUSES = ["NEW", "ONGOING", "STOPPED", "COMPLETED", "FAILED", "DELETED", "INTERRUPTED"];

/** @param {string} name */
function cookie(name) {
  const m = document.cookie.match(new RegExp(`(?:^|;\\s*)${name}=([^;]*)`));
  return m ? decodeURIComponent(m[1]) : null;
}

class ApiError extends Error {
  /** @param {string} message @param {number} status */
  constructor(message, status) { super(message); this.status = status; }
}

/** Fetch a JSON endpoint under rapidfire/api/. POSTs carry Jupyter's XSRF token, like JupyterLab's own calls.
 * @param {string} path @param {RequestInit} [init] */
async function api(path, init = {}) {
  /** @type {Record<string, string>} */
  const headers = { Accept: "application/json" };
  if (urlToken) headers.Authorization = `token ${urlToken}`;
  if (init.method && init.method !== "GET") {
    headers["X-XSRFToken"] = cookie("_xsrf") || cfg.xsrfToken;
    headers["Content-Type"] = "application/json";
  }
  const res = await fetch(cfg.apiUrl + path, { credentials: "same-origin", cache: "no-store", ...init, headers });
  /** @type {any} */ let body = null;
  try { body = await res.json(); } catch (e) { /* not JSON */ }
  if (!res.ok) throw new ApiError((body && body.message) || `${res.status} ${res.statusText}`, res.status);
  return body;
}

// ---------------------------------------------------------------------------------------------------------
// assets: plotly.js (one <script> per page) and the panel module
// ---------------------------------------------------------------------------------------------------------

/** @type {Promise<any>|null} */ let plotlyPromise = null;
function loadPlotly() {
  const g = /** @type {any} */ (globalThis);
  if (g.Plotly && g.Plotly.newPlot) return Promise.resolve(g.Plotly);
  if (!cfg.plotlyJs) return Promise.reject(new Error("plotly.js is not installed next to the server (pip install plotly)"));
  plotlyPromise ??= new Promise((resolve, reject) => {
    const s = document.createElement("script");
    s.src = `${cfg.staticUrl}plotly.min.js?v=${enc(cfg.version)}`;
    s.onload = () => (g.Plotly && g.Plotly.newPlot ? resolve(g.Plotly) : reject(new Error("plotly.js did not load")));
    s.onerror = () => reject(new Error("could not load plotly.js"));
    document.head.appendChild(s);
  });
  return plotlyPromise;
}

/** @type {Promise<Function|null>|null} */ let panelPromise = null;
function loadPanelRender() {
  if (!cfg.panelJs) return Promise.resolve(null);
  panelPromise ??= import(`${cfg.staticUrl}panel.js?v=${enc(cfg.version)}`).then(
    (mod) => (mod && mod.default && typeof mod.default.render === "function" ? mod.default.render : null),
    (e) => { console.warn("rapidfire_nb: panel.js could not be loaded; using the basic view", e); return null; });
  return panelPromise;
}

// ---------------------------------------------------------------------------------------------------------
// the feed: REST polling behind a model that looks like an anywidget model to panel.js
// ---------------------------------------------------------------------------------------------------------

class Feed {
  /** @param {string} name */
  constructor(name) {
    this.name = name;
    /** @type {Set<Function>} */ this.listeners = new Set();
    this.cursor = 0;
    this.seen = 0;
    this.needFull = true;
    this.snapKey = "";
    this.alive = false;
    this.closed = false;
    this.running = false;
    this.again = false;
    this.fastUntil = 0;
    this.lastError = "";
    /** @type {any} */ this.timer = 0;
    this.onVisible = () => { if (!document.hidden) this.wake(0); };
    document.addEventListener("visibilitychange", this.onVisible);
  }

  /** @returns {ShimModel} */
  model() {
    const listeners = this.listeners;
    return {
      get: (k) => (k === "summary" ? { experiment: this.name } : undefined),
      set: () => {}, save_changes: () => {},
      on: (ev, f) => { if (ev === "msg:custom") listeners.add(f); },
      off: (ev, f) => { if (ev === "msg:custom") listeners.delete(f); },
      send: (content) => {
        if (this.closed) throw new Error("closed");
        queueMicrotask(() => this.onSend(content));
      },
    };
  }

  /** @param {any} msg @param {any[]} [buffers] */
  emit(msg, buffers = []) {
    for (const f of [...this.listeners]) {
      try { f(msg, buffers); } catch (e) { console.error("rapidfire_nb page:", e); }
    }
  }

  /** @param {any} c */
  onSend(c) {
    if (!c || typeof c !== "object" || this.closed) return;
    if (c.type === "hello") { this.needFull = true; this.wake(0); }
    else if (c.type === "op") this.postOp(c);
    else if (c.type === "need_plotly") this.sendPlotly();
  }

  async sendPlotly() {
    try {
      const res = await fetch(`${cfg.staticUrl}plotly.min.js?v=${enc(cfg.version)}`, { credentials: "same-origin" });
      if (!res.ok) throw new Error(`${res.status} ${res.statusText}`);
      this.emit({ type: "plotly" }, [await res.arrayBuffer()]);
    } catch (e) {
      this.emit({ type: "error", message: `cannot load plotly.js: ${/** @type {any} */ (e).message}` });
    }
  }

  /** @param {any} c */
  async postOp(c) {
    const ack = { op_id: c.op_id, run_id: c.run_id, kind: c.kind, state: "queued", message: "", new_run_id: null };
    /** @type {any} */ const body = { op_id: c.op_id, kind: c.kind, run_id: c.run_id };
    if (c.kind === "clone") { body.changes = c.changes || {}; body.warm_start = !!c.warm_start; }
    try {
      const r = await api(`experiments/${enc(this.name)}/ops`, { method: "POST", body: JSON.stringify(body) });
      ack.message = r.message;
    } catch (e) {
      ack.state = "rejected";
      ack.message = /** @type {any} */ (e).message;
    }
    this.emit({ type: "ack", ack });
    this.fastUntil = Date.now() + 15000;
    this.wake(300);
  }

  /** @param {number} delay */
  wake(delay) {
    clearTimeout(this.timer);
    if (!this.closed) this.timer = setTimeout(() => this.pump(), delay);
  }

  async pump() {
    if (this.closed) return;
    if (this.running) { this.again = true; return; }
    this.running = true;
    let next = 1000;
    try {
      if (this.needFull) { this.needFull = false; await this.full(); } else await this.update();
      this.lastError = "";
      next = Date.now() < this.fastUntil ? 500 : this.alive ? 1000 : 5000;
    } catch (e) {
      const err = /** @type {any} */ (e);
      const text = err.status === 403 ? "not authorized (log in to Jupyter again?)" : err.message;
      if (text !== this.lastError) {
        this.lastError = text;
        this.emit({ type: "error", message: `cannot read experiment ${this.name}: ${text}` });
      }
      next = err.status === 404 ? 15000 : 5000;
    } finally {
      this.running = false;
    }
    if (document.hidden) next = Math.max(next, 10000);
    if (this.again) { this.again = false; next = 0; }
    this.wake(next);
  }

  /** @param {number} cursor @param {number|null} [seen] points held (lets the server say "reload") */
  metrics(cursor, seen = null) {
    const held = seen === null ? "" : `&seen=${seen}`;
    return api(`experiments/${enc(this.name)}/metrics?format=columnar&cursor=${cursor}${held}`);
  }

  snapshot() { return api(`experiments/${enc(this.name)}/snapshot`); }

  /** @param {any} snap */
  keep(snap) {
    this.alive = !!snap.writer_alive;
    const key = JSON.stringify({ ...snap, now: 0 });
    const changed = key !== this.snapKey;
    this.snapKey = key;
    return changed;
  }

  async full() {
    const snap = await this.snapshot();
    let page = await this.metrics(0);
    if (this.closed) return;
    this.keep(snap);
    this.cursor = page.cursor;
    this.seen = page.points.run.length;
    this.emit({ type: "snapshot", reset: true, snapshot: snap, points: page.points, now: snap.now });
    while (page.more && !this.closed) {
      page = await this.metrics(this.cursor);
      this.cursor = page.cursor;
      this.seen += page.points.run.length;
      this.emit({ type: "points", points: page.points });
    }
  }

  async update() {
    const snap = await this.snapshot();
    const page = await this.metrics(this.cursor, this.seen);
    if (this.closed || this.needFull) return;
    if (page.reset) { this.needFull = true; this.again = true; return; } // points we hold were deleted (resume)
    const changed = this.keep(snap);
    this.cursor = page.cursor;
    this.seen += page.points.run.length;
    const points = page.points && page.points.run.length ? page.points : null;
    if (changed || points) this.emit({ type: "update", snapshot: changed ? snap : null, points, now: snap.now });
    if (page.more) this.again = true;
  }

  close() {
    this.closed = true;
    clearTimeout(this.timer);
    this.listeners.clear();
    document.removeEventListener("visibilitychange", this.onVisible);
  }
}

// ---------------------------------------------------------------------------------------------------------
// basic view: used only when panel.js is not available
// ---------------------------------------------------------------------------------------------------------

/** @param {string} tag @param {Record<string, any>} [attrs] @param {...(Node|string)} kids */
function h(tag, attrs = {}, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") el.textContent = String(v);
    else if (k === "class") el.className = String(v);
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, String(v));
  }
  el.append(...kids);
  return el;
}

/** @param {any} v */
function fmt(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") {
    if (Number.isInteger(v)) return String(v);
    return Math.abs(v) !== 0 && (Math.abs(v) < 1e-3 || Math.abs(v) >= 1e5) ? v.toExponential(2) : v.toPrecision(4);
  }
  return typeof v === "object" ? JSON.stringify(v) : String(v);
}

/** A runs table and loss curves, speaking the same message protocol as panel.js.
 * @param {{model: ShimModel, el: HTMLElement}} ctx */
function renderBasic({ model, el }) {
  /** @type {any} */ let snap = null;
  /** @type {Map<string, Map<number, {x: number[], y: (number|null)[]}>>} */ const series = new Map();
  const status = h("div", { class: "rf-basic-status" });
  const table = h("table", { class: "rf-basic-table" });
  const notices = h("div", { class: "rf-basic-notices" });
  const plot = h("div", { class: "rf-basic-plot", "data-points": "0" });
  el.append(h("div", { class: "rf-basic", "data-rf-basic": "" }, status, notices, table, plot));
  let frame = 0;

  /** @param {any} e */
  const ingest = (e) => {
    if (!e || !e.run) return;
    for (let i = 0; i < e.run.length; i++) {
      const name = e.names[e.name[i]];
      if (!series.has(name)) series.set(name, new Map());
      const byRun = /** @type {Map<number, any>} */ (series.get(name));
      if (!byRun.has(e.run[i])) byRun.set(e.run[i], { x: [], y: [] });
      const s = byRun.get(e.run[i]);
      s.x.push(e.step[i]); s.y.push(e.value[i]);
    }
  };
  /** @param {string} text @param {string} state */
  const notice = (text, state) => {
    notices.prepend(h("div", { class: `rf-basic-notice rf-basic-${state}`, text }));
    while (notices.children.length > 3) notices.lastElementChild?.remove();
  };
  const drawTable = () => {
    if (!snap) return;
    status.textContent = [snap.experiment, snap.progress, snap.device_status].filter(Boolean).join(" · ");
    const cols = snap.hparam_columns || [];
    const head = h("tr", {}, ...["Run", "Status", ...cols, "Steps", "Loss", "Eval loss", ""].map((t) => h("th", { text: t })));
    const rows = (snap.runs || []).filter((/** @type {any} */ r) => r.status !== "DELETED").map((/** @type {any} */ r) => {
      const ops = (r.legal_ops || []).filter((/** @type {string} */ o) => o !== "clone").map((/** @type {string} */ o) =>
        h("button", { "data-op": o, text: o, onclick: () => model.send({ type: "op", op_id: crypto.randomUUID(), kind: o, run_id: r.run_id, changes: {}, warm_start: false }) }));
      return h("tr", { "data-run-id": r.run_id, "data-status": r.status },
        h("td", { text: r.run_id }), h("td", { class: `rf-basic-st rf-basic-st-${r.status}`, text: r.status, title: r.error || null }),
        ...cols.map((/** @type {string} */ c) => h("td", { text: fmt((r.hparams || {})[c]) })),
        h("td", { text: `${fmt(r.completed_steps)}/${fmt(r.total_steps)}` }), h("td", { text: fmt(r.loss) }),
        h("td", { text: fmt(r.eval_loss) }), h("td", {}, ...ops));
    });
    table.replaceChildren(h("thead", {}, head), h("tbody", {}, ...rows));
  };
  const drawPlot = () => {
    frame = 0;
    const P = /** @type {any} */ (globalThis).Plotly;
    if (!P) return;
    /** @type {any[]} */ const traces = [];
    let n = 0;
    for (const metric of ["loss", "eval_loss"]) {
      for (const [rid, s] of [...(series.get(metric) || new Map())].sort((a, b) => a[0] - b[0])) {
        n += s.x.length;
        traces.push({ x: s.x, y: s.y, name: `run ${rid} ${metric}`, mode: "lines",
          line: { dash: metric === "loss" ? "solid" : "dot" } });
      }
    }
    plot.dataset.points = String(n);
    P.react(plot, traces, { height: 300, margin: { l: 50, r: 10, t: 10, b: 40 }, xaxis: { title: { text: "step" } },
      yaxis: { title: { text: "loss" } } }, { displaylogo: false, responsive: true });
  };
  const schedule = () => { if (!frame) frame = requestAnimationFrame(drawPlot); };
  /** @param {any} msg */
  const onMsg = (msg) => {
    if (msg.type === "snapshot") { if (msg.reset) series.clear(); ingest(msg.points); snap = msg.snapshot; drawTable(); schedule(); }
    else if (msg.type === "points") { ingest(msg.points); schedule(); }
    else if (msg.type === "update") { ingest(msg.points); if (msg.snapshot) { snap = msg.snapshot; drawTable(); } schedule(); }
    else if (msg.type === "ack") notice(`${msg.ack.kind} run ${msg.ack.run_id}: ${msg.ack.state} — ${msg.ack.message}`, msg.ack.state);
    else if (msg.type === "error") notice(msg.message, "rejected");
  };
  model.on("msg:custom", onMsg);
  model.send({ type: "hello" });
  return () => {
    model.off("msg:custom", onMsg);
    if (frame) cancelAnimationFrame(frame);
    const P = /** @type {any} */ (globalThis).Plotly;
    if (P) P.purge(plot);
  };
}

// ---------------------------------------------------------------------------------------------------------
// the page: experiments list + one view
// ---------------------------------------------------------------------------------------------------------

const listEl = /** @type {HTMLElement} */ (document.querySelector("[data-rf-list]"));
const viewHost = /** @type {HTMLElement} */ (document.querySelector("[data-rf-view-host]"));
const rootEl = /** @type {HTMLElement} */ (document.querySelector("[data-rf-root]"));
/** @type {{name: string, feed: Feed, cleanup: Function|null}|null} */ let current = null;
/** @type {any[]} */ let experiments = [];

function selectedName() {
  const m = location.hash.match(/^#exp=(.+)$/);
  return m ? decodeURIComponent(m[1]) : null;
}

/** @param {number|null|undefined} t unix seconds */
function ago(t) {
  if (!t) return "–";
  const s = Math.max(0, Date.now() / 1000 - t);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return new Date(t * 1000).toLocaleDateString();
}

function drawList() {
  const sel = current ? current.name : selectedName();
  if (!experiments.length) {
    listEl.replaceChildren(h("p", { class: "rf-page-note",
      text: `No experiments under ${cfg.root} yet. An experiment appears here once a notebook creates ` +
        "Experiment(\"name\") with the same experiments root (RF_HOME or experiment_path)." }));
    return;
  }
  const rows = experiments.map((x) => {
    const counts = x.status_counts || {};
    const badges = STATUSES.filter((s) => counts[s]).map((s) =>
      h("span", { class: `rf-page-badge rf-page-st-${s}`, title: s, text: `${counts[s]} ${s.toLowerCase()}` }));
    const live = x.error ? h("span", { class: "rf-page-error", text: x.error })
      : x.writer_alive ? h("span", { class: "rf-page-live", text: "● kernel running" })
        : h("span", { class: "rf-page-idle", text: "no kernel" });
    const link = h("a", { href: `#exp=${enc(x.name)}`, text: x.name });
    return h("tr", { "data-rf-experiment": x.name, "data-rf-selected": x.name === sel ? "true" : "false",
      "data-rf-live": x.writer_alive ? "true" : "false", class: x.name === sel ? "rf-page-sel" : "",
      onclick: (/** @type {Event} */ ev) => { if (ev.target !== link) location.hash = `exp=${enc(x.name)}`; } },
    h("td", {}, link), h("td", { text: x.trainer_type || "–" }), h("td", {}, ...badges),
    h("td", {}, live), h("td", { text: ago(x.updated_at) }));
  });
  listEl.replaceChildren(h("table", { class: "rf-page-table" },
    h("thead", {}, h("tr", {}, ...["Experiment", "Type", "Runs", "Kernel", "Updated"].map((t) => h("th", { text: t })))),
    h("tbody", {}, ...rows)));
}

async function refreshList() {
  try {
    const data = await api("experiments");
    experiments = data.experiments || [];
    rootEl.textContent = data.root;
    rootEl.title = "experiments root (c.RapidfireApp.experiments_root)";
    drawList();
    if (!selectedName() && experiments.length) {
      // a kernel-backed experiment first, then the most recently updated
      const newest = [...experiments].filter((x) => !x.error).sort((a, b) =>
        Number(!!b.writer_alive) - Number(!!a.writer_alive) || (b.updated_at || 0) - (a.updated_at || 0))[0];
      if (newest) history.replaceState(null, "", `#exp=${enc(newest.name)}`);
      route();
    }
  } catch (e) {
    listEl.replaceChildren(h("p", { class: "rf-page-error", text: `Cannot list experiments: ${/** @type {any} */ (e).message}` }));
  }
}

async function route() {
  const name = selectedName();
  if (current && current.name === name) return;
  if (current) {
    const old = current;
    current = null;
    old.feed.close();
    try { if (old.cleanup) old.cleanup(); } catch (e) { console.error(e); }
  }
  viewHost.replaceChildren();
  drawList();
  if (!name) return;
  const feed = new Feed(name);
  current = { name, feed, cleanup: null };
  const mine = current;
  await loadPlotly().catch((e) => console.warn("rapidfire_nb:", e.message));
  const render = await loadPanelRender();
  if (current !== mine) return;
  const el = h("div", { class: "rf-page-panel", "data-rf-view": render ? "panel" : "basic", "data-rf-experiment-view": name });
  viewHost.replaceChildren(el);
  const out = await (render || renderBasic)({ model: feed.model(), el });
  mine.cleanup = typeof out === "function" ? out : null;
  if (current !== mine && mine.cleanup) mine.cleanup();
}

rootEl.textContent = cfg.root;
window.addEventListener("hashchange", route);
refreshList().then(route);
setInterval(() => { if (!document.hidden) refreshList(); }, 5000);
