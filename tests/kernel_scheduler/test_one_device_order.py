"""On one device, FairPlacement (the path every scheduler takes) picks exactly FurthestBehindFirst's run.

Random schedules: runs with their own chunk plans (batch sizes, GRPO-like ``step_multiple`` that merges chunks
into one segment, ``max_steps`` ending mid-epoch), joining late, stopped, resumed, not ready; at every turn both
choose, and the chosen run trains its next segment.
"""

from __future__ import annotations

import random

import pytest

from kernel_scheduler import (
    Assignment,
    ChunkPlan,
    DeviceView,
    FairPlacement,
    FurthestBehindFirst,
    PlacedRun,
    RunStatus,
    RunView,
    plan_chunks,
)

DEVICE = "device"


def _plan(rnd: random.Random, num_chunks: int) -> ChunkPlan:
    rows = rnd.randint(num_chunks * 4, 64)
    batch = rnd.randint(1, 4)
    per_epoch = -(-rows // batch)
    step_multiple = rnd.choice([1, 1, 2, 3])
    total = rnd.randint(max(1, per_epoch // 2), per_epoch * rnd.randint(1, 3))
    return plan_chunks(rows, num_chunks, batch, total, step_multiple=step_multiple)


def _choices(rnd: random.Random) -> int:
    """Play one random schedule; return how many turns were compared."""
    num_chunks = rnd.randint(1, 4)
    plans: dict[int, ChunkPlan] = {}
    done: dict[int, int] = {}
    status: dict[int, RunStatus] = {}
    ready: dict[int, bool] = {}

    def join() -> None:
        run_id = len(plans) + 1
        plans[run_id], done[run_id] = _plan(rnd, num_chunks), 0
        status[run_id], ready[run_id] = RunStatus.NEW, rnd.random() > 0.1

    for _ in range(rnd.randint(1, 5)):
        join()
    compared = 0
    for _ in range(200):
        views = [RunView(i, status[i], plans[i].label(done[i]), ready=ready[i]) for i in plans]
        placed = [
            PlacedRun(i, status[i], done[i], DEVICE, ready=ready[i], position=plans[i].label(done[i]))
            for i in plans
        ]
        expected = FurthestBehindFirst().choose(views)
        picks = FairPlacement().assign_free([DeviceView(DEVICE)], placed)
        got = picks[0].run_id if picks else None
        assert got == expected, (views, placed)
        assert all(p.move_from is None for p in picks)
        compared += 1
        event = rnd.random()
        if event < 0.05:
            join()
        elif event < 0.10 and plans:
            run_id = rnd.choice(list(plans))
            if status[run_id].in_rotation():
                status[run_id] = RunStatus.STOPPED
            elif status[run_id] is RunStatus.STOPPED:
                status[run_id] = RunStatus.ONGOING
        elif event < 0.15:
            run_id = rnd.choice(list(plans))
            ready[run_id] = not ready[run_id]
        elif got is not None:
            done[got] += 1
            status[got] = RunStatus.ONGOING
            if done[got] >= plans[got].num_segments:
                status[got] = RunStatus.COMPLETED
        elif not any(s.in_rotation() for s in status.values()):
            break
    return compared


@pytest.mark.parametrize("seed", range(40))
def test_fair_placement_on_one_device_is_furthest_behind_first(seed: int) -> None:
    assert _choices(random.Random(seed)) > 0


def test_a_run_whose_segments_span_chunks_does_not_hold_back_the_run_furthest_behind() -> None:
    """A one-chunk-a-segment run 3 segments in is at chunk 4; a GRPO-like run whose segments merge 3 chunks is 1
    segment in and at chunk 6. The fairness floor (1 segment, so at most 2) would hold the first back; it is
    furthest behind in chunks, so it trains next, as FurthestBehindFirst says."""
    one = plan_chunks(12, 6, 1, 24)  # a segment per chunk, 2 epochs
    merged = plan_chunks(12, 6, 1, 24, step_multiple=6)  # chunk ends rounded to 6 steps: 3 chunks a segment
    assert (merged.label(1), one.label(3)) == ((1, 6), (1, 4))
    runs = [
        PlacedRun(1, RunStatus.ONGOING, 1, DEVICE, position=merged.label(1)),
        PlacedRun(2, RunStatus.ONGOING, 3, DEVICE, position=one.label(3)),
    ]
    views = [RunView(1, RunStatus.ONGOING, merged.label(1)), RunView(2, RunStatus.ONGOING, one.label(3))]
    assert FurthestBehindFirst().choose(views) == 2
    assert FairPlacement().assign_free([DeviceView(DEVICE)], runs) == [Assignment(2, DEVICE)]
