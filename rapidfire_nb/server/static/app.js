// @ts-check
/**
 * rapidfire_nb experiments page (served by the server extension at <base_url>/rapidfire/).
 *
 * Lists the experiments under the server's experiments root and shows one at a time with the notebook
 * panel's own front end: it imports the panel's modules (widgets/*.js, served under rapidfire/static/) as they
 * are, and feeds panel.js through a shim model that speaks the panel's message protocol (rapidfire_nb/panel/widget.py):
 *   view -> "kernel": {type:"hello"} -> a full {type:"snapshot"} (+ {type:"points"} pages),
 *                     {type:"op", ...} -> POST .../ops -> {type:"ack"}, {type:"need_plotly"} -> {type:"plotly"}.
 *   polling: GET .../snapshot + GET .../metrics?cursor=N&seen=M&format=columnar -> {type:"update"} (~1 s while
 *            a kernel is alive, ~5 s otherwise, ~10 s in a background tab); {reset: true} (points deleted by a
 *            resume from an older checkpoint) -> a full reload.
 * No kernel is needed: everything is read from the experiment stores. The page follows the browser's colour
 * scheme (the panel's dark colours too), and its list takes the shown experiment's counts from the panel's own
 * snapshots, so the two never disagree.
 *
 * Test hooks: [data-rf-page], tr[data-rf-experiment][data-rf-selected][data-rf-live], [data-rf-view="panel"]
 * [data-rf-experiment-view=<name>], and the panel's own data-* attributes.
 */

import { h } from "./dom.js";
import { STATUSES } from "./format.js";
import { inboxPath, opBody, readCookie } from "./ops.js";
import panel from "./panel.js";

/** @typedef {{get: (k: string) => any, set: (k: string, v: any) => void, save_changes: () => void,
 *   on: (e: string, f: Function) => void, off: (e: string, f: Function) => void,
 *   send: (content: any, callbacks?: any, buffers?: any[]) => void}} ShimModel */

const cfgEl = /** @type {HTMLElement} */ (document.getElementById("rf-page-config"));
/** @type {{baseUrl: string, apiUrl: string, staticUrl: string, xsrfToken: string, version: string,
 *   root: string, panelJs: boolean, plotlyJs: boolean}} */
const cfg = JSON.parse(cfgEl.textContent || "{}");
const urlToken = new URLSearchParams(location.search).get("token");
const enc = encodeURIComponent;

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
    headers["X-XSRFToken"] = readCookie(document.cookie, "_xsrf") || cfg.xsrfToken;
    headers["Content-Type"] = "application/json";
  }
  const res = await fetch(cfg.apiUrl + path, { credentials: "same-origin", cache: "no-store", ...init, headers });
  /** @type {any} */ let body = null;
  try { body = await res.json(); } catch (e) { /* not JSON */ }
  if (!res.ok) throw new ApiError((body && body.message) || `${res.status} ${res.statusText}`, res.status);
  return body;
}

// ---------------------------------------------------------------------------------------------------------
// plotly.js: one <script> per page
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
    try {
      const r = await api(inboxPath(this.name), { method: "POST", body: JSON.stringify(opBody(c)) });
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
    const key = JSON.stringify({ ...snap, now: 0, elapsed_s: 0, stats: null }); // the clock alone is no change
    const changed = key !== this.snapKey;
    this.snapKey = key;
    if (changed) onFeedSnapshot(this.name, snap);
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
// the page: experiments list + one view
// ---------------------------------------------------------------------------------------------------------

const listEl = /** @type {HTMLElement} */ (document.querySelector("[data-rf-list]"));
const viewHost = /** @type {HTMLElement} */ (document.querySelector("[data-rf-view-host]"));
const rootEl = /** @type {HTMLElement} */ (document.querySelector("[data-rf-root]"));
/** @type {{name: string, feed: Feed, cleanup: Function|null}|null} */ let current = null;
/** @type {any[]} */ let experiments = [];

/** The list row of the experiment the panel shows follows the panel's snapshots (the list polls every 5 s).
 * @param {string} name @param {any} snap */
function onFeedSnapshot(name, snap) {
  const x = experiments.find((e) => e.name === name);
  if (!x || !Array.isArray(snap.runs)) return;
  /** @type {Record<string, number>} */ const counts = {};
  for (const r of snap.runs) counts[r.status] = (counts[r.status] || 0) + 1;
  x.status_counts = counts;
  x.writer_alive = !!snap.writer_alive;
  drawList();
}

/** A kernel trains it now: a live writer whose experiment did not end after its last heartbeat. @param {any} x */
function isLive(x) {
  return !!x.writer_alive && !(x.ended_at && (!x.last_beat || x.ended_at >= x.last_beat));
}

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
      : isLive(x) ? h("span", { class: "rf-page-live", text: "● kernel running" })
        : h("span", { class: "rf-page-idle", text: x.ended ? "ended" : "no kernel",
          title: x.ended ? "experiment.end() ran; re-run Experiment(...) and run_fit(...) to continue it" : "" });
    const link = h("a", { href: `#exp=${enc(x.name)}`, text: x.name });
    return h("tr", { "data-rf-experiment": x.name, "data-rf-selected": x.name === sel ? "true" : "false",
      "data-rf-live": isLive(x) ? "true" : "false", "data-rf-counts": STATUSES.filter((s) => counts[s])
        .map((s) => `${s}:${counts[s]}`).join(","), class: x.name === sel ? "rf-page-sel" : "",
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
      // the experiment a kernel trains now first (not one that just ended), then the most recently updated
      const newest = [...experiments].filter((x) => !x.error).sort((a, b) =>
        Number(isLive(b)) - Number(isLive(a)) || (b.updated_at || 0) - (a.updated_at || 0))[0];
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
  if (current !== mine) return;
  const el = h("div", { class: "rf-page-panel", "data-rf-view": "panel", "data-rf-experiment-view": name });
  viewHost.replaceChildren(el);
  const model = feed.model();
  const stopModel = panel.initialize({ model });
  const stopView = panel.render({ model, el });
  mine.cleanup = () => { stopView(); stopModel(); };
  if (current !== mine) mine.cleanup();
}

/** The panel's colours follow the page's scheme: panel.css reads JupyterLab's theme flag on <body>. */
function followColorScheme() {
  const dark = window.matchMedia("(prefers-color-scheme: dark)");
  const apply = () => { document.body.dataset.jpThemeLight = String(!dark.matches); };
  apply();
  dark.addEventListener("change", apply);
}

followColorScheme();
rootEl.textContent = cfg.root;
window.addEventListener("hashchange", route);
refreshList().then(route);
setInterval(() => { if (!document.hidden) refreshList(); }, 5000);
