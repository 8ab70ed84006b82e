"""What every trainer kind does around TRL on the engine's shared base model (the kinds' default hooks).

Measured on TRL 1.16 / PEFT 0.21:

* **Per-run forward of the shared base.** Every TRL trainer patches the base model's ``forward`` with a
  fused LM head carrying its own settings (GRPO's ``temperature``, DPO's extra outputs for
  ``use_weighting``); on a shared base the last trainer built would win. :func:`record_forward` records the
  forward each trainer installed and :func:`restore_forward` puts the active run's back on every handover.
* **Exact resume past the first epoch** (crash recovery, warm clones). GRPO's ``RepeatSampler`` shuffles each
  epoch with its own generator, advanced once per epoch and never reseeded (no ``set_epoch``); a resumed
  trainer's fresh sampler would shuffle epoch ``e`` like epoch 0, so other prompts from the first step after
  the checkpoint (measured: loss 0.058 and adapter 0.04-0.05 off; plain TRL's own ``resume_from_checkpoint``
  is off the same way). :func:`resume_sampler_epochs` replays the epochs already trained on the resumed
  trainer's sampler before its first batch (a no-op for samplers with ``set_epoch``: SFT/DPO).
* **The reference model of LoRA runs is the shared base with adapters disabled** — exactly what a plain
  ``DPOTrainer``/``GRPOTrainer`` given ``peft_config`` uses. Given an already-wrapped ``PeftModel`` instead
  (our case: one PeftModel holding one adapter ``run_<id>`` per run), both trainers look up the adapter named
  ``"default"`` (``KeyError`` with per-run names) and add a frozen ``"ref"`` copy of it, which would then be
  the reference (a second adapter, different from a plain run's reference). :func:`reference_free_build`
  exposes the run's adapter as ``"default"`` while the trainer is built and skips the ``"ref"`` copy, so the
  trainer keeps ``ref_model=None`` and computes reference log-probs under ``disable_adapter()``.

No torch import at module level.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

__all__ = ["freeze", "record_forward", "reference_free_build", "restore_forward", "resume_sampler_epochs"]


def _forward_owner(model: Any) -> Any:
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def record_forward(trainer: Any) -> None:
    """Record the ``forward`` this trainer installed on its (possibly shared) base model.

    Args:
        trainer: A TRL trainer, right after it was built.
    """
    owner = _forward_owner(trainer.model)
    trainer._rapidfire_forward = (owner, owner.__dict__.get("forward"))


def restore_forward(trainer: Any) -> None:
    """Put back the ``forward`` the active run's trainer installed (its own fused-LM-head settings).

    Args:
        trainer: The trainer of the run about to train (``record_forward`` was called on it).
    """
    owner, forward = getattr(trainer, "_rapidfire_forward", (None, None))
    if owner is not None and forward is not None and owner.__dict__.get("forward") is not forward:
        owner.forward = forward


def resume_sampler_epochs(trainer: Any) -> None:
    """On ``train(resume_from_checkpoint=...)``, put the training sampler where an uninterrupted run has it.

    GRPO's ``RepeatSampler`` shuffles with its own ``torch.Generator``, seeded once when the sampler is made
    and advanced by one permutation per epoch (each ``iter()``); it has no ``set_epoch``. A resumed trainer
    makes a fresh sampler, so epoch ``e > 0`` would be shuffled with epoch 0's permutation: other prompts
    from the first step after the checkpoint (crash resume, warm clones past the first epoch). transformers
    only fast-forwards the batches inside the resumed epoch (``skip_first_batches``); its own samplers are
    reseeded per epoch by ``set_epoch`` (SFT/DPO are exact without this).

    After transformers has read the checkpoint's position (``_init_training_state``: ``epochs_trained``) and
    before the first batch is drawn, a sampler without ``set_epoch`` is iterated once per epoch already
    trained, exactly as the uninterrupted run iterated it, so its generator is where that run's was. Samplers
    with ``set_epoch`` or without a generator of their own, and trainers that do not resume, are left alone.

    Args:
        trainer: A TRL trainer, before ``train()``; its ``_get_train_sampler``/``_init_training_state`` are
            wrapped on the instance.
    """
    if "_get_train_sampler" not in dir(trainer) or "_init_training_state" not in dir(trainer):
        return
    made: list[Any] = []
    make_sampler = trainer._get_train_sampler
    init_state = trainer._init_training_state

    def get_train_sampler(*args: Any, **kwargs: Any) -> Any:
        sampler = make_sampler(*args, **kwargs)
        made[:] = [sampler]
        return sampler

    signature = inspect.signature(init_state)

    def init_training_state(*args: Any, **kwargs: Any) -> Any:
        out = init_state(*args, **kwargs)
        resume_from_checkpoint = signature.bind(*args, **kwargs).arguments.get("resume_from_checkpoint")
        epochs_trained = int(out[0])
        sampler = made[0] if made else None
        if (
            resume_from_checkpoint is not None
            and epochs_trained > 0
            and sampler is not None
            and not hasattr(sampler, "set_epoch")
            and getattr(sampler, "generator", None) is not None
        ):
            for _ in range(epochs_trained):
                for _ in sampler:  # the whole epoch, as the uninterrupted run drew it
                    pass
        return out

    trainer._get_train_sampler = get_train_sampler
    trainer._init_training_state = init_training_state


@contextlib.contextmanager
def reference_free_build(model: Any, adapter: str | None) -> Iterator[None]:
    """While a DPO/GRPO trainer is built on the shared PeftModel: its adapter is also ``"default"``, no ``"ref"``.

    DPOTrainer/GRPOTrainer given a PeftModel and no ``peft_config`` read ``model.peft_config["default"]`` and
    add a ``"ref"`` adapter copied from it (their reference). A plain run given ``peft_config`` has no
    ``"ref"`` adapter: its reference is the base with adapters disabled, and so is ours after this.

    Args:
        model: The model the trainer is given (a ``PeftModel`` for LoRA runs).
        adapter: The run's adapter name, or ``None`` (full fine-tuning: nothing to do).
    """
    if adapter is None or not hasattr(model, "peft_config"):
        yield
        return
    configs = model.peft_config
    aliased = "default" not in configs
    if aliased:
        configs["default"] = configs[adapter]
    original_add = model.__dict__.get("add_adapter")

    def add_adapter(adapter_name: str, *args: Any, **kwargs: Any) -> Any:
        if adapter_name == "ref":
            return None  # TRL's frozen copy of "default": not made; the reference is the base, adapters off
        return type(model).add_adapter(model, adapter_name, *args, **kwargs)

    model.add_adapter = add_adapter
    try:
        yield
    finally:
        if original_add is None:
            model.__dict__.pop("add_adapter", None)
        else:
            model.add_adapter = original_add
        if aliased and configs.get("default") is configs.get(adapter):
            configs.pop("default", None)
        model.set_adapter(adapter)


def freeze(model: Any) -> Any:
    """Put ``model`` in eval mode with every parameter frozen (a reference model); returns it."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model
