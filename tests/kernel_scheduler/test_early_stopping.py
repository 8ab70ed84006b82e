"""Early-stopping policies (kernel_scheduler.early_stopping), pure: rungs, ties, late joiners, stragglers, resumed
runs, mode="max", a missing or NaN metric, bad arguments. No scheduler, no torch: reports go in by hand."""

from __future__ import annotations

import math
from collections.abc import Sequence

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

NAN = math.nan
ON = RunStatus.ONGOING


class World:
    """Runs with a chunk count each; ``report`` ends one chunk of a run and returns the stops' run ids."""

    def __init__(
        self, policy: EarlyStoppingPolicy, n: int, total: int = 8, metric: str = "eval_loss"
    ) -> None:
        self.policy = policy
        self.metric = metric
        self.total = total
        self.done = {r: 0 for r in range(1, n + 1)}
        self.status = {r: ON for r in self.done}
        self.exempt_through = {r: 0 for r in self.done}
        self.reasons: dict[int, str] = {}
        self.notes: list[str] = []

    def states(self) -> list[RunState]:
        return [
            RunState(r, self.status[r], c, self.total, exempt_through=self.exempt_through[r])
            for r, c in self.done.items()
        ]

    def _take(self, d: Decisions) -> list[int]:
        self.notes += d.notes
        for stop in d.stops:
            assert self.status[stop.run_id] is ON, f"stop for run {stop.run_id}, which is not active"
            self.status[stop.run_id] = RunStatus.STOPPED
            self.reasons[stop.run_id] = stop.reason
        return [s.run_id for s in d.stops]

    def report(self, run_id: int, value: float | None, metric: str | None = None) -> list[int]:
        metric = metric or self.metric
        self.done[run_id] += 1
        chunk = self.done[run_id]
        if chunk >= self.total:
            self.status[run_id] = RunStatus.COMPLETED
        metrics = {} if value is None else {metric: value}
        return self._take(self.policy.on_chunk(ChunkResult(run_id, chunk, metrics), self.states()))

    def change(self) -> list[int]:
        return self._take(self.policy.on_change(self.states(), self.states()))

    def add(self, run_id: int, chunks_done: int = 0) -> None:
        self.done[run_id] = chunks_done
        self.status[run_id] = ON
        self.exempt_through[run_id] = 0

    def round(self, values: dict[int, float | None]) -> list[int]:
        """Every active run in ``values`` ends its next chunk, in id order; all stops of the round."""
        out: list[int] = []
        for r, v in values.items():
            if self.status[r] is ON:
                out += self.report(r, v)
        return out

    def active(self) -> list[int]:
        return [r for r, s in self.status.items() if s is ON]


def sh(**kw: object) -> SuccessiveHalving:
    return SuccessiveHalving(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("eta", "grace", "rungs"),
    [(2, 1, [1, 2, 4, 8, 16]), (3, 1, [1, 3, 9]), (2, 2, [2, 4, 8, 16]), (4, 3, [3, 12])],
)
def test_rungs_are_at_grace_times_powers_of_eta(eta: int, grace: int, rungs: list[int]) -> None:
    p = sh(reduction_factor=eta, grace_chunks=grace)
    assert [c for c in range(1, 20) if p.is_rung(c)] == [r for r in rungs if r < 20]


def test_eight_runs_halve_at_chunks_1_2_4_and_one_trains_to_the_end() -> None:
    w = World(sh(), 8)
    # run r's loss is r at every chunk: the lower ids are better
    losses = {r: float(r) for r in range(1, 9)}
    assert w.round(dict(losses)) == [5, 6, 7, 8]  # rung 1: decided once all 8 reached it, best 4 go on
    assert w.round(dict(losses)) == [3, 4]  # rung 2: best 2 of the 4 recorded there
    assert w.round(dict(losses)) == []  # chunk 3 is no rung
    assert w.round(dict(losses)) == [2]  # rung 4
    for _ in range(4):
        assert w.round(dict(losses)) == []
    assert w.status[1] is RunStatus.COMPLETED
    assert w.reasons[8] == ("pruned at chunk 1/8: eval_loss 8 not in the best 4 of 8 at this rung (cutoff 4)")
    assert w.reasons[2] == "pruned at chunk 4/8: eval_loss 2 not in the best 1 of 2 at this rung (cutoff 1)"


def test_a_rung_waits_for_every_run_in_the_rotation() -> None:
    w = World(sh(), 4)
    assert w.report(4, 9.0) == [] and w.report(3, 8.0) == [] and w.report(2, 7.0) == []
    assert w.report(1, 1.0) == [4, 3]  # the last one to reach chunk 1 decides it (in arrival order)


def test_ties_with_the_cutoff_all_go_on() -> None:
    w = World(sh(), 4)
    assert w.round({1: 1.0, 2: 2.0, 3: 2.0, 4: 3.0}) == [4]  # 2 and 3 tie with the cutoff 2: both go on
    assert set(w.active()) == {1, 2, 3}


def test_all_equal_nobody_is_pruned() -> None:
    w = World(sh(), 4)
    assert w.round({r: 0.5 for r in range(1, 5)}) == []


def test_mode_max_keeps_the_highest() -> None:
    w = World(sh(metric="eval_rewards/margins", mode="max"), 4)
    out = []
    for r, v in {1: 0.1, 2: 0.9, 3: 0.5, 4: -0.2}.items():
        out += w.report(r, v, metric="eval_rewards/margins")
    assert out == [1, 4]
    assert "eval_rewards/margins 0.1 not in the best 2 of 4" in w.reasons[1]
    assert "(cutoff 0.5)" in w.reasons[1]


def test_nan_ranks_worst_and_the_reason_says_nan() -> None:
    w = World(sh(), 4)
    assert w.round({1: NAN, 2: 5.0, 3: 1.0, 4: 9.0}) == [1, 4]
    assert w.reasons[1] == (
        "pruned at chunk 1/8: eval_loss is NaN; the best 2 of 4 at this rung go on (cutoff 5)"
    )
    assert "NaN" not in w.reasons[4]


def test_all_nan_nobody_is_pruned() -> None:
    w = World(sh(), 2)
    assert w.round({1: NAN, 2: NAN}) == []


def test_a_missing_metric_is_not_judged_and_says_so_once() -> None:
    w = World(sh(metric="eval_acc"), 4, metric="eval_acc")
    assert w.round({1: 1.0, 2: None, 3: 3.0, 4: None}) == [3]  # judged among the 2 that logged it
    assert 2 in w.active() and 4 in w.active()
    assert len(w.notes) == 1
    assert "run 2 logged no 'eval_acc' in chunk 1" in w.notes[0]
    assert "it logged no metric" in w.notes[0]
    w.round({1: None, 2: None, 4: None})
    assert len(w.notes) == 1  # said once


def test_the_note_names_what_was_logged() -> None:
    p = sh(metric="eval_acc")
    d = p.on_chunk(ChunkResult(1, 1, {"eval_loss": 1.0, "loss": 2.0}), [RunState(1, ON, 1, 8)])
    assert "it logged eval_loss, loss" in d.notes[0]


def test_a_late_joiner_is_judged_on_arrival_against_the_recorded_values() -> None:
    w = World(sh(), 4)
    assert w.round({1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0}) == [3, 4]
    w.add(5)  # a cold clone: rung 1 is decided already
    assert w.report(5, 3.5) == [5]  # 5 values at rung 1, the best 2 go on: cutoff 2
    assert w.reasons[5] == "pruned at chunk 1/8: eval_loss 3.5 not in the best 2 of 5 at this rung (cutoff 2)"
    w.add(6)
    assert w.report(6, 0.5) == []  # better than all: goes on, and nobody already past rung 1 is stopped again
    assert set(w.active()) == {1, 2, 6}


def test_a_late_joiner_holds_the_next_rung_until_it_arrives() -> None:
    w = World(sh(), 4)
    w.round({1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0})
    w.add(5)
    assert w.report(5, 0.1) == []  # joins 1 and 2
    assert w.report(1, 1.0) == [] and w.report(2, 3.0) == []  # rung 2 still open: run 5 has not reached it
    assert w.report(5, 0.1) == [1, 2]  # 3 values: the best 1 goes on (cutoff 0.1): 1 and 2 stop
    assert set(w.active()) == {5}


def test_a_straggler_out_of_the_rotation_does_not_hold_a_rung() -> None:
    w = World(sh(), 4)
    w.status[4] = RunStatus.INTERRUPTED  # e.g. its checkpoint is being restored, or a stopped run
    assert w.round({1: 1.0, 2: 2.0, 3: 3.0}) == [2, 3]  # 3 values: best 1 goes on
    w.status[4] = ON  # back: judged on arrival against the 3 recorded
    assert w.report(4, 2.5) == [4]
    assert "not in the best 2 of 4" in w.reasons[4]


def test_a_run_starting_past_a_rung_is_not_judged_there() -> None:
    w = World(sh(), 2)
    w.add(3, chunks_done=1)  # a warm clone at its parent's chunk 1
    assert w.round({1: 1.0, 2: 2.0}) == [2]
    assert w.report(3, 5.0) == []  # its chunk 2 is rung 2; run 1 has not reached it yet
    assert w.report(1, 1.0) == [3]
    assert "best 1 of 2" in w.reasons[3]


def test_a_run_the_user_resumed_is_not_pruned_again_at_that_rung() -> None:
    w = World(sh(), 4)
    w.round({1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0})
    w.status[4], w.exempt_through[4] = ON, 1  # the user resumed it after its prune at chunk 1
    assert w.change() == []
    assert w.report(1, 1.0) == [] and w.report(2, 2.0) == []
    assert w.report(4, 1.5) == [2, 4]  # rung 2 decided (best 1 of 3); 4 is judged there like anyone
    assert set(w.active()) == {1}


def test_an_exempt_run_is_not_stopped_but_its_value_counts() -> None:
    p = sh()
    runs = [RunState(1, ON, 1, 8), RunState(2, ON, 1, 8, exempt=True), RunState(3, ON, 0, 8)]
    assert not p.on_chunk(ChunkResult(1, 1, {"eval_loss": 1.0}), runs)
    runs = [RunState(1, ON, 1, 8), RunState(2, ON, 1, 8, exempt=True), RunState(3, ON, 1, 8)]
    p.on_chunk(ChunkResult(2, 1, {"eval_loss": 9.0}), runs)
    d = p.on_chunk(ChunkResult(3, 1, {"eval_loss": 5.0}), runs)
    assert [s.run_id for s in d.stops] == [3]  # 2 is worse but exempt; 3 is judged against 3 values
    assert "best 1 of 3" in d.stops[0].reason


def test_the_same_report_twice_decides_nothing_new() -> None:
    p = sh()
    runs: Sequence[RunState] = [RunState(1, ON, 1, 8), RunState(2, ON, 1, 8)]
    p.on_chunk(ChunkResult(1, 1, {"eval_loss": 1.0}), runs)
    first = p.on_chunk(ChunkResult(2, 1, {"eval_loss": 2.0}), runs)
    assert [s.run_id for s in first.stops] == [2]
    assert not p.on_chunk(ChunkResult(2, 1, {"eval_loss": 0.0}), runs)  # the first value stays
    assert not p.on_change(runs, runs)


def test_a_rung_past_a_short_runs_end_is_not_held_by_it() -> None:
    p = sh()
    runs = [RunState(1, ON, 2, 8), RunState(2, RunStatus.COMPLETED, 1, 1), RunState(3, ON, 2, 8)]
    p.on_chunk(ChunkResult(1, 2, {"eval_loss": 1.0}), runs)
    d = p.on_chunk(ChunkResult(3, 2, {"eval_loss": 2.0}), runs)
    assert [s.run_id for s in d.stops] == [3]


def test_median_stopping_after_warm_up() -> None:
    w = World(MedianStopping(grace_chunks=2, min_runs=3), 4)
    assert w.round({1: 1.0, 2: 2.0, 3: 3.0, 4: 9.0}) == []  # chunk 1: warm-up
    assert w.round({1: 1.0, 2: 2.0, 3: 3.0, 4: 9.0}) == [3, 4]  # medians of the others: 3, 2 (for 3 and 4)
    assert w.reasons[4] == (
        "stopped at chunk 2/8: eval_loss 9 is worse than the median 2 of the other 3 runs at this chunk"
    )
    assert w.round({1: 1.0, 2: 2.0}) == []  # only 2 runs with a value (min_runs=3): no comparison


def test_median_stopping_mode_max_and_nan() -> None:
    w = World(MedianStopping(metric="eval_reward", mode="max", grace_chunks=1, min_runs=2), 3)
    out = []
    for r, v in {1: 0.9, 2: NAN, 3: 0.2}.items():
        out += w.report(r, v, metric="eval_reward")
    assert out == [2, 3]
    assert w.reasons[2] == "stopped at chunk 1/8: eval_reward is NaN"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"metric": ""}, "metric must be the name of a logged metric"),
        ({"metric": 3}, "metric must be the name of a logged metric"),
        ({"mode": "minimize"}, "mode must be 'min'"),
        ({"reduction_factor": 1}, "reduction_factor must be an integer >= 2, got 1"),
        ({"reduction_factor": 2.5}, "reduction_factor must be an integer >= 2"),
        ({"reduction_factor": True}, "reduction_factor must be an integer >= 2"),
        ({"grace_chunks": 0}, "grace_chunks must be an integer >= 1, got 0"),
    ],
)
def test_bad_arguments_name_the_field(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        sh(**kw)


def test_median_bad_min_runs() -> None:
    with pytest.raises(ValueError, match="min_runs must be an integer >= 2, got 1"):
        MedianStopping(min_runs=1)


def test_describe_and_repr() -> None:
    assert sh().describe() == "SuccessiveHalving(eval_loss, min, η=2, grace 1 chunk)"
    assert repr(sh(mode="max", reduction_factor=3)) == (
        "SuccessiveHalving(metric='eval_loss', mode='max', reduction_factor=3, grace_chunks=1)"
    )
    assert sh().progress() == {
        "label": "SuccessiveHalving(eval_loss, min, η=2, grace 1 chunk)",
        "kind": "rungs",
        "name": "successive halving (η=2)",
        "metric": "eval_loss",
        "next_rung": None,  # no run seen yet
    }


def test_progress_says_the_next_rung_the_runs_reach() -> None:
    w = World(sh(), 4)
    w.change()
    assert w.policy.progress()["next_rung"] == 1
    w.round({1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0})  # rung 1: runs 3 and 4 stop
    w.change()
    assert w.policy.progress()["next_rung"] == 2
    w.round({1: 1.0, 2: 2.0})  # rung 2: run 2 stops
    w.change()
    assert w.policy.progress()["next_rung"] == 4
    for _ in range(5):  # run 1 trains on alone: rung 8 is its last chunk
        w.round({1: 1.0})
    w.change()
    assert w.policy.progress()["next_rung"] == 8
    w.round({1: 1.0})  # it completed: no rung is left
    w.change()
    assert w.policy.progress()["next_rung"] is None


@pytest.mark.parametrize(
    ("policy", "after", "rungs"),
    [
        (
            SuccessiveHalving(reduction_factor=3, grace_chunks=2),
            [0, 2, 5, 6, 17, 18],
            [2, 6, 6, 18, 18, None],
        ),
        (MedianStopping(grace_chunks=3), [0, 2, 3, 7, 18], [3, 3, 4, 8, None]),
    ],
)
def test_next_rung_matches_is_rung(
    policy: EarlyStoppingPolicy, after: list[int], rungs: list[int | None]
) -> None:
    assert isinstance(policy, (SuccessiveHalving, MedianStopping))
    assert [policy.next_rung(a, 18) for a in after] == rungs
    for a in range(0, 18):  # the shortcut equals the scan over is_rung
        assert policy.next_rung(a, 18) == next((c for c in range(a + 1, 19) if policy.is_rung(c)), None)
    assert MedianStopping().progress()["name"] == "median stopping"


def test_a_reason_never_prints_two_different_values_alike() -> None:
    """Issue 34 item 9: "6.144 is worse than the median 6.144" (both rounded to 4 digits)."""
    from kernel_scheduler.early_stopping.base import nums

    assert nums(6.14412, 6.14398) == ("6.1441", "6.144")
    assert nums(2.71, 2.43) == ("2.71", "2.43")  # 4 digits when they tell the values apart
    assert nums(1.0, 1.0) == ("1", "1")
    assert nums(float("nan"), 3.0) == ("NaN", "3")
    assert nums(1.0, 1.0 + 2**-52) == ("1", "1.0000000000000002")
    policy = MedianStopping(metric="eval_loss", min_runs=3)
    states = [RunState(r, RunStatus.ONGOING, 1, 8) for r in (1, 2, 3)]
    policy.on_chunk(ChunkResult(1, 1, {"eval_loss": 6.14398}), states)
    policy.on_chunk(ChunkResult(2, 1, {"eval_loss": 6.14398}), states)
    decisions = policy.on_chunk(ChunkResult(3, 1, {"eval_loss": 6.14412}), states)
    assert [s.reason for s in decisions.stops] == [
        "stopped at chunk 1/8: eval_loss 6.1441 is worse than the median 6.144 of the other 2 runs at this chunk"
    ]
