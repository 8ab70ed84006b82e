"""Per-trainer-type knowledge: which TRL trainer, which columns, how many optimizer steps.

Kept in one table so SFT, DPO and GRPO go through the same engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rapidfire_nb.errors import ConfigError

__all__ = ["TrainerKind", "trainer_kind", "step_geometry", "StepGeometry"]


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
        rows_per_step: rows one optimizer step consumes.
        steps_per_epoch: optimizer steps per epoch (transformers' ``num_update_steps_per_epoch``).
        total_steps: the run's optimizer steps (``max_steps`` or ``ceil(num_train_epochs * steps_per_epoch)``).
        step_multiple: chunk boundaries must be multiples of this many global steps (GRPO generation).
    """

    rows_per_epoch: int
    rows_per_step: int
    steps_per_epoch: int
    total_steps: int
    step_multiple: int = 1


def step_geometry(trainer: Any, kind: TrainerKind) -> StepGeometry:
    """Compute a built trainer's step geometry exactly as ``Trainer.set_initial_training_values`` does."""
    args = trainer.args
    n_rows = len(trainer.train_dataset)
    bs = args.per_device_train_batch_size * max(1, args.world_size)
    ga = args.gradient_accumulation_steps
    if kind.name == "GRPO":
        # GRPO's sampler repeats each prompt num_generations times; a dataloader "row" is one completion.
        n_rows_dl = n_rows * args.num_generations
    else:
        n_rows_dl = n_rows
    len_dl = n_rows_dl // bs if args.dataloader_drop_last else math.ceil(n_rows_dl / bs)
    if kind.name == "GRPO":
        # GRPOTrainer's dataloader yields one batch per generation step of `steps_per_generation` micro-steps.
        len_dl = len(trainer.get_train_dataloader())
    spe = max(len_dl // ga + int(len_dl % ga > 0), 1)
    total = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * spe)
    if kind.name == "GRPO":
        gen_every = args.steps_per_generation * getattr(args, "num_iterations", 1)
        step_multiple = gen_every // math.gcd(gen_every, ga)
        rows_per_epoch = n_rows
        rows_per_step = max(1, (bs * ga) // args.num_generations)
    else:
        step_multiple = 1
        rows_per_epoch = len_dl * bs if args.dataloader_drop_last else n_rows
        rows_per_step = bs * ga
    return StepGeometry(rows_per_epoch, rows_per_step, spe, total, step_multiple)
