"""Property test of the scheduler under random IC Ops interleaved with segment completions.

The fake executor holds each segment's Future until the test resolves it, so the Scheduler thread is driven
step by step. Properties checked on every example:

* no illegal status transition (every status change goes through ``check_transition``, which is wrapped, and
  consecutive ``on_run`` snapshots of a run are compared against ``TRANSITIONS``);
* no lost op: every submitted op ends ``applied`` or ``rejected``, and the listener heard that outcome once;
* no finished run trains again (no ``run_segment`` for a run after it was COMPLETED / FAILED / DELETED), and
  no STOPPED run trains either;
* the order rule: each ``run_segment`` goes to the run whose position ``(epoch, chunk)`` is smallest among the
  runs in rotation and ready at that moment, ties by run id;
* the executor is never called (add_run, on_status, has_boundary) while a segment is in flight;
* the later request wins: a stop / resume / delete sent while a stop or delete of another kind for the same run
  waits for that run's chunk boundary (the same segment in flight) cancels it (rejected, "cancelled by op
  <id>"), and such a resume is applied at once;
* at the end nothing is left in NEW or ONGOING, COMPLETED runs made all their steps.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernel_scheduler.core as loop_mod  # every status change of the loop goes through core.check_transition
from kernel_scheduler import IllegalTransition, Op, OpKind, RunStatus, check_transition
from rapidfire_nb.testing.fakes import FakeSpec, Harness

specs = st.builds(
    FakeSpec,
    rows=st.sampled_from([8, 12, 16]),
    batch=st.sampled_from([2, 4]),
    epochs=st.integers(1, 2),
    max_steps=st.one_of(st.none(), st.none(), st.integers(1, 7)),
    fail_at_step=st.one_of(st.none(), st.none(), st.none(), st.integers(1, 6)),
)

clone_specs = st.one_of(specs, specs, specs, st.just(FakeSpec(add_error="bad config")))
run_ids = st.integers(0, 7)  # 0 and ids past the last run are unknown
# (kind, run id, settle afterwards); without settling, the next op lands in the same loop turn
simple_ops = st.tuples(st.sampled_from(["stop", "resume", "delete"]), run_ids, st.booleans())
clone_ops = st.tuples(st.just("clone"), run_ids, st.booleans(), clone_specs, st.booleans())
segment = st.tuples(st.just("seg"), st.sampled_from(["ok", "ok", "ok", "ok", "error"]))
# a stop / resume / delete of whichever run is training when the action runs (its ops wait for the boundary),
# or two of them in a row (the second one must win)
live_kinds = st.sampled_from(["stop", "resume", "delete"])
live_ops = st.tuples(st.just("live"), live_kinds, st.booleans())
live_pairs = st.tuples(st.just("live2"), live_kinds, live_kinds, st.booleans())
actions = st.one_of(
    segment,
    segment,
    simple_ops,
    clone_ops,
    live_ops,
    live_pairs,
    st.tuples(st.just("dup"), st.integers(0, 50)),
)


def expand(script: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """``("live2", a, b, settle)`` -> ``("live", a, settle), ("live", b, True)``."""
    out: list[tuple[Any, ...]] = []
    for action in script:
        if action[0] == "live2":
            out += [("live", action[1], action[3]), ("live", action[2], True)]
        else:
            out.append(action)
    return out


class Checks:
    """Invariants checked from inside the scheduler thread (recorded, never raised there)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.problems: list[str] = []
        self.last: dict[int, RunStatus] = {}
        self.finished: set[int] = set()

    def add(self, msg: str) -> None:
        with self.lock:
            self.problems.append(msg)

    def on_run(self, run_id: int, status: RunStatus) -> None:
        prev = self.last.get(run_id, RunStatus.NEW)
        try:
            check_transition(prev, status)
        except IllegalTransition as exc:
            self.add(f"run {run_id}: snapshot went {prev.value} -> {status.value}: {exc}")
        self.last[run_id] = status
        if status.is_finished():
            self.finished.add(run_id)


@contextlib.contextmanager
def recording_transitions(checks: Checks) -> Iterator[None]:
    """Wrap the loop's check_transition so an illegal transition is recorded even if the loop swallows it."""
    real = loop_mod.check_transition

    def wrapped(old: RunStatus, new: RunStatus) -> None:
        try:
            real(old, new)
        except IllegalTransition as exc:
            checks.add(f"illegal transition attempted: {exc}")
            raise

    loop_mod.check_transition = wrapped  # type: ignore[assignment]
    try:
        yield
    finally:
        loop_mod.check_transition = real  # type: ignore[assignment]


def make_hooks(h: Harness, checks: Checks) -> None:
    sched = h.sched
    real_on_run = h.rec.on_run

    def on_run(snap: Any) -> None:
        checks.on_run(snap.run_id, snap.status)
        real_on_run(snap)

    h.rec.on_run = on_run  # type: ignore[method-assign]

    def on_segment(run_id: int, stop: int) -> None:
        snaps = sched.snapshot()
        me = next(s for s in snaps if s.run_id == run_id)
        if me.status is not RunStatus.ONGOING:
            checks.add(f"run_segment for run {run_id} while it is {me.status.value}")
        if run_id in checks.finished:
            checks.add(f"run {run_id} trains again after it finished")
        ready = [s for s in snaps if s.status.in_rotation() and s.total_steps > 0]
        best = min(ready, key=lambda s: (s.position, s.run_id)) if ready else None
        if best is None or best.run_id != run_id:
            checks.add(
                f"order: run {run_id} at {me.position} chosen, but "
                f"{[(s.run_id, s.position) for s in ready]} are ready"
            )

    h.fake.on_segment = on_segment

    def on_add_run(run_id: int, warm_from: int | None) -> None:
        snap = sched.run_snapshot(run_id)
        if snap is not None and snap.status is RunStatus.DELETED:
            checks.add(f"add_run for run {run_id}, which is DELETED")
        if warm_from is not None and not h.fake.has_boundary(warm_from):
            checks.add(f"warm start of run {run_id} from run {warm_from}, which has no boundary")

    h.fake.on_add_run = on_add_run


def later_wins(h: Harness, history: list[tuple[Op, int, int | None]], op: Op, resolved: int) -> list[str]:
    """The earlier stop/delete ops of ``op``'s run (another kind) still waiting for the boundary of the segment
    in flight now (sent during that same segment): ``op`` must cancel them."""
    out = []
    for earlier, seg, inflight in history:
        if (
            earlier.run_id == op.run_id
            and earlier.kind in (OpKind.STOP, OpKind.DELETE)
            and earlier.kind is not op.kind
            and (seg, inflight) == (resolved, op.run_id)
        ):
            ack = h.sched.ack(earlier.op_id)
            if ack is not None and ack.state == "queued":
                out.append(earlier.op_id)
    return out


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(
    initial=st.lists(specs, min_size=1, max_size=3),
    before_start=st.lists(st.one_of(simple_ops, clone_ops), max_size=3),
    script=st.lists(actions, max_size=30),
)
def test_random_ops_and_completions(
    initial: list[FakeSpec], before_start: list[tuple[Any, ...]], script: list[tuple[Any, ...]]
) -> None:
    checks = Checks()
    with recording_transitions(checks):
        h = Harness(initial, num_chunks=2, mode="manual", idle_poll_s=0.0005, start=False)
        make_hooks(h, checks)
        spec_of: dict[int, FakeSpec] = dict(enumerate(initial, start=1))
        submitted: list[Op] = []
        history: list[tuple[Op, int, int | None]] = []  # (op, segments resolved before it, run in flight)
        cancelled_by: dict[str, str] = {}  # op id -> the later op that must cancel it
        resolved = 0
        try:
            for i, action in enumerate(before_start + [("start",)] + expand(script)):
                if action[0] == "start":
                    h.sched.start()
                    h.settle()
                    continue
                started = i > len(before_start)
                kind = action[0]
                if kind == "seg":
                    if h.fake.inflight is not None:
                        h.fake.resolve(error="boom" if action[1] == "error" else None)
                        resolved += 1
                    h.settle()
                    continue
                if kind == "dup":
                    if not submitted:
                        continue
                    old = submitted[action[1] % len(submitted)]
                    op = Op(old.kind, old.run_id, op_id=old.op_id, payload=dict(old.payload))
                    settle = True
                elif kind == "clone":
                    _, rid, warm, spec, settle = action
                    parent_spec = spec_of.get(rid, spec)
                    op = Op(
                        OpKind.CLONE, rid, payload={"spec": parent_spec if warm else spec, "warm_start": warm}
                    )
                elif kind == "live":
                    _, kind, settle = action
                    op = Op(OpKind(kind), h.fake.inflight[0] if h.fake.inflight is not None else 1)
                else:
                    _, rid, settle = action
                    op = Op(OpKind(kind), rid)
                inflight = h.fake.inflight[0] if h.fake.inflight is not None else None
                waiting = (
                    []
                    if kind in ("dup", "clone") or inflight != op.run_id
                    else later_wins(h, history, op, resolved)
                )
                ack = h.sched.submit(op)
                for earlier in waiting:
                    cancelled_by[earlier] = op.op_id
                if waiting and op.kind is OpKind.RESUME:
                    assert ack.state == "applied", (op, ack)
                if kind != "dup":
                    history.append((op, resolved, inflight))
                    submitted.append(op)
                    if ack.new_run_id is not None:
                        spec_of[ack.new_run_id] = op.payload["spec"]
                else:
                    assert ack.op_id == op.op_id
                if settle and started:
                    h.settle()
            h.run_to_idle()
        finally:
            h.close()

    assert not h.fake.violations, h.fake.violations
    assert not checks.problems, checks.problems
    assert h.sched.loop_error is None, h.sched.loop_error

    # no lost op: every op has one final outcome, and the listener heard it
    for op in submitted:
        ack = h.sched.ack(op.op_id)
        assert ack is not None and ack.state in ("applied", "rejected"), (op, ack)
        states = h.rec.states(op.op_id)
        assert states and states[-1] == ack.state, (op, states)
        assert sum(s in ("applied", "rejected") for s in states) == 1, (op, states)
    assert {op.op_id for op in submitted} == {e[0] for e in h.rec.op_events}

    # the later request won
    for earlier, later in cancelled_by.items():
        ack = h.sched.ack(earlier)
        assert ack is not None and ack.state == "rejected", ack
        assert f"cancelled by op {later}" in ack.message, ack

    # nothing left to train; runs that completed made all their steps; no chunk trained twice
    for snap in h.sched.snapshot():
        assert not snap.status.in_rotation(), snap
        if snap.status is RunStatus.COMPLETED:
            assert snap.step == snap.total_steps > 0, snap
        stops = h.fake.calls_of(snap.run_id)
        assert stops == sorted(set(stops)), (snap.run_id, stops)
    assert len({s.run_id for s in h.sched.snapshot()}) == len(h.sched.snapshot())
