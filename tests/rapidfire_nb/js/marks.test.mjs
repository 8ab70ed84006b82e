// Unit tests of the run marks (issue 37): ✂ PRUNED apart from STOPPED (badge, header count, the reason inline, the
// curve's marker), STOPPING… while a stop waits for the chunk boundary (Resume's tooltip), a warm clone's wait.
import assert from "node:assert/strict";
import { test } from "node:test";

import "./_dom_shim.mjs";
import { pruneMarker } from "../../../widgets/curves.js";
import { createState, firstWords, reduce, runMark, statusCounts } from "../../../widgets/state.js";
import { RunTable } from "../../../widgets/table.js";

const REASON = "eval_loss 2.71 not in the best 2 of 4 at this rung (cutoff 2.43)";

function run(id, status, extra = {}) {
  return { run_id: id, status, on_device: false, hparams: {}, completed_steps: 4, total_steps: 8, chunks_done: 1,
    samples_seen: 0, loss: null, eval_loss: null, error: null, parent_id: null, warm_start: false,
    stop_reason: null, pruned: false, legal_ops: ["clone", "delete"], ...extra };
}

function stateWith(runs, ops = []) {
  const s = createState();
  reduce(s, { type: "snapshot", reset: true, snapshot: { experiment: "e", runs, hparam_columns: [], ops,
    metric_names: [] }, points: { names: [], run: [], step: [], samples: [], name: [], value: [] } }, 0);
  return s;
}

function table(s) {
  const t = new RunTable(s, { send() {} }, { showDeleted: false, sort: { key: "run", dir: 1 }, bestRunId: null,
    bestMetric: "loss", onSort() {}, onCounts() {} });
  t.render();
  return t;
}

const pruned = (id) => run(id, "STOPPED", { pruned: true, stop_reason: REASON });
const userStop = (id) => run(id, "STOPPED", { stop_reason: "stopped by the user (panel)" });

test("the header counts pruned runs apart from the user's stops", () => {
  const s = stateWith([pruned(1), pruned(2), userStop(3), run(4, "ONGOING")]);
  assert.deepEqual(statusCounts(s), { PRUNED: 2, STOPPED: 1, ONGOING: 1 });
});

test("a pruned row: a ✂ PRUNED badge, the reason's first words inline (all of it on hover), no reason row", () => {
  const s = stateWith([pruned(1), userStop(2)]);
  const t = table(s);
  const badge = t.rows.get(1).cells.status.querySelector("span[data-badge]");
  assert.equal(badge.textContent, "✂ PRUNED");
  assert.equal(badge.dataset.badge, "PRUNED");
  const why = t.rows.get(1).cells.status.querySelector("span[data-rf-mark-why]");
  assert.equal(why.textContent, "eval_loss 2.71 not in…");
  assert.ok(why.getAttribute("title").endsWith(REASON), why.getAttribute("title"));
  assert.ok("data-pruned" in t.rows.get(1).tr.attrs);
  assert.equal(t.rows.get(2).cells.status.querySelector("span[data-badge]").textContent, "STOPPED");
  assert.equal(t.rows.get(2).cells.status.querySelector("span[data-rf-mark-why]"), null);
  assert.equal(t.tbody.children.length, 2); // one row per run: no reason row pushes the next one down
});

test("a stop queued for the training run: STOPPING… until it applies, Resume says it cancels the stop", () => {
  const training = run(1, "ONGOING", { on_device: true, legal_ops: ["stop", "resume", "delete", "clone"] });
  const stop = { op_id: "a", run_id: 1, kind: "stop", state: "queued", message: "", requested_at: 1, applied_at: null };
  const s = stateWith([training], [stop]);
  const t = table(s);
  const row = t.rows.get(1);
  assert.equal(row.cells.status.querySelector("span[data-badge]").textContent, "STOPPING…");
  assert.match(row.buttons.resume.title, /^Resume run 1: cancel the pending stop/);
  assert.equal(row.buttons.resume.disabled, false);
  // applied: the run is STOPPED, the badge and the tooltip are the usual ones
  const after = stateWith([run(1, "STOPPED", { stop_reason: "stopped by the user (panel)",
    legal_ops: ["resume", "delete", "clone"] })], [{ ...stop, state: "applied" }]);
  const t2 = table(after);
  assert.equal(t2.rows.get(1).cells.status.querySelector("span[data-badge]").textContent, "STOPPED");
  assert.doesNotMatch(t2.rows.get(1).buttons.resume.title, /pending stop/);
});

test("a warm clone waiting for its parent's chunk boundary says so, not NEW", () => {
  const clone = run(3, "NEW", { parent_id: 1, warm_start: true, completed_steps: 0, total_steps: 0 });
  const op = { op_id: "c", run_id: 1, kind: "clone", state: "queued", message: "", requested_at: 1, applied_at: null };
  const s = stateWith([run(1, "ONGOING", { on_device: true }), clone], [op]);
  const mark = runMark(s.snapshot, clone);
  assert.equal(mark.key, "waiting");
  assert.match(mark.title, /waits for run 1's chunk boundary/);
  const t = table(s);
  const cell = t.rows.get(3).cells.status;
  assert.equal(t.rows.get(3).stepText.textContent, "–"); // not "0/0": its budget comes with its build
  assert.equal(cell.querySelector("span[data-badge]").textContent, "WAITING");
  assert.equal(cell.querySelector("span[data-rf-mark-why]").textContent, "for run 1");
  // built (its clone op applied): NEW as any other run; a cold clone never waits
  assert.equal(runMark({ ...s.snapshot, ops: [{ ...op, state: "applied" }] }, clone), null);
  assert.equal(runMark(s.snapshot, { ...clone, warm_start: false }), null);
});

test("first words and the curve's ✂ marker at a pruned run's last point", () => {
  assert.equal(firstWords("a b c d e", 4), "a b c d…");
  assert.equal(firstWords("a  b", 4), "a b");
  const c = { x: [1, 2, 3], y: [0.9, 0.8, 0.7], step: [10, 20, 30], samples: [], raw: [], joined: false };
  assert.deepEqual(pruneMarker(c, pruned(1)), { x: 3, y: 0.7, step: 30 });
  assert.equal(pruneMarker(c, userStop(1)), null);
  assert.equal(pruneMarker({ ...c, x: [], y: [], step: [] }, pruned(1)), null);
  assert.equal(pruneMarker(c, undefined), null);
});

test("'stop all but best k' sends its own reason with each stop, over the comm and in the server's inbox body", async () => {
  const { bulkStopReason } = await import("../../../widgets/rank.js");
  const { createOpSender, opBody } = await import("../../../widgets/ops.js");
  assert.equal(bulkStopReason(2, "eval_loss"), "stop all but best 2 by eval_loss");
  const sent = [];
  const sender = createOpSender({ send: (c) => sent.push(c) }, createState(), () => {});
  sender.send("stop", 3, {}, false, bulkStopReason(2, "eval_loss"));
  sender.send("stop", 4);
  sender.dispose();
  assert.equal(sent[0].reason, "stop all but best 2 by eval_loss");
  assert.equal("reason" in sent[1], false); // a plain click: the user's stop
  assert.equal(opBody(sent[0]).reason, "stop all but best 2 by eval_loss"); // the HTTP fallback keeps it
  assert.deepEqual(Object.keys(opBody(sent[1])).sort(), ["kind", "op_id", "run_id"]);
});
