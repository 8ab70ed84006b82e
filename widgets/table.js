// @ts-check
/**
 * The run table of one panel view: a row per run with its IC Ops buttons (a disabled button says why in its
 * tooltip), the table sorted by any column (click a title; click again to flip), the best run for the chosen
 * metric highlighted, each run's full config on demand, and the clone form (widgets/clone_form.js: it warns when
 * the clone would repeat an existing run's config). Keeps its DOM nodes across redraws (focus in a clone form survives).
 *
 * Test hooks: tr[data-run-id][data-status][data-on-device][data-best][data-pruned], tr[data-error-for] (a failure),
 * the Status cell's [data-badge] (a status, or PRUNED / STOPPING / WAITING: state.runMark) and
 * [data-rf-mark-why="pruned"|"waiting"] (why early stopping pruned the run: its first words, all of it in the
 * title; whose chunk boundary a warm clone waits for), tr[data-config-for],
 * th[data-sort-key][aria-sort], button[data-op] (button[data-op="continue"]: a COMPLETED or STOPPED run's
 * "Continue…", the clone form with warm start on and its max_steps ready), button[data-config], form[data-clone-form],
 * [data-clone-warning], td[data-rf-chunks-note] (the Chunks cell of a run whose chunks are not whole epochs': the
 * snapshot's chunks_note in its title, a * after the count), td[data-rf-device-cell] (the Device column: only when some run has a device, i.e. the
 * experiment trains on several: `run_fit(devices=...)`), td[data-rf-pack-cell] (the Pack column: the pack's id, "" alone;
 * only when some run trains packed: `run_fit(packing=...)`).
 */

import { h, setKids, setText } from "./dom.js";
import {
  DEFAULT_METRICS, fmtHparam, fmtInt, fmtMetric, metricTitle, OP_LABEL, OP_TITLE, OPS, runColor, shortHparam,
} from "./format.js";
import { canContinue, cloneForm } from "./clone_form.js";
import { latestValues, sortRuns } from "./rank.js";
import { hasDeviceColumn, hasPackColumn, isPending, isPruned, kindMetrics, runMark, visibleRuns } from "./state.js";

/**
 * @typedef {import("./state.js").State} State
 * @typedef {import("./state.js").Run} Run
 * @typedef {import("./rank.js").Sort} Sort
 * @typedef {{send: (kind: string, runId: number, changes?: Record<string, any>, warm?: boolean, reason?: string)
 *   => void}} OpSender
 * @typedef {{showDeleted: boolean, sort: Sort, bestRunId: number|null, bestMetric: string,
 *   onSort: (key: string) => void, onCounts: () => void}} Host
 * @typedef {{tr: HTMLElement, cells: Record<string, HTMLElement>, buttons: Record<string, HTMLButtonElement>,
 *   errorTr: HTMLElement, configTr: HTMLElement|null, stepText: HTMLElement, stepFill: HTMLElement,
 *   runKey: string, statusKey: string, formTr: HTMLElement|null}} Row
 */

/**
 * The line under a run's row: why it failed, else null (why early stopping pruned a run stays inline in its
 * Status cell, the full text on hover: no row pushes the rows below down during training).
 * @param {Run} run @returns {{label: string, text: string}|null}
 */
function noteOf(run) {
  if (run.status === "FAILED" && run.error) return { label: `run ${run.run_id} failed: `, text: run.error };
  return null;
}
const svg = (/** @type {string} */ body) => `<svg viewBox="0 0 16 16" width="13" height="13" fill="none" ` +
  `stroke="currentColor" stroke-width="1.5" stroke-linecap="round" stroke-linejoin="round">${body}</svg>`;
const OP_ICON = {
  stop: svg('<rect x="4" y="4" width="8" height="8" rx="1.2" fill="currentColor" stroke="none"/>'),
  resume: svg('<path d="M5 3.5v9l7.5-4.5z" fill="currentColor" stroke="none"/>'),
  delete: svg('<path d="M3 4.5h10M6.5 4.5V3h3v1.5M4.5 4.5l.6 8.5h5.8l.6-8.5M7 7v4M9 7v4"/>'),
  clone: svg('<rect x="5.5" y="5.5" width="7.5" height="7.5" rx="1.3"/><path d="M10.5 3.5V3H3v7.5h.5"/>'),
};
/** "Continue…" (a finished run trained on): a step forward past a bar. */
const CONTINUE_ICON = svg('<path d="M3 3.5v9l6-4.5z" fill="currentColor" stroke="none"/><path d="M11.5 3.5v9"/>');
/** The sort key of a metric column: the run's own `loss` / `eval_loss`, else `m:<metric>` (run.metrics). @param {string} m */
const metricKey = (m) => (m === "loss" || m === "eval_loss" ? m : `m:${m}`);
/** A named run's name under its id: one line in the Run column's fixed width, cut with an ellipsis, the whole name
 * (and the tags) in its title; null for a run without a name (the id alone, as before names).
 * @param {Run & {run_name?: string|null, tags?: string[]}} run @returns {HTMLElement|null} */
export function runNameLabel(run) {
  if (!run.run_name) return null;
  const tags = run.tags?.length ? `\ntags: ${run.tags.join(", ")}` : "";
  return h("span", { class: "rf-run-name", "data-rf-run-name": run.run_id, title: `run ${run.run_id}: ${run.run_name}${tags}`,
    text: run.run_name });
}

/** Sortable columns after the hyperparameters: key, title, tooltip; the metric columns are the trainer kind's
 * (state.kindMetrics: SFT loss / eval_loss, GRPO reward / eval_reward; zero or absent for every run: not shown).
 * @param {string[]} metrics */
const tailCols = (metrics) => [["step", "Step", "completed / total optimizer steps"],
  ["chunks", "Chunks", "chunks done / chunks in total (all epochs)"],
  ...metrics.map((m) => [metricKey(m), metricTitle(m), m === "loss" ? "latest train loss" : `latest ${m}`]),
  ["samples", "Samples", "samples seen"]];

export class RunTable {
  /** @param {State} state @param {OpSender} ops @param {Host} host */
  constructor(state, ops, host) {
    this.state = state;
    this.ops = ops;
    this.host = host;
    /** @type {Map<number, Row>} */ this.rows = new Map();
    /** @type {string[]} the metric columns shown */ this.metricCols = [...DEFAULT_METRICS];
    this.headKey = "";
    this.theadRow = h("tr");
    this.tbody = h("tbody");
    this.table = h("table", { class: "rf-table" }, h("thead", {}, this.theadRow), this.tbody);
    this.el = h("div", { class: "rf-table-wrap" }, this.table);
  }

  colCount() {
    return 6 + this.metricCols.length + (this.state.snapshot?.hparam_columns?.length || 0) +
      (hasDeviceColumn(this.state.snapshot) ? 1 : 0) + (hasPackColumn(this.state.snapshot) ? 1 : 0);
  }

  render() {
    const snap = this.state.snapshot;
    const cols = snap?.hparam_columns || [];
    const device = hasDeviceColumn(snap);
    const pack = hasPackColumn(snap);
    this.metricCols = kindMetrics(snap).columns;
    this.renderHead(cols, device, pack);
    // any named run: the Run column takes the name's fixed width at once, so a later (clone's) name moves nothing
    this.table.classList.toggle("rf-named", (snap?.runs || []).some((r) => !!/** @type {any} */ (r).run_name));
    const sort = this.host.sort;
    const metric = sort.key.startsWith("m:") ? latestValues(this.state, sort.key.slice(2)) : undefined;
    const runs = sortRuns(visibleRuns(this.state, this.host.showDeleted), sort, metric);
    const wanted = /** @type {HTMLElement[]} */ ([]);
    for (const run of runs) {
      let row = this.rows.get(run.run_id);
      if (!row) { row = this.makeRow(run, cols, device, pack); this.rows.set(run.run_id, row); }
      this.updateRow(row, run, cols);
      wanted.push(row.tr);
      if (noteOf(run)) wanted.push(row.errorTr);
      for (const extra of [row.configTr, row.formTr]) {
        if (!extra) continue;
        /** @type {HTMLElement} */ (extra.firstElementChild).setAttribute("colspan", String(this.colCount()));
        wanted.push(extra);
      }
    }
    if (!runs.length) {
      wanted.push(h("tr", { class: "rf-empty-row" }, h("td", { colspan: this.colCount(),
        text: snap ? "No runs to show." : "Waiting for the experiment…" })));
    }
    wanted.forEach((node, i) => {
      if (this.tbody.children[i] !== node) this.tbody.insertBefore(node, this.tbody.children[i] || null);
    });
    while (this.tbody.children.length > wanted.length) /** @type {Element} */ (this.tbody.lastElementChild).remove();
    this.host.onCounts();
  }

  /** @param {string[]} cols @param {boolean} device whether the Device column shows @param {boolean} pack the Pack column */
  renderHead(cols, device, pack) {
    const sort = this.host.sort;
    const colsKey = `${cols.join("\u0000")}\u0001${device}\u0001${pack}\u0001${this.metricCols.join("\u0000")}`;
    const key = `${colsKey}|${sort.key}|${sort.dir}`;
    if (key === this.headKey && this.theadRow.children.length) return;
    const colsChanged = this.headKey.split("|")[0] !== colsKey;
    this.headKey = key;
    const th = (/** @type {string} */ k, /** @type {string} */ t, /** @type {string} */ cls, /** @type {string} */ tip) => {
      const on = sort.key === k;
      return h("th", { class: cls, title: tip || null, "data-sort-key": k,
        "aria-sort": on ? (sort.dir === 1 ? "ascending" : "descending") : "none" },
      h("button", { type: "button", class: "rf-sort", onclick: () => this.host.onSort(k) }, t,
        h("span", { class: "rf-sort-mark", "aria-hidden": "true", text: on ? (sort.dir === 1 ? "▲" : "▼") : "" })));
    };
    this.theadRow.replaceChildren(
      th("run", "Run", "rf-col-run", "run id (and name)"), th("status", "Status", "rf-col-status", "status"),
      ...(device ? [th("device", "Device", "rf-col-device", "the device the run trains on (its worker process)")] : []),
      ...(pack ? [th("pack", "Pack", "rf-num rf-col-pack",
        "the pack the run trains in (its smallest run id): a pack's runs share one forward/backward per step; – alone")] : []),
      ...cols.map((c) => th(`hp:${c}`, shortHparam(c), "rf-num rf-col-hp", c)),
      ...tailCols(this.metricCols).map(([k, t, tip]) => th(k, t, `rf-num${k === "step" ? " rf-col-step" : ""}`, tip)),
      h("th", { class: "rf-col-actions" }));
    if (!colsChanged) return;
    for (const row of this.rows.values()) { row.tr.remove(); row.errorTr.remove(); row.formTr?.remove(); row.configTr?.remove(); }
    this.rows.clear(); // rebuilt with the new columns
  }

  /** @param {Run} run @param {string[]} cols @param {boolean} device @param {boolean} pack @returns {Row} */
  makeRow(run, cols, device, pack) {
    /** @type {Record<string, HTMLElement>} */ const cells = {};
    const td = (/** @type {string} */ name, /** @type {string} */ cls = "") => (cells[name] = h("td", { class: cls }));
    const tr = h("tr", { class: "rf-run-row" });
    tr.append(td("run", "rf-col-run"), td("status", "rf-col-status"),
      ...(device ? [td("device", "rf-col-device")] : []),
      ...(pack ? [td("pack", "rf-num rf-col-pack")] : []),
      ...cols.map((c) => td(`hp:${c}`, "rf-num rf-col-hp")),
      td("step", "rf-num rf-col-step"), td("chunks", "rf-num"), ...this.metricCols.map((m) => td(`m:${m}`, "rf-num")),
      td("samples", "rf-num"), td("actions", "rf-col-actions"));
    /** @type {Record<string, HTMLButtonElement>} */ const buttons = {};
    for (const op of OPS) {
      const icon = h("span", { class: "rf-op-icon", "aria-hidden": "true" });
      icon.innerHTML = OP_ICON[op];
      buttons[op] = /** @type {HTMLButtonElement} */ (h("button", { type: "button", class: `rf-btn rf-op rf-op-${op}`,
        "data-op": op, "data-run-id": run.run_id, "aria-label": `${OP_LABEL[op]} run ${run.run_id}`,
        onclick: () => {
          const cur = (this.state.snapshot?.runs || []).find((r) => r.run_id === run.run_id) || run;
          if (op === "clone") this.toggleCloneForm(cur); else this.ops.send(op, run.run_id);
        } }, icon, h("span", { class: "rf-op-label", text: OP_LABEL[op] })));
      cells.actions.append(buttons[op]);
    }
    const contIcon = h("span", { class: "rf-op-icon", "aria-hidden": "true" });
    contIcon.innerHTML = CONTINUE_ICON; // an icon like the other ops (a label only where the panel is wide): no overflow
    buttons.continue = /** @type {HTMLButtonElement} */ (h("button", { type: "button",
      class: "rf-btn rf-op rf-op-continue", "data-op": "continue", "data-run-id": run.run_id,
      "aria-label": `Continue run ${run.run_id}`,
      onclick: () => this.toggleCloneForm((this.state.snapshot?.runs || []).find((r) => r.run_id === run.run_id) || run,
        true) }, contIcon, h("span", { class: "rf-op-label", text: "Continue…" })));
    cells.actions.append(buttons.continue);
    const errorTr = h("tr", { class: "rf-error-row", "data-error-for": run.run_id }, h("td", { colspan: this.colCount() }));
    const stepText = h("span");
    const stepFill = h("span", { class: "rf-bar-fill" });
    cells.step.append(stepText, h("span", { class: "rf-bar" }, stepFill));
    return { tr, cells, buttons, errorTr, configTr: null, stepText, stepFill, runKey: "", statusKey: "", formTr: null };
  }

  /** @param {Row} row @param {Run} run @param {string[]} cols */
  updateRow(row, run, cols) {
    const { tr, cells } = row;
    const best = this.host.bestRunId === run.run_id;
    tr.dataset.runId = String(run.run_id);
    tr.dataset.status = run.status;
    tr.dataset.onDevice = String(!!run.on_device);
    tr.dataset.best = String(best);
    tr.classList.toggle("rf-deleted", run.status === "DELETED");
    tr.classList.toggle("rf-failed", run.status === "FAILED");
    tr.classList.toggle("rf-active", !!run.on_device);
    tr.classList.toggle("rf-best", best);
    this.updateIdentity(row, run, best);
    if (cells.device) {
      cells.device.dataset.rfDeviceCell = run.device || "";
      const sharded = run.device && run.sharding ? ` · ${run.sharding}` : "";  // a run over several devices
      setText(cells.device, run.device ? run.device + sharded : "–", run.device
        ? `run ${run.run_id} trains on ${run.device}${sharded ? ` (${run.sharding === "fsdp" ? "sharded with FSDP" : "data-parallel"})` : ""}`
        : "");
    }
    if (cells.pack) {
      const packed = typeof run.pack === "number";
      cells.pack.dataset.rfPackCell = packed ? String(run.pack) : "";
      setText(cells.pack, packed ? String(run.pack) : "–", packed
        ? `run ${run.run_id} trains in pack ${run.pack}: one forward/backward per step with the pack's other runs`
        : `run ${run.run_id} trains alone (time-sliced)`);
    }
    for (const c of cols) {
      const v = run.hparams ? run.hparams[c] : undefined;
      setText(cells[`hp:${c}`], fmtHparam(v), `${c} = ${typeof v === "string" ? v : JSON.stringify(v)}`);
    }
    const frac = run.total_steps ? Math.min(1, run.completed_steps / run.total_steps) : 0;
    const waiting = runMark(this.state.snapshot, run)?.key === "waiting"; // a warm clone not built: no budget yet
    setText(row.stepText, waiting ? "–" : `${fmtInt(run.completed_steps)}/${fmtInt(run.total_steps)}`);
    row.stepFill.style.width = `${(frac * 100).toFixed(1)}%`;
    cells.step.classList.toggle("rf-bar-failed", run.status === "FAILED");
    cells.step.classList.toggle("rf-bar-done", run.status === "COMPLETED");
    const nTotal = run.num_segments || this.state.snapshot?.num_chunks;
    const chunks = nTotal ? `${run.chunks_done}/${nTotal}` : String(run.chunks_done ?? "–");
    // why the chunks are not whole epochs' (a max_steps that ends inside one): a marker, the reason on hover
    setText(cells.chunks, run.chunks_note ? `${chunks} *` : chunks, run.chunks_note || "");
    cells.chunks.toggleAttribute("data-rf-chunks-note", !!run.chunks_note);
    for (const m of this.metricCols) {
      if (cells[`m:${m}`]) setText(cells[`m:${m}`], fmtMetric(run.metrics && m in run.metrics ? run.metrics[m] : run[m]));
    }
    setText(cells.samples, fmtInt(run.samples_seen));
    this.updateButtons(row, run);
    row.tr.toggleAttribute("data-pruned", isPruned(run));
    const note = noteOf(run);
    if (note) {
      const cell = /** @type {HTMLElement} */ (row.errorTr.firstElementChild);
      cell.setAttribute("colspan", String(this.colCount()));
      if (cell.textContent !== note.label + note.text) {
        setKids(cell, h("span", { class: "rf-error-label", text: note.label }),
          h("span", { class: "rf-error-text", text: note.text }));
      }
    }
    if (row.configTr) this.fillConfig(row.configTr, run);
  }

  /** Enabled where legal; a disabled button's tooltip says why. @param {Row} row @param {Run} run */
  updateButtons(row, run) {
    const legal = new Set(run.legal_ops || []);
    const hints = run.op_hints || {};
    const stopping = runMark(this.state.snapshot, run)?.key === "stopping";
    for (const op of OPS) {
      const pending = isPending(this.state, op, run.run_id);
      const b = row.buttons[op];
      b.disabled = !legal.has(op) || pending;
      const why = pending ? "waiting for the kernel's answer to your click"
        : !legal.has(op) ? (hints[op] || `not possible for a ${run.status} run`) : "";
      const what = op === "resume" && stopping ? "cancel the pending stop (it waits for the chunk boundary)" : OP_TITLE[op];
      const title = `${OP_LABEL[op]} run ${run.run_id}: ${why ? `unavailable — ${why}` : what}`;
      if (b.title !== title) b.title = title;
      b.classList.toggle("rf-pending", pending);
      b.classList.toggle("rf-open", op === "clone" && !!row.formTr);
    }
    const c = row.buttons.continue;
    const may = canContinue(run); // only where a run has ended and a clone of it is legal
    c.style.display = may ? "" : "none";
    c.disabled = !may || isPending(this.state, "clone", run.run_id); // hidden is not enough: never enabled if illegal
    const title = `Continue run ${run.run_id}: a new run from its final state (step ${run.completed_steps}), ` +
      "trained on to a larger max_steps with the schedule recomputed for it; run " + `${run.run_id} stays as it is`;
    if (c.title !== title) c.title = title;
  }

  /** The run and status cells (rebuilt only when they change). @param {Row} row @param {Run} run
   * @param {boolean} best */
  updateIdentity(row, run, best) {
    const runKey = `${run.parent_id}|${run.warm_start}|${best}|${!!row.configTr}|${runColor(run.run_id)}|` +
      `${run.run_name || ""}|${(run.tags || []).join("\u0000")}`;
    if (row.runKey !== runKey) {
      row.runKey = runKey;
      const origin = run.parent_id !== null && run.parent_id !== undefined
        ? h("span", { class: "rf-origin", title: run.warm_start ? "cloned with warm start" : "cloned from scratch",
          text: `↳ run ${run.parent_id}${run.warm_start ? " · warm" : ""}` }) : null;
      setKids(row.cells.run, h("span", { class: "rf-swatch", style: { background: runColor(run.run_id) } }),
        h("button", { type: "button", class: `rf-run-id rf-config-btn${row.configTr ? " rf-open" : ""}`,
          "data-config": run.run_id, title: `run ${run.run_id}: click for its full config`,
          "aria-expanded": String(!!row.configTr), text: `run ${run.run_id}`,
          onclick: () => this.toggleConfig(run.run_id) }),
        best ? h("span", { class: "rf-best-mark", title: `best ${this.host.bestMetric}`, text: "★" }) : null,
        runNameLabel(run), origin);
    }
    const mark = runMark(this.state.snapshot, run); // ✂ PRUNED, STOPPING…, a warm clone's wait
    const statusKey = `${run.status}|${!!run.on_device}|${run.device || ""}|${JSON.stringify(mark)}`;
    if (row.statusKey !== statusKey) {
      row.statusKey = statusKey;
      const badge = mark ? h("span", { class: `rf-badge rf-st-${mark.key}`, "data-badge": mark.key.toUpperCase(),
        title: mark.title, text: mark.text })
        : h("span", { class: `rf-badge rf-st-${run.status.toLowerCase()}`, "data-badge": run.status, text: run.status });
      setKids(row.cells.status, badge,
        mark?.why ? h("span", { class: "rf-mark-why", "data-rf-mark-why": mark.key, title: mark.title, text: mark.why })
          : null,
        run.on_device ? h("span", { class: "rf-badge rf-on-device", "data-badge": "on-device",
          text: run.device ? `on ${run.device}` : "on device" })
          : null);
    }
  }

  /** Show / hide a run's full config. @param {number} runId */
  toggleConfig(runId) {
    const row = this.rows.get(runId);
    if (!row) return;
    if (row.configTr) { row.configTr.remove(); row.configTr = null; } else {
      row.configTr = h("tr", { class: "rf-config-row", "data-config-for": runId }, h("td", { colspan: this.colCount() }));
    }
    row.runKey = "";
    this.render();
  }

  /** @param {HTMLElement} tr @param {Run} run */
  fillConfig(tr, run) {
    const all = { ...(run.editable || {}), ...(run.hparams || {}) };
    const key = JSON.stringify(all);
    if (tr.dataset.key === key) return;
    tr.dataset.key = key;
    const items = Object.keys(all).sort().map((k) => h("div", { class: "rf-config-item" },
      h("span", { class: "rf-config-key", text: k }),
      h("span", { class: "rf-config-val", text: typeof all[k] === "string" ? all[k] : JSON.stringify(all[k]) })));
    setKids(/** @type {HTMLElement} */ (tr.firstElementChild), h("div", { class: "rf-config" },
      ...(items.length ? items : [h("span", { text: "no hyperparameters recorded" })])));
  }

  /** The clone form of `run` (`cont`: as "Continue…", warm start on, max_steps ready). @param {Run} run
   * @param {boolean} [cont] */
  toggleCloneForm(run, cont = false) {
    const row = this.rows.get(run.run_id);
    if (!row) return;
    if (row.formTr) { row.formTr.remove(); row.formTr = null; this.render(); return; }
    const form = cloneForm(run, this.state, {
      submit: (changes, warm) => {
        this.ops.send("clone", run.run_id, changes, warm);
        row.formTr?.remove(); row.formTr = null;
        this.render();
      },
      cancel: () => this.toggleCloneForm(run),
    }, cont);
    row.formTr = h("tr", { class: "rf-form-row" }, h("td", { colspan: this.colCount() }, form));
    this.render();
    const first = cont ? 'input[name="max_steps"]' : "input[type=text]";
    /** @type {HTMLInputElement|null} */ (form.querySelector(first))?.focus();
  }

  reset() {
    this.headKey = "";
  }
}
