// The trainer kind's metrics in the panel (issue 37 item 2): default plots, table columns and the best run follow
// the snapshot's panel_metrics / metric_columns / best_by (rapidfire_nb.view.metrics_view); SFT's without them.
// Run with `node --test` by tests/rapidfire_nb/panel/test_widgets_js.py. No DOM.
import assert from "node:assert/strict";
import { test } from "node:test";

import { runsCsv } from "../../../widgets/export.js";
import { metricTitle } from "../../../widgets/format.js";
import { bestRun, latestValues, nextSort } from "../../../widgets/rank.js";
import { createState, kindMetrics, metricOrder, plotMetrics, reduce } from "../../../widgets/state.js";

function run(id, metrics, extra = {}) {
  return { run_id: id, status: "COMPLETED", on_device: false, hparams: {}, completed_steps: 2, total_steps: 2,
    chunks_done: 1, samples_seen: 8, loss: 0, eval_loss: 0, metrics, error: null, parent_id: null,
    warm_start: false, legal_ops: [], ...extra };
}

function grpoSnapshot() {
  return { experiment: "grpo", started_at: 1, progress: "", on_device: null, num_chunks: 1, hparam_columns: [],
    ops: [], metric_names: ["eval_loss", "eval_reward", "loss", "reward", "reward_std"],
    panel_metrics: ["reward", "eval_reward"], metric_columns: ["reward", "eval_reward"],
    best_by: { metric: "eval_reward", mode: "max" },
    runs: [run(1, { reward: 0.5, eval_reward: 0.25, loss: 0 }), run(2, { reward: 0.5, eval_reward: 0.75, loss: 0 }),
      run(3, { reward: 0.9, eval_reward: null, loss: 0 })] };
}

function stateWith(snap) {
  const state = createState();
  reduce(state, { type: "snapshot", snapshot: snap }, 0);
  return state;
}

test("a snapshot without kind metrics keeps SFT's losses", () => {
  assert.deepEqual(kindMetrics(null), { plots: ["loss", "eval_loss"], columns: ["loss", "eval_loss"], best: "eval_loss" });
  assert.deepEqual(plotMetrics(null, [null, null]), ["loss", "eval_loss"]);
  assert.deepEqual(metricOrder(createState()), ["loss", "eval_loss"]);
});

test("GRPO: reward plots, reward columns, best by eval reward highest first", () => {
  const snap = grpoSnapshot();
  const state = stateWith(snap);
  assert.equal(state.snapshot?.panel_metrics?.[0], "reward");
  assert.deepEqual(kindMetrics(snap), { plots: ["reward", "eval_reward"], columns: ["reward", "eval_reward"],
    best: "eval_reward" });
  assert.deepEqual(plotMetrics(snap, [null, null]), ["reward", "eval_reward"]);
  assert.deepEqual(plotMetrics(snap, [null, "kl"]), ["reward", "kl"]); // a plot the user picked stays
  assert.deepEqual(metricOrder(state).slice(0, 2), ["reward", "eval_reward"]);
  assert.equal(bestRun(state, "eval_reward"), 2); // highest, not run 1 on a tie of zeros
  assert.equal(bestRun(state, "reward"), 3);
  assert.deepEqual([...latestValues(state, "eval_reward")], [[1, 0.25], [2, 0.75]]); // run 3: no value (null)
  assert.deepEqual(nextSort({ key: "run", dir: 1 }, "m:eval_reward"), { key: "m:eval_reward", dir: -1 }); // best first
});

test("a kind metric the table shows wins over an older series point", () => {
  const state = stateWith(grpoSnapshot());
  reduce(state, { type: "points", points: { names: ["eval_reward"], run: [2], step: [1], samples: [4], name: [0],
    value: [0.1] } }, 0);
  assert.equal(latestValues(state, "eval_reward").get(2), 0.75);
});

test("DPO: one plot named, the second keeps SFT's default; titles read as words", () => {
  const snap = { ...grpoSnapshot(), panel_metrics: ["rewards/accuracies"], best_by: { metric: "rewards/accuracies", mode: "max" } };
  assert.deepEqual(plotMetrics(snap, [null, null]), ["rewards/accuracies", "eval_loss"]);
  assert.equal(kindMetrics(snap).best, "rewards/accuracies");
  assert.deepEqual(["loss", "eval_loss", "reward", "eval_rewards/accuracies"].map(metricTitle),
    ["Loss", "Eval loss", "Reward", "Eval rewards/accuracies"]);
});

test("the runs CSV carries the kind's metric columns", () => {
  const lines = runsCsv(stateWith(grpoSnapshot())).split("\r\n");
  assert.ok(lines[0].endsWith("loss,eval_loss,reward,eval_reward,error"), lines[0]);
  assert.ok(lines[2].endsWith(",0,0,0.5,0.75,"), lines[2]);
});
