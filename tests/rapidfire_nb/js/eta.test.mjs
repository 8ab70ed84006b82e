// Unit tests of widgets/eta.js (the header's smoothed time left) and the header's percentage text, run with
// `node --test` by tests/rapidfire_nb/panel/test_widgets_js.py. Fake snapshots' stats, no DOM.
import assert from "node:assert/strict";
import { test } from "node:test";

import { ETA_SMOOTHING, EtaSmoother } from "../../../widgets/eta.js";
import { percentText, statsText } from "../../../widgets/format.js";

/** A snapshot's stats as rapidfire_nb.view.clock.progress_stats makes them (eta_s from the average rate). */
function stats(done, planned, elapsed, training = true) {
  const rate = elapsed > 1 && done ? done / elapsed : null;
  const left = planned - done;
  return { steps_done: done, steps_planned: planned, elapsed_s: elapsed, steps_per_s: rate, training,
    eta_s: training && rate && left ? left / rate : training && !left ? 0 : null, percent: 100 * done / planned };
}

test("the time left counts down between step counts instead of climbing with the average rate", () => {
  const eta = new EtaSmoother();
  assert.equal(eta.update(stats(20, 100, 10)), 40); // seeded with the average rate: 80 steps at 2 steps/s
  // a chunk trains: 8 more seconds, no new step; the average-rate estimate climbs to 72 s, this one counts down
  const mid = stats(20, 100, 18);
  assert.equal(mid.eta_s, 72);
  assert.equal(eta.update(mid), 40 - 8);
  assert.equal(eta.update(mid, 20), 40 - 10); // the clock moved on past the snapshot
  assert.equal(eta.update(stats(20, 100, 60)), 0); // never below 0
});

test("a new step count moves the rate by an EMA (tqdm's smoothing, alpha 0.3), not to the latest rate", () => {
  const eta = new EtaSmoother();
  eta.update(stats(20, 100, 10)); // rate 2
  const out = eta.update(stats(60, 100, 20)); // 40 steps in 10 s: 4 steps/s now
  const rate = ETA_SMOOTHING * 4 + (1 - ETA_SMOOTHING) * 2;
  assert.equal(ETA_SMOOTHING, 0.3);
  assert.ok(Math.abs(out - 40 / rate) < 1e-9, String(out));
  assert.ok(out > 40 / 4 && out < 40 / 2); // between the newest rate's estimate and the old one
});

test("no estimate when not training; a restart of the counts reseeds; nothing left reads 0", () => {
  const eta = new EtaSmoother();
  assert.equal(eta.update(stats(20, 100, 10, false)), null);
  assert.equal(eta.update(null), null);
  assert.equal(eta.update(stats(50, 100, 25)), 25);
  assert.equal(eta.update(stats(10, 100, 5)), 45); // fewer steps than before (another experiment): reseeded
  assert.equal(eta.update(stats(100, 100, 50)), 0);
});

test("the header says 100% only when every run has its full budget", () => {
  assert.equal(percentText(99.6), "99");
  assert.equal(percentText(100), "100");
  assert.equal(percentText(45.4), "45");
  assert.equal(statsText({ percent: 99.7, short_runs: 2, steps_per_s: 2, training: false }),
    "99% · 2 runs short of budget · 2 steps/s");
  assert.equal(statsText({ percent: 50, short_runs: 1, training: true, eta_s: 35 }), "50% · 1 run short of budget · 0:35 left");
});
