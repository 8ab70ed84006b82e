"""Rungs survive a restart (issue 34 item 2), pure: a rung policy's book is rebuilt from the events it journaled, so
a kill at any point of a rung decision gives the decisions of a process that was never killed.

The smallest cases first (a kill during the chunk-1 decision, a cold clone of a pruned run after a restart, a
resumed run judged against values recorded before the restart), then a property test over random rung histories:
runs ending early, kills at random points of a decision (any prefix of its events kept, the run's checkpoint
written or not), clones and resumes after each restart; every stop equals the uninterrupted process' stop, after
the same chunks (a run trained again below a rung is judged once it is back there).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from kernel_scheduler import (
    ChunkResult,
    Decisions,
    EarlyStoppingPolicy,
    MedianStopping,
    RunState,
    RunStatus,
    SuccessiveHalving,
)

S = RunStatus
METRIC = "eval_loss"


@dataclass
class Run:
    curve: list[float]  # its eval_loss after each chunk (its total chunks: len(curve))
    done: int = 0
    status: RunStatus = S.ONGOING
    exempt_through: int = 0
    stopped_at: int = 0  # the rung the policy stopped it at (0: not stopped by the policy)


@dataclass
class Process:
    """One kernel: a policy over runs in a one-device rotation (fewest chunks first), journaling to ``events``."""

    policy: EarlyStoppingPolicy
    runs: dict[int, Run]
    events: list[dict[str, Any]] = field(default_factory=list)
    stops: list[tuple[int, int, str]] = field(default_factory=list)  # (run, rung, reason) applied, in order

    def states(self) -> list[RunState]:
        return [
            RunState(i, r.status, r.done, len(r.curve), exempt_through=r.exempt_through)
            for i, r in sorted(self.runs.items())
        ]

    def apply(self, decisions: Decisions, keep: int | None = None) -> list[tuple[int, int, str]]:
        """Apply the stops (only the first ``keep`` of them: the kernel died before the others applied)."""
        stops = [(s.run_id, s.chunk, s.reason) for s in decisions.stops]
        for run_id, rung, reason in stops[:keep]:
            run = self.runs[run_id]
            assert run.status is S.ONGOING, f"a stop for run {run_id}, which is {run.status}"
            run.status, run.stopped_at = S.STOPPED, rung
            self.stops.append((run_id, rung, reason))
        return stops

    def next_run(self) -> int | None:
        active = [(r.done, i) for i, r in self.runs.items() if r.status is S.ONGOING]
        return min(active)[1] if active else None

    def chunk(self, run_id: int) -> Decisions:
        """``run_id`` trains its next chunk; the policy's decisions on it (not applied yet)."""
        run = self.runs[run_id]
        run.done += 1
        if run.done == len(run.curve):
            run.status = S.COMPLETED
        result = ChunkResult(run_id, run.done, {METRIC: run.curve[run.done - 1]}, run.done == len(run.curve))
        return self.policy.on_chunk(result, self.states()) + self.policy.on_change(
            self.states(), self.states()
        )

    def step(self) -> bool:
        run_id = self.next_run()
        if run_id is None:
            return False
        self.apply(self.chunk(run_id))
        return True

    def run_to_end(self) -> None:
        while self.step():
            pass

    def clone(self, curve: list[float]) -> int:
        run_id = max(self.runs) + 1
        self.runs[run_id] = Run(list(curve))
        self.apply(self.policy.on_change(self.states(), self.states()))
        return run_id

    def resume(self, run_id: int) -> None:
        run = self.runs[run_id]
        assert run.status is S.STOPPED and run.stopped_at, f"run {run_id} is {run.status}, not pruned"
        run.status, run.exempt_through = S.ONGOING, run.stopped_at
        self.apply(self.policy.on_change(self.states(), self.states()))


def journaled(policy: EarlyStoppingPolicy, events: list[dict[str, Any]], kept: list[dict[str, Any]]) -> int:
    return policy.keep_book(lambda e: events.append(dict(e)), kept)


def start(make: Callable[[], EarlyStoppingPolicy], curves: list[list[float]]) -> Process:
    proc = Process(make(), {i: Run(list(c)) for i, c in enumerate(curves, start=1)})
    journaled(proc.policy, proc.events, [])
    return proc


def kill_during_step(
    proc: Process,
    make: Callable[[], EarlyStoppingPolicy],
    cut: Callable[[int], int],
    checkpoint_written: bool,
) -> Process:
    """Run the next chunk, then kill the kernel inside its decision: ``cut(n)`` of its ``n`` journal events and
    stop applications are kept (in their order: events first). Returns the restarted kernel (stops it owes and
    decisions left open already applied at its first decision point)."""
    run_id = proc.next_run()
    assert run_id is not None
    mark = len(proc.events)
    decisions = proc.chunk(run_id)
    new = len(proc.events) - mark
    kept_n = cut(new + len(decisions.stops))
    proc.apply(decisions, keep=max(0, kept_n - new))
    kept = proc.events[: mark + min(kept_n, new)]
    runs = {
        i: Run(list(r.curve), r.done, r.status, r.exempt_through, r.stopped_at) for i, r in proc.runs.items()
    }
    lost_value = kept_n == 0 and any(e.get("run") == run_id for e in proc.events[mark:])
    ran = runs[run_id]
    if ran.status is S.COMPLETED and lost_value or not checkpoint_written and ran.status is not S.STOPPED:
        ran.done, ran.status = ran.done - 1, S.ONGOING  # its last chunk is trained again
    restarted = Process(make(), runs, events=list(kept), stops=list(proc.stops))  # the store keeps them
    journaled(restarted.policy, restarted.events, kept)
    for i, run in sorted(runs.items()):  # the store's metric rows of what each continued run trained
        if run.status is not S.COMPLETED:
            for c in range(1, run.done + 1):
                restarted.policy.restore_chunk(ChunkResult(i, c, {METRIC: run.curve[c - 1]}))
    restarted.apply(restarted.policy.on_change(restarted.states(), restarted.states()))
    return restarted


def sh(eta: int = 2, grace: int = 1) -> Callable[[], EarlyStoppingPolicy]:
    return lambda: SuccessiveHalving(METRIC, "min", eta, grace)


def by_run(stops: list[tuple[int, int, str]]) -> dict[int, list[tuple[int, str]]]:
    out: dict[int, list[tuple[int, str]]] = {}
    for run_id, rung, reason in stops:
        out.setdefault(run_id, []).append((rung, reason))
    return out


# ------------------------------------------------------------------------------------------- the smallest cases
FOUR = [[1.0] * 4, [2.0] * 4, [3.0] * 4, [4.0] * 4]  # run r's eval_loss is r throughout, 4 chunks each


def test_a_kill_during_the_chunk_1_decision_prunes_as_without_it() -> None:
    ref = start(sh(), FOUR)
    ref.run_to_end()
    assert by_run(ref.stops) == {
        3: [(1, "pruned at chunk 1/4: eval_loss 3 not in the best 2 of 4 at this rung (cutoff 2)")],
        4: [(1, "pruned at chunk 1/4: eval_loss 4 not in the best 2 of 4 at this rung (cutoff 2)")],
        2: [(2, "pruned at chunk 2/4: eval_loss 2 not in the best 1 of 2 at this rung (cutoff 1)")],
    }
    for kept in range(7):  # the 4th chunk's decision: value, closed, 4 judgements, then 2 stops to apply
        proc = start(sh(), FOUR)
        for _ in range(3):
            proc.step()
        proc = kill_during_step(proc, sh(), lambda n, k=kept: min(k, n), checkpoint_written=True)
        proc.run_to_end()
        assert by_run(proc.stops) == by_run(ref.stops), f"kept {kept} events"
        assert [proc.runs[r].status for r in (1, 2, 3, 4)] == [S.COMPLETED, S.STOPPED, S.STOPPED, S.STOPPED]
        assert [proc.runs[r].done for r in (1, 2, 3, 4)] == [4, 2, 1, 1]


def test_after_a_restart_a_cold_clone_of_a_pruned_run_is_pruned_at_rung_1() -> None:
    proc = start(sh(), FOUR)
    for _ in range(4):
        proc.step()  # rung 1 decided: 3 and 4 pruned
    proc = kill_during_step(proc, sh(), lambda n: n, checkpoint_written=True)  # run 1's chunk 2, then a kill
    clone = proc.clone([5.0] * 4)  # a cold clone of run 4, worse than every value recorded at rung 1
    proc.run_to_end()
    assert by_run(proc.stops)[clone] == [
        (1, "pruned at chunk 1/4: eval_loss 5 not in the best 2 of 5 at this rung (cutoff 2)")
    ]
    assert proc.runs[clone].done == 1


def test_a_run_resumed_after_a_restart_is_judged_against_values_recorded_before_it() -> None:
    curves = [[1.0, 1.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0], [3.0, 9.0, 9.0, 9.0], [4.0, 4.0, 4.0, 4.0]]
    proc = start(sh(), curves)
    for _ in range(5):
        proc.step()  # rung 1: 3, 4 pruned; run 1 did chunk 2
    proc = kill_during_step(
        proc, sh(), lambda n: n, checkpoint_written=True
    )  # run 2's chunk 2: rung 2 decided
    assert by_run(proc.stops)[2] == [
        (2, "pruned at chunk 2/4: eval_loss 2 not in the best 1 of 2 at this rung (cutoff 1)")
    ]
    proc.resume(3)  # exempt at rung 1; at rung 2 it meets the values 1 and 2 recorded before the restart
    proc.run_to_end()
    assert by_run(proc.stops)[3][-1] == (
        2,
        "pruned at chunk 2/4: eval_loss 9 not in the best 1 of 3 at this rung (cutoff 1)",
    )
    assert proc.runs[3].done == 2


def test_a_book_of_another_metric_or_malformed_events_are_left_out() -> None:
    policy = SuccessiveHalving(METRIC)
    taken = policy.keep_book(
        lambda e: None,
        [
            {"event": "value", "rung": 1, "run": 1, "metric": "loss", "value": 1.0},
            {"event": "value", "rung": "1", "run": 2, "metric": METRIC, "value": 1.0},
            {"event": "value", "rung": 1, "run": 3, "metric": METRIC, "value": "x"},
            {"event": "judged", "rung": 1, "run": 4, "outcome": "stopped"},  # no value, no decision: left out
            {"event": "value", "rung": 1, "run": 5, "metric": METRIC, "value": math.nan},
            ["value", 1, 6],  # type: ignore[list-item]
            {"event": "closed", "rung": 2, "values": 1},  # a rung with no value: left out
        ],
    )
    assert taken == 1
    assert math.isnan(policy._book.values(1)[5])  # the one value taken, NaN kept


# ------------------------------------------------------------------------------------------- the property
def random_policy(rng: random.Random) -> Callable[[], EarlyStoppingPolicy]:
    mode = rng.choice(("min", "max"))
    if rng.random() < 0.7:
        eta, grace = rng.choice((2, 3)), rng.choice((1, 1, 2))
        return lambda: SuccessiveHalving(METRIC, mode, eta, grace)
    grace, least = rng.choice((1, 2)), rng.choice((2, 3))
    return lambda: MedianStopping(METRIC, mode, grace, least)


def random_curve(rng: random.Random, chunks: int) -> list[float]:
    length = chunks if rng.random() < 0.7 else rng.randint(1, chunks)  # some runs end early
    return [math.nan if rng.random() < 0.05 else float(rng.randint(1, 6)) for _ in range(length)]


def history(seed: int) -> tuple[Process, Process]:
    """One random history run twice: uninterrupted, and with 1-2 kills at random decisions (user actions after
    each restart, the same actions at the same point of the uninterrupted one)."""
    rng = random.Random(seed)
    make = random_policy(rng)
    chunks = rng.choice((4, 6, 8))
    curves = [random_curve(rng, chunks) for _ in range(rng.randint(2, 6))]
    ref, proc = start(make, curves), start(make, curves)
    for _ in range(rng.randint(1, 2)):
        for _ in range(rng.randint(0, 2 * len(ref.runs))):
            if proc.next_run() is None:
                break
            proc.step()
            ref.step()
        if proc.next_run() is None:
            break
        ref.step()
        proc = kill_during_step(proc, make, lambda n: rng.randint(0, n), rng.random() < 0.7)
        while any(r.done < ref.runs[i].done for i, r in proc.runs.items()):  # a chunk whose checkpoint
            assert proc.step()  # the kill lost is trained again: both are at the same point
        actions(rng, ref, proc, chunks)
    ref.run_to_end()
    proc.run_to_end()
    return ref, proc


def actions(rng: random.Random, ref: Process, proc: Process, chunks: int) -> None:
    """The same user actions on both: cold clones, resumes of pruned runs."""
    for _ in range(rng.randint(0, 2)):
        if rng.random() < 0.5:
            curve = random_curve(rng, chunks)
            assert ref.clone(curve) == proc.clone(curve)
        else:
            pruned = [i for i, r in ref.runs.items() if r.status is S.STOPPED and r.stopped_at]
            if pruned:
                run_id = rng.choice(pruned)
                ref.resume(run_id)
                proc.resume(run_id)


@pytest.mark.parametrize("seed", range(150))
def test_every_decision_equals_the_uninterrupted_one(seed: int) -> None:
    ref, proc = history(seed)
    assert by_run(proc.stops) == by_run(ref.stops)
    assert {i: r.status for i, r in proc.runs.items()} == {i: r.status for i, r in ref.runs.items()}
    assert {i: r.done for i, r in proc.runs.items()} == {i: r.done for i, r in ref.runs.items()}


def test_without_the_book_a_restart_changes_decisions() -> None:
    """The property test can fail: a restarted policy that keeps no book decides differently in some histories."""

    class Forgetful(SuccessiveHalving):
        def keep_book(self, journal: Any, events: Any = ()) -> int:
            return 0

        def restore_chunk(self, result: ChunkResult) -> bool:
            return False

    differ = 0
    for seed in range(40):
        rng = random.Random(seed)
        ref, proc = start(sh(), FOUR), start(sh(), FOUR)
        steps = rng.randint(2, 6)
        for _ in range(steps):
            ref.step()
            proc.step()
        ref.step()
        proc = kill_during_step(proc, lambda: Forgetful(METRIC), lambda n: n, True)
        ref.run_to_end()
        proc.run_to_end()
        differ += by_run(proc.stops) != by_run(ref.stops)
    assert differ > 0


# ------------------------------------------------------------------------------------------- in the scheduler
def test_a_restarted_scheduler_decides_the_open_rung_before_any_run_trains_on() -> None:
    """The scheduler over the fake executor, restarted with every run at its chunk-1 checkpoint after a kill that
    kept rung 1's values and its decision but no judgement: the first turn prunes 3 and 4 there, before any of
    them trains chunk 2 (without the book: all four passed rung 1, steps 8, 4, 2, 2 instead of 8, 2, 1, 1)."""
    from kernel_scheduler import RunStart, Scheduler
    from kernel_scheduler.arbiter import DeviceArbiter
    from rapidfire_nb.testing.fakes import TIMEOUT, FakeExecutor, FakeSpec, Recorder

    specs = {r: FakeSpec(rows=16, batch=2, curve=(float(r),) * 8) for r in (1, 2, 3, 4)}  # 8 chunks of 1 step
    first = start(sh(), [[float(r)] * 8 for r in specs])
    for _ in range(4):
        first.chunk(first.next_run() or 0)  # chunk 1 of each run; its decisions never applied
    kept = [
        e for e in first.events if e["event"] != "judged"
    ]  # killed after the decision, before a judgement
    assert [e["event"] for e in kept] == ["value"] * 4 + ["closed"]

    fake = FakeExecutor(num_chunks=8)
    policy = SuccessiveHalving(METRIC)
    journaled(policy, [], kept)
    sched = Scheduler(
        fake, listener=Recorder(), idle_poll_s=0.002, arbiter=DeviceArbiter(), early_stopping=policy
    )
    for run_id, spec in specs.items():
        plan = fake.add_run(run_id, spec).plan  # the executor restores the run at its chunk-1 checkpoint
        fake.steps[run_id] = fake.last_boundary[run_id] = 1
        sched.add_run(run_id, spec, start=RunStart(plan, 1, plan.segments_done_at(1), plan.samples_seen(1)))
    sched.start()
    try:
        assert sched.wait(timeout=TIMEOUT)
        steps = {r: s.step for r in specs if (s := sched.run_snapshot(r)) is not None}
        status = {r: s.status for r in specs if (s := sched.run_snapshot(r)) is not None}
    finally:
        sched.close(timeout=TIMEOUT)
    assert not fake.violations, fake.violations
    assert steps == {1: 8, 2: 2, 3: 1, 4: 1}, steps
    assert status == {1: S.COMPLETED, 2: S.STOPPED, 3: S.STOPPED, 4: S.STOPPED}
