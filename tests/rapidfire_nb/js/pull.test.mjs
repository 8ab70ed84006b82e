// Unit tests of widgets/pull.js (sequence numbers, one pull in flight) and of the reducer's use of them, run with
// `node --test` by tests/rapidfire_nb/panel/test_widgets_js.py. No DOM.
import assert from "node:assert/strict";
import { test } from "node:test";

import { createPuller, createSeq, PULL_TIMEOUT_MS, sequence } from "../../../widgets/pull.js";
import { createState, reduce } from "../../../widgets/state.js";

/** Columnar loss points of run 1 at `steps`. */
function pts(steps) {
  return { names: ["loss"], run: steps.map(() => 1), step: steps, samples: steps, name: steps.map(() => 0),
    value: steps.map((s) => 1 / (s + 1)) };
}

const SNAP = { experiment: "e", started_at: 1, progress: "", on_device: null, num_chunks: 1, hparam_columns: [],
  runs: [], metric_names: ["loss"] };

function lossSteps(state) {
  return state.series.get("loss")?.get(1)?.step ?? [];
}

/** A hello's answer holding steps 0..2 (cursor 3, version 1). */
function hello(state) {
  reduce(state, { type: "snapshot", reset: true, snapshot: { ...SNAP, ops: [] }, points: pts([0, 1, 2]), now: 1,
    cursor: 3, version: 1, ops_version: 1 }, 0);
}

test("points that continue the cursor are taken; held ones are not taken twice; a gap makes it behind", () => {
  const s = createState();
  hello(s);
  assert.deepEqual([s.seq.cursor, s.seq.version, s.seq.opsVersion, s.seq.behind], [3, 1, 1, false]);
  const push = { type: "update", snapshot: null, points: pts([3, 4]), since: 3, cursor: 5, version: 1, ops_version: 1 };
  assert.deepEqual(reduce(s, push, 0), { points: true });
  // the same points again (a pull's answer that crossed the push): not added twice
  assert.deepEqual(reduce(s, { ...push, reply_to: "x:1" }, 0), {});
  assert.deepEqual(lossSteps(s), [0, 1, 2, 3, 4]);
  assert.equal(s.seq.behind, false);
  // a push from cursor 7 (those from 5 to 7 were dropped): nothing taken, behind
  reduce(s, { ...push, points: pts([7]), since: 7, cursor: 8 }, 0);
  assert.deepEqual([lossSteps(s).length, s.seq.cursor, s.seq.behind], [5, 5, true]);
  // the answer to our pull from 5 fills the gap
  reduce(s, { type: "update", snapshot: null, points: pts([5, 6, 7]), since: 5, cursor: 8, version: 1, ops_version: 1,
    reply_to: "x:2" }, 0);
  assert.deepEqual(lossSteps(s), [0, 1, 2, 3, 4, 5, 6, 7]);
  assert.equal(s.seq.cursor, 8);
});

test("an older snapshot never replaces a newer one; a snapshot without its ops log asks for it", () => {
  const s = createState();
  hello(s);
  const newer = { ...SNAP, progress: "newer", ops: [] };
  reduce(s, { type: "update", snapshot: newer, points: null, since: 3, cursor: 3, version: 3, ops_version: 1 }, 0);
  reduce(s, { type: "update", snapshot: { ...SNAP, progress: "older" }, points: null, since: 3, cursor: 3, version: 2,
    ops_version: 1 }, 0);
  assert.equal(s.snapshot.progress, "newer");
  assert.equal(s.seq.behind, false);
  // version 4 changed the ops log (ops_version 4) but came without it: taken, and behind until the log arrives
  reduce(s, { type: "update", snapshot: { ...SNAP, progress: "v4" }, points: null, since: 3, cursor: 3, version: 4,
    ops_version: 4 }, 0);
  assert.deepEqual([s.snapshot.progress, s.seq.version, s.seq.opsVersion, s.seq.behind], ["v4", 4, 1, true]);
  // a message naming a version we never got (its snapshot went to another page): behind
  const t = createState();
  hello(t);
  reduce(t, { type: "update", snapshot: null, points: null, since: 3, cursor: 3, version: 2, ops_version: 1 }, 0);
  assert.equal(t.seq.behind, true);
});

test("a batched answer: its parts are taken only after its head was", () => {
  const s = createState();
  hello(s);
  reduce(s, { type: "update", snapshot: null, points: pts([3]), since: 3, cursor: 6, parts: 3, version: 1,
    ops_version: 1 }, 0);
  reduce(s, { type: "points", points: pts([4]), cursor: 6, part: 1, parts: 3 }, 0);
  reduce(s, { type: "points", points: pts([5]), cursor: 6, part: 2, parts: 3 }, 0);
  assert.deepEqual(lossSteps(s), [0, 1, 2, 3, 4, 5]);
  // parts of an answer whose head was not taken (it started before our cursor)
  reduce(s, { type: "update", snapshot: null, points: pts([4, 5, 6]), since: 4, cursor: 7, parts: 2, version: 1,
    ops_version: 1 }, 0);
  assert.equal(reduce(s, { type: "points", points: pts([6]), cursor: 7, part: 1, parts: 2 }, 0).points, undefined);
  assert.deepEqual(lossSteps(s), [0, 1, 2, 3, 4, 5]);
});

test("messages without sequence numbers (the server page's feed) are taken as they come", () => {
  const seq = createSeq();
  assert.deepEqual(sequence(seq, { type: "update", points: pts([1]) }), { points: true, snapshot: true });
  assert.deepEqual(sequence(seq, { type: "points", points: pts([2]) }), { points: true, snapshot: true });
  assert.equal(seq.cursor, null);
});

test("the puller: nothing before sequence numbers, one request in flight, its answer frees it", () => {
  const s = createState();
  const sent = [];
  let reachable = true;
  const puller = createPuller(s, (m) => { if (reachable) sent.push(m); return reachable; });
  assert.equal(puller.request(0), false); // the kernel never spoke sequence numbers: no pull
  hello(s);
  assert.equal(puller.request(1000), true);
  const [first] = sent;
  assert.equal(first.type, "pull");
  assert.deepEqual([first.since, first.version, first.ops_version], [3, 1, 1]);
  assert.match(first.req, /^[a-z0-9]+:1$/);
  // the timer fires while the first waits (a cell runs): no second request
  assert.equal(puller.request(2000), false);
  assert.equal(puller.request(1000 + PULL_TIMEOUT_MS - 1), false);
  // another page's answer (another token) does not free ours
  puller.onMessage({ type: "update", reply_to: "other:1" }, 2500);
  assert.equal(puller.inFlight(), first.req);
  puller.onMessage({ type: "update", reply_to: first.req }, 3000);
  assert.equal(puller.inFlight(), null);
  assert.equal(puller.request(3000), true);
  assert.equal(sent[1].req.split(":")[1], "2");
  // an answer never came: given up after PULL_TIMEOUT_MS
  assert.equal(puller.request(3000 + PULL_TIMEOUT_MS), true);
  assert.equal(sent.length, 3);
  // a kernel that cannot be reached: nothing in flight
  reachable = false;
  puller.onMessage({ type: "update", reply_to: sent[2].req }, 4000);
  assert.equal(puller.request(4000), false);
  assert.equal(puller.inFlight(), null);
});

test("behind: the answer that frees the flight sends the next pull at once, from the state's cursor", () => {
  const s = createState();
  const sent = [];
  const puller = createPuller(s, (m) => { sent.push(m); return true; });
  hello(s);
  puller.request(0);
  const gap = { type: "update", snapshot: null, points: pts([9]), since: 9, cursor: 10, version: 1, ops_version: 1 };
  reduce(s, gap, 0);
  puller.onMessage(gap, 100); // a dropped stretch, but our pull is in flight: wait for its answer
  assert.equal(sent.length, 1);
  const answer = { type: "update", snapshot: null, points: pts([3, 4]), since: 3, cursor: 5, version: 1, ops_version: 1,
    reply_to: sent[0].req };
  reduce(s, answer, 0);
  puller.onMessage(answer, 200);
  assert.equal(sent.length, 2);
  assert.equal(sent[1].since, 5);
  assert.equal(s.seq.behind, false);
});
