"""Median stopping: after a warm-up, a run worse than the median of the other runs at the same chunk stops."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping

from .base import nums
from .halving import _positive_int
from .rungs import RungPolicy, worse

__all__ = ["MedianStopping"]


class MedianStopping(RungPolicy):
    """Stop a run whose metric is worse than the median of the other runs' values at the same chunk.

    Every chunk from ``grace_chunks`` on is a rung. The median is taken over the other runs' finite values
    recorded at that chunk, and only when there are at least ``min_runs - 1`` of them; a run with a NaN value stops
    whenever one other run has a number there. Decided once every run in the rotation has reached the chunk; a
    run reaching it later is compared with every value recorded there (see
    :mod:`~kernel_scheduler.early_stopping.rungs`).

    Args:
        metric: the metric compared (any logged eval metric).
        mode: ``"min"`` (lower is better) or ``"max"``.
        grace_chunks: chunks every run trains before it can be stopped (an integer >= 1).
        min_runs: runs with a value at a chunk (this one included) needed to compare there (an integer >= 2).

    Raises:
        ValueError: a bad argument (the message names it).
    """

    def __init__(
        self, metric: str = "eval_loss", mode: str = "min", grace_chunks: int = 1, min_runs: int = 3
    ) -> None:
        super().__init__(metric, mode)
        self.grace_chunks = _positive_int("grace_chunks", grace_chunks, 1)
        self.min_runs = _positive_int("min_runs", min_runs, 2)

    @property
    def name(self) -> str:
        return "median stopping"

    def next_rung(self, after: int, last: int) -> int | None:
        rung = max(after + 1, self.grace_chunks)
        return rung if rung <= last else None

    def is_rung(self, chunk: int) -> bool:
        return chunk >= self.grace_chunks

    def judge(self, run_id: int, rung: int, total_chunks: int, values: Mapping[int, float]) -> str | None:
        others = [v for r, v in values.items() if r != run_id and not math.isnan(v)]
        value = values[run_id]
        where = f"stopped at chunk {rung}/{total_chunks}" if total_chunks else f"stopped at chunk {rung}"
        if math.isnan(value):
            return f"{where}: {self.metric} is NaN" if others else None
        if len(others) < self.min_runs - 1:
            return None
        median = statistics.median(others)
        if not worse(value, median, self.mode):
            return None
        shown, median_shown = nums(value, median)
        return (
            f"{where}: {self.metric} {shown} is worse than the median {median_shown} of the other "
            f"{len(others)} runs at this chunk"
        )

    def describe(self) -> str:
        return (
            f"MedianStopping({self.metric}, {self.mode}, grace {self.grace_chunks}, min {self.min_runs} runs)"
        )

    def __repr__(self) -> str:
        return (
            f"MedianStopping(metric={self.metric!r}, mode={self.mode!r}, grace_chunks={self.grace_chunks}, "
            f"min_runs={self.min_runs})"
        )
