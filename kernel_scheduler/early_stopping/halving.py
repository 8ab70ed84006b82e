"""Successive halving on chunk rungs: at each rung only the best ``1/η`` of the runs go on."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .base import num, nums
from .rungs import RungPolicy, rank, worse

__all__ = ["SuccessiveHalving"]


def _positive_int(name: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    return value


class SuccessiveHalving(RungPolicy):
    """Successive halving with rungs counted in chunks (rows seen).

    Rungs are at ``grace_chunks · η^k`` chunks (1, 2, 4, ... for ``grace_chunks=1, reduction_factor=2``). At a
    rung with ``n`` recorded values the best ``max(1, n // η)`` go on; a run strictly worse than the last of them
    (the cutoff) stops, so runs tied with the cutoff all go on. A NaN value ranks last. A rung is decided once every
    run in the rotation has reached it; a run reaching it later is judged on arrival against every value recorded
    there (ASHA's rule, see :mod:`~kernel_scheduler.early_stopping.rungs`).

    Args:
        metric: the metric compared (any logged eval metric: ``eval_loss``, ``eval_rewards/margins``, ...).
        mode: ``"min"`` (lower is better) or ``"max"``.
        reduction_factor: ``η`` (an integer >= 2).
        grace_chunks: chunks every run trains before the first rung (an integer >= 1).

    Raises:
        ValueError: a bad argument (the message names it).

    Example:
        8 runs, ``num_chunks=8``, ``η=2``: 4 stop after chunk 1, 2 more after chunk 2, 1 more after chunk 4;
        the last one trains to the end.
    """

    def __init__(
        self,
        metric: str = "eval_loss",
        mode: str = "min",
        reduction_factor: int = 2,
        grace_chunks: int = 1,
    ) -> None:
        super().__init__(metric, mode)
        self.reduction_factor = _positive_int("reduction_factor", reduction_factor, 2)
        self.grace_chunks = _positive_int("grace_chunks", grace_chunks, 1)

    @property
    def name(self) -> str:
        return f"successive halving (η={self.reduction_factor})"

    def next_rung(self, after: int, last: int) -> int | None:
        rung = self.grace_chunks
        while rung <= after:
            rung *= self.reduction_factor
        return rung if rung <= last else None

    def is_rung(self, chunk: int) -> bool:
        if chunk < self.grace_chunks or chunk % self.grace_chunks:
            return False
        k = chunk // self.grace_chunks
        while k % self.reduction_factor == 0:
            k //= self.reduction_factor
        return k == 1

    def judge(self, run_id: int, rung: int, total_chunks: int, values: Mapping[int, float]) -> str | None:
        ranked = rank(values, self.mode)
        keep = max(1, len(ranked) // self.reduction_factor)
        cutoff = ranked[keep - 1][1]
        value = values[run_id]
        if not worse(value, cutoff, self.mode):
            return None
        where = f"pruned at chunk {rung}/{total_chunks}" if total_chunks else f"pruned at chunk {rung}"
        if math.isnan(value):
            return (
                f"{where}: {self.metric} is NaN; the best {keep} of {len(ranked)} at this rung go on "
                f"(cutoff {num(cutoff)})"
            )
        shown, cutoff_shown = nums(value, cutoff)
        return (
            f"{where}: {self.metric} {shown} not in the best {keep} of {len(ranked)} at this rung "
            f"(cutoff {cutoff_shown})"
        )

    def describe(self) -> str:
        grace = f"grace {self.grace_chunks} chunk" + ("s" if self.grace_chunks != 1 else "")
        return f"SuccessiveHalving({self.metric}, {self.mode}, η={self.reduction_factor}, {grace})"

    def __repr__(self) -> str:
        return (
            f"SuccessiveHalving(metric={self.metric!r}, mode={self.mode!r}, "
            f"reduction_factor={self.reduction_factor}, grace_chunks={self.grace_chunks})"
        )
