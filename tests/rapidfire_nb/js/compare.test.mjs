// Unit tests of the "Compare runs" trace (widgets/compare.js parcoordsData), run with `node --test` by
// tests/rapidfire_nb/test_widgets_js.py. No DOM, no plotly: only the trace handed to it.
import assert from "node:assert/strict";
import { test } from "node:test";

import { compareNote, parcoordsData, shortCategory } from "../../../widgets/compare.js";
import { plotlyText, runColor } from "../../../widgets/format.js";

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
  assert.equal(trace.dimensions[1].label, plotlyText(LINK.replace(/_/g, " ")));
  // the long link text is shortened on the axis (its full text in the key under the plot)
  assert.deepEqual(trace.dimensions[2].ticktext, [plotlyText(LINK.slice(0, 11) + "…"), "plain"]);
  assert.deepEqual(trace.dimensions[2].values, [0, 1]);
  assert.deepEqual(trace.dimensions[3], { label: "eval_loss", values: [2, 3], tickformat: ".4~g" });
});

test("short category labels: target lists lose their shared suffix, long text ends with …", () => {
  assert.equal(shortCategory(["q_proj", "v_proj"]), "q,v");
  assert.equal(shortCategory(["q", "v"]), "q,v");
  assert.equal(shortCategory(["q_proj", "k_proj", "v_proj", "o_proj"]), "q,k,v,o");
  assert.equal(shortCategory(["q_proj", "fc1"]), "q_proj,fc1"); // no shared suffix: kept
  assert.equal(shortCategory("cosine_with_restarts"), "cosine_with…");
  assert.equal(shortCategory(2e-4), "2e-4");
});

test("a run axis first, the best run starred and at full strength, the others lighter; hover names the run", () => {
  const s = state(["learning_rate", "lora.target_modules"], [
    { learning_rate: 1e-4, "lora.target_modules": ["q_proj", "v_proj"] },
    { learning_rate: 2e-4, "lora.target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"] },
    { learning_rate: 3e-4, "lora.target_modules": ["q_proj", "v_proj"] }]);
  const { trace, runIds, key, hover } = parcoordsData(s, "eval_loss", 1);
  assert.deepEqual(runIds, [1, 2, 3]);
  assert.deepEqual(trace.dimensions[0], { label: "run", values: [1, 2, 3], tickvals: [1, 2, 3], ticktext: ["1 ★", "2", "3"] });
  assert.deepEqual(trace.dimensions[2].ticktext, ["q,k,v,o", "q,v"]); // sorted by the full JSON text
  assert.deepEqual(trace.dimensions[2].values, [1, 0, 1]);
  assert.deepEqual(key.map((k) => `${k.column} ${k.short} = ${k.full}`),
    ['targets q,v = ["q_proj","v_proj"]', 'targets q,k,v,o = ["q_proj","k_proj","v_proj","o_proj"]']);
  const colors = trace.line.colorscale.map((c) => c[1]);
  assert.equal(colors[0], runColor(1)); // the best run: its colour as is
  assert.match(colors[2], /^rgba\(\d+,\d+,\d+,0\.45\)$/); // the others lighter
  assert.equal(hover[0], 'run 1 ★ best · lr 1e-4 · targets ["q_proj","v_proj"] · eval_loss 2');
});

test("the note reads as English for any metric name (no 'a eval_loss')", () => {
  assert.equal(compareNote([1, 2], "eval_loss", 2),
    "2 runs (1, 2) have logged eval_loss; ★ run 2 is the best; drag along an axis to filter, hover a line for its run");
  assert.equal(compareNote([3], "eval_reward", null),
    "run 3 has logged eval_reward; drag along an axis to filter, hover a line for its run");
  assert.equal(compareNote([], "eval_loss", null), "no run has logged eval_loss yet");
});

test("run colours: TensorBoard's Time Series palette; its dark value for Slate on a dark page", async () => {
  const { PALETTE, PALETTE_DARK, isDarkColor, setDarkRunColors } = await import("../../../widgets/format.js");
  assert.deepEqual(PALETTE, ["#425066", "#12b5cb", "#e52592", "#f9ab00", "#9334e6", "#7cb342", "#e8710a"]);
  assert.equal(runColor(1), "#425066");
  assert.equal(runColor(8), "#425066"); // 7 colours, then again
  assert.equal(isDarkColor("#111"), true);
  assert.equal(isDarkColor("rgb(255, 255, 255)"), false);
  assert.equal(isDarkColor("var(--x)"), false); // unreadable: light
  assert.equal(setDarkRunColors(true), true);
  try {
    assert.equal(runColor(1), PALETTE_DARK[0]);
    assert.equal(runColor(1), "#8e98a3");
    assert.equal(runColor(2), "#12b5cb");
  } finally {
    setDarkRunColors(false);
  }
});
