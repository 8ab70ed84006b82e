"""GRPO: ``trl.GRPOTrainer`` / ``trl.GRPOConfig`` on the engine's shared base model.

* Before anything is built: no reference model settings (GRPOTrainer takes none), whole groups of
  ``num_generations`` completions per generation batch, reward functions that accept TRL's keyword call.
* The trainer gets the reward functions wrapped so that an exception names the function (``rewards``).
* LoRA runs: ``"default"`` aliased while building, no ``"ref"`` adapter (``hooks.reference_free_build``).
* Chunk boundaries end a generation round and an optimizer step (``grpo_plan``).
* Over several devices (``num_gpus`` >= 2): LoRA only (``spec.gangs.refuse_grpo_full``); each rank generates for its
  own share of the generation batch, the ranks' forwards kept in step by ``generate(synced_gpus=True)``
  (``training.sharding.shard_model`` marks the sharded model for transformers).
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from typing import Any, ClassVar

from kernel_scheduler import ChunkPlan
from rapidfire_nb.errors import ConfigError
from rapidfire_nb.spec import LeafConfig
from rapidfire_nb.spec.gangs import refuse_grpo_full, run_width

from ..data import prepare_dataset
from ..models import ModelProvider
from . import hooks
from .base import COMMON_WARM_FORBIDDEN, StepGeometry, TrainerKind, training_value
from .grpo_plan import GRPOStepGeometry, grpo_step_geometry, plan_grpo_chunks
from .rewards import check_reward_funcs, wrap_reward_funcs

__all__ = ["GRPOKind", "check_generation_batch"]


class GRPOKind(TrainerKind):
    """Group relative policy optimisation on prompts, scored by the run's reward functions."""

    name = "GRPO"
    trainer_class_name = "GRPOTrainer"
    required_columns = (("prompt",),)
    keep_extra_columns: ClassVar[bool] = True  # reward functions receive the extra columns
    warm_forbidden: ClassVar[tuple[str, ...]] = (
        *COMMON_WARM_FORBIDDEN,
        "num_generations",
        "max_completion_length",
        "steps_per_generation",
        "generation_batch_size",
        "num_iterations",
    )

    def precheck(self, spec: LeafConfig, train_dataset: Any, eval_dataset: Any = None) -> None:
        """GRPO's generation batch and reward functions, checked before anything is built.

        Args:
            spec: The run spec.
            train_dataset: The training rows (before ``formatting_func``).
            eval_dataset: The eval rows, or ``None`` (TRL calls the reward functions on them too).

        Raises:
            ConfigError: reference model settings given, a generation batch not divisible by
                ``num_generations`` (both numbers named), or a reward function that cannot accept TRL's
                keyword call.
        """
        if spec.ref_model_name is not None or spec.ref_model_kwargs:
            raise ConfigError(
                "ref_model_name/ref_model_kwargs are not supported for GRPO: TRL's GRPOTrainer takes no reference "
                "model (LoRA runs use the base with adapters disabled; full fine-tuning with beta > 0 reloads the "
                "policy's own weights); remove them"
            )
        check_generation_batch(spec)
        remove = bool(training_value(spec, "remove_unused_columns"))
        for what, ds in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
            if (
                ds is not None
            ):  # TRL calls the reward functions on eval rows too (with the eval set's columns)
                rows = prepare_dataset(ds, spec.formatting_func, self, what, spec)
                check_reward_funcs(spec.reward_funcs, rows.column_names, remove_unused_columns=remove)

    def trainer_kwargs(
        self, spec: LeafConfig, model: Any, args: Any, models: ModelProvider
    ) -> dict[str, Any]:
        # run_fit refused it before training (spec.gangs.check_gangs); a TorchExecutor driven alone is refused here
        if run_width(spec) > 1:
            refuse_grpo_full(f"num_gpus={run_width(spec)}", spec)
        return {"reward_funcs": wrap_reward_funcs(spec.reward_funcs)}

    def eval_metric_names(self, trainer: Any) -> list[str]:
        """GRPO's eval reward: the mean total reward and each reward function's mean over eval completions."""
        names = list(getattr(trainer, "reward_func_names", []) or [])
        return ["eval_reward", *(f"eval_rewards/{n}/mean" for n in names)]

    def building(self, model: Any, adapter: str | None) -> AbstractContextManager[None]:
        return hooks.reference_free_build(model, adapter)

    def step_geometry(self, trainer: Any) -> GRPOStepGeometry:
        return grpo_step_geometry(trainer)

    def plan_chunks(self, geo: StepGeometry, num_chunks: int) -> ChunkPlan:
        """Generation-aligned boundaries (see ``grpo_plan.plan_grpo_chunks``).

        Raises:
            ChunkPlanError: ``num_chunks`` larger than the valid generation boundaries per epoch.
        """
        if not isinstance(geo, GRPOStepGeometry):
            raise TypeError(f"GRPO plans chunks from a GRPOStepGeometry, got {type(geo).__name__}")
        return plan_grpo_chunks(geo, num_chunks)


def check_generation_batch(spec: LeafConfig) -> None:
    """GRPO: each generation batch must hold whole groups of ``num_generations`` completions.

    Mirrors ``GRPOConfig.__post_init__``: the generation batch is ``generation_batch_size`` when set, else
    ``per_device_train_batch_size x num_gpus x steps_per_generation`` (``steps_per_generation`` defaults to
    ``gradient_accumulation_steps``; ``num_gpus`` is the run's gang width, 1 on one device).

    Args:
        spec: A GRPO run spec.

    Raises:
        ConfigError: naming the generation batch, how it was derived, and ``num_generations``.
    """
    g = training_value(spec, "num_generations")
    bs = training_value(spec, "per_device_train_batch_size")
    if not isinstance(g, int) or not isinstance(bs, int) or g < 1 or bs < 1:
        return  # TRL reports malformed values itself
    gbs = spec.training.get("generation_batch_size")
    spg = spec.training.get("steps_per_generation")
    if gbs is not None and spg is not None:
        return  # TRL: "can not be both configured"
    width = run_width(spec)  # a gang: each rank takes bs rows (TRL's num_processes)
    if isinstance(gbs, int):
        derived = f"generation_batch_size={gbs}"
    else:
        if spg is None:
            spg = training_value(spec, "gradient_accumulation_steps") or 1
            how = f"gradient_accumulation_steps={spg}, the default steps_per_generation"
        else:
            how = f"steps_per_generation={spg}"
        if not isinstance(spg, int):
            return
        gbs = bs * width * spg
        ranks = f" x num_gpus={width}" if width > 1 else ""
        derived = f"per_device_train_batch_size={bs}{ranks} x {how}"
    if gbs % g:
        multiple = g // math.gcd(g, bs * width)
        raise ConfigError(
            f"GRPO: the generation batch of {gbs} completions ({derived}) is not divisible by num_generations={g}: "
            f"every prompt needs all its {g} completions in one generation batch. Make the generation batch a "
            f"multiple of {g} (e.g. steps_per_generation a multiple of {multiple} with per_device_train_batch_size="
            f"{bs}), or change num_generations"
        )
