// @ts-check
/**
 * Sending IC Ops from the panel: one op_id per click over the widget's comm, and — when no `ack` comes within
 * 2.5 s because a busy cell holds the kernel's shell — the same op (same op_id: applied once) POSTed to the
 * Jupyter server extension's ops inbox (`<baseUrl>rapidfire/api/experiments/<name>/ops`, cookie + XSRF auth),
 * which the kernel's scheduler thread polls. The server page (app.js) posts its ops with the same body.
 */

import { takesChanges } from "./format.js";
import { clickFailed, clickSent, expireClick, postedToServer } from "./state.js";

/** Milliseconds to wait for the kernel's ack before posting the op to the server's inbox. */
export const COMM_ACK_TIMEOUT_MS = 2500;
/** Milliseconds after which a click's buttons stop waiting for its answer. */
export const PENDING_TIMEOUT_MS = 15000;

/** @typedef {{op_id: string, kind: string, run_id: number, changes: Record<string, any>, warm_start: boolean,
 *   reason?: string}} OpRequest */
/** @typedef {{send: (content: any, callbacks?: any, buffers?: any[]) => void}} Sender */

/** A fresh op id (a uuid4). */
export function newOpId() {
  const c = globalThis.crypto;
  if (c && typeof c.randomUUID === "function") return c.randomUUID();
  const b = new Uint8Array(16);
  if (c && c.getRandomValues) c.getRandomValues(b); else for (let i = 0; i < 16; i++) b[i] = Math.random() * 256;
  b[6] = (b[6] & 0x0f) | 0x40; b[8] = (b[8] & 0x3f) | 0x80;
  const x = Array.from(b, (v) => v.toString(16).padStart(2, "0")).join("");
  return `${x.slice(0, 8)}-${x.slice(8, 12)}-${x.slice(12, 16)}-${x.slice(16, 20)}-${x.slice(20)}`;
}

/** The JSON body of an op for the server's inbox (only a clone carries changes and warm_start; a stop its own
 * reason, when it has one). @param {OpRequest} op */
export function opBody(op) {
  if (takesChanges(op.kind)) {
    return { op_id: op.op_id, kind: op.kind, run_id: op.run_id, changes: op.changes || {},
      warm_start: !!op.warm_start };
  }
  return { op_id: op.op_id, kind: op.kind, run_id: op.run_id, ...(op.reason ? { reason: op.reason } : {}) };
}

/** The inbox path under the server's `rapidfire/api/`. @param {string} name the experiment */
export function inboxPath(name) {
  return `experiments/${encodeURIComponent(name)}/ops`;
}

/** A cookie's value from `document.cookie` text, or null. @param {string} cookies @param {string} name */
export function readCookie(cookies, name) {
  const m = cookies.match(new RegExp(`(?:^|;\\s*)${name}=([^;]*)`));
  return m ? decodeURIComponent(m[1]) : null;
}

/**
 * The fetch arguments that post `op` to the inbox of experiment `name` from a Jupyter page.
 * @param {string} baseUrl the server's base URL (ends with "/") @param {string} name @param {OpRequest} op
 * @param {string|null} xsrf the `_xsrf` cookie @returns {{url: string, init: RequestInit}}
 */
export function inboxRequest(baseUrl, name, op, xsrf) {
  return {
    url: `${baseUrl}rapidfire/api/${inboxPath(name)}`,
    init: {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", ...(xsrf ? { "X-XSRFToken": xsrf } : {}) },
      body: JSON.stringify(opBody(op)),
    },
  };
}

/** Send a custom message; false when the widget has no live kernel connection (e.g. a reopened notebook).
 * @param {Sender} model @param {any} content */
export function safeSend(model, content) {
  try {
    model.send(content);
    return true;
  } catch (e) {
    console.warn("rapidfire_nb: could not reach the kernel", e);
    return false;
  }
}

/** The Jupyter page's base URL, or null outside a Jupyter server page (VS Code, Colab). */
function jupyterBaseUrl() {
  const el = typeof document !== "undefined" ? document.getElementById("jupyter-config-data") : null;
  if (!el) return null;
  return JSON.parse(el.textContent || "{}").baseUrl || "/";
}

/**
 * The op sender of one widget model.
 * @param {Sender} model @param {import("./state.js").State} state
 * @param {(change: import("./state.js").Change) => void} changed called after each state change
 * @returns {{send: (kind: string, runId: number, changes?: Record<string, any>, warm?: boolean, reason?: string)
 *   => void, dispose: () => void}}
 */
export function createOpSender(model, state, changed) {
  /** @type {Set<any>} */ const timers = new Set();
  const later = (/** @type {() => void} */ fn, /** @type {number} */ ms) => {
    const t = setTimeout(() => { timers.delete(t); fn(); }, ms);
    timers.add(t);
  };
  /** @param {OpRequest} op */
  const postToServer = async (op) => {
    const name = state.snapshot?.experiment;
    const baseUrl = jupyterBaseUrl();
    if (!name || !baseUrl) return; // no Jupyter server page: the op waits for the kernel
    try {
      const { url, init } = inboxRequest(baseUrl, name, op, readCookie(document.cookie, "_xsrf"));
      const res = await fetch(url, init);
      if (res.ok && postedToServer(state, op)) changed({ notices: true });
    } catch (_err) {
      /* server extension not reachable: the comm message is still queued in the kernel */
    }
  };
  const send = (/** @type {string} */ kind, /** @type {number} */ runId, changes = {}, warm = false, reason = "") => {
    // once per click; a stop's own reason ("stop all but best 2 by eval_loss") goes with the comm message and with
    // the same op posted to the server's inbox after 2.5 s
    const op = { op_id: newOpId(), kind, run_id: runId, changes, warm_start: warm, ...(reason ? { reason } : {}) };
    clickSent(state, kind, runId, op.op_id);
    if (!safeSend(model, { type: "op", ...op })) {
      clickFailed(state, kind, runId, op.op_id);
      changed({ notices: true, table: true });
      return;
    }
    changed({ notices: true, table: true });
    later(() => { if (!state.acked.has(op.op_id)) postToServer(op); }, COMM_ACK_TIMEOUT_MS);
    later(() => { if (expireClick(state, kind, runId, op.op_id)) changed({ table: true }); }, PENDING_TIMEOUT_MS);
  };
  return { send, dispose: () => { for (const t of timers) clearTimeout(t); timers.clear(); } };
}
