// Unit tests of the "Compare runs" trace (widgets/compare.js parcoordsData), run with `node --test` by
// tests/rapidfire_nb/test_widgets_js.py. No DOM, no plotly: only the trace handed to it.
import assert from "node:assert/strict";
import { test } from "node:test";

import { parcoordsData } from "../../../widgets/compare.js";
import { plotlyText } from "../../../widgets/format.js";

const LINK = '<a href="https://evil.example">x</a>';

/** A state with two runs and their eval_loss (read from the snapshot, as the panel does). */
function state(columns, hparams) {
  return {
    series: new Map(),
    snapshot: {
      hparam_columns: columns,
      runs: hparams.map((hp, i) => ({ run_id: i + 1, status: "COMPLETED", eval_loss: 2 + i, hparams: hp })),
    },
  };
}

test("plotlyText writes the characters plotly reads as markup as entities", () => {
  assert.equal(plotlyText(LINK), "&lt;a href=\"https://evil.example\"&gt;x&lt;/a&gt;");
  assert.equal(plotlyText("a & b"), "a &amp; b");
  assert.equal(plotlyText("learning rate"), "learning rate");
});

test("hparam names, text values and the metric never reach plotly as markup (issue 34 item 9)", () => {
  const s = state([LINK, "note"], [{ [LINK]: 1e-3, note: LINK }, { [LINK]: 2e-3, note: "plain" }]);
  const { trace, runIds } = parcoordsData(s, "eval_loss");
  assert.deepEqual(runIds, [1, 2]);
  const texts = trace.dimensions.flatMap((d) => [d.label, ...(d.ticktext || [])]);
  assert.ok(texts.every((t) => !t.includes("<") && !t.includes(">")), JSON.stringify(texts));
  assert.equal(trace.dimensions[0].label, plotlyText(LINK.replace(/_/g, " ")));
  assert.deepEqual(trace.dimensions[1].ticktext, [plotlyText(LINK), "plain"]);
  assert.deepEqual(trace.dimensions[1].values, [0, 1]);
  assert.deepEqual(trace.dimensions[2], { label: "eval_loss", values: [2, 3], tickformat: ".4~g" });
});
