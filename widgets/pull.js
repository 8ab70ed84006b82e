// @ts-check
/**
 * The front end's pull: sequence numbers and one request in flight (kernel side: rapidfire_nb/panel/pull.py).
 *
 * Every state message of the kernel carries `cursor` (the newest metric point it holds, `since` the one before
 * its points), `version` (the snapshot's) and `ops_version` (the ops log's). `sequence` decides whether a message's
 * points continue what the state holds (then they are taken), are held already, or leave a gap (`state.behind`);
 * and whether its snapshot is newer than the one held. The puller asks the kernel for what changed since the state's
 * numbers (`{type: "pull", req, since, version, ops_version}`) about every second and at once when behind; the
 * kernel answers in its comm handler (`reply_to: req`), so the answer arrives even where a front end drops kernel
 * messages that answer none of its requests (Colab, some VS Code versions). One request is in flight at a time
 * (requests wait in the kernel's queue while a cell runs); a request unanswered after PULL_TIMEOUT_MS is given up.
 * Messages without sequence numbers (the server page's feed) are taken as they come, and nothing is pulled.
 * No DOM, no timers, no clock: the caller passes the time (node unit tests: tests/rapidfire_nb/js/pull.test.mjs).
 */

/** Milliseconds between two pulls while the page is visible. */
export const PULL_MS = 1000;
/** Milliseconds after which an unanswered pull is given up (a new one may go). */
export const PULL_TIMEOUT_MS = 30000;

/**
 * @typedef {{cursor: number|null, version: number|null, opsVersion: number|null,
 *   expect: {cursor: number, part: number}|null, behind: boolean}} Seq
 */

/** @returns {Seq} the sequence numbers of a state that holds nothing yet. */
export function createSeq() {
  return { cursor: null, version: null, opsVersion: null, expect: null, behind: false };
}

/**
 * What to take of one kernel message, by its sequence numbers; updates `seq` (cursor, versions, `behind`).
 * @param {Seq} seq @param {any} msg a `snapshot`, `update` or `points` message
 * @returns {{points: boolean, snapshot: boolean}} whether to take its points, its snapshot
 */
export function sequence(seq, msg) {
  if (typeof msg.cursor !== "number") return { points: true, snapshot: true }; // no sequence numbers
  if (msg.type === "points") { // part `part` of a batched message: taken when its head was
    const e = seq.expect;
    const ok = !!e && e.cursor === msg.cursor && e.part === msg.part;
    seq.expect = ok && msg.part + 1 < msg.parts ? { cursor: msg.cursor, part: msg.part + 1 } : null;
    return { points: ok, snapshot: false };
  }
  seq.expect = null;
  const points = !!msg.reset || (seq.cursor !== null && msg.since === seq.cursor);
  if (points) {
    seq.cursor = msg.cursor;
    if (msg.parts > 1) seq.expect = { cursor: msg.cursor, part: 1 };
  } else if (seq.cursor === null || msg.cursor > seq.cursor) {
    seq.behind = true; // a gap (pushes were dropped), or points partly held: ask from our cursor
  }
  const snapshot = !!msg.reset || seq.version === null || msg.version >= seq.version;
  if (snapshot && msg.snapshot) {
    seq.version = msg.version;
    if (Array.isArray(msg.snapshot.ops)) seq.opsVersion = msg.ops_version;
  }
  if (seq.version === null || msg.version > seq.version || msg.ops_version > (seq.opsVersion ?? -1)) {
    seq.behind = true; // a snapshot (or its ops log) we did not get
  }
  return { points, snapshot };
}

/**
 * The pull requests of one widget model.
 * @param {{seq: Seq}} state @param {(content: any) => boolean} send false when the kernel is not reachable
 * @returns {{request: (nowMs: number) => boolean, onMessage: (msg: any, nowMs: number) => void,
 *   inFlight: () => string|null}}
 */
export function createPuller(state, send) {
  const token = Math.random().toString(36).slice(2, 10); // replies go to every page: ours carry our token
  let serial = 0;
  /** @type {{req: string, at: number}|null} */ let flight = null;
  /** Send a pull unless one is in flight or the kernel never gave sequence numbers. @param {number} nowMs */
  const request = (nowMs) => {
    const seq = state.seq;
    if (seq.cursor === null) return false;
    if (flight && nowMs - flight.at < PULL_TIMEOUT_MS) return false;
    serial += 1;
    const req = `${token}:${serial}`;
    seq.behind = false;
    if (!send({ type: "pull", req, since: seq.cursor, version: seq.version, ops_version: seq.opsVersion })) {
      flight = null;
      return false;
    }
    flight = { req, at: nowMs };
    return true;
  };
  return {
    request,
    /** After the reducer took a kernel message: our answer ends the flight; behind -> ask again now. */
    onMessage(msg, nowMs) {
      if (flight && msg && msg.reply_to === flight.req) flight = null;
      if (state.seq.behind) request(nowMs);
    },
    inFlight: () => (flight ? flight.req : null),
  };
}
