// @ts-check
/**
 * One rendered view of the panel (anywidget's `render`), drawn from the model's state (widgets/state.js):
 * the header (training time, frozen while nothing trains; tqdm-like progress: percentage of the full budget,
 * steps/s, s/chunk, time left smoothed by widgets/eta.js; the early-stopping line: trials asked / budget, pruned runs; the run on the device, or with several
 * devices one chip per device: "cpu:0 · run 3", "cpu:1 · idle", "cuda:2 · lost"), one reserved line for op notices (nothing below moves), the compare bar
 * (best run by a metric, "stop all but the best k", CSV export), the run table (widgets/table.js), the curve
 * controls (x axis step / samples / wall time, smoothing, y scale auto / linear / log), the legend, the curves (widgets/plots.js),
 * the parallel-coordinates view (widgets/compare.js) and the ops log. The plots' metrics, smoothing and y scale
 * go to the kernel when they change (`plot_settings`): the static copy is drawn with them. When the experiment ends, the static copy
 * the kernel sends (`frozen`) replaces it all.
 *
 * Test hooks: data-rf-panel[data-closed] (no op applies here), [data-rf-elapsed][data-training], [data-rf-stats],
 * [data-rf-count] (the header's counts: "2 stopped", "2 pruned" apart), [data-rf-early-stopping],
 * [data-rf-devices] > [data-rf-device][data-state][data-run-id],
 * [data-rf-plots][data-points],
 * button[data-x], input[data-rf-smoothing], button[data-y] (auto / linear / log), select[data-rf-best-by],
 * input[data-rf-keep] + button[data-rf-stop-all-but], button[data-rf-export], input[data-rf-show-deleted],
 * .rf-legend-item[data-run-id], .rf-op-item[data-state], .rf-notice[data-state], [data-rf-frozen], and the
 * table's (widgets/table.js).
 */

import { ComparePanel } from "./compare.js";
import { plotSettingsChange } from "./curves.js";
import { h } from "./dom.js";
import { EtaSmoother } from "./eta.js";
import { csvName, download, metricsCsv, runsCsv } from "./export.js";
import { fmtClock, fmtDuration, isDarkColor, runColor, setDarkRunColors, statsText, STATUSES } from "./format.js";
import { safeSend } from "./ops.js";
import { PlotArea } from "./plots.js";
import { bestRun, bulkStopReason, nextSort, stopAllButBest } from "./rank.js";
import {
  deviceChips, earlyStoppingText, kindMetrics, metricOrder, notice, noticesNewestFirst, statusCounts, visibleRuns,
} from "./state.js";
import { RunTable } from "./table.js";

/**
 * @typedef {import("./state.js").State} State
 * @typedef {import("./state.js").Change} Change
 * @typedef {{get: (k: string) => any}} Model
 * @typedef {{send: (kind: string, runId: number, changes?: Record<string, any>, warm?: boolean, reason?: string)
 *   => void}} OpSender
 */

const CLOCK_SVG = '<svg viewBox="0 0 16 16" width="12" height="12" fill="none" stroke="currentColor" ' +
  'stroke-width="1.6" stroke-linecap="round"><circle cx="8" cy="8" r="6.2"/><path d="M8 4.6V8l2.3 1.5"/></svg>';
/** The header's counts, in this order: a pruned run (STOPPED by early stopping) counts apart from the user's stops. */
const COUNTED = STATUSES.flatMap((s) => (s === "STOPPED" ? [s, "PRUNED"] : [s]));
const X_AXES = /** @type {const} */ ([["step", "step"], ["samples", "samples seen"], ["wall", "wall time"]]);
const Y_SCALES = /** @type {const} */ ([
  ["auto", "a log scale when a plot's values span more than 10×, else linear with outliers left out of the range " +
    "when they would flatten the rest (a cue on the plot says so)"],
  ["linear", "linear y axis, every value in range"], ["log", "log y axis (values <= 0 are not drawn)"]]);

export class PanelView {
  /** @param {Model} model @param {HTMLElement} el @param {State} state @param {OpSender} ops */
  constructor(model, el, state, ops) {
    this.model = model;
    this.el = el;
    this.state = state;
    this.ops = ops;
    this.xAxis = /** @type {"step"|"samples"|"wall"} */ ("step");
    this.showDeleted = false;
    this.smoothing = 0;
    /** the plot settings last sent to the kernel (sendPlotSettings) */
    this.settingsKey = "";
    /** the y scale: "auto" (each plot's own, widgets/curves.yScale) until the user picks linear or log */
    this.yScale = /** @type {"auto"|"linear"|"log"} */ ("auto");
    /** runs' status and pruned marks at the last plot: a change redraws the curves (their ✂ markers) */
    this.marksKey = "";
    this.bestMetric = "eval_loss";
    /** the user picked the "best by" metric (else it follows the trainer kind's, the snapshot's best_by) */
    this.bestPicked = false;
    /** @type {import("./rank.js").Sort} */ this.sort = { key: "run", dir: 1 };
    /** @type {number|null} */ this.bestRunId = null;
    /** @type {Set<number>} runs hidden from the curves by a click on their legend entry */
    this.hiddenRuns = new Set();
    /** @type {Map<string, HTMLElement>} */ this.noticeEls = new Map();
    this.legendKey = "";
    /** @type {string|null} */ this.opsKey = null;
    this.plotFrame = 0;
    this.themeKey = "";
    this.eta = new EtaSmoother();
    this.disposed = false;
    this.plots = new PlotArea(state, () => this.schedulePlot());
    this.compare = new ComparePanel(state, () => this.bestMetric, () => this.bestRunId);
    this.table = new RunTable(state, ops, this);
    this.build();
  }

  build() {
    this.titleEl = h("span", { class: "rf-title" });
    this.elapsedText = h("span", { text: "–", "data-rf-elapsed": "" });
    const clock = h("span", { class: "rf-icon", "aria-hidden": "true" });
    clock.innerHTML = CLOCK_SVG;
    const elapsed = h("span", { class: "rf-chip rf-elapsed", title: "training time (stops while nothing trains)" },
      clock, this.elapsedText);
    this.statsFill = h("span", { class: "rf-meter-fill" });
    this.statsText = h("span", { "data-rf-stats": "" });
    this.statsEl = h("span", { class: "rf-chip rf-stats", title: "overall progress · speed · time left" },
      h("span", { class: "rf-meter" }, this.statsFill), this.statsText);
    this.progressEl = h("span", { class: "rf-chip rf-progress", title: "chunk progress" });
    this.stopperEl = h("span", { class: "rf-chip rf-early-stopping", "data-rf-early-stopping": "",
      title: "early stopping / search: trials asked of the budget, runs pruned" });
    this.deviceEl = h("span", { class: "rf-chip rf-device" });
    /** the chips of several devices (run_fit(devices=...)), in place of deviceEl */
    this.devicesEl = h("span", { class: "rf-devices", "data-rf-devices": "", hidden: true });
    this.devicesKey = "";
    this.countsEl = h("div", { class: "rf-counts" });
    const header = h("div", { class: "rf-header" },
      h("div", { class: "rf-heading" }, h("span", { class: "rf-logo", "aria-hidden": "true" }), this.titleEl,
        this.countsEl),
      h("div", { class: "rf-chips" }, elapsed, this.statsEl, this.progressEl, this.stopperEl,
        this.deviceEl, this.devicesEl));
    this.noticesEl = h("div", { class: "rf-notices", "aria-live": "polite" });
    this.statusLine = h("div", { class: "rf-waiting", text: "Connecting to the kernel…" });
    this.legendEl = h("div", { class: "rf-legend", "data-rf-legend": "", role: "group",
      "aria-label": "runs shown in the curves" });
    this.opsCount = h("span", { class: "rf-ops-count", text: "0" });
    this.opsList = h("ol", { class: "rf-ops-list" });
    this.opsEl = h("details", { class: "rf-ops", open: true },
      h("summary", {}, h("span", { text: "Ops log " }), this.opsCount), this.opsList);
    this.root = h("div", { class: "rf-panel", "data-rf-panel": "" }, header, this.noticesEl, this.statusLine,
      this.buildCompareBar(), this.table.el, this.buildCurveBar(), this.legendEl, this.plots.el, this.compare.el,
      this.opsEl);
    this.el.replaceChildren(this.root);
    if (this.state.live) this.statusLine.hidden = true;
    if (this.state.frozenHtml !== null) this.showFrozen(); else this.renderAll();
  }

  buildCompareBar() {
    this.bestSelect = /** @type {HTMLSelectElement} */ (h("select", { class: "rf-select", "data-rf-best-by": "",
      title: "the metric that ranks the runs (losses: lowest is best; accuracies, rewards: highest)",
      onchange: () => {
        this.bestMetric = this.bestSelect.value; this.bestPicked = true; this.compare.invalidate(); this.renderAll();
      } }));
    this.keepInput = /** @type {HTMLInputElement} */ (h("input", { type: "number", class: "rf-num-input", min: "1",
      value: "2", "data-rf-keep": "", "aria-label": "runs to keep" }));
    const stopBtn = h("button", { type: "button", class: "rf-btn", "data-rf-stop-all-but": "",
      title: "Stop every run still training except the best k by the chosen metric (one stop op per run)",
      onclick: () => this.stopAllButBest() }, "Stop all but best");
    const box = /** @type {HTMLInputElement} */ (h("input", { type: "checkbox", "data-rf-show-deleted": "",
      onchange: () => { this.showDeleted = box.checked; this.renderAll(); } }));
    this.deletedLabel = h("span", { text: "show deleted" });
    const exp = (/** @type {"runs"|"metrics"} */ what) => h("button", { type: "button", class: "rf-btn rf-export",
      "data-rf-export": what, title: what === "runs" ? "the runs table as CSV" : "every logged metric as CSV (one row per run and step)",
      onclick: () => this.exportCsv(what) }, `${what}.csv`);
    return h("div", { class: "rf-toolbar rf-compare-bar" },
      h("label", { class: "rf-inline" }, h("span", { class: "rf-seg-label", text: "best by" }), this.bestSelect),
      h("span", { class: "rf-inline" }, stopBtn, this.keepInput),
      h("span", { class: "rf-inline" }, exp("runs"), exp("metrics")),
      h("span", { class: "rf-spacer" }),
      h("label", { class: "rf-check", title: "Bring deleted runs back, greyed, in the table and the curves" },
        box, this.deletedLabel));
  }

  buildCurveBar() {
    /** @type {Record<string, HTMLElement>} */ this.xButtons = {};
    for (const [x, label] of X_AXES) {
      this.xButtons[x] = h("button", { type: "button", class: `rf-seg-btn${x === this.xAxis ? " rf-on" : ""}`,
        "data-x": x, text: label, onclick: () => this.setXAxis(x) });
    }
    this.smoothValue = h("span", { class: "rf-smooth-value", text: "0" });
    const slider = /** @type {HTMLInputElement} */ (h("input", { type: "range", min: "0", max: "0.99", step: "0.01",
      value: "0", "data-rf-smoothing": "", "aria-label": "smoothing",
      oninput: () => { this.smoothing = Number(slider.value); this.smoothValue.textContent = slider.value; this.schedulePlot(); } }));
    /** @type {Record<string, HTMLElement>} */ this.yButtons = {};
    for (const [y, title] of Y_SCALES) {
      this.yButtons[y] = h("button", { type: "button", class: `rf-seg-btn${y === this.yScale ? " rf-on" : ""}`,
        "data-y": y, text: y, title, onclick: () => this.setYScale(y) });
    }
    return h("div", { class: "rf-toolbar rf-curve-bar" },
      h("div", { class: "rf-seg", role: "group", "aria-label": "x axis" },
        h("span", { class: "rf-seg-label", text: "x axis" }), ...Object.values(this.xButtons)),
      h("label", { class: "rf-inline", title: "exponential moving average, as TensorBoard's smoothing (the raw curve stays, faint)" },
        h("span", { class: "rf-seg-label", text: "smoothing" }), slider, this.smoothValue),
      h("div", { class: "rf-seg", role: "group", "aria-label": "y scale" },
        h("span", { class: "rf-seg-label", text: "y scale" }), ...Object.values(this.yButtons)));
  }

  /** Redraw what a state change touched. @param {Change} change */
  onChange(change) {
    if (this.disposed) return;
    if (change.frozen) { this.showFrozen(); return; }
    if (this.state.frozenHtml !== null) return;
    if (change.notices) this.renderNotices();
    if (change.snapshot) {
      this.statusLine.hidden = true;
      this.renderAll();
    } else {
      if (change.table) {
        this.table.render();
        if (this.marksChanged()) this.schedulePlot(); // a ✂ marker comes with a prune, not with new points
      }
      if (change.points) { this.updateBest(); this.schedulePlot(); }
    }
  }

  /** Whether a run's status or pruned mark changed since the last call (the curves draw both). */
  marksChanged() {
    const key = (this.state.snapshot?.runs || []).map((r) => `${r.run_id}:${r.status}:${r.pruned ? 1 : 0}`).join();
    if (key === this.marksKey) return false;
    this.marksKey = key;
    return true;
  }

  /** The experiment ended: its static copy (HTML drawn and escaped by the kernel) replaces the live view. */
  showFrozen() {
    this.plots.destroy();
    this.compare.destroy();
    const box = h("div", { class: "rf-frozen", "data-rf-frozen": "" });
    box.innerHTML = this.state.frozenHtml || "";
    this.el.replaceChildren(box);
  }

  renderAll() {
    this.renderHeader();
    this.refreshBestOptions();
    this.updateBest(false);
    this.table.render();
    this.renderLegend();
    this.renderOps();
    this.renderNotices();
    this.schedulePlot();
  }

  /** The best run for the chosen metric (re-renders the table when it changed). @param {boolean} [render] */
  updateBest(render = true) {
    const best = bestRun(this.state, this.bestMetric);
    if (best === this.bestRunId) return;
    this.bestRunId = best;
    if (render) this.table.render();
  }

  refreshBestOptions() {
    const kind = kindMetrics(this.state.snapshot).best; // GRPO: eval_reward (highest first), DPO: reward accuracy
    if (!this.bestPicked && kind !== this.bestMetric) { this.bestMetric = kind; this.compare.invalidate(); }
    if (!this.state.metricNames.has(this.bestMetric)) this.state.metricNames.add(this.bestMetric);
    const names = metricOrder(this.state);
    if ([...this.bestSelect.options].map((o) => o.value).join("\u0000") !== names.join("\u0000")) {
      this.bestSelect.replaceChildren(...names.map((n) => h("option", { value: n, text: n })));
    }
    this.bestSelect.value = this.bestMetric;
  }

  /** A column title was clicked. @param {string} key */
  onSort(key) {
    this.sort = nextSort(this.sort, key);
    this.table.render();
  }

  onCounts() {
    const counts = statusCounts(this.state);
    const total = (this.state.snapshot?.runs || []).length;
    this.countsEl.replaceChildren(h("span", { class: "rf-count-total", text: `${total} run${total === 1 ? "" : "s"}` }),
      ...COUNTED.filter((s) => counts[s]).map((s) =>
        h("span", { class: `rf-count rf-st-${s.toLowerCase()}`, "data-rf-count": s.toLowerCase(),
          title: s === "PRUNED" ? "stopped by the early-stopping policy (their status is STOPPED)" : null,
          text: `${counts[s]} ${s.toLowerCase()}` })));
    const nDeleted = counts.DELETED || 0;
    this.deletedLabel.textContent = nDeleted ? `show deleted (${nDeleted})` : "show deleted";
  }

  stopAllButBest() {
    const k = Math.max(1, Math.floor(Number(this.keepInput.value) || 1));
    const { stop, keep, unranked } = stopAllButBest(this.state, this.bestMetric, k);
    const reason = bulkStopReason(k, this.bestMetric); // recorded as the runs' stop reason, not "by the user"
    for (const rid of stop) this.ops.send("stop", rid, {}, false, reason);
    if (!stop.length) {
      const text = `nothing to stop: ${keep.length ? `runs ${keep.join(", ")} are the best ${k} by ${this.bestMetric}` :
        `no run still training has a ${this.bestMetric} value`}` + (unranked.length ? `; runs ${unranked.join(", ")} have no value yet` : "");
      notice(this.state, `bulk:${this.state.serial + 1}`, text, "rejected");
      this.renderNotices();
    }
  }

  /** @param {"runs"|"metrics"} what */
  exportCsv(what) {
    const name = csvName(this.state.snapshot?.experiment, what);
    download(name, what === "runs" ? runsCsv(this.state) : metricsCsv(this.state));
  }

  summary() {
    /** @type {any} */ const s = this.model.get("summary") || {};
    const snap = this.state.snapshot;
    if (!snap) return s;
    return { ...s, experiment: snap.experiment, progress: snap.progress, on_device: snap.on_device };
  }

  renderHeader() {
    const s = this.summary();
    const snap = this.state.snapshot;
    this.titleEl.textContent = s.experiment || "experiment";
    this.titleEl.title = s.experiment || "";
    this.progressEl.textContent = s.progress || "–";
    this.progressEl.hidden = !s.progress;
    const stats = snap?.stats;
    this.statsFill.style.width = `${Math.max(0, Math.min(100, stats?.percent ?? 0)).toFixed(1)}%`;
    this.statsEl.hidden = !stats;
    // nothing here applies an op (ended, or read from the store with no kernel training it here): the notice
    // line says so instead of "ops apply at the end of a chunk" (the header says how to continue)
    const runs = snap?.runs || [];
    const closed = !!snap && (snap.ended || snap.source === "store") && runs.every((r) => !(r.legal_ops || []).length);
    this.root.dataset.closed = String(closed);
    const stopper = earlyStoppingText(snap);
    this.stopperEl.textContent = stopper;
    this.stopperEl.hidden = !stopper;
    this.deviceEl.replaceChildren();
    const chips = deviceChips(snap); // several devices: one chip each, in place of the single device chip
    this.renderDevices(chips);
    // the server page knows the devices' names, not what they do: its device_status chip stays
    this.deviceEl.hidden = chips.some((c) => c.state !== "—");
    if (s.on_device !== null && s.on_device !== undefined) {
      this.deviceEl.append(h("span", { class: "rf-dot rf-pulse", style: { background: runColor(s.on_device) } }),
        `run ${s.on_device} on device`);
      this.deviceEl.classList.remove("rf-idle");
    } else {
      // the server page's snapshots (from the store) cannot name the run on the device; they say what they can
      this.deviceEl.append(snap?.ended ? "ended" : snap?.device_status || "device idle");
      this.deviceEl.classList.add("rf-idle");
    }
    this.tick();
  }

  /** One chip per device (rebuilt only when one changed: the pulse animations keep running).
   * @param {import("./state.js").DeviceChip[]} chips */
  renderDevices(chips) {
    const key = JSON.stringify(chips);
    this.devicesEl.hidden = chips.length === 0;
    if (key === this.devicesKey) return;
    this.devicesKey = key;
    this.devicesEl.replaceChildren(...chips.map((c) => h("span", {
      class: `rf-chip rf-device rf-device-${c.state === "—" ? "unknown" : c.state}${c.runId === null ? " rf-idle" : ""}`,
      "data-rf-device": c.name, "data-state": c.state, "data-run-id": c.runId === null ? null : String(c.runId),
      title: c.title,
    }, c.runId !== null ? h("span", { class: "rf-dot rf-pulse", style: { background: runColor(c.runId) } }) : null,
    c.text)));
  }

  /** Training time: the snapshot's, moving on with the kernel's clock only while something trains. */
  tick() {
    const snap = this.state.snapshot;
    if (!snap || typeof snap.elapsed_s !== "number") {
      this.elapsedText.textContent = "–";
      this.statsText.textContent = statsText(snap?.stats) || "–";
      return;
    }
    const training = !!snap.training && this.state.live;
    const extra = training && typeof snap.now === "number" ? (Date.now() + this.state.clockOffset) / 1000 - snap.now : 0;
    this.elapsedText.textContent = fmtDuration(snap.elapsed_s + Math.max(0, extra));
    this.elapsedText.dataset.training = String(training);
    // the time left: tqdm-like smoothed rate, counted down with the training clock between snapshots (eta.js)
    const stats = snap.stats;
    const eta = this.eta.update(stats, (stats?.elapsed_s ?? snap.elapsed_s) + Math.max(0, extra));
    this.statsText.textContent = statsText(stats && { ...stats, eta_s: eta }) || "–";
  }

  /** The newest notice in its one reserved line (older ones stay in the ops log). */
  renderNotices() {
    const wanted = noticesNewestFirst(this.state).map(([id, n]) => {
      let el = this.noticeEls.get(id);
      if (!el) { el = h("div", { class: "rf-notice", "data-op-id": id }); this.noticeEls.set(id, el); }
      if (el.textContent !== n.text) { el.textContent = n.text; el.title = n.text; }
      el.className = `rf-notice rf-notice-${n.state}${n.fading ? " rf-fade" : ""}`;
      el.dataset.state = n.state;
      return el;
    });
    for (const [id, el] of [...this.noticeEls]) {
      if (!this.state.notices.has(id)) { el.remove(); this.noticeEls.delete(id); }
    }
    wanted.forEach((el, i) => {
      if (this.noticesEl.children[i] !== el) this.noticesEl.insertBefore(el, this.noticesEl.children[i] || null);
    });
  }

  renderLegend() {
    const runs = visibleRuns(this.state, this.showDeleted);
    const key = runs.map((r) => `${r.run_id}:${r.status === "DELETED"}:${this.hiddenRuns.has(r.run_id)}:` +
      `${/** @type {any} */ (r).run_name || ""}`).join(",");
    if (key === this.legendKey) return;
    this.legendKey = key;
    this.legendEl.replaceChildren(...runs.map((r) => {
      const off = this.hiddenRuns.has(r.run_id);
      return h("button", { type: "button", class: `rf-legend-item${off ? " rf-legend-off" : ""}` +
        `${r.status === "DELETED" ? " rf-legend-deleted" : ""}`, "data-run-id": r.run_id,
        "aria-pressed": String(!off),
        title: (off ? `show run ${r.run_id} in the curves` : `hide run ${r.run_id}`) + // its name, when it has one
          (/** @type {any} */ (r).run_name ? ` (${/** @type {any} */ (r).run_name})` : ""),
        onclick: () => {
          if (this.hiddenRuns.has(r.run_id)) this.hiddenRuns.delete(r.run_id); else this.hiddenRuns.add(r.run_id);
          this.renderLegend();
          this.schedulePlot();
        } },
      h("span", { class: "rf-legend-line", style: { background: runColor(r.run_id) } }), `run ${r.run_id}`);
    }));
  }

  renderOps() {
    const ops = [...(this.state.snapshot?.ops || [])];
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
      h("span", { class: "rf-op-msg", text: op.message || "", title: op.message || "" })));
    this.opsList.replaceChildren(...items);
  }

  /** @param {"step"|"samples"|"wall"} x */
  setXAxis(x) {
    if (x === this.xAxis) return;
    this.xAxis = x;
    for (const [k, b] of Object.entries(this.xButtons)) b.classList.toggle("rf-on", k === x);
    this.schedulePlot();
  }

  /** The user's y scale (wins over the automatic one). @param {"auto"|"linear"|"log"} y */
  setYScale(y) {
    if (y === this.yScale) return;
    this.yScale = y;
    for (const [k, b] of Object.entries(this.yButtons)) b.classList.toggle("rf-on", k === y);
    this.schedulePlot();
  }

  schedulePlot() {
    if (this.plotFrame || this.disposed) return;
    this.plotFrame = requestAnimationFrame(() => {
      this.plotFrame = 0;
      if (this.disposed || this.state.frozenHtml !== null) return;
      this.plots.draw(this);
      this.compare.draw(this.themeKey);
      this.sendPlotSettings();
    });
  }

  /** Tell the kernel the curves' metrics, smoothing and y scale when they change (the static copy uses them). */
  sendPlotSettings() {
    if (!this.state.snapshot) return; // the metrics follow the trainer kind's defaults once a snapshot is here
    const c = plotSettingsChange(this.settingsKey, this.plots.slots.map((s) => s.metric), this.smoothing, this.yScale);
    if (c && safeSend(this.model, c.msg)) this.settingsKey = c.key;
  }

  /** plotly.js is loaded. @param {any} Plotly */
  onPlotly(Plotly) {
    if (this.disposed) return;
    this.plots.Plotly = Plotly;
    this.compare.Plotly = Plotly;
    this.schedulePlot();
  }

  /** The page theme changed. @param {string} key */
  setTheme(key) {
    if (key === this.themeKey) return;
    this.themeKey = key;
    const bg = getComputedStyle(this.root).getPropertyValue("--rf-bg");
    if (setDarkRunColors(isDarkColor(bg))) { // run 1's Slate: TensorBoard's lighter value on a dark page
      this.legendKey = "";
      this.opsKey = null;
      this.renderAll();
    }
    this.compare.invalidate();
    this.schedulePlot();
  }

  destroy() {
    this.disposed = true;
    if (this.plotFrame) cancelAnimationFrame(this.plotFrame);
    this.plots.destroy();
    this.compare.destroy();
  }
}
