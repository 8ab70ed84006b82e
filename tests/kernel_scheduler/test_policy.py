"""Scheduling policies (kernel_scheduler.policy): furthest behind first, ties by run id."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_scheduler import FurthestBehindFirst, RunStatus, RunView, SchedulingPolicy

S = RunStatus


def v(
    run_id: int, epoch: int = 1, chunk: int = 1, status: RunStatus = S.ONGOING, ready: bool = True
) -> RunView:
    return RunView(run_id, status, (epoch, chunk), ready)


@pytest.fixture
def policy() -> FurthestBehindFirst:
    return FurthestBehindFirst()


def test_all_level_picks_lowest_id(policy: FurthestBehindFirst) -> None:
    assert policy.choose([v(3), v(1), v(2)]) == 1


def test_fewest_chunks_first(policy: FurthestBehindFirst) -> None:
    assert policy.choose([v(1, 1, 3), v(2, 1, 2), v(3, 1, 4)]) == 2


def test_epoch_before_chunk(policy: FurthestBehindFirst) -> None:
    # run 1 is at chunk 1 of epoch 2, run 2 at chunk 4 of epoch 1: run 2 is behind
    assert policy.choose([v(1, 2, 1), v(2, 1, 4)]) == 2


def test_ties_by_run_id_whatever_the_input_order(policy: FurthestBehindFirst) -> None:
    views = [v(7, 1, 2), v(4, 1, 2), v(5, 1, 3), v(9, 1, 2)]
    for _ in range(10):
        random.shuffle(views)
        assert policy.choose(views) == 4


def test_a_late_joiner_catches_up(policy: FurthestBehindFirst) -> None:
    # a clone at chunk 1 goes before the others at chunk 3, however high its id
    assert policy.choose([v(1, 1, 3), v(2, 1, 3), v(10, 1, 1, status=S.NEW)]) == 10


def test_not_ready_runs_are_skipped(policy: FurthestBehindFirst) -> None:
    assert policy.choose([v(1, ready=False), v(2, 1, 3)]) == 2
    assert policy.choose([v(1, ready=False), v(2, ready=False)]) is None


@pytest.mark.parametrize("status", [S.STOPPED, S.COMPLETED, S.FAILED, S.DELETED, S.INTERRUPTED])
def test_parked_or_finished_runs_are_never_chosen(policy: FurthestBehindFirst, status: RunStatus) -> None:
    assert policy.choose([v(1, status=status), v(2, 3, 4)]) == 2
    assert policy.choose([v(1, status=status)]) is None


def test_new_runs_are_chosen(policy: FurthestBehindFirst) -> None:
    assert policy.choose([v(1, status=S.NEW)]) == 1


def test_empty(policy: FurthestBehindFirst) -> None:
    assert policy.choose([]) is None


def test_is_a_scheduling_policy() -> None:
    assert isinstance(FurthestBehindFirst(), SchedulingPolicy)
    with pytest.raises(TypeError):
        SchedulingPolicy()  # type: ignore[abstract]


views = st.lists(
    st.builds(
        RunView,
        run_id=st.integers(1, 30),
        status=st.sampled_from(list(RunStatus)),
        position=st.tuples(st.integers(1, 3), st.integers(1, 4)),
        ready=st.booleans(),
    ),
    max_size=8,
    unique_by=lambda r: r.run_id,
)


@settings(max_examples=100, deadline=None)
@given(views, st.randoms(use_true_random=False))
def test_policy_contract(rs: list[RunView], rnd: random.Random) -> None:
    """Contract for every SchedulingPolicy: idempotent, order-independent, only ready runs in rotation."""
    policy: SchedulingPolicy = FurthestBehindFirst()
    chosen = policy.choose(rs)
    candidates = [r for r in rs if r.status.in_rotation() and r.ready]
    if not candidates:
        assert chosen is None
        return
    assert chosen == policy.choose(rs), "idempotent"
    shuffled = list(rs)
    rnd.shuffle(shuffled)
    assert policy.choose(shuffled) == chosen, "independent of the input order"
    best = [r for r in candidates if r.run_id == chosen]
    assert best, "chose a run that is not ready or not in rotation"
    assert all((best[0].position, best[0].run_id) <= (r.position, r.run_id) for r in candidates)
