// @ts-check
/**
 * The clone form of a run (and "Continue…", the same form with warm start on and the budget first): its editable
 * fields with the hyperparameters that differ between the runs first (the table's columns, then any other field
 * whose value is not the same in every run), the rest collapsed under "N more fields"; only changed fields are
 * sent. `cloneFieldOrder`, `canContinue` and `continueBudget` are pure (node-tested in table.test.mjs).
 *
 * Test hooks: form[data-clone-form], details[data-rf-more-fields], [data-clone-warning].
 */

import { h } from "./dom.js";
import { fmtHparam, parseValue, runColor } from "./format.js";
import { duplicateConfig } from "./rank.js";

/**
 * @typedef {import("./state.js").State} State
 * @typedef {import("./state.js").Run} Run
 */

/**
 * The clone form's fields in order: `first` the hyperparameters that differ between the runs shown (DELETED ones
 * left out), in the table's column order then by name; `rest` the other fields by name. When no field differs
 * (one run, or a sweep of one config), every field is in `first`.
 * @param {Run} run @param {State} state @returns {{first: string[], rest: string[]}}
 */
export function cloneFieldOrder(run, state) {
  const fields = Object.keys(run.editable || run.hparams || {});
  const runs = (state.snapshot?.runs || []).filter((r) => r.status !== "DELETED");
  const valuesOf = (/** @type {string} */ k) => new Set(runs.map((r) => JSON.stringify((r.editable || r.hparams || {})[k])));
  const cols = state.snapshot?.hparam_columns || [];
  const differs = new Set(fields.filter((k) => cols.includes(k) || valuesOf(k).size > 1));
  const rank = (/** @type {string} */ k) => (cols.includes(k) ? cols.indexOf(k) : cols.length);
  const first = fields.filter((k) => differs.has(k)).sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
  const rest = fields.filter((k) => !differs.has(k)).sort();
  return first.length ? { first, rest } : { first: rest, rest: [] };
}

/**
 * The clone form of a run: its hyperparameters (only changed fields are sent), other fields as field=value,
 * warm start; a clone that would repeat an existing run's config asks for a second click. As "Continue…"
 * (`cont`): warm start on and the budget, `max_steps`, filled in with {@link continueBudget} and first.
 * @param {Run} run @param {State} state
 * @param {{submit: (changes: Record<string, any>, warm: boolean) => void, cancel: () => void}} on
 * @param {boolean} [cont]
 * @returns {HTMLElement}
 */
export function cloneForm(run, state, on, cont = false) {
  const inputs = /** @type {Record<string, HTMLInputElement>} */ ({});
  const values = run.editable || run.hparams || {};
  const field = (/** @type {string} */ k) => {
    const v = values[k];
    inputs[k] = /** @type {HTMLInputElement} */ (h("input", { type: "text", name: k,
      value: typeof v === "string" ? v : fmtHparam(v), spellcheck: "false" }));
    return h("label", { class: "rf-field", title: k }, h("span", { text: k }), inputs[k]);
  };
  const order = cloneFieldOrder(run, state);
  const fields = h("div", { class: "rf-form-grid" }, ...order.first.map(field));
  const more = order.rest.length ? h("details", { class: "rf-form-more", "data-rf-more-fields": "" },
    h("summary", { text: `${order.rest.length} more field${order.rest.length === 1 ? "" : "s"} (the same in every run)` }),
    h("div", { class: "rf-form-grid" }, ...order.rest.map(field))) : null;
  const extra = /** @type {HTMLInputElement} */ (h("input", { type: "text", name: "__extra", spellcheck: "false",
    placeholder: "field=value, e.g. lora.lora_dropout=0.1; max_steps=50" }));
  const warm = /** @type {HTMLInputElement} */ (h("input", { type: "checkbox", name: "warm_start", checked: cont }));
  const budget = cont ? continueBudget(run) : null;
  if (budget) {
    const hint = budget.perEpoch ? ` (${budget.perEpoch} steps an epoch)` : "";
    inputs.max_steps?.closest("label")?.remove(); // the run's own max_steps field: shown first, as the budget
    inputs.max_steps = /** @type {HTMLInputElement} */ (h("input", { type: "text", name: "max_steps",
      value: String(budget.value), spellcheck: "false" }));
    fields.prepend(h("label", { class: "rf-field", title: `total optimizer steps, run ${run.run_id}'s ` +
      `${budget.done} included; more than ${budget.done}${hint}` }, h("span", { text: `max_steps (> ${budget.done})` }),
    inputs.max_steps));
  }
  const error = h("span", { class: "rf-form-error", "data-clone-warning": "" });
  const submitBtn = h("button", { type: "submit", class: "rf-btn rf-btn-primary", "data-op": "clone-submit", text: "Submit" });
  let confirmed = "";
  const changesOf = () => {
    /** @type {Record<string, any>} */ const changes = {};
    const base = run.editable || run.hparams || {};
    for (const [k, input] of Object.entries(inputs)) {
      const orig = base[k];
      if (input.value.trim() === (typeof orig === "string" ? orig : fmtHparam(orig))) continue;
      const val = parseValue(input.value, orig);
      if (JSON.stringify(val) !== JSON.stringify(orig)) changes[k] = val;
    }
    for (const part of extra.value.split(/\s*[;\n]\s*|,\s*(?=[\w.\-/]+\s*=)/).filter((s) => s.trim())) {
      const eq = part.indexOf("=");
      if (eq <= 0) throw new Error(`"${part}" is not field=value`);
      const k = part.slice(0, eq).trim();
      changes[k] = parseValue(part.slice(eq + 1), base[k]);
    }
    return changes;
  };
  const submit = () => {
    let changes;
    try { changes = changesOf(); } catch (e) { error.textContent = /** @type {any} */ (e).message; return; }
    const twin = duplicateConfig(state, run, changes);
    const key = JSON.stringify([changes, warm.checked]);
    if (twin !== null && confirmed !== key) {
      confirmed = key;
      error.textContent = `same config as run ${twin}${warm.checked ? " (a warm start differs only in its start)" : ""}` +
        " — change a field, or submit again to clone anyway";
      submitBtn.textContent = "Clone anyway";
      return;
    }
    on.submit(changes, warm.checked);
  };
  return h("form", { class: "rf-form", "data-clone-form": run.run_id,
    onsubmit: (/** @type {Event} */ e) => { e.preventDefault(); submit(); } },
  h("div", { class: "rf-form-title" },
    h("span", { class: "rf-swatch", style: { background: runColor(run.run_id) } }),
    h("span", { text: cont ? `Continue run ${run.run_id} — a new run from its final state, trained on to max_steps ` +
      "(the LR schedule is recomputed for the new total)" :
      `Clone run ${run.run_id} — edit hyperparameters (only changed fields are sent)` })),
  fields, more,
  h("label", { class: "rf-field rf-field-wide" }, h("span", { text: "other fields" }), extra),
  h("div", { class: "rf-form-actions" },
    h("label", { class: "rf-check", title: "Start from this run's latest chunk boundary instead of from scratch" },
      warm, h("span", { text: `warm start (from run ${run.run_id}'s latest chunk boundary)` })),
    error,
    h("span", { class: "rf-spacer" }),
    h("button", { type: "button", class: "rf-btn", text: "Cancel", onclick: on.cancel }),
    submitBtn));
}

/** Whether `run` can be continued ("Continue…"): it ended (COMPLETED, or STOPPED with its state kept) after at
 * least one step, and a clone of it is legal. @param {Run} run @returns {boolean} */
export function canContinue(run) {
  return (run.status === "COMPLETED" || run.status === "STOPPED") && run.completed_steps > 0 &&
    (run.legal_ops || []).includes("clone");
}

/**
 * The budget a "Continue…" form starts with: a COMPLETED run twice its steps, a STOPPED one its own total (the
 * run it would have been), never at or under the steps done (the kernel refuses those); `perEpoch` is the steps
 * of one epoch when the run's epoch is known (for "more epochs": max_steps = epochs x perEpoch), else 0.
 * @param {Run} run @returns {{value: number, done: number, perEpoch: number}}
 */
export function continueBudget(run) {
  const done = run.completed_steps || 0;
  const value = run.status === "STOPPED" && run.total_steps > done ? run.total_steps : Math.max(2 * done, done + 1);
  const perEpoch = run.epoch && run.epoch > 0 ? Math.round(done / run.epoch) : 0;
  return { value, done, perEpoch };
}
