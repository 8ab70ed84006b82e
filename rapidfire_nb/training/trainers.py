"""Per-trainer-type knowledge: which TRL trainer, which columns, how many optimizer steps.

Kept in one table so SFT, DPO and GRPO go through the same engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kernel_scheduler import ChunkPlan, ChunkPlanError, plan_chunks
from rapidfire_nb.errors import ConfigError

__all__ = ["GRPOChunkPlan", "GRPOGeometry", "StepGeometry", "TrainerKind", "plan_run", "step_geometry", "trainer_kind"]


@dataclass(frozen=True)
class TrainerKind:
    name: str  # "SFT" | "DPO" | "GRPO"
    required_columns: tuple[tuple[str, ...], ...]  # any one of these column sets must be present
    keep_extra_columns: bool  # GRPO passes extra columns to reward functions

    def trainer_class(self) -> Any:
        import trl

        return {"SFT": trl.SFTTrainer, "DPO": trl.DPOTrainer, "GRPO": trl.GRPOTrainer}[self.name]


_KINDS = {
    "SFT": TrainerKind("SFT", (("prompt", "completion"), ("messages",), ("text",)), keep_extra_columns=False),
    "DPO": TrainerKind("DPO", (("prompt", "chosen", "rejected"), ("chosen", "rejected")), keep_extra_columns=False),
    "GRPO": TrainerKind("GRPO", (("prompt",),), keep_extra_columns=True),
}


def trainer_kind(name: str) -> TrainerKind:
    try:
        return _KINDS[name.upper()]
    except KeyError:
        raise ConfigError(f"trainer_type={name!r} is not supported; use one of 'SFT', 'DPO', 'GRPO'") from None


@dataclass(frozen=True)
class StepGeometry:
    """How a run walks through its data, in TRL's own terms.

    Attributes:
        rows_per_epoch: rows (prompts for GRPO) one epoch consumes.
        rows_per_step: rows one optimizer step consumes (GRPO: rounded down, at least 1; see ``GRPOChunkPlan``).
        steps_per_epoch: optimizer steps per epoch (transformers' ``num_update_steps_per_epoch``).
        total_steps: the run's optimizer steps (``max_steps`` or ``ceil(num_train_epochs * steps_per_epoch)``);
            equal to the trainer's ``state.max_steps`` once it trains.
        step_multiple: chunk boundaries must be multiples of this many global steps (1; GRPO uses ``grpo``).
        grpo: GRPO's generation geometry (``None`` for SFT/DPO).
    """

    rows_per_epoch: int
    rows_per_step: int
    steps_per_epoch: int
    total_steps: int
    step_multiple: int = 1
    grpo: GRPOGeometry | None = None


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


def _dataloader_batches(n_rows: int, batch_size: int, drop_last: bool) -> int:
    return n_rows // batch_size if drop_last else math.ceil(n_rows / batch_size)


def step_geometry(trainer: Any, kind: TrainerKind) -> StepGeometry:
    """Compute a built trainer's step geometry exactly as ``Trainer.set_initial_training_values`` does.

    For GRPO this follows ``GRPOTrainer``: its ``RepeatSampler`` yields each of ``generation_batch_size //
    num_generations`` prompts ``num_generations`` times, the whole generation batch
    ``steps_per_generation x num_iterations`` times, and drops an incomplete last batch of prompts; its
    dataloader yields ``per_device_train_batch_size x steps_per_generation`` rows per micro-step (see
    :class:`GRPOGeometry`). Nothing is built or iterated (no dataloader is created).

    Raises:
        ConfigError: GRPO whose training set has fewer prompts than one generation batch needs.
    """
    args = trainer.args
    n_rows = len(trainer.train_dataset)
    world = max(1, int(getattr(args, "world_size", 1) or 1))
    bs = args.per_device_train_batch_size * world
    ga = args.gradient_accumulation_steps
    if kind.name == "GRPO":
        return _grpo_geometry(args, n_rows, ga)
    len_dl = _dataloader_batches(n_rows, bs, args.dataloader_drop_last)
    spe = max(len_dl // ga + int(len_dl % ga > 0), 1)
    total = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * spe)
    rows_per_epoch = len_dl * bs if args.dataloader_drop_last else n_rows
    return StepGeometry(rows_per_epoch, bs * ga, spe, total)


def _grpo_geometry(args: Any, n_rows: int, ga: int) -> StepGeometry:
    g = int(args.num_generations)
    gbs = int(args.generation_batch_size)  # global, set by GRPOConfig.__post_init__
    spg = int(args.steps_per_generation)
    num_iterations = int(getattr(args, "num_iterations", 1) or 1)
    if gbs % g:
        raise ConfigError(f"the generation batch ({gbs} completions) is not divisible by num_generations ({g})")
    prompts = gbs // g
    rounds = n_rows // prompts
    if rounds < 1:
        raise ConfigError(
            f"GRPO: the training set has {n_rows} prompts, fewer than one generation batch needs "
            f"({prompts} prompts = generation_batch_size {gbs} / num_generations {g}); GRPOTrainer would train "
            "on nothing. Add prompts or lower per_device_train_batch_size / steps_per_generation")
    micro_per_round = spg * num_iterations  # RepeatSampler's repeat_count: micro-steps per generation round
    micro = rounds * micro_per_round  # len(GRPOTrainer.get_train_dataloader())
    spe = max(micro // ga + int(micro % ga > 0), 1)
    total = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * spe)
    valid = tuple((i, min(-(-i * micro_per_round // ga), spe)) for i in range(1, rounds + 1)
                  if (i * micro_per_round) % ga == 0 or i == rounds)
    geo = GRPOGeometry(num_generations=g, generation_batch_size=gbs, prompts_per_generation=prompts,
                       micro_steps_per_generation=micro_per_round, gradient_accumulation_steps=ga,
                       rounds_per_epoch=rounds, micro_steps_per_epoch=micro, boundary_steps=valid)
    step_multiple = micro_per_round // math.gcd(micro_per_round, ga)
    rows_per_step = max(1, (prompts * ga) // micro_per_round)
    return StepGeometry(rounds * prompts, rows_per_step, spe, total, step_multiple, geo)


def plan_run(geo: StepGeometry, num_chunks: int) -> ChunkPlan:
    """The run's chunk plan: ``kernel_scheduler.plan_chunks`` for SFT/DPO; generation-aligned for GRPO.

    GRPO: chunk ``k`` of an epoch ends after the first *valid* generation round ``i`` (see
    :class:`GRPOGeometry`) with ``i >= ceil(k x rounds_per_epoch / num_chunks)``, i.e. once at least ``k/K`` of
    the epoch's prompts have been generated for, so every run with the same seed sees the same prompts per
    chunk up to one generation batch; the boundary is the optimizer step that ends round ``i``. A run whose
    ``max_steps`` ends inside a chunk ends there.

    Raises:
        ChunkPlanError: ``num_chunks`` larger than the steps per epoch (SFT/DPO) or than the valid generation
            boundaries per epoch (GRPO); the message says the largest legal value.
    """
    if geo.grpo is None:
        return plan_chunks(geo.rows_per_epoch, num_chunks, geo.rows_per_step, geo.total_steps,
                           steps_per_epoch=geo.steps_per_epoch, step_multiple=geo.step_multiple)
    g = geo.grpo
    if num_chunks < 1:
        raise ChunkPlanError(f"num_chunks must be >= 1, got {num_chunks}")
    valid = g.boundary_steps
    if num_chunks > len(valid):
        raise ChunkPlanError(
            f"num_chunks={num_chunks} is larger than the {len(valid)} generation-aligned chunk boundaries per "
            f"epoch of this GRPO run ({g.rounds_per_epoch} generation rounds of {g.prompts_per_generation} prompts x "
            f"{g.num_generations} completions, {g.micro_steps_per_generation} micro-steps each, "
            f"gradient_accumulation_steps={g.gradient_accumulation_steps}); use num_chunks <= {len(valid)}")
    within: list[int] = []
    prev = 0
    for k in range(1, num_chunks + 1):
        target = max(-(-k * g.rounds_per_epoch // num_chunks), prev + 1)
        i, step = next(((i, s) for i, s in valid if i >= target), valid[-1])
        if within and step <= within[-1]:
            raise ChunkPlanError(
                f"num_chunks={num_chunks}: this GRPO run has too few generation-aligned boundaries per epoch to "
                f"give every chunk its own; use num_chunks <= {max(1, len(within))}")
        within.append(step)
        prev = i
    spe, total = geo.steps_per_epoch, geo.total_steps
    boundaries: list[int] = []
    labels: list[tuple[int, int]] = []
    epoch = 0
    while not boundaries or boundaries[-1] < total:
        for k, s in enumerate(within, start=1):
            step = min(total, epoch * spe + s)
            if boundaries and step <= boundaries[-1]:
                break
            boundaries.append(step)
            labels.append((epoch + 1, k))
            if step >= total:
                break
        epoch += 1
    return GRPOChunkPlan(num_chunks=num_chunks, rows_per_epoch=geo.rows_per_epoch, rows_per_step=geo.rows_per_step,
                         steps_per_epoch=spe, total_steps=total, boundaries=tuple(boundaries), labels=tuple(labels),
                         grpo=g)
