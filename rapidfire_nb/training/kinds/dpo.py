"""DPO: ``trl.DPOTrainer`` / ``trl.DPOConfig`` on the engine's shared base model.

* LoRA runs: the reference is the shared base with adapters disabled (``hooks.reference_free_build``), as for
  a plain ``DPOTrainer`` given ``peft_config``.
* Full fine-tuning: one frozen reference per distinct base (a copy of the pristine base, shared by the runs
  on it) instead of TRL loading one per run from the model's path; ``ref_model_name``/``ref_model_kwargs``
  load another one through ``create_model_fn`` (one per distinct name and keywords).
* Over several devices (``num_gpus`` >= 2): LoRA only, the reference being the sharded base with the adapter
  disabled (a reference model of its own is not sharded yet: refused, ``spec.gangs.refuse_dpo_reference``).
* Either way the reference log-probs of a micro-batch are computed once and shared by the runs that train on
  it (:mod:`.dpo_reference`), bit-identical to each run's own computation (one device: a gang rank computes
  its own, as plain TRL).
"""

from __future__ import annotations

import copy
from contextlib import AbstractContextManager
from typing import Any

from rapidfire_nb.spec import LeafConfig
from rapidfire_nb.spec.gangs import refuse_dpo_reference, run_width

from ..models import ModelProvider
from . import dpo_reference, hooks
from .base import TrainerKind

__all__ = ["DPOKind"]


class DPOKind(TrainerKind):
    """Direct preference optimisation on prompt/chosen/rejected rows."""

    name = "DPO"
    trainer_class_name = "DPOTrainer"
    required_columns = (("prompt", "chosen", "rejected"), ("chosen", "rejected"))

    def trainer_kwargs(
        self, spec: LeafConfig, model: Any, args: Any, models: ModelProvider
    ) -> dict[str, Any]:
        # run_fit refused it before training (spec.gangs.check_gangs); a TorchExecutor driven alone is refused here
        if run_width(spec) > 1:
            refuse_dpo_reference(f"num_gpus={run_width(spec)}", spec)
        ref = reference_model(spec, model, args, models)
        return {"ref_model": ref} if ref is not None else {}

    def building(self, model: Any, adapter: str | None) -> AbstractContextManager[None]:
        return hooks.reference_free_build(model, adapter)

    def build_trainer(
        self,
        spec: LeafConfig,
        model: Any,
        adapter: str | None,
        tokenizer: Any,
        args: Any,
        datasets: tuple[Any, Any],
        models: ModelProvider,
    ) -> Any:
        """The run's ``DPOTrainer`` (as every kind's), taking its reference log-probs from the shared cache."""
        trainer = super().build_trainer(spec, model, adapter, tokenizer, args, datasets, models)
        dpo_reference.install(trainer, models)
        return trainer


def reference_model(spec: LeafConfig, model: Any, args: Any, models: ModelProvider) -> Any:
    """A frozen reference model shared by the runs that use it, or ``None`` (LoRA: the base, adapters off).

    One per distinct ``(ref_model_name, ref_model_kwargs)`` (loaded with ``create_model_fn``), else, for full
    fine-tuning, one per base (a copy of the pristine base, which the runs never train: each trains its own
    copy).

    Args:
        spec: The run spec.
        model: The model the run trains.
        args: Its built ``DPOConfig``.
        models: The executor's model provider (holds the shared references).

    Returns:
        The reference ``nn.Module`` (eval mode, frozen), or ``None``.

    Raises:
        ConfigError: ``create_model_fn`` failed on the reference model.
    """
    if spec.ref_model_name is not None or spec.ref_model_kwargs:
        name = spec.ref_model_name or spec.model_name
        kwargs = dict(spec.ref_model_kwargs if spec.ref_model_kwargs is not None else spec.model_kwargs or {})

        def load() -> Any:
            config = spec.model_config_dict()
            config.update(model_name=name, model_kwargs=kwargs, peft_config=None)
            ref, _tokenizer = models.create(config)
            return hooks.freeze(ref)

        return models.shared(("named", name, repr(sorted(kwargs.items()))), load)
    if hasattr(model, "peft_config"):
        return None
    base = models.base_for(spec, args)
    return models.shared(("base", base.key), lambda: hooks.freeze(copy.deepcopy(base.model)))
