// Unit tests of widgets/rank.js (sorting, best run, stop all but the best k, duplicate configs).
import assert from "node:assert/strict";
import { test } from "node:test";

import { bestRun, duplicateConfig, latestValues, nextSort, sortRuns, stopAllButBest } from "../../../widgets/rank.js";
import { createState, reduce } from "../../../widgets/state.js";

function run(id, status, extra = {}) {
  return { run_id: id, status, on_device: false, hparams: {}, completed_steps: 0, total_steps: 10, chunks_done: 0,
    samples_seen: 0, loss: null, eval_loss: null, error: null, parent_id: null, warm_start: false,
    legal_ops: [], ...extra };
}

function stateWith(runs, pts = []) {
  const s = createState();
  const names = [...new Set(pts.map((p) => p[3]))];
  reduce(s, { type: "snapshot", reset: true, snapshot: { experiment: "e", runs, hparam_columns: ["lr"], ops: [],
    metric_names: [] }, points: { names, run: pts.map((p) => p[0]), step: pts.map((p) => p[1]),
    samples: pts.map(() => 0), name: pts.map((p) => names.indexOf(p[3])), value: pts.map((p) => p[2]) } }, 0);
  return s;
}

test("sort by any column; missing values last in both directions; ties by run id", () => {
  const runs = [run(1, "ONGOING", { eval_loss: 0.9, hparams: { lr: 1e-3 } }),
    run(2, "COMPLETED", { eval_loss: null, hparams: { lr: 1e-4 } }),
    run(3, "STOPPED", { eval_loss: 0.5, hparams: { lr: 5e-4 } })];
  const ids = (sort) => sortRuns(runs, sort).map((r) => r.run_id);
  assert.deepEqual(ids({ key: "eval_loss", dir: 1 }), [3, 1, 2]);
  assert.deepEqual(ids({ key: "eval_loss", dir: -1 }), [1, 3, 2]);
  assert.deepEqual(ids({ key: "hp:lr", dir: 1 }), [2, 3, 1]);
  assert.deepEqual(ids({ key: "status", dir: 1 }), [2, 1, 3]);
  assert.deepEqual(nextSort({ key: "run", dir: 1 }, "loss"), { key: "loss", dir: 1 });
  assert.deepEqual(nextSort({ key: "loss", dir: 1 }, "loss"), { key: "loss", dir: -1 });
  assert.deepEqual(nextSort({ key: "run", dir: 1 }, "m:eval_accuracy"), { key: "m:eval_accuracy", dir: -1 });
});

test("the best run for a metric: lowest loss, highest accuracy, latest finite value", () => {
  const s = stateWith([run(1, "ONGOING", { eval_loss: 0.9 }), run(2, "ONGOING", { eval_loss: 0.7 }),
    run(3, "DELETED", { eval_loss: 0.1 })],
  [[1, 1, 0.4, "accuracy"], [2, 1, 0.6, "accuracy"], [1, 2, NaN, "accuracy"]]);
  assert.equal(latestValues(s, "eval_loss").get(1), 0.9);
  assert.equal(latestValues(s, "accuracy").get(1), 0.4); // the NaN at step 2 is skipped
  assert.equal(bestRun(s, "eval_loss"), 2); // run 3 is deleted
  assert.equal(bestRun(s, "accuracy"), 2);
  assert.equal(bestRun(s, "reward"), null);
  // a FAILED run's last values are not a result: never the best (the store's best_run says the same)
  const f = stateWith([run(1, "COMPLETED", { eval_loss: 0.9 }), run(2, "FAILED", { eval_loss: 0.2 })]);
  assert.equal(bestRun(f, "eval_loss"), 1);
});

test("the best run by loss/eval_loss is the one the table shows best: points the snapshot has not caught up with do not count", () => {
  // CI caught the star on a warm clone whose Eval loss cell still said "–": its first eval point had arrived in
  // the series before the next snapshot
  const s = stateWith([run(1, "ONGOING", { eval_loss: 0.96 }), run(5, "ONGOING", { eval_loss: null }),
    run(6, "ONGOING", { eval_loss: NaN })],
  [[1, 4, 0.96, "eval_loss"], [5, 5, 0.5, "eval_loss"], [6, 3, 0.1, "eval_loss"]]);
  assert.deepEqual([...latestValues(s, "eval_loss").keys()], [1]);
  assert.equal(bestRun(s, "eval_loss"), 1);
  assert.deepEqual(stopAllButBest(s, "eval_loss", 1), { stop: [], keep: [1], unranked: [5, 6] });
  assert.deepEqual(sortRuns(s.snapshot.runs, { key: "eval_loss", dir: 1 }).map((r) => r.run_id), [1, 5, 6]);
});

test("stop all but the best k: only runs still training, one op per run, unranked runs left alone", () => {
  const s = stateWith([run(1, "ONGOING", { eval_loss: 0.5 }), run(2, "NEW", { eval_loss: 0.9 }),
    run(3, "ONGOING", { eval_loss: 0.7 }), run(4, "COMPLETED", { eval_loss: 0.1 }), run(5, "NEW")]);
  assert.deepEqual(stopAllButBest(s, "eval_loss", 1), { stop: [3, 2], keep: [1], unranked: [5] });
  assert.deepEqual(stopAllButBest(s, "eval_loss", 5).stop, []);
});

test("a clone that repeats an existing run's config is found", () => {
  const a = run(1, "ONGOING", { editable: { lr: 1e-3, r: 8 } });
  const b = run(2, "ONGOING", { editable: { lr: 5e-4, r: 8 } });
  const s = stateWith([a, b]);
  assert.equal(duplicateConfig(s, a, { lr: 5e-4 }), 2);
  assert.equal(duplicateConfig(s, a, {}), 1); // a clone without changes repeats its parent
  assert.equal(duplicateConfig(s, a, { lr: 2e-4 }), null);
});

test("the Device column sorts by device name, runs without one last", () => {
  const runs = [{ run_id: 1, device: "cpu:1" }, { run_id: 2, device: null }, { run_id: 3, device: "cpu:0" }];
  assert.deepEqual(sortRuns(runs, { key: "device", dir: 1 }).map((r) => r.run_id), [3, 1, 2]);
  assert.deepEqual(sortRuns(runs, { key: "device", dir: -1 }).map((r) => r.run_id), [1, 3, 2]);
});
