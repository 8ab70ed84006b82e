// @ts-check
/**
 * One rendered view of the panel (anywidget's `render`): header, notices, run table with IC Ops buttons and the
 * clone form, legend, curves (widgets/plots.js) and ops log, all drawn from the model's state (widgets/state.js).
 * A view holds only DOM and view settings (x axis, show deleted, runs hidden from the curves); clicks go to the
 * model's op sender (widgets/ops.js).
 *
 * Test hooks: data-rf-panel, tr[data-run-id][data-status][data-on-device], tr[data-error-for],
 * [data-rf-plots][data-points], button[data-op], form[data-clone-form], button[data-x], input[data-rf-show-deleted],
 * .rf-legend-item[data-run-id], .rf-op-item[data-state], .rf-notice[data-state].
 */

import { h, setKids, setText } from "./dom.js";
import { fmtClock, fmtElapsed, fmtHparam, fmtInt, fmtNum, OPS, parseValue, runColor, shortHparam, STATUSES }
  from "./format.js";
import { PlotArea } from "./plots.js";
import { isActive, isPending, noticesNewestFirst, statusCounts, visibleRuns } from "./state.js";

/**
 * @typedef {import("./state.js").State} State
 * @typedef {import("./state.js").Run} Run
 * @typedef {import("./state.js").Change} Change
 * @typedef {{get: (k: string) => any}} Model
 * @typedef {{send: (kind: string, runId: number, changes?: Record<string, any>, warm?: boolean) => void}} OpSender
 * @typedef {{tr: HTMLElement, cells: Record<string, HTMLElement>, buttons: Record<string, HTMLButtonElement>,
 *   errorTr: HTMLElement, stepText: HTMLElement, stepFill: HTMLElement, runKey: string, statusKey: string,
 *   formTr: HTMLElement|null}} Row
 */

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
const CLOCK_SVG = '<svg viewBox="0 0 16 16" width="12" height="12" fill="none" stroke="currentColor" ' +
  'stroke-width="1.6" stroke-linecap="round"><circle cx="8" cy="8" r="6.2"/><path d="M8 4.6V8l2.3 1.5"/></svg>';

export class PanelView {
  /** @param {Model} model @param {HTMLElement} el @param {State} state @param {OpSender} ops */
  constructor(model, el, state, ops) {
    this.model = model;
    this.el = el;
    this.state = state;
    this.ops = ops;
    this.xAxis = /** @type {"step"|"samples"} */ ("step");
    this.showDeleted = false;
    /** @type {Set<number>} runs hidden from the curves by a click on their legend entry */
    this.hiddenRuns = new Set();
    /** @type {Map<number, Row>} */ this.rows = new Map();
    /** @type {Map<string, HTMLElement>} */ this.noticeEls = new Map();
    this.hparamKey = "";
    this.legendKey = "";
    /** @type {string|null} */ this.opsKey = null;
    this.plotFrame = 0;
    this.themeKey = "";
    this.disposed = false;
    this.plots = new PlotArea(state, () => this.schedulePlot());
    this.build();
  }

  build() {
    this.titleEl = h("span", { class: "rf-title" });
    this.elapsedText = h("span", { text: "–" });
    const clock = h("span", { class: "rf-icon", "aria-hidden": "true" });
    clock.innerHTML = CLOCK_SVG;
    const elapsed = h("span", { class: "rf-chip rf-elapsed", title: "elapsed since run_fit" }, clock,
      this.elapsedText);
    this.progressEl = h("span", { class: "rf-chip rf-progress", title: "chunk progress" });
    this.deviceEl = h("span", { class: "rf-chip rf-device" });
    const header = h("div", { class: "rf-header" },
      h("div", { class: "rf-heading" }, h("span", { class: "rf-logo", "aria-hidden": "true" }), this.titleEl),
      h("div", { class: "rf-chips" }, elapsed, this.progressEl, this.deviceEl));
    this.noticesEl = h("div", { class: "rf-notices", "aria-live": "polite" });
    this.statusLine = h("div", { class: "rf-waiting", text: "Connecting to the kernel…" });
    this.theadRow = h("tr");
    this.tbody = h("tbody");
    const table = h("table", { class: "rf-table" }, h("thead", {}, this.theadRow), this.tbody);
    this.legendEl = h("div", { class: "rf-legend", "data-rf-legend": "", role: "group",
      "aria-label": "runs shown in the curves" });
    this.opsCount = h("span", { class: "rf-ops-count", text: "0" });
    this.opsList = h("ol", { class: "rf-ops-list" });
    this.opsEl = h("details", { class: "rf-ops", open: true },
      h("summary", {}, h("span", { text: "Ops log " }), this.opsCount), this.opsList);
    this.root = h("div", { class: "rf-panel", "data-rf-panel": "" }, header, this.noticesEl, this.statusLine,
      h("div", { class: "rf-table-wrap" }, table), this.buildToolbar(), this.legendEl, this.plots.el, this.opsEl);
    this.el.replaceChildren(this.root);
    if (this.state.live) this.statusLine.hidden = true;
    this.renderAll(true);
  }

  buildToolbar() {
    this.countsEl = h("div", { class: "rf-counts" });
    this.stepBtn = h("button", { class: "rf-seg-btn rf-on", "data-x": "step", text: "step",
      onclick: () => this.setXAxis("step") });
    this.samplesBtn = h("button", { class: "rf-seg-btn", "data-x": "samples", text: "samples seen",
      onclick: () => this.setXAxis("samples") });
    const box = /** @type {HTMLInputElement} */ (h("input", { type: "checkbox", "data-rf-show-deleted": "",
      onchange: () => { this.showDeleted = box.checked; this.renderAll(); } }));
    this.deletedLabel = h("span", { text: "show deleted" });
    return h("div", { class: "rf-toolbar" },
      h("div", { class: "rf-counts-wrap" }, this.countsEl),
      h("label", { class: "rf-check", title: "Bring deleted runs back, greyed, in the table and the curves" },
        box, this.deletedLabel),
      h("div", { class: "rf-seg", role: "group", "aria-label": "x axis" },
        h("span", { class: "rf-seg-label", text: "x axis" }), this.stepBtn, this.samplesBtn));
  }

  /** Redraw what a state change touched. @param {Change} change */
  onChange(change) {
    if (this.disposed) return;
    if (change.redraw) this.plots.invalidate(true);
    if (change.notices) this.renderNotices();
    if (change.snapshot) {
      this.statusLine.hidden = true;
      this.renderAll(change.full);
    } else {
      if (change.table) this.renderTable();
      if (change.points) this.schedulePlot();
    }
  }

  /** @param {boolean} [full] */
  renderAll(full = false) {
    this.renderHeader();
    this.renderTable();
    this.renderLegend();
    this.renderOps();
    this.renderNotices();
    if (full) this.plots.invalidate();
    this.schedulePlot();
  }

  summary() {
    /** @type {any} */ const s = this.model.get("summary") || {};
    const snap = this.state.snapshot;
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
      this.deviceEl.append(this.state.snapshot?.device_status || "device idle");
      this.deviceEl.classList.add("rf-idle");
    }
    this.tick();
  }

  /** Elapsed time: ticks with the kernel's clock while live and active; frozen otherwise. */
  tick() {
    const s = /** @type {any} */ (this.model.get("summary") || {});
    const snap = this.state.snapshot;
    const started = snap?.started_at ?? s.started_at;
    if (!started) { this.elapsedText.textContent = "–"; return; }
    const active = snap ? isActive(snap) : false;
    const now = this.state.live && active ? (Date.now() + this.state.clockOffset) / 1000
      : (snap?.now ?? s.updated_at ?? started);
    this.elapsedText.textContent = fmtElapsed(now - started);
  }

  /** The notice lines, newest first; each op keeps its element (updated in place). */
  renderNotices() {
    const wanted = noticesNewestFirst(this.state).map(([id, n]) => {
      let el = this.noticeEls.get(id);
      if (!el) { el = h("div", { class: "rf-notice", "data-op-id": id }); this.noticeEls.set(id, el); }
      if (el.textContent !== n.text) el.textContent = n.text;
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

  colCount() {
    return 8 + (this.state.snapshot?.hparam_columns?.length || 0);
  }

  renderTable() {
    const snap = this.state.snapshot;
    const cols = snap?.hparam_columns || [];
    this.renderHead(cols);
    const runs = visibleRuns(this.state, this.showDeleted);
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
    this.renderCounts();
  }

  /** @param {string[]} cols */
  renderHead(cols) {
    const key = cols.join("\u0000");
    if (key === this.hparamKey && this.theadRow.children.length) return;
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

  renderCounts() {
    const counts = statusCounts(this.state);
    const total = (this.state.snapshot?.runs || []).length;
    this.countsEl.replaceChildren(h("span", { class: "rf-count-total", text: `${total} run${total === 1 ? "" : "s"}` }),
      ...STATUSES.filter((s) => counts[s]).map((s) =>
        h("span", { class: `rf-count rf-st-${s.toLowerCase()}`, text: `${counts[s]} ${s.toLowerCase()}` })));
    const nDeleted = counts.DELETED || 0;
    this.deletedLabel.textContent = nDeleted ? `show deleted (${nDeleted})` : "show deleted";
  }

  /** @param {Run} run @param {string[]} cols @returns {Row} */
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
          const cur = (this.state.snapshot?.runs || []).find((r) => r.run_id === run.run_id) || run;
          if (op === "clone") this.toggleCloneForm(cur); else this.ops.send(op, run.run_id);
        } }, icon, h("span", { class: "rf-op-label", text: OP_LABEL[op] })));
      cells.actions.append(buttons[op]);
    }
    const errorTr = h("tr", { class: "rf-error-row", "data-error-for": run.run_id },
      h("td", { colspan: this.colCount() }));
    const stepText = h("span");
    const stepFill = h("span", { class: "rf-bar-fill" });
    cells.step.append(stepText, h("span", { class: "rf-bar" }, stepFill));
    return { tr, cells, buttons, errorTr, stepText, stepFill, runKey: "", statusKey: "", formTr: null };
  }

  /** @param {Row} row @param {Run} run @param {string[]} cols */
  updateRow(row, run, cols) {
    const { tr, cells } = row;
    tr.dataset.runId = String(run.run_id);
    tr.dataset.status = run.status;
    tr.dataset.onDevice = String(!!run.on_device);
    tr.classList.toggle("rf-deleted", run.status === "DELETED");
    tr.classList.toggle("rf-failed", run.status === "FAILED");
    tr.classList.toggle("rf-active", !!run.on_device);
    this.updateIdentity(row, run);
    for (const c of cols) {
      const v = run.hparams ? run.hparams[c] : undefined;
      setText(cells[`hp:${c}`], fmtHparam(v), typeof v === "string" && v.length > 14 ? v : `${c} = ${JSON.stringify(v)}`);
    }
    const frac = run.total_steps ? Math.min(1, run.completed_steps / run.total_steps) : 0;
    setText(row.stepText, `${fmtInt(run.completed_steps)}/${fmtInt(run.total_steps)}`);
    row.stepFill.style.width = `${(frac * 100).toFixed(1)}%`;
    cells.step.classList.toggle("rf-bar-failed", run.status === "FAILED");
    cells.step.classList.toggle("rf-bar-done", run.status === "COMPLETED");
    // chunks over the whole run (all epochs): chunks_done / num_segments; older snapshots: per-epoch count
    const nTotal = run.num_segments || this.state.snapshot?.num_chunks;
    setText(cells.chunks, nTotal ? `${run.chunks_done}/${nTotal}` : String(run.chunks_done ?? "–"));
    setText(cells.loss, fmtNum(run.loss));
    setText(cells.eval, fmtNum(run.eval_loss));
    setText(cells.samples, fmtInt(run.samples_seen));
    const legal = new Set(run.legal_ops || []);
    for (const op of OPS) {
      const pending = isPending(this.state, op, run.run_id);
      row.buttons[op].disabled = !legal.has(op) || pending;
      row.buttons[op].classList.toggle("rf-pending", pending);
      row.buttons[op].classList.toggle("rf-open", op === "clone" && !!row.formTr);
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

  /** The run and status cells (rebuilt only when they change). @param {Row} row @param {Run} run */
  updateIdentity(row, run) {
    const runKey = `${run.parent_id}|${run.warm_start}`;
    if (row.runKey !== runKey) {
      row.runKey = runKey;
      const origin = run.parent_id !== null && run.parent_id !== undefined
        ? h("span", { class: "rf-origin", title: run.warm_start ? "cloned with warm start" : "cloned from scratch",
          text: `↳ run ${run.parent_id}${run.warm_start ? " · warm" : ""}` }) : null;
      setKids(row.cells.run, h("span", { class: "rf-swatch", style: { background: runColor(run.run_id) } }),
        h("span", { class: "rf-run-id", text: `run ${run.run_id}` }), origin);
    }
    const statusKey = `${run.status}|${!!run.on_device}`;
    if (row.statusKey !== statusKey) {
      row.statusKey = statusKey;
      setKids(row.cells.status,
        h("span", { class: `rf-badge rf-st-${run.status.toLowerCase()}`, "data-badge": run.status, text: run.status }),
        run.on_device ? h("span", { class: "rf-badge rf-on-device", "data-badge": "on-device", text: "on device" })
          : null);
    }
  }

  renderLegend() {
    const runs = visibleRuns(this.state, this.showDeleted);
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
      h("span", { class: "rf-op-msg", text: op.message || "" })));
    this.opsList.replaceChildren(...items);
  }

  /** @param {"step"|"samples"} x */
  setXAxis(x) {
    if (x === this.xAxis) return;
    this.xAxis = x;
    this.stepBtn.classList.toggle("rf-on", x === "step");
    this.samplesBtn.classList.toggle("rf-on", x === "samples");
    this.plots.invalidate();
    this.schedulePlot();
  }

  /** @param {Run} run */
  toggleCloneForm(run) {
    const row = this.rows.get(run.run_id);
    if (!row) return;
    if (row.formTr) { row.formTr.remove(); row.formTr = null; this.renderTable(); return; }
    const form = cloneForm(run, {
      submit: (changes, warm) => {
        this.ops.send("clone", run.run_id, changes, warm);
        row.formTr?.remove(); row.formTr = null;
        this.renderTable();
      },
      cancel: () => this.toggleCloneForm(run),
    });
    row.formTr = h("tr", { class: "rf-form-row" }, h("td", { colspan: this.colCount() }, form));
    this.renderTable();
    /** @type {HTMLInputElement|null} */ (form.querySelector("input[type=text]"))?.focus();
  }

  schedulePlot() {
    if (this.plotFrame || this.disposed) return;
    this.plotFrame = requestAnimationFrame(() => {
      this.plotFrame = 0;
      if (!this.disposed) this.plots.draw(this);
    });
  }

  /** plotly.js is loaded. @param {any} Plotly */
  onPlotly(Plotly) {
    if (this.disposed) return;
    this.plots.Plotly = Plotly;
    this.plots.invalidate();
    this.schedulePlot();
  }

  /** The page theme changed. @param {string} key */
  setTheme(key) {
    if (key === this.themeKey) return;
    this.themeKey = key;
    this.plots.invalidate();
    this.schedulePlot();
  }

  destroy() {
    this.disposed = true;
    if (this.plotFrame) cancelAnimationFrame(this.plotFrame);
    this.plots.destroy();
  }
}

/**
 * The clone form of a run: its hyperparameters (only changed fields are sent), other fields as field=value,
 * warm start.
 * @param {Run} run @param {{submit: (changes: Record<string, any>, warm: boolean) => void, cancel: () => void}} on
 * @returns {HTMLElement}
 */
function cloneForm(run, on) {
  const inputs = /** @type {Record<string, HTMLInputElement>} */ ({});
  const fields = h("div", { class: "rf-form-grid" });
  for (const [k, v] of Object.entries(run.hparams || {})) {
    inputs[k] = /** @type {HTMLInputElement} */ (h("input", { type: "text", name: k,
      value: typeof v === "string" ? v : fmtHparam(v), spellcheck: "false" }));
    fields.append(h("label", { class: "rf-field", title: k }, h("span", { text: k }), inputs[k]));
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
    for (const part of extra.value.split(/\s*[;\n]\s*|,\s*(?=[\w.\-/]+\s*=)/).filter((s) => s.trim())) {
      const eq = part.indexOf("=");
      if (eq <= 0) { error.textContent = `"${part}" is not field=value`; return; }
      const k = part.slice(0, eq).trim();
      changes[k] = parseValue(part.slice(eq + 1), run.hparams[k]);
    }
    on.submit(changes, warm.checked);
  };
  return h("form", { class: "rf-form", "data-clone-form": run.run_id,
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
    h("button", { type: "button", class: "rf-btn", text: "Cancel", onclick: on.cancel }),
    h("button", { type: "submit", class: "rf-btn rf-btn-primary", "data-op": "clone-submit", text: "Submit" })));
}
