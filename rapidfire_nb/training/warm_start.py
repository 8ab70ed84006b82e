"""Where a run starts: its position in a checkpoint, and what a warm clone takes from its parent.

A run restarted from a ``checkpoint-<step>`` folder continues at that step (:func:`checkpoint_step`,
:func:`start_at`); a warm clone starts from its parent's latest boundary snapshot (:func:`warm_snapshot` checks
that it can) with its own hyperparameters (:func:`keep_own_hyperparameters`). The executor writes the snapshot
as a resumable checkpoint and the clone's trainer resumes from it with TRL/transformers' own resume.

A parent that finished before this process (``end()``, a restart) is continued from its final state on disk: the
executor writes a finished run's final snapshot as its ``checkpoint-<final step>`` (the one checkpoint a run keeps),
and :func:`warm_start_from_disk` copies that folder as the clone's warm start, with the clone's own LoRA settings:
the same files the parent's snapshot in memory would have given, so the continuation is the same. A gang parent's
state is each rank's share (:mod:`~rapidfire_nb.training.gang_checkpoint`): each rank of a clone of the same width
copies its own share, as the parent's gang would have written its snapshot in memory.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

from kernel_scheduler import ChunkPlan, RunStart
from rapidfire_nb._atomic import COMPLETE_MARKER, atomic_dir
from rapidfire_nb.errors import ConfigError
from rapidfire_nb.run_folder import WARM_START_PREFIX, latest_checkpoint, readable_checkpoint

from .checkpoint import BoundarySnapshot
from .gang import gang_of
from .gang_checkpoint import check_share_width, copy_shares

__all__ = [
    "checkpoint_step",
    "keep_own_hyperparameters",
    "saved_state",
    "start_at",
    "warm_snapshot",
    "warm_start_from_disk",
]


def checkpoint_step(folder: Path) -> int:
    """The global optimizer step of a ``checkpoint-<step>`` folder (from its ``trainer_state.json``).

    Raises:
        OSError: the file cannot be read. KeyError, ValueError: it holds no ``global_step``.
    """
    state = json.loads((Path(folder) / "trainer_state.json").read_text())
    return int(state["global_step"])


def start_at(plan: ChunkPlan, step: int) -> RunStart:
    """A run that starts at global optimizer ``step`` of its ``plan`` (chunks done and rows seen up to it)."""
    return RunStart(
        plan=plan, step=step, segments_done=plan.segments_done_at(step), samples_seen=plan.samples_seen(step)
    )


def warm_snapshot(
    parent: Any, parent_id: int, trainer: Any, adapter: str | None, plan: ChunkPlan
) -> BoundarySnapshot:
    """The parent's latest boundary snapshot as the warm clone starts from it (its own LoRA settings kept).

    Args:
        parent: the parent's run record in the executor (``last`` snapshot, ``adapter``, ``plan``), or None when
            the parent is not on this executor.
        parent_id: the parent's run id (named in the messages).
        trainer: the clone's built trainer.
        adapter: the clone's adapter name, or None for full fine-tuning.
        plan: the clone's chunk plan.

    Raises:
        ConfigError: the parent has no completed chunk here, trains the other way (LoRA or full), is already at
            or past the clone's last step, or batches data differently.
    """
    if parent is None or parent.last is None:
        raise ConfigError(f"run {parent_id} has no completed chunk to warm-start from")
    snap: BoundarySnapshot = parent.last
    if (parent.adapter is None) != (adapter is None):
        raise ConfigError("a warm start needs the same kind of training (LoRA or full) as the parent")
    if snap.step >= plan.total_steps:
        raise ConfigError(
            f"the clone's total steps ({plan.total_steps}) must exceed the parent's position "
            f"(step {snap.step}); raise max_steps"
        )
    if (plan.rows_per_step, plan.steps_per_epoch) != (parent.plan.rows_per_step, parent.plan.steps_per_epoch):
        raise ConfigError("the clone batches data differently from its parent; use a cold clone")
    if adapter is not None:
        own = trainer.model.peft_config[adapter]
        snap = copy.copy(snap)
        snap.adapter_config = copy.deepcopy(own)  # the clone's own lora_alpha / lora_dropout
    return snap


def saved_state(parent_dir: Path) -> Path | None:
    """A run's latest readable ``checkpoint-<step>`` folder (a finished run's final state), or None."""
    ckpt = latest_checkpoint(parent_dir)
    return ckpt if ckpt is not None and readable_checkpoint(ckpt) else None


def warm_start_from_disk(
    parent_id: int, parent_dir: Path, trainer: Any, adapter: str | None, plan: ChunkPlan, run_dir: Path
) -> tuple[Path, int]:
    """The warm start of a clone whose parent is not in this process: its latest checkpoint (a finished run's final
    state) copied into ``run_dir/warm-start-from-run-<parent>-step-<s>`` with the clone's own LoRA settings.

    A gang parent's checkpoint (``gang.json``: ``k`` ranks' shares) is warm-started by a clone over ``k`` devices
    only: each of its ranks (this process one of them) copies its own share
    (:func:`~rapidfire_nb.training.gang_checkpoint.copy_shares`); the gang's resume reads them back.

    Args:
        parent_id: the parent's run id; ``parent_dir`` its run folder.
        trainer: the clone's built trainer; ``adapter`` its adapter name (None: full fine-tuning).
        plan: the clone's chunk plan; ``run_dir`` its run folder.

    Returns:
        ``(warm-start folder, step it starts at)``.

    Raises:
        ConfigError: no readable checkpoint, a parent of another width than the clone's (``num_gpus``) or a share
            of it missing, another kind of training (LoRA or full), no step left to train, another batch size,
            or (a gang) a share that does not fit the clone's sharded model.
    """
    ckpt = saved_state(parent_dir)
    if ckpt is None:
        raise ConfigError(f"run {parent_id} has no checkpoint on disk to warm-start from")
    found = gang_of(trainer.model)  # the clone's gang (this process one of its ranks), or None: one device
    gang = found[0] if found is not None else None
    check_share_width(parent_id, ckpt, gang.world_size if gang is not None else 1)
    step = checkpoint_step(ckpt)
    if (ckpt / "adapter_model.safetensors").is_file() != (adapter is not None):
        raise ConfigError("a warm start needs the same kind of training (LoRA or full) as the parent")
    if step >= plan.total_steps:
        raise ConfigError(
            f"the clone's total steps ({plan.total_steps}) must exceed the parent's position "
            f"(step {step}); raise max_steps"
        )
    saved = json.loads((ckpt / "trainer_state.json").read_text()).get("train_batch_size")
    if saved is not None and saved != trainer.args.train_batch_size:
        raise ConfigError("the clone batches data differently from its parent; use a cold clone")
    target = Path(run_dir) / f"{WARM_START_PREFIX}{parent_id}-step-{step}"
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    if gang is not None:  # each rank its share (rank 0 also the shared files), as the gang resume reads them
        copy_shares(parent_id, ckpt, target, gang, trainer.model, adapter)
        return target, step
    with atomic_dir(target) as tmp:
        for item in ckpt.iterdir():
            if item.is_file() and item.name != COMPLETE_MARKER:  # atomic_dir writes its own, last
                shutil.copy2(item, Path(tmp) / item.name)
        if adapter is not None:
            own = trainer.model.peft_config[adapter]  # the clone's own lora_alpha / lora_dropout
            own.save_pretrained(str(tmp))
    return target, step


def keep_own_hyperparameters(trainer: Any) -> None:
    """After transformers loads a parent's optimizer/scheduler state, put back the clone's own hyperparameters.

    ``Optimizer.load_state_dict`` also loads the parent's param-group values (lr, weight_decay, betas, eps) and
    ``LambdaLR.load_state_dict`` the parent's ``base_lrs``; the clone must train with its own config, so the
    learning rate at step s is the clone's schedule at step s: ``base_lr_clone * lambda_clone(s)``.

    Args:
        trainer: the clone's trainer, before ``train(resume_from_checkpoint=...)`` (its
            ``_load_optimizer_and_scheduler`` is wrapped).
    """
    original = trainer._load_optimizer_and_scheduler

    def load_then_restore(checkpoint: Any) -> None:
        opt, sched = trainer.optimizer, trainer.lr_scheduler
        own_groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in opt.param_groups]
        own_base = list(getattr(sched, "base_lrs", []))
        original(checkpoint)
        for group, own in zip(opt.param_groups, own_groups):
            group.update(own)
        if own_base and hasattr(sched, "lr_lambdas"):
            sched.base_lrs = own_base
            for group, base, lam in zip(opt.param_groups, sched.base_lrs, sched.lr_lambdas):
                group["lr"] = base * lam(sched.last_epoch)
            sched._last_lr = [g["lr"] for g in opt.param_groups]

    trainer._load_optimizer_and_scheduler = load_then_restore
