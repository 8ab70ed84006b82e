"""Chunk boundaries (kernel_scheduler.chunks.plan_chunks) and the "same rows per chunk" fairness invariant."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_scheduler import ChunkPlan, ChunkPlanError, plan_chunks


def _plan(n: int, k: int, b: int, total: int | None = None, **kw: int) -> ChunkPlan:
    return plan_chunks(n, k, b, total if total is not None else math.ceil(n / b), **kw)


# ------------------------------------------------------------------ exact boundaries
@pytest.mark.parametrize(
    "n,k,b,total,boundaries,labels",
    [
        # 16 rows, 4 per step: one step per chunk
        (16, 4, 4, 4, (1, 2, 3, 4), ((1, 1), (1, 2), (1, 3), (1, 4))),
        # 16 rows, 2 per step, 4 chunks of 4 rows = 2 steps each
        (16, 4, 2, 8, (2, 4, 6, 8), ((1, 1), (1, 2), (1, 3), (1, 4))),
        # partial last batch: 10 rows, 4 per step -> 3 steps (4, 4, 2 rows); chunk 1 = 5 rows -> step 2
        (10, 2, 4, 3, (2, 3), ((1, 1), (1, 2))),
        # the same over 2 epochs
        (10, 2, 4, 6, (2, 3, 5, 6), ((1, 1), (1, 2), (2, 1), (2, 2))),
        # 3 epochs of 2 steps, 2 chunks: one step per chunk
        (8, 2, 4, 6, (1, 2, 3, 4, 5, 6), ((1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (3, 2))),
        # max_steps ends inside chunk 2 of epoch 1
        (16, 2, 2, 6, (4, 6), ((1, 1), (1, 2))),
        # max_steps ends inside chunk 1 of epoch 2
        (16, 2, 2, 11, (4, 8, 11), ((1, 1), (1, 2), (2, 1))),
        # max_steps ends inside the very first chunk
        (100, 4, 10, 2, (2,), ((1, 1),)),
        # num_chunks == steps per epoch (exact and with a partial last batch)
        (9, 3, 3, 3, (1, 2, 3), ((1, 1), (1, 2), (1, 3))),
        (10, 3, 4, 3, (1, 2, 3), ((1, 1), (1, 2), (1, 3))),
        # one chunk: the epoch is the chunk
        (10, 1, 3, 8, (4, 8), ((1, 1), (2, 1))),
        # uneven chunks: 10 rows / 3 chunks, 1 row per step -> rows 4, 7, 10
        (10, 3, 1, 10, (4, 7, 10), ((1, 1), (1, 2), (1, 3))),
    ],
)
def test_exact_boundaries(
    n: int, k: int, b: int, total: int, boundaries: tuple[int, ...], labels: tuple[tuple[int, int], ...]
) -> None:
    plan = plan_chunks(n, k, b, total)
    assert plan.boundaries == boundaries
    assert plan.labels == labels
    assert plan.num_segments == len(boundaries)
    assert (plan.num_chunks, plan.rows_per_epoch, plan.rows_per_step, plan.total_steps) == (k, n, b, total)
    assert plan.steps_per_epoch == math.ceil(n / b)


def test_partial_last_batch_samples_seen() -> None:
    plan = plan_chunks(10, 2, 4, 6)
    assert [plan.samples_seen(s) for s in range(7)] == [0, 4, 8, 10, 14, 18, 20]
    assert plan.epoch_at(3) == 1.0 and plan.epoch_at(4) == pytest.approx(4 / 3)


def test_step_multiple_rounds_boundaries_up() -> None:
    # raw boundaries 4, 8, 12, 16 -> multiples of 3; the last step is always a boundary
    plan = plan_chunks(32, 4, 2, 16, step_multiple=3)
    assert plan.boundaries == (6, 9, 12, 16)
    assert plan.labels == ((1, 1), (1, 2), (1, 3), (1, 4))


def test_step_multiple_merges_chunks_that_round_to_the_same_step() -> None:
    # raw 2, 4, 6, 8 -> 3, 6, 6, 8: chunk 3 ends where chunk 2 ends, so they form one segment
    plan = plan_chunks(16, 4, 2, 8, step_multiple=3)
    assert plan.boundaries == (3, 6, 8)
    assert plan.labels == ((1, 1), (1, 3), (1, 4))


def test_step_multiple_over_two_epochs_keeps_boundaries_increasing() -> None:
    plan = plan_chunks(12, 3, 2, 12, step_multiple=4)  # raw 2, 4, 6 | 8, 10, 12
    assert plan.boundaries == (4, 8, 12)
    assert plan.boundaries[-1] == plan.total_steps


def test_explicit_steps_per_epoch() -> None:
    plan = plan_chunks(10, 2, 4, 6, steps_per_epoch=3)
    assert plan.steps_per_epoch == 3
    assert plan.boundaries == (2, 3, 5, 6)


def test_segments_done_at_and_label() -> None:
    plan = plan_chunks(10, 2, 4, 6)  # (2, 3, 5, 6)
    assert [plan.segments_done_at(s) for s in range(7)] == [0, 0, 1, 2, 2, 3, 4]
    assert plan.label(0) == (1, 1) and plan.label(3) == (2, 2)
    assert plan.label(99) == (2, 2)  # past the end: the last label


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("k", [0, -1])
def test_num_chunks_below_one(k: int) -> None:
    with pytest.raises(ChunkPlanError, match="num_chunks must be >= 1"):
        plan_chunks(16, k, 4, 4)


def test_more_chunks_than_steps_per_epoch() -> None:
    with pytest.raises(
        ChunkPlanError, match=r"num_chunks=4 is larger than the 3 optimizer steps.*num_chunks <= 3"
    ):
        plan_chunks(10, 4, 4, 3)  # ceil(10/4) = 3 steps per epoch
    plan_chunks(10, 3, 4, 3)  # the largest legal value


def test_empty_training_set() -> None:
    with pytest.raises(ChunkPlanError, match="empty"):
        plan_chunks(0, 1, 4, 1)


@pytest.mark.parametrize("b,total,mult", [(0, 4, 1), (4, 0, 1), (4, 4, 0), (-2, 4, 1)])
def test_non_positive_sizes(b: int, total: int, mult: int) -> None:
    with pytest.raises(ChunkPlanError, match="must be >= 1"):
        plan_chunks(16, 2, b, total, step_multiple=mult)


def test_chunk_plan_error_is_a_value_error() -> None:
    assert issubclass(ChunkPlanError, ValueError)


# ------------------------------------------------------------------ invariants (hypothesis)
BATCHES = [bs * ga for bs in (1, 2, 3, 4, 8) for ga in (1, 2, 4)]


@st.composite
def plans(draw: st.DrawFn) -> tuple[int, int, int, int]:
    """(N, K, B, total_steps) with K <= steps per epoch; total may end anywhere, over up to 3 epochs."""
    b = draw(st.sampled_from(BATCHES))
    n = draw(st.integers(1, 600))
    spe = math.ceil(n / b)
    k = draw(st.integers(1, min(spe, 12)))
    total = draw(st.one_of(st.integers(1, 3 * spe), st.sampled_from([spe, 2 * spe, 3 * spe])))
    return n, k, b, total


def _check_rows_at_boundaries(plan: ChunkPlan) -> None:
    n, k, b, spe = plan.rows_per_epoch, plan.num_chunks, plan.rows_per_step, plan.steps_per_epoch
    for step, (epoch, chunk) in zip(plan.boundaries, plan.labels):
        if step == plan.total_steps and (step - 1) // spe + 1 == epoch and step % spe:
            # the run ends inside this chunk (max_steps): it has consumed at most the chunk's rows
            rows = plan.samples_seen(step) - (epoch - 1) * n
            assert rows * k < chunk * n + b * k
            continue
        rows = plan.samples_seen(step) - (epoch - 1) * n
        # k-th boundary: at least k*N/K rows of the epoch consumed, less than one batch more
        assert chunk * n <= rows * k < chunk * n + b * k, (step, epoch, chunk, rows)
        # ... and it is the *first* such step
        if step > (epoch - 1) * spe + 1:
            before = plan.samples_seen(step - 1) - (epoch - 1) * n
            assert before * k < chunk * n


@settings(max_examples=150, deadline=None)
@given(plans())
def test_plan_invariants(p: tuple[int, int, int, int]) -> None:
    n, k, b, total = p
    plan = plan_chunks(n, k, b, total)
    spe = plan.steps_per_epoch
    assert spe == math.ceil(n / b)
    bs = plan.boundaries
    assert all(x < y for x, y in itertools.pairwise(bs)), "boundaries strictly increasing"
    assert bs[0] >= 1 and bs[-1] == total
    assert len(plan.labels) == len(bs)
    # labels: epochs 1.., chunks 1..K each in order exactly once (a prefix of that sequence)
    full = [(e, c) for e in range(1, math.ceil(total / spe) + 1) for c in range(1, k + 1)]
    assert list(plan.labels) == full[: len(bs)]
    if total % spe == 0:
        assert list(plan.labels) == full, "whole epochs: every chunk of every epoch, exactly once"
    for step, (epoch, _) in zip(bs, plan.labels):
        assert (epoch - 1) * spe < step <= epoch * spe, "a boundary lies inside its epoch"
    # samples_seen: never more than the rows that exist, never more than steps x B
    epochs = math.ceil(total / spe)
    for step in range(total + 1):
        seen = plan.samples_seen(step)
        assert seen <= epochs * n and seen <= step * b
        assert step == 0 or seen > plan.samples_seen(step - 1)
    assert [plan.segments_done_at(s) for s in bs] == list(range(1, len(bs) + 1))
    assert plan.segments_done_at(0) == 0
    _check_rows_at_boundaries(plan)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 1000), k=st.integers(1, 16), epochs=st.integers(1, 3))
def test_same_rows_per_chunk_for_every_batch_size(n: int, k: int, epochs: int) -> None:
    """Runs with different rows per step end chunk c of every epoch within one batch after c*N/K rows."""
    for b in BATCHES:
        spe = math.ceil(n / b)
        if k > spe:
            with pytest.raises(ChunkPlanError):
                plan_chunks(n, k, b, epochs * spe)
            continue
        plan = plan_chunks(n, k, b, epochs * spe)
        assert plan.num_segments == epochs * k
        for i, step in enumerate(plan.boundaries):
            epoch, chunk = plan.labels[i]
            assert (epoch, chunk) == (i // k + 1, i % k + 1)
            rows = plan.samples_seen(step) - (epoch - 1) * n
            lo = chunk * n / k
            assert lo <= rows < lo + b, (b, epoch, chunk, rows)
            # in integers, no float rounding: K*rows in [c*N, c*N + K*B)
            assert chunk * n <= rows * k < chunk * n + b * k


# ------------------------------------------------------------------ computed on demand (issue 12, item 5)
def _reference(
    n: int, k: int, b: int, total: int, spe: int, mult: int
) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """The plan materialised one chunk at a time (the straightforward algorithm, for small runs only)."""
    boundaries: list[int] = []
    labels: list[tuple[int, int]] = []
    epoch = 0
    while not boundaries or boundaries[-1] < total:
        for c in range(1, k + 1):
            step = epoch * spe + min(spe, math.ceil(c * n / (k * b)))
            step = min(total, math.ceil(step / mult) * mult)
            if boundaries and step <= boundaries[-1]:
                labels[-1] = (epoch + 1, c)
                continue
            boundaries.append(step)
            labels.append((epoch + 1, c))
            if step >= total:
                break
        epoch += 1
    return tuple(boundaries), tuple(labels)


@settings(max_examples=300, deadline=None)
@given(
    b=st.sampled_from([1, 2, 3, 4, 8]),
    n=st.integers(1, 60),
    extra=st.integers(-1, 2),
    mult=st.sampled_from([1, 2, 3, 4, 6, 7]),
    k_frac=st.floats(0, 1),
    total_frac=st.floats(0, 1),
)
def test_computed_plan_equals_the_materialised_one(
    b: int, n: int, extra: int, mult: int, k_frac: float, total_frac: float
) -> None:
    spe = max(1, math.ceil(n / b) + extra)
    k = 1 + int(k_frac * (spe - 1))
    total = 1 + int(total_frac * (6 * spe + 4))
    plan = plan_chunks(n, k, b, total, steps_per_epoch=spe, step_multiple=mult)
    boundaries, labels = _reference(n, k, b, total, spe, mult)
    assert plan.boundaries == boundaries and plan.labels == labels
    assert plan.num_segments == len(boundaries)
    assert [plan.boundary(i) for i in range(len(boundaries))] == list(boundaries)
    assert [plan.label(i) for i in range(len(labels) + 2)] == [*labels, labels[-1], labels[-1]]
    assert [plan.segments_done_at(s) for s in range(total + 2)] == [
        sum(1 for x in boundaries if x <= s) for s in range(total + 2)
    ]
    assert [s for s in range(total + 2) if plan.is_boundary(s)] == list(boundaries)


def test_an_absurd_run_length_is_planned_at_once_without_memory() -> None:
    import time
    import tracemalloc

    tracemalloc.start()
    t0 = time.perf_counter()
    plan = plan_chunks(32, 4, 2, 10**12)  # was: one entry per chunk, 3 s and 431 MB for 10**7 steps
    n = plan.num_segments
    last = plan.boundary(n - 1)
    middle = plan.segments_done_at(5 * 10**11 + 1)
    label = plan.label(10**9)
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert (n, last, middle, label) == (250_000_000_000, 10**12, 125_000_000_000, (250_000_001, 1))
    assert plan.is_boundary(10**12) and plan.is_boundary(8) and not plan.is_boundary(9)
    assert plan.boundaries[-1] == 10**12 and len(plan.labels) == n
    assert elapsed < 0.5 and peak < 1_000_000, (elapsed, peak)


def test_boundary_out_of_range() -> None:
    plan = plan_chunks(10, 2, 4, 6)  # (2, 3, 5, 6)
    assert plan.boundary(0) == 2 and plan.boundary(3) == 6
    for i in (-1, 4):
        with pytest.raises(IndexError):
            plan.boundary(i)
    assert (
        plan.boundaries[-1] == 6 and plan.boundaries[1:3] == [3, 5] and list(plan.boundaries) == [2, 3, 5, 6]
    )


def test_full_chunks_leave_out_a_last_chunk_that_max_steps_cuts_short() -> None:
    """40 rows, batch 4, 4 chunks: chunk ends at steps 3, 5, 8, 10. A run's whole chunks are the ones whose rows
    it consumed; max_steps inside a chunk does not complete it (what early stopping compares runs by)."""
    assert [
        plan_chunks(40, 4, 4, n).full_chunks_at(plan_chunks(40, 4, 4, n).num_segments) for n in range(1, 11)
    ] == [0, 0, 1, 1, 2, 2, 2, 3, 3, 4]
    cut = plan_chunks(40, 4, 4, 12)  # 2 steps into epoch 2: 8 of its rows, under a chunk's 10
    assert (cut.chunks_at(5), cut.full_chunks_at(5)) == (5, 4)
    assert cut.full_chunks_at(3) == cut.chunks_at(3) == 3  # not the last segment: unchanged
    merged = plan_chunks(
        40, 4, 1, 25, step_multiple=20
    )  # segments end at 20 (chunk 2) and 25 (inside chunk 3)
    assert (merged.chunks_at(2), merged.full_chunks_at(2)) == (3, 2)
    assert plan_chunks(40, 4, 4, 20).full_chunks_at(8) == 8  # ends on an epoch end: every chunk whole
