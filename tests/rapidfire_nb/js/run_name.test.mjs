// widgets/table.js's Run cell with run names: the name under the id (the whole name and the tags in its title), none
// for a run without a name, the fixed-width mark on the table as soon as any run is named, and a renamed run redrawn.
import assert from "node:assert/strict";
import { test } from "node:test";

import "./_dom_shim.mjs";
import { parcoordsData } from "../../../widgets/compare.js";
import { createState, reduce } from "../../../widgets/state.js";
import { RunTable, runNameLabel } from "../../../widgets/table.js";

function run(id, extra = {}) {
  return { run_id: id, status: "ONGOING", on_device: false, hparams: {}, completed_steps: 1, total_steps: 4,
    chunks_done: 1, samples_seen: 0, loss: null, eval_loss: null, error: null, parent_id: null, warm_start: false,
    legal_ops: [], ...extra };
}

function table(runs) {
  const s = createState();
  reduce(s, { type: "snapshot", reset: true, snapshot: { experiment: "e", runs, hparam_columns: [], ops: [],
    metric_names: [] }, points: { names: [], run: [], step: [], samples: [], name: [], value: [] } }, 0);
  const t = new RunTable(s, { send() {} }, { showDeleted: false, sort: { key: "run", dir: 1 }, bestRunId: null,
    bestMetric: "loss", onSort() {}, onCounts() {} });
  t.render();
  return { s, t };
}

const nameSpan = (t, id) => t.rows.get(id).cells.run.querySelector("span[data-rf-run-name]");

test("a named run shows its name under the id, whole in the title with its tags; an unnamed run its id alone", () => {
  const long = "lr1e-04-r8 with a name far longer than the Run column is wide";
  const { t } = table([run(1, { run_name: long, tags: ["sweep", "lora"] }), run(2),
    run(3, { run_name: `${long} (clone)`, tags: [], parent_id: 1 })]);
  const one = nameSpan(t, 1);
  assert.equal(one.textContent, long);
  assert.equal(one.className, "rf-run-name");
  assert.equal(one.attrs.title, `run 1: ${long}\ntags: sweep, lora`);
  assert.equal(nameSpan(t, 2), null);
  assert.equal(t.rows.get(2).cells.run.textContent.includes("run 2"), true);
  assert.equal(nameSpan(t, 3).attrs.title, `run 3: ${long} (clone)`);
  const kids = t.rows.get(3).cells.run.children.map((c) => c.className);
  assert.deepEqual(kids, ["rf-swatch", "rf-run-id rf-config-btn", "rf-run-name", "rf-origin"]); // id, name, origin
  assert.equal(t.table.classList.contains("rf-named"), true); // the Run column's fixed width
});

test("no named run: no name line and no fixed-width mark; a run renamed by a later snapshot is redrawn", () => {
  const { s, t } = table([run(1), run(2)]);
  assert.equal(t.table.classList.contains("rf-named"), false);
  assert.equal(nameSpan(t, 1), null);
  s.snapshot.runs[0] = { ...s.snapshot.runs[0], run_name: "base" };
  t.render();
  assert.equal(nameSpan(t, 1).textContent, "base");
  assert.equal(t.table.classList.contains("rf-named"), true);
  assert.equal(runNameLabel(run(4, { run_name: "" })), null);
});

test("Compare runs: the hover line names a named run next to its id", () => {
  const runs = [run(1, { run_name: "base <b>", status: "COMPLETED", eval_loss: 2, hparams: { learning_rate: 1e-4 } }),
    run(2, { status: "COMPLETED", eval_loss: 3, hparams: { learning_rate: 2e-4 } })];
  const { hover } = parcoordsData({ series: new Map(), snapshot: { hparam_columns: ["learning_rate"], runs } },
    "eval_loss", 1);
  assert.equal(hover[0], "run 1 (base <b>) ★ best · lr 1e-4 · eval_loss 2"); // shown as text, never as markup
  assert.equal(hover[1], "run 2 · lr 2e-4 · eval_loss 3");
});
