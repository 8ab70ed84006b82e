"""GRPO's step geometry and chunk plan: chunk boundaries fall on generation rounds and optimizer steps.

Standard library and ``kernel_scheduler`` only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kernel_scheduler import ChunkPlan, ChunkPlanError
from kernel_scheduler.chunks import periodic_plan
from rapidfire_nb.errors import ConfigError

from .base import StepGeometry

__all__ = ["GRPOChunkPlan", "GRPOGeometry", "GRPOStepGeometry", "grpo_step_geometry", "plan_grpo_chunks"]


@dataclass(frozen=True)
class GRPOGeometry:
    """GRPO's generation rounds, exactly as ``GRPOTrainer``'s sampler, dataloader and buffer walk them.

    One *generation round* generates ``num_generations`` completions for each of ``prompts_per_generation``
    prompts (the generation batch, ``generation_batch_size`` completions) and then trains on it for
    ``micro_steps_per_generation = steps_per_generation x num_iterations`` micro-batches (forward/backward
    passes; ``gradient_accumulation_steps`` of them make one optimizer step). ``RepeatSampler`` drops the
    prompts of an incomplete last round, so an epoch is ``rounds_per_epoch = N // prompts_per_generation``
    rounds, ``rounds_per_epoch x micro_steps_per_generation`` micro-steps, and
    ``ceil(micro-steps / gradient_accumulation_steps)`` optimizer steps (transformers' last step of an epoch
    takes the remaining micro-batches).

    A chunk boundary must end a generation round *and* an optimizer step: after ``i`` rounds of an epoch
    when ``i x micro_steps_per_generation`` is a multiple of ``gradient_accumulation_steps``, or at the end
    of the epoch. ``boundary_steps`` maps each such ``i`` to the optimizer step (within the epoch) it ends.
    """

    num_generations: int
    generation_batch_size: int
    prompts_per_generation: int
    micro_steps_per_generation: int
    gradient_accumulation_steps: int
    rounds_per_epoch: int
    micro_steps_per_epoch: int
    boundary_steps: tuple[tuple[int, int], ...]  # ((rounds i, optimizer step within the epoch), ...)


@dataclass(frozen=True)
class GRPOStepGeometry(StepGeometry):
    """A GRPO run's ``StepGeometry`` with its generation rounds (``rows_per_step`` rounded down, at least 1).

    Attributes:
        grpo: The generation rounds the boundaries must respect.
    """

    grpo: GRPOGeometry = field(kw_only=True)


class GRPOChunkPlan(ChunkPlan):
    """A ``ChunkPlan`` whose ``samples_seen`` counts GRPO prompts exactly (prompts whose completions were
    generated), also when an optimizer step covers a fraction of a generation round."""

    grpo: GRPOGeometry

    def __init__(self, *, grpo: GRPOGeometry, **fields: Any) -> None:
        super().__init__(**fields)
        object.__setattr__(self, "grpo", grpo)

    def samples_seen(self, step: int) -> int:
        g = self.grpo
        epochs, within = divmod(step, self.steps_per_epoch)
        micro = min(within * g.gradient_accumulation_steps, g.micro_steps_per_epoch)
        rounds = -(-micro // g.micro_steps_per_generation)
        return epochs * self.rows_per_epoch + rounds * g.prompts_per_generation


def grpo_step_geometry(trainer: Any) -> GRPOStepGeometry:
    """Compute a built ``GRPOTrainer``'s step geometry exactly as its sampler, dataloader and buffer walk it.

    ``RepeatSampler`` yields each of ``generation_batch_size // num_generations`` prompts ``num_generations``
    times, the whole generation batch ``steps_per_generation x num_iterations`` times, and drops an incomplete
    last batch of prompts; the dataloader yields ``per_device_train_batch_size x steps_per_generation`` rows
    per micro-step (see :class:`GRPOGeometry`). Nothing is built or iterated (no dataloader is created).

    Args:
        trainer: A built ``trl.GRPOTrainer``.

    Returns:
        The geometry, with the generation rounds in ``.grpo``.

    Raises:
        ConfigError: The training set has fewer prompts than one generation batch needs, or the generation
            batch is not divisible by ``num_generations``.
    """
    args = trainer.args
    n_rows = len(trainer.train_dataset)
    ga = args.gradient_accumulation_steps
    g = int(args.num_generations)
    gbs = int(args.generation_batch_size)  # global, set by GRPOConfig.__post_init__
    spg = int(args.steps_per_generation)
    num_iterations = int(getattr(args, "num_iterations", 1) or 1)
    if gbs % g:
        raise ConfigError(
            f"the generation batch ({gbs} completions) is not divisible by num_generations ({g})"
        )
    prompts = gbs // g
    rounds = n_rows // prompts
    if rounds < 1:
        raise ConfigError(
            f"GRPO: the training set has {n_rows} prompts, fewer than one generation batch needs "
            f"({prompts} prompts = generation_batch_size {gbs} / num_generations {g}); GRPOTrainer would train "
            "on nothing. Add prompts or lower per_device_train_batch_size / steps_per_generation"
        )
    micro_per_round = spg * num_iterations  # RepeatSampler's repeat_count: micro-steps per generation round
    micro = rounds * micro_per_round  # len(GRPOTrainer.get_train_dataloader())
    spe = max(micro // ga + int(micro % ga > 0), 1)
    total = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * spe)
    valid = tuple(
        (i, min(-(-i * micro_per_round // ga), spe))
        for i in range(1, rounds + 1)
        if (i * micro_per_round) % ga == 0 or i == rounds
    )
    geo = GRPOGeometry(
        num_generations=g,
        generation_batch_size=gbs,
        prompts_per_generation=prompts,
        micro_steps_per_generation=micro_per_round,
        gradient_accumulation_steps=ga,
        rounds_per_epoch=rounds,
        micro_steps_per_epoch=micro,
        boundary_steps=valid,
    )
    step_multiple = micro_per_round // math.gcd(micro_per_round, ga)
    rows_per_step = max(1, (prompts * ga) // micro_per_round)
    return GRPOStepGeometry(rounds * prompts, rows_per_step, spe, total, step_multiple, grpo=geo)


def plan_grpo_chunks(geo: GRPOStepGeometry, num_chunks: int) -> GRPOChunkPlan:
    """A GRPO run's chunk plan, aligned on generation rounds.

    Chunk ``k`` of an epoch ends after the first *valid* generation round ``i`` (see
    :class:`GRPOGeometry`) with ``i >= ceil(k x rounds_per_epoch / num_chunks)``, i.e. once at least ``k/K`` of
    the epoch's prompts have been generated for, so every run with the same seed sees the same prompts per
    chunk up to one generation batch; the boundary is the optimizer step that ends round ``i``. A run whose
    ``max_steps`` ends inside a chunk ends there.

    Args:
        geo: The run's ``grpo_step_geometry``.
        num_chunks: Chunks per epoch.

    Returns:
        The plan; its ``samples_seen`` counts prompts exactly.

    Raises:
        ChunkPlanError: ``num_chunks`` larger than the valid generation boundaries per epoch; the message says
            the largest legal value.
    """
    g = geo.grpo
    if num_chunks < 1:
        raise ChunkPlanError(f"num_chunks must be >= 1, got {num_chunks}")
    valid = g.boundary_steps
    if num_chunks > len(valid):
        raise ChunkPlanError(
            f"num_chunks={num_chunks} is larger than the {len(valid)} generation-aligned chunk boundaries per "
            f"epoch of this GRPO run ({g.rounds_per_epoch} generation rounds of {g.prompts_per_generation} prompts x "
            f"{g.num_generations} completions, {g.micro_steps_per_generation} micro-steps each, "
            f"gradient_accumulation_steps={g.gradient_accumulation_steps}); use num_chunks <= {len(valid)}"
        )
    within: list[int] = []
    prev = 0
    for k in range(1, num_chunks + 1):
        target = max(-(-k * g.rounds_per_epoch // num_chunks), prev + 1)
        i, step = next(((i, s) for i, s in valid if i >= target), valid[-1])
        if within and step <= within[-1]:
            raise ChunkPlanError(
                f"num_chunks={num_chunks}: this GRPO run has too few generation-aligned boundaries per epoch to "
                f"give every chunk its own; use num_chunks <= {max(1, len(within))}"
            )
        within.append(step)
        prev = i
    spe = geo.steps_per_epoch
    fields = periodic_plan(
        [(s, (1, k)) for k, s in enumerate(within, start=1)],
        1,
        spe,  # generation rounds restart with every epoch: the boundaries repeat every epoch
        num_chunks=num_chunks,
        rows_per_epoch=geo.rows_per_epoch,
        rows_per_step=geo.rows_per_step,
        steps_per_epoch=spe,
        total_steps=geo.total_steps,
    )
    return GRPOChunkPlan(grpo=g, **fields)
