// Unit tests of widgets/table.js's pure parts: which rows offer "Continue…" and the budget its form starts with.
import assert from "node:assert/strict";
import { test } from "node:test";

import { canContinue, continueBudget } from "../../../widgets/table.js";

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
