// Unit tests of widgets/curves.js plotSettingsChange: the message that tells the kernel a view's plot settings
// (the static copy is drawn with them), sent only when they changed.
import assert from "node:assert/strict";
import { test } from "node:test";

import { plotSettingsChange } from "../../../widgets/curves.js";

test("the first settings make a message; the same settings again make none; a change makes a new one", () => {
  const first = plotSettingsChange("", ["loss", "eval_loss"], 0, "auto");
  assert.ok(first);
  assert.deepEqual(first.msg, { type: "plot_settings", metrics: ["loss", "eval_loss"], smoothing: 0, y_scale: "auto" });
  assert.equal(plotSettingsChange(first.key, ["loss", "eval_loss"], 0, "auto"), null);
  const smoothed = plotSettingsChange(first.key, ["loss", "eval_loss"], 0.6, "auto");
  assert.ok(smoothed && smoothed.key !== first.key);
  assert.equal(smoothed.msg.smoothing, 0.6);
  const picked = plotSettingsChange(smoothed.key, ["eval_loss", "loss"], 0.6, "auto"); // the order is the plots'
  assert.deepEqual(picked?.msg.metrics, ["eval_loss", "loss"]);
  assert.equal(plotSettingsChange(picked.key, ["eval_loss", "loss"], 0.6, "log")?.msg.y_scale, "log");
});

test("smoothing is clamped to the slider's 0..0.99 and a non-number is 0; the metrics list is a copy", () => {
  assert.equal(plotSettingsChange("", ["loss"], 5, "auto")?.msg.smoothing, 0.99);
  assert.equal(plotSettingsChange("", ["loss"], -1, "auto")?.msg.smoothing, 0);
  assert.equal(plotSettingsChange("", ["loss"], NaN, "auto")?.msg.smoothing, 0);
  const metrics = ["loss"];
  const c = plotSettingsChange("", metrics, 0, "auto");
  metrics.push("eval_loss");
  assert.deepEqual(c?.msg.metrics, ["loss"]);
});
