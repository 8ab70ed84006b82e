// @ts-check
/**
 * rapidfire_nb live panel — the front end of `rapidfire_nb.panel.RunPanel` (an anywidget), and of the server
 * extension's experiments page (rapidfire_nb/server/static/app.js, which feeds it from the REST API).
 *
 * Plain ES modules, no build step: this entry module imports its siblings (format.js, state.js, ops.js, dom.js,
 * plots.js, view.js) with `import { ... } from "./x.js"`. The server page loads them as they are; for anywidget,
 * whose `_esm` is one module text, `rapidfire_nb.panel.bundle_esm` inlines them into one module.
 *
 * Protocol (see rapidfire_nb/panel/widget.py):
 *   view -> kernel: {type:"hello"} on every render, {type:"need_plotly"} once per page,
 *                   {type:"op", op_id, kind, run_id, changes, warm_start} per click (op_id made once per click),
 *                   {type:"pull", req, since, version, ops_version} about every second while the page is visible,
 *                   on focus, after an ack and when a message shows a gap (pull.js: one in flight at a time).
 *                   {type:"plot_settings", metrics, smoothing, y_scale} when a view's curve settings change.
 *   kernel -> view: {type:"snapshot", reset, snapshot, points, now}, {type:"points", points},
 *                   {type:"update", snapshot|null, points|null, now}, {type:"ack", ack},
 *                   {type:"plotly"} + one buffer (plotly.min.js), {type:"error", message}; the state messages
 *                   carry sequence numbers (cursor, since, version, ops_version) and, answering a pull, reply_to.
 * Every answer is sent in the kernel's comm handler (a reply to the view's own message): the panel stays live
 * where a front end drops unsolicited kernel messages (Colab); the pump's pushes are the fast path elsewhere.
 * Model level (`initialize`, once per widget model): the state (series store, runs, ops, notices; state.js), the
 * message listener, the op sender (ops.js), the puller (pull.js) and the notices' fade timers. View level
 * (`render`, once per view): the DOM (view.js), plotly, theme and resize observers. Synced trait: `summary`.
 */

import { fmtNum, runColor } from "./format.js";
import { createOpSender, safeSend } from "./ops.js";
import { loadPlotlyFromBuffer, plotlyLoader } from "./plots.js";
import { createPuller, PULL_MS } from "./pull.js";
import { createState, dismissNotice, fadeNotice, isFinal, reduce } from "./state.js";
import { PanelView } from "./view.js";

export { fmtNum, runColor };

/**
 * @typedef {{get: (k: string) => any, on: (e: string, f: Function) => void, off: (e: string, f: Function) => void,
 *   send: (content: any, callbacks?: any, buffers?: any[]) => void}} Model
 * @typedef {import("./state.js").Change} Change
 */

/** How long an applied / rejected notice stays (ms), and its fade-out. */
const NOTICE_MS = { applied: 6000, rejected: 12000 };
const FADE_MS = 400;

/** @type {WeakMap<object, ReturnType<typeof createModelStore>>} */
const STORES = new WeakMap();

/** The model's store, made on first use (anywidget calls `initialize` first; the server page may not).
 * @param {Model} model */
function modelStore(model) {
  let store = STORES.get(model);
  if (!store) { store = createModelStore(model); STORES.set(model, store); }
  return store;
}

/** @param {Model} model */
function createModelStore(model) {
  const state = createState();
  /** @type {Set<(c: Change) => void>} */ const views = new Set();
  /** @type {Map<string, {serial: number, timer: any}>} */ const fades = new Map();
  const changed = (/** @type {Change} */ change) => {
    if (change.notices) scheduleFades();
    for (const v of [...views]) v(change);
  };
  const scheduleFades = () => { // applied/rejected notices fade after a while; a newer text restarts the clock
    for (const [id, f] of [...fades]) {
      const n = state.notices.get(id);
      if (!n || n.serial !== f.serial) { clearTimeout(f.timer); fades.delete(id); }
    }
    for (const [id, n] of state.notices) {
      if (!isFinal(n) || fades.has(id)) continue;
      const serial = n.serial;
      const timer = setTimeout(() => {
        if (fadeNotice(state, id, serial)) changed({ notices: true });
        fades.set(id, { serial, timer: setTimeout(() => {
          fades.delete(id);
          if (dismissNotice(state, id, serial)) changed({ notices: true });
        }, FADE_MS) });
      }, n.state === "applied" ? NOTICE_MS.applied : NOTICE_MS.rejected);
      fades.set(id, { serial, timer });
    }
  };
  const puller = createPuller(state, (content) => safeSend(model, content));
  const onMsg = (/** @type {any} */ msg, /** @type {any[]} */ buffers) => {
    const change = reduce(state, msg, Date.now(), buffers);
    if (change.plotly) loadPlotlyFromBuffer(change.plotly);
    changed(change);
    puller.onMessage(msg, Date.now());
    if (msg && msg.type === "ack") puller.request(Date.now()); // the op's effect, where pushes do not arrive
  };
  model.on("msg:custom", onMsg);
  const ops = createOpSender(model, state, changed);
  // pull while a view is shown and the page visible, and at once when the page comes back
  const pull = () => { if (views.size && document.visibilityState !== "hidden") puller.request(Date.now()); };
  const timer = setInterval(pull, PULL_MS);
  window.addEventListener("focus", pull);
  document.addEventListener("visibilitychange", pull);
  return {
    state, ops,
    /** @param {(c: Change) => void} fn */
    subscribe(fn) { views.add(fn); return () => { views.delete(fn); }; },
    dispose() {
      model.off("msg:custom", onMsg);
      clearInterval(timer);
      window.removeEventListener("focus", pull);
      document.removeEventListener("visibilitychange", pull);
      ops.dispose();
      for (const f of fades.values()) clearTimeout(f.timer);
      views.clear();
    },
  };
}

function themeKey() {
  const b = document.body;
  return `${b.dataset.jpThemeLight ?? ""}|${b.dataset.jpThemeName ?? ""}|${b.className.includes("vscode-dark")}`;
}

/** plotly.js: one load per page; each model asks at most once, another panel only if the pending request is
 * old (its kernel may be gone). @param {Model} model @param {PanelView} view @returns {() => void} stop */
function askForPlotly(model, view) {
  const L = plotlyLoader();
  const ask = () => {
    if (L.done || L.loading || view.disposed || L.askedBy.has(model)) return;
    if (Date.now() - L.requestedAt > 15000) {
      L.requestedAt = Date.now();
      L.askedBy.add(model);
      safeSend(model, { type: "need_plotly" });
    }
  };
  ask();
  const retry = setInterval(ask, 5000); // if the kernel that was asked never answers, ask ours
  L.promise.then((P) => { clearInterval(retry); view.onPlotly(P); });
  return () => clearInterval(retry);
}

/** Resize and theme observers of one view. @param {PanelView} view @returns {() => void} stop */
function observe(view) {
  let frame = 0;
  const ro = new ResizeObserver(() => {
    if (frame) return;
    frame = requestAnimationFrame(() => { frame = 0; view.plots.resize(); });
  });
  ro.observe(view.plots.el);
  const mo = new MutationObserver(() => view.setTheme(themeKey()));
  mo.observe(document.body, { attributes: true, attributeFilter: ["data-jp-theme-light", "data-jp-theme-name",
    "class"] });
  return () => { if (frame) cancelAnimationFrame(frame); ro.disconnect(); mo.disconnect(); };
}

export default {
  /** Once per widget model: its state, message listener and op sender. @param {{model: Model}} ctx */
  initialize({ model }) {
    const store = modelStore(model);
    return () => { store.dispose(); STORES.delete(model); };
  },

  /** Once per view. @param {{model: Model, el: HTMLElement}} ctx */
  render({ model, el }) {
    const store = modelStore(model);
    const view = new PanelView(model, el, store.state, store.ops);
    view.setTheme(themeKey());
    const unsubscribe = store.subscribe((change) => view.onChange(change));
    const onSummary = () => view.renderHeader();
    model.on("change:summary", onSummary);
    safeSend(model, { type: "hello" });
    const stopPlotly = askForPlotly(model, view);
    const stopObserving = observe(view);
    const ticker = setInterval(() => view.tick(), 1000);
    const waiting = setTimeout(() => {
      if (!store.state.live) {
        view.statusLine.textContent = "Waiting for the kernel… This panel is live only while the kernel that " +
          "runs the experiment is connected; call experiment.panel() there to show it again.";
      }
    }, 6000);
    return () => {
      unsubscribe();
      model.off("change:summary", onSummary);
      clearInterval(ticker); clearTimeout(waiting);
      stopPlotly(); stopObserving();
      view.destroy();
    };
  },
};
