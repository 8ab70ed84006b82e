// Unit tests of widgets/curves.js (TensorBoard-like curve data), run with `node --test` by test_widgets_js.py.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  curve, duplicateCurves, integerDtick, metricDirection, parentSeries, quantile, scaleCue, sharedXRange, smooth, yScale,
} from "../../../widgets/curves.js";

const series = (steps, values, wall) => ({ step: steps, samples: steps.map((s) => s * 4), value: values,
  wall: wall || steps.map(() => null) });

test("smoothing is TensorBoard's debiased EMA; 0 leaves the values; gaps stay gaps", () => {
  assert.deepEqual(smooth([1, 2, 3], 0), [1, 2, 3]);
  const out = smooth([2, 4], 0.5);
  assert.equal(out[0], 2); // debiased: the first point is itself, not pulled towards 0
  assert.equal(out[1], (0.5 * (0.5 * 2) + 0.5 * 4) / (1 - 0.25));
  assert.deepEqual(smooth([1, null, 1], 0.9), [1, null, 1]);
});

test("a warm clone's curve starts at its parent's point at the branch step", () => {
  const parent = series([1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1]);
  const clone = series([5, 6], [2.5, 2.2]);
  const c = curve(clone, { xAxis: "step", parent });
  assert.deepEqual(c.x, [4, 5, 6]);
  assert.deepEqual(c.raw, [3, 2.5, 2.2]);
  assert.equal(c.joined, true);
  const run = { run_id: 2, warm_start: true, parent_id: 1 };
  const byRun = new Map([[1, parent], [2, clone]]);
  assert.equal(parentSeries(run, byRun), parent);
  assert.equal(parentSeries({ ...run, warm_start: false }, byRun), null); // a cold clone starts from scratch
  assert.equal(curve(clone, { xAxis: "step" }).joined, false);
});

test("x axes: step, samples, wall time (ms); log scale drops values <= 0; NaN never plotted", () => {
  const s = series([1, 2, 3], [0, 0.5, NaN], [100, 101, 102]);
  assert.deepEqual(curve(s, { xAxis: "samples" }).x, [4, 8]);
  assert.deepEqual(curve(s, { xAxis: "wall" }).x, [100000, 101000]);
  assert.deepEqual(curve(s, { xAxis: "step", log: true }).x, [2]);
});

test("identical curves are found (the later run is drawn dashed)", () => {
  const a = curve(series([1, 2], [1, 2]), { xAxis: "step" });
  const b = curve(series([1, 2], [1, 2]), { xAxis: "step" });
  const c = curve(series([1, 2], [1, 3]), { xAxis: "step" });
  assert.deepEqual([...duplicateCurves(new Map([[3, b], [1, a], [2, c]]))], [[3, 1]]);
});

test("whole-number ticks on count axes; metric directions", () => {
  assert.equal(integerDtick(1, 4), 1); // never 0.5 steps
  assert.equal(integerDtick(0, 100), 20);
  assert.equal(integerDtick(0, 12345), 5000);
  assert.equal(integerDtick(3, 3), 1);
  assert.equal(metricDirection("eval_loss"), "min");
  assert.equal(metricDirection("eval_mean_token_accuracy"), "max");
  assert.equal(metricDirection("rewards/margins"), "max");
  assert.equal(metricDirection("grad_norm"), "min");
});

test("auto y scale: log when the values span more than 10× (DPO ipo ≈ 25 beside sigmoid ≈ 0.7); the user's wins", () => {
  const sigmoid = [0.69, 0.65, 0.6], ipo = [25, 24, 22];
  const auto = yScale([sigmoid, sigmoid, sigmoid, ipo], "auto");
  assert.equal(auto.type, "log");
  assert.equal(auto.auto, true);
  assert.equal(Math.round(auto.span), Math.round(25 / 0.6));
  assert.equal(scaleCue(auto), "log scale · auto (values span 42×)");
  assert.deepEqual(yScale([sigmoid, ipo], "linear"), { type: "linear", auto: false, span: null, range: null, clipped: 0 });
  assert.equal(scaleCue(yScale([sigmoid], "log")), "log scale"); // the user's log scale has its cue too
  const narrow = yScale([[1.0, 0.9, 0.5, 0.2]], "auto"); // a 5× span stays linear, no cue
  assert.equal(narrow.type, "linear");
  assert.equal(scaleCue(narrow), "");
  assert.equal(yScale([[null, NaN, 3]], "auto").type, "linear"); // non-finite values are ignored
});

test("auto y scale with values <= 0: outliers are left out of the range (TensorBoard's 5th-95th percentile)", () => {
  const rewards = Array.from({ length: 40 }, (_, i) => (i % 2 ? 0.1 : -0.1) * (1 + i / 40));
  const s = yScale([[-30, ...rewards, 40]], "auto");
  assert.equal(s.type, "linear");
  assert.equal(s.auto, true);
  const [lo, hi] = /** @type {[number, number]} */ (s.range);
  assert.ok(lo < -0.1 && lo > -1 && hi > 0.1 && hi < 1, JSON.stringify(s.range));
  assert.equal(s.clipped, 2);
  assert.equal(scaleCue(s), "outliers clipped · auto (2 points off the range)");
  assert.equal(yScale([rewards], "auto").range, null); // no outliers: the full range
  assert.equal(quantile([1, 2, 3, 4, 5], 0.5), 3);
  assert.equal(quantile([0, 10], 0.05), 0.5);
});

test("both plots share one x range: the union of their curves, padded 2 %", () => {
  const loss = curve(series([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], Array(11).fill(1)), { xAxis: "step" });
  const evalLoss = curve(series([5, 10], [1, 1]), { xAxis: "step" });
  assert.deepEqual(sharedXRange([loss, evalLoss]), [1 - 0.2, 11 + 0.2]);
  assert.deepEqual(sharedXRange([evalLoss]), [5 - 0.1, 10 + 0.1]);
  assert.equal(sharedXRange([curve(series([3], [1]), { xAxis: "step" })]), null); // one x: plotly's own range
});
