// Unit tests of widgets/export.js (CSV of the runs table and of every metric point).
import assert from "node:assert/strict";
import { test } from "node:test";

import { csvField, csvName, metricsCsv, runsCsv } from "../../../widgets/export.js";
import { createState, reduce } from "../../../widgets/state.js";

test("CSV fields are quoted when needed; NaN and null are empty", () => {
  assert.equal(csvField('a,"b"'), '"a,""b"""');
  assert.equal(csvField(["q_proj", "v_proj"]), '"[""q_proj"",""v_proj""]"');
  assert.equal(csvField(NaN), "");
  assert.equal(csvField(null), "");
  assert.equal(csvName("sft demo", "runs"), "sft_demo-runs.csv");
});

test("the runs table and the metrics as CSV", () => {
  const s = createState();
  const runs = [{ run_id: 2, status: "STOPPED", hparams: { lr: 1e-4 }, editable: { lr: 1e-4, r: 8 },
    completed_steps: 4, total_steps: 8, chunks_done: 2, samples_seen: 16, loss: 1.5, eval_loss: null,
    error: null, parent_id: 1, warm_start: true },
  { run_id: 1, status: "COMPLETED", hparams: { lr: 1e-3 }, editable: { lr: 1e-3, r: 8 }, completed_steps: 8,
    total_steps: 8, chunks_done: 4, samples_seen: 32, loss: 1.2, eval_loss: 1.3, error: 'bad "x", y',
    parent_id: null, warm_start: false }];
  reduce(s, { type: "snapshot", reset: true, snapshot: { experiment: "e", runs, hparam_columns: ["lr"], ops: [] },
    points: { names: ["loss", "eval_loss"], run: [1, 1, 2], step: [1, 1, 5], samples: [4, 4, 20], name: [0, 1, 0],
      value: [2.0, 2.5, 1.9], wall: [10.5, 10.5, 20] } }, 0);
  assert.equal(runsCsv(s), "run_id,status,parent_id,warm_start,lr,r,completed_steps,total_steps,chunks_done," +
    "samples_seen,loss,eval_loss,error\r\n" +
    '1,COMPLETED,,false,0.001,8,8,8,4,32,1.2,1.3,"bad ""x"", y"\r\n' +
    "2,STOPPED,1,true,0.0001,8,4,8,2,16,1.5,,\r\n");
  assert.equal(metricsCsv(s), "run_id,step,samples_seen,wall_time,eval_loss,loss\r\n" +
    "1,1,4,10.5,2.5,2\r\n2,5,20,20,,1.9\r\n");
});

test("with several devices the runs CSV has a device column", () => {
  const s = createState();
  const runs = [{ run_id: 1, status: "ONGOING", device: "cpu:1", hparams: {}, completed_steps: 1, total_steps: 2,
    chunks_done: 0, samples_seen: 2, loss: null, eval_loss: null, error: null, parent_id: null, warm_start: false }];
  reduce(s, { type: "snapshot", reset: true, snapshot: { experiment: "e", runs, hparam_columns: [], ops: [] } }, 0);
  assert.equal(runsCsv(s).split("\r\n")[0].split(",").slice(0, 3).join(","), "run_id,status,device");
  assert.equal(runsCsv(s).split("\r\n")[1].split(",").slice(0, 3).join(","), "1,ONGOING,cpu:1");
});
