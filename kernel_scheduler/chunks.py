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

Nothing is materialised per step or per chunk of the whole run: the boundaries repeat with a period of
``P = step_multiple / gcd(S, step_multiple)`` epochs (``P x S`` steps, a multiple of ``step_multiple``), so a
plan keeps the segments of its first period and of one later period (``O(K x P)`` entries) and computes
``boundary(i)``, ``label(i)`` and ``segments_done_at(step)`` from them in ``O(log K)``, whatever the run's
``max_steps`` (``plan_chunks(32, 4, 2, 10**12)`` takes microseconds).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

__all__ = ["ChunkPlan", "ChunkPlanError", "Segment", "plan_chunks"]

Label = tuple[int, int]
"""``(epoch, chunk)`` of a segment, both 1-based."""


class ChunkPlanError(ValueError):
    """The chunking asked for cannot be planned (e.g. more chunks than optimizer steps per epoch)."""


@dataclass(frozen=True)
class Segment:
    """One segment of a plan before the run's ``total_steps`` cuts it.

    Attributes:
        step: the global optimizer step it ends at.
        opened: the ``(epoch, chunk)`` of the chunk that opened it.
        label: the ``(epoch, chunk)`` of its last chunk (later than ``opened`` when rounding onto
            ``step_multiple`` merged chunks into it).
    """

    step: int
    opened: Label
    label: Label

    def shifted(self, cycles: int, steps: int, epochs: int) -> Segment:
        """The same segment ``cycles`` periods of ``steps`` steps / ``epochs`` epochs later."""
        if not cycles:
            return self
        de = cycles * epochs
        return Segment(
            self.step + cycles * steps,
            (self.opened[0] + de, self.opened[1]),
            (self.label[0] + de, self.label[1]),
        )


@dataclass(frozen=True)
class ChunkPlan:
    """Where one run's chunks end, computed on demand (nothing is stored per chunk of the whole run).

    The segments before ``total_steps`` cuts them are ``head`` followed by ``cycle`` repeated forever, each
    repetition ``cycle_steps`` steps and ``cycle_epochs`` epochs later than the previous one.

    Attributes:
        num_chunks: chunks per epoch (``K``).
        rows_per_epoch: training rows per epoch (``N``), in rows (prompts for GRPO).
        rows_per_step: rows consumed by one optimizer step (``B``).
        steps_per_epoch: optimizer steps per epoch (``S``).
        total_steps: optimizer steps of the whole run (its ``max_steps`` or epochs x ``S``).
        head: the segments of the first period, strictly increasing steps.
        cycle: the segments of the second period (non-empty, strictly increasing, after ``head``).
        cycle_steps: steps per period (> 0).
        cycle_epochs: epochs per period (> 0).
    """

    num_chunks: int
    rows_per_epoch: int
    rows_per_step: int
    steps_per_epoch: int
    total_steps: int
    head: tuple[Segment, ...]
    cycle: tuple[Segment, ...]
    cycle_steps: int
    cycle_epochs: int
    _count: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.cycle or self.cycle_steps < 1 or self.cycle_epochs < 1:
            raise ChunkPlanError("a chunk plan needs a non-empty cycle of at least one step and one epoch")
        object.__setattr__(self, "_count", self._first_at_or_after(self.total_steps) + 1)

    # ------------------------------------------------------------------ the uncut segments
    def _segment(self, index: int) -> Segment:
        if index < len(self.head):
            return self.head[index]
        cycles, r = divmod(index - len(self.head), len(self.cycle))
        return self.cycle[r].shifted(cycles, self.cycle_steps, self.cycle_epochs)

    def _first_at_or_after(self, step: int) -> int:
        """The index of the first uncut segment ending at or after ``step``."""
        head = [s.step for s in self.head]
        if head and head[-1] >= step:
            return bisect.bisect_left(head, step)
        steps = [s.step for s in self.cycle]
        cycles = max(0, -(-(step - steps[-1]) // self.cycle_steps))  # the first period reaching ``step``
        return (
            len(self.head) + cycles * len(steps) + bisect.bisect_left(steps, step - cycles * self.cycle_steps)
        )

    # ------------------------------------------------------------------ the plan
    @property
    def num_segments(self) -> int:
        """Number of chunks the run will train in total (over all its epochs)."""
        return self._count

    def boundary(self, segment: int) -> int:
        """The global optimizer step at which segment ``segment`` (0-based) ends.

        Raises:
            IndexError: ``segment`` is not in ``0 .. num_segments - 1``.
        """
        if not 0 <= segment < self._count:
            raise IndexError(f"segment {segment} of a plan with {self._count} segments")
        return self.total_steps if segment == self._count - 1 else self._segment(segment).step

    def label(self, segment: int) -> Label:
        """``(epoch, chunk)`` of segment ``segment`` (0-based); past the end, the last label."""
        last = self._count - 1
        if segment >= last:  # cut by total_steps: the chunk it ends in (no later chunk merged into it)
            return self._segment(last).opened
        return self._segment(max(segment, 0)).label

    def segments_done_at(self, step: int) -> int:
        """How many segments are complete once the run has made ``step`` optimizer steps."""
        if step >= self.total_steps:
            return self._count
        return self._first_at_or_after(step + 1)

    def is_boundary(self, step: int) -> bool:
        """Whether a segment ends at global step ``step``."""
        done = self.segments_done_at(step)
        return done > 0 and self.boundary(done - 1) == step

    @property
    def boundaries(self) -> Sequence[int]:
        """Every segment's end step, as a lazy sequence (``boundary(i)`` per item; equal to a tuple of them)."""
        return _Lazy(self._count, self.boundary)

    @property
    def labels(self) -> Sequence[Label]:
        """Every segment's ``(epoch, chunk)``, as a lazy sequence (``label(i)`` per item)."""
        return _Lazy(self._count, self.label)

    def samples_seen(self, step: int) -> int:
        """Training rows consumed after ``step`` optimizer steps (rows; partial last batch counted)."""
        epochs, within = divmod(step, self.steps_per_epoch)
        return epochs * self.rows_per_epoch + min(within * self.rows_per_step, self.rows_per_epoch)

    def chunks_at(self, segments: int) -> int:
        """Chunks done over all epochs once ``segments`` segments are complete (``(epoch - 1) * K + chunk`` of the
        last one's label; a segment merged by ``step_multiple`` counts the chunks it covers). 0 for 0 segments."""
        if segments <= 0:
            return 0
        epoch, chunk = self.label(segments - 1)
        return (epoch - 1) * self.num_chunks + chunk

    def full_chunks_at(self, segments: int) -> int:
        """Chunks whose rows the run has wholly trained on once ``segments`` segments are complete: as
        :meth:`chunks_at`, except that a last segment cut by ``total_steps`` inside a chunk (``max_steps`` ends
        mid-chunk) does not count that chunk. A chunk ``k`` of an epoch is whole once at least ``k * N / K`` of the
        epoch's rows are consumed (the boundary rule of the module docstring), so the count is
        ``epochs * K + floor(rows * K / N)`` at the run's last step. What early stopping compares runs by: a run
        that ended before a rung never trained on that rung's rows."""
        done = self.chunks_at(segments)
        if (
            segments < self._count
            or self._count == 0
            or self.total_steps >= self._segment(self._count - 1).step
        ):
            return done
        epochs, within = divmod(self.total_steps, self.steps_per_epoch)
        rows = min(within * self.rows_per_step, self.rows_per_epoch)
        return min(done, epochs * self.num_chunks + rows * self.num_chunks // self.rows_per_epoch)

    def epoch_at(self, step: int) -> float:
        """Fractional epoch after ``step`` optimizer steps (TRL's ``epoch`` convention)."""
        return step / self.steps_per_epoch


class _Lazy(Sequence[Any]):
    """A read-only sequence of ``length`` items computed by ``item(i)``; compares equal to lists and tuples."""

    def __init__(self, length: int, item: Any) -> None:
        self._length = length
        self._item = item

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self._item(i) for i in range(*index.indices(self._length))]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError(index)
        return self._item(index)

    def __iter__(self) -> Iterator[Any]:
        return (self._item(i) for i in range(self._length))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(other) == self._length and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = [repr(self._item(i)) for i in range(min(self._length, 8))]
        return "(" + ", ".join(shown) + (", ...)" if self._length > 8 else ")")


def _merged(candidates: list[tuple[int, Label, int]]) -> list[tuple[Segment, int]]:
    """Candidate ends ``(step, (epoch, chunk), period)`` in order -> segments (with the period that opened them);
    a candidate not after the previous segment's end is merged into it (its label moves on)."""
    out: list[tuple[Segment, int]] = []
    for step, label, period in candidates:
        if out and step <= out[-1][0].step:
            seg, p = out[-1]
            out[-1] = (Segment(seg.step, seg.opened, label), p)
        else:
            out.append((Segment(step, label, label), period))
    return out


def periodic_plan(
    candidates: list[tuple[int, Label]], period_epochs: int, period_steps: int, **fields: Any
) -> dict[str, Any]:
    """The ``head``/``cycle`` fields of a :class:`ChunkPlan` from the candidate ends of its first period.

    Args:
        candidates: every chunk end ``(step, (epoch, chunk))`` of epochs ``1 .. period_epochs``, in order, not
            yet cut by ``total_steps`` (ends not after the previous one are merged into it).
        period_epochs: epochs after which the candidates repeat.
        period_steps: steps after which they repeat (a multiple of any rounding applied to the steps).
        fields: the plan's other fields, returned with ``head``, ``cycle``, ``cycle_steps``, ``cycle_epochs``.

    Returns:
        Keyword arguments for ``ChunkPlan`` (or a subclass).
    """
    # three periods: the third only settles the labels of chunks merged into the second one's last segment
    rounds = [
        (step + p * period_steps, (epoch + p * period_epochs, chunk), p)
        for p in range(3)
        for step, (epoch, chunk) in candidates
    ]
    segments = _merged(rounds)
    return {
        **fields,
        "head": tuple(s for s, p in segments if p == 0),
        "cycle": tuple(s for s, p in segments if p == 1),
        "cycle_steps": period_steps,
        "cycle_epochs": period_epochs,
    }


def plan_chunks(
    rows_per_epoch: int,
    num_chunks: int,
    rows_per_step: int,
    total_steps: int,
    steps_per_epoch: int | None = None,
    step_multiple: int = 1,
) -> ChunkPlan:
    """Plan a run's chunk boundaries (``O(num_chunks x period)`` time and memory, whatever ``total_steps``).

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
    period = step_multiple // math.gcd(spe, step_multiple)  # epochs after which the rounding repeats
    candidates: list[tuple[int, Label]] = []
    for epoch in range(period):
        for k in range(1, num_chunks + 1):
            within = min(spe, math.ceil(k * rows_per_epoch / (num_chunks * rows_per_step)))
            step = -(-(epoch * spe + within) // step_multiple) * step_multiple
            candidates.append((step, (epoch + 1, k)))
    return ChunkPlan(
        **periodic_plan(
            candidates,
            period,
            period * spe,
            num_chunks=num_chunks,
            rows_per_epoch=rows_per_epoch,
            rows_per_step=rows_per_step,
            steps_per_epoch=spe,
            total_steps=total_steps,
        )
    )
