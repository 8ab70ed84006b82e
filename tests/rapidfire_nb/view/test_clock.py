"""rapidfire_nb.clock: training time frozen while nothing trains, the same for the kernel and the server; the
header's tqdm-like numbers."""

from __future__ import annotations

from typing import Any

import pytest

from kernel_scheduler import RunStatus
from rapidfire_nb import view
from rapidfire_nb.view import KernelState, StoreRows
from rapidfire_nb.view.clock import TrainingClock, fmt_duration, progress_stats, stats_text, training_seconds


def test_clock_counts_only_while_a_run_is_in_the_rotation() -> None:
    clock = TrainingClock()
    assert clock.observe(1, RunStatus.ONGOING, 100.0) is True  # training starts
    assert clock.observe(2, RunStatus.NEW, 101.0) is False
    assert clock.observe(1, RunStatus.STOPPED, 110.0) is False  # run 2 is still in the rotation
    assert clock.observe(2, RunStatus.COMPLETED, 130.0) is True  # nothing trains: the clock stops
    assert clock.to_meta() == {"busy_s": 30.0, "busy_since": None}
    # idle for 1000 s: elapsed does not move
    assert training_seconds(clock.to_meta(), 1130.0) == 30.0
    assert clock.observe(1, RunStatus.ONGOING, 1130.0) is True  # resumed
    assert training_seconds(clock.to_meta(), 1135.0) == 35.0


def test_a_dead_writers_open_stretch_ends_at_its_last_heartbeat() -> None:
    meta = {"busy_s": 10.0, "busy_since": 100.0}
    assert training_seconds(meta, 500.0, writer_alive=True) == 410.0
    assert training_seconds(meta, 500.0, writer_alive=False, last_beat=120.0) == 30.0
    assert training_seconds(meta, 500.0, writer_alive=False) == 10.0
    assert TrainingClock(meta, last_beat=120.0).busy_s == 30.0  # a restarted kernel keeps the total
    assert training_seconds(None, 5.0) == 0.0 and training_seconds({"busy_s": "x"}, 5.0) == 0.0


def _rows(clock: Any) -> StoreRows:
    runs = [
        {
            "run_id": 1,
            "status": "COMPLETED",
            "hparams": {},
            "completed_steps": 8,
            "total_steps": 8,
            "chunks_done": 4,
        },
        {
            "run_id": 2,
            "status": "STOPPED",
            "hparams": {},
            "completed_steps": 4,
            "total_steps": 8,
            "chunks_done": 2,
        },
    ]
    return StoreRows(meta={"created_at": 1.0, "num_chunks": 4, "clock": clock}, runs=runs)


def test_an_idle_experiment_shows_the_same_frozen_time_in_the_kernel_and_on_the_server() -> None:
    rows = _rows({"busy_s": 42.0, "busy_since": None})
    kernel = KernelState(started_at=1.0, num_chunks=4, hparam_columns=[], runs=[])
    seen = set()
    for now in (100.0, 5_000.0):
        k = view.kernel_snapshot("e", rows, kernel, now=now)
        s = view.store_snapshot("e", rows, writer_alive=True, last_beat=now - 1, now=now)
        seen |= {k["elapsed_s"], s["elapsed_s"]}
        assert k["training"] is False and s["training"] is False
    assert seen == {42.0}


def test_progress_stats_like_tqdm() -> None:
    runs = [
        {"run_id": 1, "status": "ONGOING", "completed_steps": 30, "total_steps": 100, "chunks_done": 1},
        {"run_id": 2, "status": "COMPLETED", "completed_steps": 100, "total_steps": 100, "chunks_done": 4},
        {"run_id": 3, "status": "STOPPED", "completed_steps": 20, "total_steps": 100, "chunks_done": 1},
        {"run_id": 4, "status": "DELETED", "completed_steps": 50, "total_steps": 100, "chunks_done": 2},
    ]
    stats = progress_stats(runs, elapsed_s=75.0, training=True)
    # planned: 100 (in rotation) + 100 (completed) + 20 (stopped: what it did); done 150
    assert stats["steps_planned"] == 220 and stats["steps_done"] == 150
    # the percentage is of the full budget (run 3's 80 steps it will not train included): 150 / 300
    assert stats["steps_budget"] == 300 and stats["short_runs"] == 1
    assert stats["percent"] == pytest.approx(50.0)
    assert stats["steps_per_s"] == pytest.approx(2.0)
    assert stats["s_per_chunk"] == pytest.approx(75.0 / 6)
    assert stats["eta_s"] == pytest.approx(70 / 2.0)  # run 1's 70 steps left at 2 steps/s
    assert stats_text(stats) == "50% · 1 run short of budget · 2 steps/s · 12.5 s/chunk · 0:35 left"
    idle = progress_stats(runs[1:], elapsed_s=75.0, training=False)
    assert idle["eta_s"] is None and "left" not in stats_text(idle)
    assert progress_stats([], 0.0, False)["percent"] is None


def test_100_percent_only_when_every_run_has_its_full_budget() -> None:
    full = [
        {"run_id": 1, "status": "COMPLETED", "completed_steps": 100, "total_steps": 100, "chunks_done": 4},
        {"run_id": 2, "status": "COMPLETED", "completed_steps": 100, "total_steps": 100, "chunks_done": 4},
    ]
    assert (
        stats_text(progress_stats(full, elapsed_s=50.0, training=False)) == "100% · 4 steps/s · 6.25 s/chunk"
    )
    # every run ended, one stopped at 99 of 100 steps: nothing is left to train, yet the text is not "100%"
    short = [full[0], {**full[1], "status": "STOPPED", "completed_steps": 99}]
    stats = progress_stats(short, elapsed_s=50.0, training=False)
    assert stats["percent"] == pytest.approx(99.5) and stats["short_runs"] == 1
    assert stats_text(stats).startswith("99% · 1 run short of budget · ")
    failed = [
        {**full[0], "status": "FAILED", "completed_steps": 10},
        {**full[1], "status": "INTERRUPTED", "completed_steps": 30},
    ]
    assert progress_stats(failed, elapsed_s=50.0, training=False)["short_runs"] == 2


def test_slow_steps_read_as_seconds_per_step() -> None:
    runs = [{"run_id": 1, "status": "ONGOING", "completed_steps": 2, "total_steps": 10, "chunks_done": 0}]
    assert "4 s/step" in stats_text(progress_stats(runs, elapsed_s=8.0, training=True))


@pytest.mark.parametrize(("s", "text"), [(None, "-"), (5.9, "0:05"), (65, "1:05"), (3725, "1:02:05")])
def test_fmt_duration(s: float | None, text: str) -> None:
    assert fmt_duration(s) == text
