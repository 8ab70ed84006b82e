// The run table's Chunks cell (widgets/table.js): a run whose chunks are not whole epochs' (the snapshot's
// chunks_note, rapidfire_nb/view/text.py) gets a * after its count and the note as the cell's title; others none.
import assert from "node:assert/strict";
import { test } from "node:test";

import "./_dom_shim.mjs";
import { createState, reduce } from "../../../widgets/state.js";
import { RunTable } from "../../../widgets/table.js";

const NOTE = "1 chunk in all, with 2 chunks per epoch: its step budget (4 steps: max_steps, or a fractional " +
  "num_train_epochs) ends in chunk 1/2 of epoch 1";

function run(id, extra = {}) {
  return { run_id: id, status: "ONGOING", on_device: false, hparams: {}, completed_steps: 0, total_steps: 4,
    chunks_done: 0, num_segments: 1, samples_seen: 0, loss: null, eval_loss: null, error: null, parent_id: null,
    warm_start: false, legal_ops: [], ...extra };
}

function table(runs) {
  const s = createState();
  reduce(s, { type: "snapshot", reset: true, snapshot: { experiment: "e", runs, hparam_columns: [], ops: [],
    metric_names: [], num_chunks: 2 }, points: { names: [], run: [], step: [], samples: [], name: [], value: [] } }, 0);
  const t = new RunTable(s, { send() {} }, { showDeleted: false, sort: { key: "run", dir: 1 }, bestRunId: null,
    bestMetric: "loss", onSort() {}, onCounts() {} });
  t.render();
  return { s, t };
}

test("a run with a chunks_note: '0/1 *', the note as the title, the data-rf-chunks-note hook", () => {
  const { t } = table([run(1, { chunks_note: NOTE }), run(2, { num_segments: 2, chunks_note: null })]);
  const [one, two] = [t.rows.get(1).cells.chunks, t.rows.get(2).cells.chunks];
  assert.equal(one.textContent, "0/1 *");
  assert.equal(one.title, NOTE);
  assert.ok("data-rf-chunks-note" in one.attrs);
  assert.equal(two.textContent, "0/2"); // whole epochs' chunks: no marker, no title
  assert.equal(two.title, "");
  assert.ok(!("data-rf-chunks-note" in two.attrs));
});

test("the marker follows the snapshot: a note that goes away takes the * and the title with it", () => {
  const { s, t } = table([run(1, { chunks_note: NOTE })]);
  reduce(s, { type: "update", snapshot: { experiment: "e", runs: [run(1, { num_segments: 2, chunks_done: 1 })],
    hparam_columns: [], ops: [], metric_names: [], num_chunks: 2 }, points: null }, 1);
  t.render();
  const cell = t.rows.get(1).cells.chunks;
  assert.equal(cell.textContent, "1/2");
  assert.equal(cell.title, "");
  assert.ok(!("data-rf-chunks-note" in cell.attrs));
});
