"""Chunk maths: where each run's chunk boundaries fall, in optimizer steps.

Each epoch's training rows (``N``; prompts for GRPO) are split into ``K`` chunks of ``N/K`` rows. A run
consumes ``B`` rows per optimizer step (per-device batch x gradient accumulation x processes; the last step
of an epoch may be partial). Its k-th boundary in an epoch is the first optimizer step at which it has
consumed at least ``k*N/K`` rows of the epoch::

    s_k = min(S, ceil(k * N / (K * B)))        with S = optimizer steps per epoch = ceil(N / B)

so chunk k holds the same rows (in the order the run's sampler yields them for its seed) for every run with
the same seed, up to less than one effective batch at each edge, whatever its batch size. Boundaries can be
forced onto multiples of ``step_multiple`` global steps (GRPO: generation boundaries). A run whose
``max_steps`` ends inside a chunk ends there.

Proof that ``K <= S`` gives ``K`` distinct boundaries per epoch: ``S = ceil(N/B) >= K`` implies
``x = N/(K B) > (K-1)/K``, so ``k-1 < k x <= k`` and ``ceil(k x) = k`` whenever ``x < 1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["ChunkPlan", "ChunkPlanError", "plan_chunks"]


class ChunkPlanError(ValueError):
    """The chunking asked for cannot be planned (e.g. more chunks than optimizer steps per epoch)."""


@dataclass(frozen=True)
class ChunkPlan:
    """Where one run's chunks end.

    Attributes:
        num_chunks: chunks per epoch (``K``).
        rows_per_epoch: training rows per epoch (``N``), in rows (prompts for GRPO).
        rows_per_step: rows consumed by one optimizer step (``B``).
        steps_per_epoch: optimizer steps per epoch (``S``).
        total_steps: optimizer steps of the whole run (its ``max_steps`` or epochs x ``S``).
        boundaries: global optimizer step at the end of each segment; strictly increasing, last is
            ``total_steps``.
        labels: ``(epoch, chunk)`` of each segment, both 1-based.
    """

    num_chunks: int
    rows_per_epoch: int
    rows_per_step: int
    steps_per_epoch: int
    total_steps: int
    boundaries: tuple[int, ...]
    labels: tuple[tuple[int, int], ...]

    @property
    def num_segments(self) -> int:
        """Number of chunks the run will train in total (over all its epochs)."""
        return len(self.boundaries)

    def segments_done_at(self, step: int) -> int:
        """How many segments are complete once the run has made ``step`` optimizer steps."""
        return sum(1 for b in self.boundaries if b <= step)

    def samples_seen(self, step: int) -> int:
        """Training rows consumed after ``step`` optimizer steps (rows; partial last batch counted)."""
        epochs, within = divmod(step, self.steps_per_epoch)
        return epochs * self.rows_per_epoch + min(within * self.rows_per_step, self.rows_per_epoch)

    def label(self, segment: int) -> tuple[int, int]:
        """``(epoch, chunk)`` of segment ``segment`` (0-based); past the end, the last label."""
        return self.labels[min(segment, len(self.labels) - 1)]

    def chunks_at(self, segments: int) -> int:
        """Chunks done over all epochs once ``segments`` segments are complete (``(epoch - 1) * K + chunk`` of the
        last one's label; a segment merged by ``step_multiple`` counts the chunks it covers). 0 for 0 segments."""
        if segments <= 0:
            return 0
        epoch, chunk = self.label(segments - 1)
        return (epoch - 1) * self.num_chunks + chunk

    def epoch_at(self, step: int) -> float:
        """Fractional epoch after ``step`` optimizer steps (TRL's ``epoch`` convention)."""
        return step / self.steps_per_epoch


def plan_chunks(
    rows_per_epoch: int,
    num_chunks: int,
    rows_per_step: int,
    total_steps: int,
    steps_per_epoch: int | None = None,
    step_multiple: int = 1,
) -> ChunkPlan:
    """Plan a run's chunk boundaries.

    Args:
        rows_per_epoch: training rows per epoch (``N`` >= 1).
        num_chunks: chunks per epoch (``K`` >= 1, at most the optimizer steps per epoch).
        rows_per_step: rows per optimizer step (``B`` >= 1).
        total_steps: optimizer steps the run makes in total (>= 1).
        steps_per_epoch: optimizer steps per epoch; defaults to ``ceil(N / B)`` (what transformers'
            Trainer computes with ``drop_last=False``).
        step_multiple: boundaries are rounded up to multiples of this many global steps (GRPO's
            generation boundary); the run's last step is always a boundary.

    Returns:
        The :class:`ChunkPlan`.

    Raises:
        ChunkPlanError: ``num_chunks < 1``, ``num_chunks`` larger than the steps per epoch, or a
            non-positive size.
    """
    if rows_per_epoch < 1:
        raise ChunkPlanError(f"the training set is empty (rows_per_epoch={rows_per_epoch})")
    if rows_per_step < 1 or total_steps < 1 or step_multiple < 1:
        raise ChunkPlanError(
            f"rows_per_step, total_steps and step_multiple must be >= 1, got {rows_per_step}, {total_steps},"
            f" {step_multiple}"
        )
    spe = steps_per_epoch if steps_per_epoch is not None else math.ceil(rows_per_epoch / rows_per_step)
    if num_chunks < 1:
        raise ChunkPlanError(f"num_chunks must be >= 1, got {num_chunks}")
    if num_chunks > spe:
        raise ChunkPlanError(
            f"num_chunks={num_chunks} is larger than the {spe} optimizer steps per epoch of this run; "
            f"use num_chunks <= {spe} (or a smaller batch size)"
        )
    boundaries: list[int] = []
    labels: list[tuple[int, int]] = []
    epoch = 0
    while not boundaries or boundaries[-1] < total_steps:
        for k in range(1, num_chunks + 1):
            within = min(spe, math.ceil(k * rows_per_epoch / (num_chunks * rows_per_step)))
            step = epoch * spe + within
            step = min(total_steps, math.ceil(step / step_multiple) * step_multiple)
            if boundaries and step <= boundaries[-1]:
                labels[-1] = (epoch + 1, k)  # merged into the previous segment by step_multiple rounding
                continue
            boundaries.append(step)
            labels.append((epoch + 1, k))
            if step >= total_steps:
                break
        epoch += 1
    return ChunkPlan(
        num_chunks=num_chunks,
        rows_per_epoch=rows_per_epoch,
        rows_per_step=rows_per_step,
        steps_per_epoch=spe,
        total_steps=total_steps,
        boundaries=tuple(boundaries),
        labels=tuple(labels),
    )
