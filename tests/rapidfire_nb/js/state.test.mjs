// Unit tests of the panel's pure modules (widgets/state.js, widgets/format.js, widgets/ops.js), run with
// `node --test` by tests/rapidfire_nb/test_widgets_js.py. No DOM.
import assert from "node:assert/strict";
import { test } from "node:test";

import { fmtElapsed, fmtHparam, fmtNum, parseValue, shortHparam } from "../../../widgets/format.js";
import { inboxRequest, opBody, readCookie } from "../../../widgets/ops.js";
import {
  clickFailed, clickSent, createState, deviceChips, dismissNotice, earlyStoppingText, hasDeviceColumn, expireClick, fadeNotice, isPending,
  MAX_NOTICES,
  metricOrder, noticesNewestFirst, postedToServer, reduce, statusCounts, visibleRuns,
} from "../../../widgets/state.js";

/** Columnar points as the kernel encodes them. */
function points(rows) {
  const names = [...new Set(rows.map((r) => r[3]))];
  return {
    names, run: rows.map((r) => r[0]), step: rows.map((r) => r[1]), samples: rows.map((r) => r[2]),
    name: rows.map((r) => names.indexOf(r[3])), value: rows.map((r) => r[4]),
  };
}

function run(id, status, extra = {}) {
  return { run_id: id, status, on_device: false, hparams: {}, completed_steps: 0, total_steps: 10, chunks_done: 0,
    samples_seen: 0, loss: null, eval_loss: null, error: null, parent_id: null, warm_start: false,
    legal_ops: [], ...extra };
}

function snapshot(runs, ops) {
  const snap = { experiment: "exp", started_at: 100, progress: "chunk 1/4 of epoch 1", on_device: null,
    num_chunks: 4, hparam_columns: [], runs, metric_names: ["loss", "grad_norm"] };
  return ops === undefined ? snap : { ...snap, ops };
}

test("a snapshot resets the series store; points and updates append to it", () => {
  const s = createState();
  const first = reduce(s, { type: "snapshot", reset: true, now: 10, snapshot: snapshot([run(1, "ONGOING")], []),
    points: points([[1, 1, 8, "loss", 2.0], [1, 2, 16, "loss", 1.5]]) }, 9000);
  assert.equal(first.snapshot, true);
  assert.equal(first.full, true);
  assert.equal(first.redraw, true);
  assert.equal(s.live, true);
  assert.equal(s.clockOffset, 1000);
  assert.deepEqual(s.series.get("loss").get(1), { step: [1, 2], samples: [8, 16], value: [2.0, 1.5], wall: [null, null] });
  assert.deepEqual(reduce(s, { type: "points", points: points([[2, 1, 8, "eval_loss", null]]) }, 0), { points: true });
  assert.deepEqual(s.series.get("eval_loss").get(2).value, [null]);
  const upd = reduce(s, { type: "update", snapshot: null, points: points([[1, 3, 24, "loss", 1.2]]) }, 0);
  assert.deepEqual(upd, { points: true });
  assert.deepEqual(s.series.get("loss").get(1).step, [1, 2, 3]);
  assert.deepEqual(metricOrder(s), ["loss", "eval_loss", "grad_norm"]);
  reduce(s, { type: "snapshot", reset: true, snapshot: snapshot([run(1, "ONGOING")], []), points: points([]) }, 0);
  assert.equal(s.series.size, 0);
});

test("an update without ops keeps the last ops log; full only for the first snapshot", () => {
  const s = createState();
  const op = { op_id: "a", run_id: 1, kind: "stop", state: "applied", message: "run 1 stopped" };
  reduce(s, { type: "snapshot", reset: true, snapshot: snapshot([run(1, "STOPPED")], [op]), points: null }, 0);
  const change = reduce(s, { type: "update", snapshot: snapshot([run(1, "STOPPED")]), points: null }, 0);
  assert.equal(change.full, false);
  assert.deepEqual(s.snapshot.ops, [op]);
});

test("a click: pending until acknowledged, its notice follows the ack and then the ops log", () => {
  const s = createState();
  reduce(s, { type: "snapshot", reset: true, snapshot: snapshot([run(2, "ONGOING")], []), points: null }, 0);
  clickSent(s, "stop", 2, "op-1");
  assert.equal(isPending(s, "stop", 2), true);
  assert.deepEqual(noticesNewestFirst(s).map(([id, n]) => [id, n.state, n.text]),
    [["op-1", "sent", "stop requested for run 2 — applies at the end of its current chunk"]]);
  const ack = reduce(s, { type: "ack", ack: { op_id: "op-1", run_id: 2, kind: "stop", state: "queued",
    message: "stop requested for run 2 — applies now" } }, 0);
  assert.deepEqual(ack, { notices: true, table: true });
  assert.equal(isPending(s, "stop", 2), false);
  assert.equal(s.notices.get("op-1").text, "stop requested for run 2 — applies now");
  const applied = { op_id: "op-1", run_id: 2, kind: "stop", state: "applied", message: "run 2 stopped at step 3" };
  const change = reduce(s, { type: "update", snapshot: snapshot([run(2, "STOPPED")], [applied]), points: null }, 0);
  assert.equal(change.notices, true);
  assert.equal(s.notices.get("op-1").text, "✓ run 2 stopped at step 3");
  assert.equal(s.notices.get("op-1").state, "applied");
  // an ack arriving after the ops log showed the outcome changes nothing
  reduce(s, { type: "ack", ack: { op_id: "op-1", run_id: 2, kind: "stop", state: "queued", message: "x" } }, 0);
  assert.equal(s.notices.get("op-1").text, "✓ run 2 stopped at step 3");
});

test("a pending click ends once its op is logged, or expires", () => {
  const s = createState();
  clickSent(s, "delete", 3, "d1");
  const logged = { op_id: "d1", run_id: 3, kind: "delete", state: "queued", message: "" };
  reduce(s, { type: "snapshot", reset: true, snapshot: snapshot([run(3, "ONGOING")], [logged]), points: null }, 0);
  assert.equal(isPending(s, "delete", 3), false);
  clickSent(s, "stop", 3, "s1");
  assert.equal(expireClick(s, "stop", 3, "other"), false);
  assert.equal(expireClick(s, "stop", 3, "s1"), true);
  assert.equal(isPending(s, "stop", 3), false);
});

test("rejections, errors, the server fallback and a failed send are notices", () => {
  const s = createState();
  reduce(s, { type: "ack", ack: { op_id: "r", run_id: 9, kind: "stop", state: "rejected",
    message: "run 9 does not exist" } }, 0);
  assert.equal(s.notices.get("r").text, "✗ stop for run 9 rejected: run 9 does not exist");
  reduce(s, { type: "error", message: "store is locked" }, 0);
  assert.equal(s.notices.get("error:store is locked").text, "panel: store is locked");
  clickSent(s, "stop", 1, "busy");
  assert.equal(postedToServer(s, { op_id: "busy", kind: "stop", run_id: 1 }), true);
  assert.match(s.notices.get("busy").text, /kernel busy: sent through the server/);
  s.acked.add("late");
  assert.equal(postedToServer(s, { op_id: "late", kind: "stop", run_id: 1 }), false);
  clickSent(s, "resume", 1, "nc");
  clickFailed(s, "resume", 1, "nc");
  assert.equal(s.notices.get("nc").state, "rejected");
  assert.equal(isPending(s, "resume", 1), false);
});

test("at most MAX_NOTICES notices; fading and dismissing follow the notice's serial", () => {
  const s = createState();
  for (let i = 0; i < MAX_NOTICES + 2; i++) clickSent(s, "stop", i, `n${i}`);
  assert.deepEqual(noticesNewestFirst(s).map(([id]) => id), ["n5", "n4", "n3", "n2"]);
  const serial = s.notices.get("n5").serial;
  clickFailed(s, "stop", 5, "n5"); // a newer text: the old serial no longer fades it
  assert.equal(fadeNotice(s, "n5", serial), false);
  const now = s.notices.get("n5").serial;
  assert.equal(fadeNotice(s, "n5", now), true);
  assert.equal(s.notices.get("n5").fading, true);
  assert.equal(dismissNotice(s, "n5", now), true);
  assert.equal(s.notices.has("n5"), false);
});

test("plotly buffers are handed back, unknown messages ignored", () => {
  const s = createState();
  const buf = new Uint8Array([1, 2]);
  assert.deepEqual(reduce(s, { type: "plotly" }, 0, [buf]), { plotly: buf });
  assert.deepEqual(reduce(s, { type: "nope" }, 0), {});
  assert.deepEqual(reduce(s, null, 0), {});
});

test("runs: visible, counted", () => {
  const s = createState();
  reduce(s, { type: "snapshot", reset: true, points: null,
    snapshot: snapshot([run(3, "DELETED"), run(1, "COMPLETED"), run(2, "STOPPED")], []) }, 0);
  assert.deepEqual(visibleRuns(s, false).map((r) => r.run_id), [1, 2]);
  assert.deepEqual(visibleRuns(s, true).map((r) => r.run_id), [1, 2, 3]);
  assert.deepEqual(statusCounts(s), { DELETED: 1, COMPLETED: 1, STOPPED: 1 });
});

test("early stopping: the snapshot's line, nothing without one", () => {
  const line = "Optuna: 3 of 6 trials asked · 1 pruned · 2 running";
  assert.equal(earlyStoppingText(snapshot([run(1, "ONGOING")], [])), "");
  assert.equal(earlyStoppingText({ ...snapshot([], []), early_stopping: null }), "");
  assert.equal(earlyStoppingText({ ...snapshot([], []), early_stopping: ` ${line} ` }), line);
  assert.equal(earlyStoppingText(null), "");
  const s = createState();
  reduce(s, { type: "snapshot", reset: true, points: null,
    snapshot: { ...snapshot([run(1, "STOPPED", { pruned: true })], []), early_stopping: line } }, 0);
  assert.equal(earlyStoppingText(s.snapshot), line);
});

test("formatting", () => {
  assert.deepEqual([fmtNum(1e-4), fmtNum(0.812345), fmtNum(2.5e-5), fmtNum(12), fmtNum(1234.5678), fmtNum(null),
    fmtNum(123456.7)], ["1e-4", "0.8123", "2.5e-5", "12", "1235", "–", "1.235e5"]);
  assert.equal(fmtHparam(["q_proj"]), '["q_proj"]');
  assert.equal(fmtElapsed(83), "1:23");
  assert.equal(fmtElapsed(3723), "1:02:03");
  assert.equal(shortHparam("lora.lora_dropout"), "dropout");
  assert.equal(shortHparam("model_kwargs.torch_dtype"), "torch_dtype");
  assert.deepEqual([parseValue("5e-4", 1e-4), parseValue("True", false), parseValue("cosine", "linear"),
    parseValue("[1, 2]", null)], [5e-4, true, "cosine", [1, 2]]);
});

test("the op sent to the server's inbox", () => {
  const clone = { op_id: "c", kind: "clone", run_id: 1, changes: { learning_rate: 5e-4 }, warm_start: true };
  assert.deepEqual(opBody({ ...clone, kind: "stop" }), { op_id: "c", kind: "stop", run_id: 1 });
  const { url, init } = inboxRequest("/base/", "my exp", clone, "tok");
  assert.equal(url, "/base/rapidfire/api/experiments/my%20exp/ops");
  assert.equal(init.method, "POST");
  assert.equal(init.headers["X-XSRFToken"], "tok");
  assert.deepEqual(JSON.parse(init.body), clone);
  assert.equal(readCookie("a=1; _xsrf=2%7C3; b=4", "_xsrf"), "2|3");
  assert.equal(readCookie("a=1", "_xsrf"), null);
});

test("a frozen message keeps the static copy for every view", () => {
  const s = createState();
  assert.deepEqual(reduce(s, { type: "frozen", html: "<div data-rf-static></div>" }, 0), { frozen: true });
  assert.equal(s.frozenHtml, "<div data-rf-static></div>");
});

test("wall times ride along with the points", () => {
  const s = createState();
  const enc = points([[1, 1, 8, "loss", 2.0]]);
  reduce(s, { type: "points", points: { ...enc, wall: [1700000000.5] } }, 0);
  assert.deepEqual(s.series.get("loss").get(1).wall, [1700000000.5]);
});

test("several devices: one header chip each, two runs training at once, the Device column", () => {
  const runs = [run(1, "ONGOING", { on_device: true, device: "cpu:0" }), run(2, "ONGOING", { on_device: true, device: "cpu:1" }),
    run(3, "NEW", { device: "cpu:1" })];
  const snap = { ...snapshot(runs, []), on_device: 1, device_runs: { "cpu:0": 1, "cpu:1": 2 },
    devices: [{ name: "cpu:0", state: "training", run_id: 1 }, { name: "cpu:1", state: "training", run_id: 2 },
      { name: "cuda:2", state: "lost", run_id: null }, { name: "cuda:3", state: "idle", run_id: null }] };
  const chips = deviceChips(snap);
  assert.deepEqual(chips.map((c) => [c.text, c.state, c.runId]), [
    ["cpu:0 · run 1", "training", 1], ["cpu:1 · run 2", "training", 2], ["cuda:2 · lost", "lost", null],
    ["cuda:3 · idle", "idle", null]]);
  assert.match(chips[2].title, /worker died/);
  assert.equal(hasDeviceColumn(snap), true);
  // the server page: names from the store, state unknown
  const page = deviceChips({ ...snap, devices: [{ name: "cpu:0", state: "—", run_id: null }] });
  assert.deepEqual(page.map((c) => [c.text, c.state]), [["cpu:0 · —", "—"]]);
});

test("one device: no chips, no Device column, the single run on the device", () => {
  const snap = { ...snapshot([run(1, "ONGOING", { on_device: true, device: null }), run(2, "NEW")], []), on_device: 1 };
  assert.deepEqual(deviceChips(snap), []);
  assert.deepEqual(deviceChips({ ...snap, devices: [] }), []);
  assert.equal(hasDeviceColumn(snap), false);
});
