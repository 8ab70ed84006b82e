"""What a step walks on a base shared by LoRA runs: the training run's own parameters, and no module needlessly.

Every optimizer step, transformers' ``Trainer`` calls ``model.train()`` (in ``training_step``), clips with
``accelerator.clip_grad_norm_(model.parameters(), ...)`` (``Trainer._clip_grad_norm``) and calls ``model.zero_grad()``;
each walks every module of the model. On a shared base the walks also cover the other runs' adapters:
SmolLM2-135M-Instruct with the 4 adapters of ``benchmarks/overhead.py`` has 2,319 modules against a plain run's
1,599. Measured with ``benchmarks/shared_base_walks.py`` (2 CPU threads, medians of 21 calls, one adapter -> four):
``train()`` 2.8 -> 4.4 ms, the clip 3.6 -> 5.1-7.5 ms, ``zero_grad`` 1.5 -> 2.5 ms; with the changes below 0.1,
2.0 and 0.03 ms: 10-12 ms less of a ~0.28 s step with four adapters.

* :class:`OwnParameters` (one per LoRA run): only the training run's parameters can hold a gradient
  (:func:`~rapidfire_nb.training.adapters.activate_adapter` makes its adapter the only trainable one, PEFT freezes
  the base, every backward of a segment is that run's, and its ``zero_grad`` after each optimizer step clears them
  before the next run trains). So the clip goes over the run's trainable parameters in ``model.parameters()``
  order (the same gradients in the same order: the same norm, bit for bit) and ``zero_grad`` clears those. Checked
  once, at the run's first clip: when another parameter then holds a gradient, or the trainable parameters are not
  the optimizer's, the run keeps transformers' own walks.
* :func:`skip_redundant_train` (one per shared base): ``model.train()`` returns at once when every module already
  trains, which is every step but the first of a segment and the first after an evaluation.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OwnParameters", "skip_redundant_train"]


class OwnParameters:
    """One LoRA run's clip and ``zero_grad`` over its own parameters (device thread only).

    Args:
        trainer: The run's trainer; its ``model`` is the shared ``PeftModel``.

    Use :meth:`install` once, after the trainer is built, and :meth:`activate` whenever the run's adapter becomes
    the active one (before each of its segments).
    """

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.model = trainer.model
        # the trainable parameters in model order; None: not checked yet; []: checked, the default walks
        self._own: list[Any] | None = None
        self.fast_steps = 0  # clips over the own list (tests, benchmark)

    def install(self) -> bool:
        """Route the trainer's clip through :meth:`clip` (not when its class overrides ``_clip_grad_norm``, or the
        installed transformers has none); returns True when installed."""
        from transformers import Trainer

        own_clip = getattr(Trainer, "_clip_grad_norm", None)
        if own_clip is None or getattr(type(self.trainer), "_clip_grad_norm", None) is not own_clip:
            return False
        self._default_clip = self.trainer._clip_grad_norm
        self.trainer._clip_grad_norm = self.clip
        return True

    def activate(self) -> None:
        """The run trains next: ``model.zero_grad()`` clears its own parameters (once they were checked)."""
        if self._own:
            self.model.zero_grad = self.zero_grad
        else:  # nn.Module's own, until the first clip checked the list
            self.model.__dict__.pop("zero_grad", None)

    def force(self, params: list[Any]) -> bool:
        """Walk only ``params`` (the run's adapter weights, in model order) from now on, even while other runs'
        parameters hold gradients: a packed step (:mod:`~rapidfire_nb.training.packing`) leaves every run's
        gradients on the shared base until each run's optimizer step. The logged norm of a run with
        ``max_grad_norm == 0`` (transformers' ``_get_grad_norm``) is taken over ``params`` too. False (nothing
        changed) when the trainer clips its own way or its optimizer holds other parameters.
        """
        optimizer = (
            self.trainer.optimizer
        )  # None before the run's first step: train() builds it from ``params``
        optimized = (
            {id(p) for g in optimizer.param_groups for p in g["params"]} if optimizer is not None else None
        )
        if "_clip_grad_norm" not in self.trainer.__dict__ or optimized not in (None, {id(p) for p in params}):
            return False
        self._own = list(params)
        self.activate()
        accelerator, own = self.trainer.accelerator, self._own

        def grad_norm(model: Any, grad_norm: Any = None) -> Any:
            return accelerator.clip_grad_norm_(own, float("inf")) if grad_norm is None else grad_norm

        self.trainer._get_grad_norm = grad_norm
        return True

    def clip(self, model: Any) -> Any:
        """``Trainer._clip_grad_norm(model)`` over the run's own parameters (its own walk when not checked)."""
        if model is not self.model:
            return self._default_clip(model)
        if self._own is None:
            self._own = self._check(model)
            self.activate()
        if not self._own:
            return self._default_clip(model)
        self.fast_steps += 1
        return self.trainer.accelerator.clip_grad_norm_(self._own, self.trainer.args.max_grad_norm)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """``nn.Module.zero_grad`` over the run's own parameters."""
        for p in self._own or ():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                p.grad.zero_()

    def _check(self, model: Any) -> list[Any]:
        """The trainable parameters in model order, or [] when walking only them would not be the same."""
        mixed = getattr(self.trainer, "_has_mixed_mesh_grads", None)
        if mixed is not None and mixed(model):
            return []
        own, others_with_grad = [], False
        for p in model.parameters():
            if p.requires_grad:
                own.append(p)
            elif p.grad is not None:
                others_with_grad = True
        optimized = {id(p) for group in self.trainer.optimizer.param_groups for p in group["params"]}
        if others_with_grad or optimized != {id(p) for p in own}:
            return []
        return own


def _plain_train_methods() -> tuple[Any, ...]:
    """``train`` methods that do nothing beyond setting ``training`` flags unless the mode changes: ``nn.Module``'s
    and transformers' ``PreTrainedModel.train`` (which also switches a kernels mode, on a change of mode only)."""
    import torch
    from transformers import PreTrainedModel

    return (torch.nn.Module.train, PreTrainedModel.train)


class _TrainMode:
    """``model.train()`` that returns at once when every module already trains (installed on one shared base)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self._key: tuple[tuple[str, Any], ...] | None = None
        self._modules: list[Any] | None = None  # None: a module with its own train(); always the full call
        self.skipped = 0  # calls that changed nothing and returned at once (tests, benchmark)

    def __call__(self, mode: bool = True) -> Any:
        if mode is True:
            modules = self._current()
            if modules is not None and all(m.training for m in modules):
                self.skipped += 1
                return self.model
        return type(self.model).train(self.model, mode)

    def _current(self) -> list[Any] | None:
        key = tuple(getattr(self.model, "peft_config", {}).items())
        if (
            self._key is None
            or len(key) != len(self._key)
            or any(n != m or c is not d for (n, c), (m, d) in zip(key, self._key))
        ):
            modules = list(self.model.modules())
            plain = _plain_train_methods()
            self._modules = modules if all(type(m).train in plain for m in modules) else None
            self._key = key
        return self._modules


def skip_redundant_train(model: Any) -> Any:
    """Make ``model.train()`` (transformers' ``Trainer.training_step`` calls it every step) return at once when every
    module of the shared base already trains; installed once per model.

    ``nn.Module.train`` walks every module to set its ``training`` flag (module docstring: 2.8-4.4 ms per step on
    SmolLM2). When every flag is already set (every step after the first of a segment, or after an evaluation) the
    call changes nothing, and a look at each module's flag (a list of them, made again when the adapters change)
    costs ~0.1 ms. Any other call (``eval()``, ``train(False)``, a module found in eval mode, a model with a module
    whose class has its own ``train``, e.g. PEFT's DoRA layers, which clear a cache there) is the full walk of the
    model's class.

    Args:
        model: The shared ``peft.PeftModel``.

    Returns:
        The installed callable (its ``skipped`` counts the calls that returned at once).
    """
    current = model.__dict__.get("train")
    if isinstance(current, _TrainMode):
        return current
    mode = _TrainMode(model)
    model.train = mode
    return mode
