"""A gang run's trainer: its own base, sharded before the trainer exists; its snapshots; its gathered final weights.

The executor asks here for every run; a run whose plan (:func:`~rapidfire_nb.training.sharding.run_plan`) trains
on one device takes the executor's usual path unchanged (the shared base, its adapter extras, the usual
snapshots and final save). A gang run (``num_gpus`` >= 2, in a process of its gang):

* gets a base of its own from ``create_model_fn`` (never the shared multi-adapter base), its LoRA adapter made as a
  plain TRL run's (``set_seed`` then ``get_peft_model``), sharded with FSDP2 before the trainer and its optimizer
  exist (``fsdp``; ``num_gpus`` without ``fsdp`` is DDP, left to accelerate);
* its TRL config is built without ``fsdp`` / ``fsdp_config`` (:func:`training_spec`: rapidfire_nb shards, and
  transformers would hand them to accelerate);
* its boundary snapshots are each rank's share (:mod:`~rapidfire_nb.training.gang_checkpoint`) and a resume loads
  them back (``train(resume_from_checkpoint=...)`` as for any run);
* its final weights are gathered (``get_model_state_dict`` with ``full_state_dict=True``, a collective every rank
  joins) and written by rank 0 as a plain ``save_pretrained`` folder, usable without FSDP.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from rapidfire_nb.spec import LeafConfig
from rapidfire_nb.spec.fsdp import FSDP_TRAINING_FIELDS, ShardingPlan, without_fsdp_fields

from .checkpoint import Snapshotter
from .gang_checkpoint import GangSnapshotter, install_gang_resume
from .models import BaseModels, SharedBase, attach_run_model, install_lora_extras, save_final_weights
from .own_params import OwnParameters
from .sharding import Gang, join_gang, run_plan, shard_model, skip_ddp_wrap

__all__ = ["gang_of", "run_model", "run_snapshotter", "save_run_final", "setup_trainer", "training_spec"]

_GANG_ATTR = "_rapidfire_gang"  # set on a gang run's model: (Gang, ShardingPlan)


def training_spec(spec: LeafConfig) -> LeafConfig:
    """``spec`` as its TRL config is built: without ``fsdp`` / ``fsdp_config`` (``spec`` itself when it has
    neither)."""
    if not any(f in spec.training for f in FSDP_TRAINING_FIELDS):
        return spec
    return dataclasses.replace(spec, training=without_fsdp_fields(spec.training))


def gang_of(model: Any) -> tuple[Gang, ShardingPlan] | None:
    """The gang and plan a run's model trains under, or ``None`` (one device)."""
    found: tuple[Gang, ShardingPlan] | None = getattr(model, _GANG_ATTR, None)
    return found


def run_model(
    models: BaseModels, spec: LeafConfig, args: Any, lora: Any, run_id: int
) -> tuple[SharedBase, Any, str | None]:
    """The model a run trains: ``(its base, model, adapter name or None)``.

    One device: the executor's shared base and :func:`~rapidfire_nb.training.models.attach_run_model`. A gang:
    a base of its own, the adapter attached as for any run, then :func:`~rapidfire_nb.training.sharding.shard_model`
    for ``fsdp``.

    Raises:
        ConfigError: bad ``fsdp`` / ``num_gpus`` settings, a run with ``num_gpus`` >= 2 outside its gang, or what
            ``attach_run_model`` refuses.
    """
    plan = run_plan(spec)  # its notes were said by run_fit (spec.gangs.check_gangs), before training
    if plan.sharding is None:
        base = models.base_for(spec, args, run_id)
        model, adapter = attach_run_model(base, run_id, spec, lora, args.seed)
        return base, model, adapter
    gang = join_gang()
    assert gang is not None  # run_plan checked it
    created, tokenizer = models.create(spec.model_config_dict())
    base = SharedBase(key=f"gang-run-{run_id}", model=created, tokenizer=tokenizer)
    model, adapter = attach_run_model(base, run_id, spec, lora, args.seed)
    base.model = model  # full fine-tuning trained a copy: the created model is not kept beside it
    if plan.sharding == "fsdp":
        shard_model(model, plan)
    object.__setattr__(model, _GANG_ATTR, (gang, plan))
    return base, model, adapter


def setup_trainer(trainer: Any, adapter: str | None) -> OwnParameters | None:
    """Fit a built trainer to its run: one device, a LoRA run's extras on the shared base
    (:func:`~rapidfire_nb.training.models.install_lora_extras`); a gang, accelerate's DDP wrap skipped for a
    sharded model and the resume of this rank's checkpoint share installed. Returns the run's ``OwnParameters``
    (None for full fine-tuning and gangs)."""
    found = gang_of(trainer.model)
    if found is None:
        return install_lora_extras(trainer, adapter) if adapter is not None else None
    gang, plan = found
    if plan.sharding == "fsdp":
        skip_ddp_wrap(trainer)
    install_gang_resume(trainer, gang, adapter)
    return None


def run_snapshotter(run_id: int, trainer: Any, adapter: str | None) -> Snapshotter | GangSnapshotter:
    """The run's boundary snapshotter: a gang rank's share, or the usual one."""
    found = gang_of(trainer.model)
    if found is None:
        return Snapshotter(run_id, trainer, adapter)
    return GangSnapshotter(run_id, trainer, adapter, found[0])


def save_run_final(trainer: Any, adapter: str | None, target: Path) -> None:
    """Save the run's final weights and tokenizer into ``target`` (``runs/<id>/final``), a plain
    ``save_pretrained`` folder.

    A gang's weights are gathered first (every rank calls this: the gather is a collective); rank 0 writes them
    with the model's own ``save_pretrained(state_dict=...)``, the others write nothing.

    Raises:
        OSError: the write failed.
    """
    found = gang_of(trainer.model)
    if found is None:
        save_final_weights(trainer.model, trainer.processing_class, adapter, target)
        return
    gang, plan = found
    state = _full_state(trainer.model, plan)
    if gang.rank == 0:
        save_final_weights(_Saving(trainer.model, state), trainer.processing_class, adapter, target)


def _full_state(model: Any, plan: ShardingPlan) -> dict[str, Any]:
    """The model's whole state dict on rank 0's CPU (empty on the other ranks): gathered from the shards."""
    if plan.sharding != "fsdp":
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v for k, v in state.items() if k not in _tied_copies(model)}


def _tied_copies(model: Any) -> set[str]:
    """The names under which a parameter appears a second time (tied weights: ``lm_head.weight`` of a model with
    tied embeddings). The gathered state holds them as separate tensors, which ``save_pretrained`` would write
    twice (SmolLM2: +113 MB); it ties them again when the folder is loaded."""
    seen: set[int] = set()
    copies: set[str] = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            copies.add(name)
        seen.add(id(param))
    return copies


class _Saving:
    """The run's model as ``save_final_weights`` sees it: its ``save_pretrained`` given the gathered state."""

    def __init__(self, model: Any, state: dict[str, Any]) -> None:
        self._model = model
        self._state = state

    def save_pretrained(self, folder: str, **kwargs: Any) -> None:
        self._model.save_pretrained(folder, state_dict=self._state, **kwargs)
