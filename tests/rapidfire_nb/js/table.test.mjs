// Unit tests of widgets/table.js's pure parts: which rows offer "Continue…" and the budget its form starts with.
import assert from "node:assert/strict";
import { test } from "node:test";

import "./_dom_shim.mjs";
import { createState, reduce } from "../../../widgets/state.js";
import { canContinue, cloneFieldOrder, continueBudget } from "../../../widgets/clone_form.js";
import { sortValue } from "../../../widgets/rank.js";
import { RunTable } from "../../../widgets/table.js";

function run(status, done, total, extra = {}) {
  return { run_id: 1, status, on_device: false, hparams: {}, completed_steps: done, total_steps: total,
    chunks_done: 1, samples_seen: 0, loss: null, eval_loss: null, error: null, parent_id: null, warm_start: false,
    legal_ops: ["clone", "delete"], ...extra };
}

test("Continue… is offered on COMPLETED and STOPPED runs that trained and may be cloned, nowhere else", () => {
  assert.equal(canContinue(run("COMPLETED", 3, 3)), true);
  assert.equal(canContinue(run("STOPPED", 4, 8)), true);
  for (const status of ["NEW", "ONGOING", "FAILED", "DELETED", "INTERRUPTED"]) {
    assert.equal(canContinue(run(status, 3, 8)), false, status);
  }
  assert.equal(canContinue(run("STOPPED", 0, 8)), false); // nothing trained: nothing to continue from
  assert.equal(canContinue(run("COMPLETED", 3, 3, { legal_ops: ["delete"] })), false);
});

test("the budget: twice a completed run's steps, a stopped run's own total, always above the steps done", () => {
  assert.deepEqual(continueBudget(run("COMPLETED", 3, 3, { epoch: 0.375 })), { value: 6, done: 3, perEpoch: 8 });
  assert.deepEqual(continueBudget(run("STOPPED", 4, 8, { epoch: 0.5 })), { value: 8, done: 4, perEpoch: 8 });
  assert.deepEqual(continueBudget(run("STOPPED", 8, 8)), { value: 16, done: 8, perEpoch: 0 });
  assert.deepEqual(continueBudget(run("COMPLETED", 1, 1, { epoch: 0 })), { value: 2, done: 1, perEpoch: 0 });
});

test("Continue… on a COMPLETED row: the clone form with warm start on, max_steps first, filled in, focused", () => {
  const s = createState();
  const hp = { learning_rate: 0.002, max_steps: 3 };
  const runs = [run("COMPLETED", 3, 3, { hparams: hp, editable: hp, epoch: 0.375 }),
    run("ONGOING", 2, 8, { run_id: 2, hparams: hp, editable: hp, legal_ops: ["stop", "delete", "clone"] })];
  reduce(s, { type: "snapshot", reset: true, snapshot: { experiment: "e", runs, hparam_columns: ["learning_rate"],
    ops: [], metric_names: [] }, points: { names: [], run: [], step: [], samples: [], name: [], value: [] } }, 0);
  const sent = [];
  const table = new RunTable(s, { send: (...a) => sent.push(a) }, { showDeleted: false, sort: { key: "run", dir: 1 },
    bestRunId: null, bestMetric: "loss", onSort() {}, onCounts() {} });
  table.render();
  const [one, two] = [table.rows.get(1), table.rows.get(2)];
  assert.equal(one.buttons.continue.style.display, "");
  assert.equal(two.buttons.continue.style.display, "none"); // a training run is not continued: it trains on
  one.buttons.continue.click();
  const form = one.formTr.querySelector("form");
  const budget = form.querySelectorAll('input[name="max_steps"]');
  assert.equal(budget.length, 1); // the run's own max_steps field became the budget, not a second one
  assert.equal(budget[0].value, "6");
  assert.equal(globalThis.focused, budget[0]);
  assert.equal(form.querySelector('input[name="warm_start"]').checked, true);
  form.listeners.submit[0]({ preventDefault() {} });
  assert.deepEqual(sent, [["clone", 1, { max_steps: 6 }, true]]);
  two.buttons.clone.click(); // the plain clone form is as before: cold, the run's own max_steps
  const plain = two.formTr.querySelector("form");
  assert.equal(plain.querySelector('input[name="warm_start"]').checked, false);
  assert.equal(plain.querySelector('input[name="max_steps"]').value, "3");
});

test("the clone form: the hyperparameters that differ between runs first, the rest collapsed", () => {
  const fields = (lr, r) => ({ learning_rate: lr, "lora.r": r, "lora.lora_alpha": 16, max_steps: 8, seed: 42,
    "lora.target_modules": ["q_proj", "v_proj"], warmup_ratio: 0 });
  const runs = [run("ONGOING", 2, 8, { editable: fields(1e-4, 8) }),
    run("ONGOING", 2, 8, { run_id: 2, editable: fields(2e-4, 8) }),
    run("DELETED", 2, 8, { run_id: 3, editable: { ...fields(1e-4, 8), seed: 7 } })];
  const state = { snapshot: { runs, hparam_columns: ["lora.r", "learning_rate"] } };
  // lora.r is a table column (it differs in the sweep as planned); learning_rate differs; a DELETED run's seed does not count
  assert.deepEqual(cloneFieldOrder(runs[0], state), { first: ["lora.r", "learning_rate"],
    rest: ["lora.lora_alpha", "lora.target_modules", "max_steps", "seed", "warmup_ratio"] });
  const other = { snapshot: { runs, hparam_columns: [] } };
  assert.deepEqual(cloneFieldOrder(runs[0], other).first, ["learning_rate"]);
  const one = { snapshot: { runs: [runs[0]], hparam_columns: [] } }; // nothing differs: every field shown
  assert.deepEqual(cloneFieldOrder(runs[0], one), { first: Object.keys(fields(0, 0)).sort(), rest: [] });
});

test("the clone form's DOM: the differing fields in the grid, the others in a closed 'more fields' section", () => {
  const s = createState();
  const hp = (lr) => ({ learning_rate: lr, max_steps: 3, seed: 1 });
  const runs = [run("ONGOING", 1, 3, { hparams: hp(0.001), editable: hp(0.001), legal_ops: ["clone"] }),
    run("ONGOING", 1, 3, { run_id: 2, hparams: hp(0.002), editable: hp(0.002), legal_ops: ["clone"] })];
  reduce(s, { type: "snapshot", reset: true, snapshot: { experiment: "e", runs, hparam_columns: ["learning_rate"],
    ops: [], metric_names: [] }, points: { names: [], run: [], step: [], samples: [], name: [], value: [] } }, 0);
  const table = new RunTable(s, { send() {} }, { showDeleted: false, sort: { key: "run", dir: 1 },
    bestRunId: null, bestMetric: "loss", onSort() {}, onCounts() {} });
  table.render();
  table.rows.get(1).buttons.clone.click();
  const form = table.rows.get(1).formTr.querySelector("form");
  const more = form.querySelector("details[data-rf-more-fields]");
  assert.ok(more && !more.open);
  assert.deepEqual(more.querySelectorAll("input").map((i) => i.getAttribute("name")), ["max_steps", "seed"]);
  assert.equal(form.querySelectorAll("input")[0].getAttribute("name"), "learning_rate"); // the first field
});

test("the Pack column: only when some run trains packed; the pack's id, '–' for a run alone; sortable", () => {
  const make = (runs) => {
    const s = createState();
    reduce(s, { type: "snapshot", reset: true, snapshot: { experiment: "e", runs, hparam_columns: [], ops: [],
      metric_names: [] }, points: { names: [], run: [], step: [], samples: [], name: [], value: [] } }, 0);
    const table = new RunTable(s, { send() {} }, { showDeleted: false, sort: { key: "run", dir: 1 },
      bestRunId: null, bestMetric: "loss", onSort() {}, onCounts() {} });
    table.render();
    return table;
  };
  const plain = make([run("ONGOING", 1, 4), run("ONGOING", 1, 4, { run_id: 2 })]);
  assert.equal(plain.rows.get(1).cells.pack, undefined); // nobody packed: no column
  assert.equal(plain.colCount(), 6 + 2); // run, status, step, chunks, samples, actions + loss, eval_loss
  const packed = make([run("ONGOING", 1, 4, { pack: 1 }), run("ONGOING", 1, 4, { run_id: 2, pack: 1 }),
    run("ONGOING", 1, 4, { run_id: 3, pack: null })]);
  assert.equal(packed.colCount(), 6 + 2 + 1);
  const heads = [...packed.theadRow.children].map((th) => th.getAttribute("data-sort-key"));
  assert.deepEqual(heads.slice(0, 3), ["run", "status", "pack"]);
  const cell = (id) => packed.rows.get(id).cells.pack;
  assert.equal(cell(2).textContent, "1");
  assert.equal(cell(2).dataset.rfPackCell, "1");
  assert.equal(cell(3).textContent, "–");
  assert.equal(cell(3).dataset.rfPackCell, "");
  assert.equal(sortValue(run("ONGOING", 1, 4, { pack: 5 }), "pack"), 5);
  assert.equal(sortValue(run("ONGOING", 1, 4), "pack"), null);
});
