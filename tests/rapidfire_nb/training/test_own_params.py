"""``OwnParameters``: on a shared base, a run's clip and ``zero_grad`` walk its own parameters, with the same result.

Two runs share one tiny PEFT base (two adapters); each trains with TRL, in turns, as the executor trains them. The
weights, the logged gradient norms and the losses must equal those of the same runs trained with transformers'
own walks over every parameter, bit for bit, with the clip active (``max_grad_norm`` small enough to cut).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from trl import SFTConfig, SFTTrainer

from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset
from rapidfire_nb.training.adapters import activate_adapter
from rapidfire_nb.training.own_params import OwnParameters, skip_redundant_train


def _lora(r: int) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def _pair(tmp_path: Path, own: bool) -> tuple[Any, list[Any], list[OwnParameters | None]]:
    """A shared base with adapters run_1 (r=2) and run_2 (r=4) and one TRL trainer per adapter."""
    from peft import get_peft_model

    torch.manual_seed(0)
    base, tok = tiny_create_model({"model_name": "tiny"})
    model = get_peft_model(base, _lora(2), adapter_name="run_1")
    model.add_adapter("run_2", _lora(4))
    trainers, owns = [], []
    for i, adapter in enumerate(("run_1", "run_2"), start=1):
        activate_adapter(model, adapter)  # the optimizer holds the active adapter's parameters only
        args = SFTConfig(
            output_dir=str(tmp_path / f"{own}-{i}"),
            max_steps=4,
            per_device_train_batch_size=2,
            learning_rate=5e-2,
            max_grad_norm=0.05,  # far below the tiny model's gradient norms: every step is clipped
            logging_steps=1,
            max_length=32,
            eval_strategy="steps",  # model.eval() every 2 steps, then model.train() has work again
            eval_steps=2,
            save_strategy="no",
            report_to=[],
            bf16=False,  # TRL turns bf16 on by default; the Accelerator state must stay as the rest of the suite has it
            use_cpu=True,
            seed=i,
        )
        trainer = SFTTrainer(
            model=model,
            args=args,
            train_dataset=tiny_sft_dataset(8),
            eval_dataset=tiny_sft_dataset(4, seed=1),
            processing_class=tok,
        )
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
        watcher = OwnParameters(trainer) if own else None
        if watcher is not None:
            assert watcher.install()
            skip_redundant_train(model)
        trainers.append(trainer)
        owns.append(watcher)
    return model, trainers, owns


def _train_in_turns(model: Any, trainers: list[Any], owns: list[OwnParameters | None]) -> None:
    for trainer, own, adapter in zip(trainers, owns, ("run_1", "run_2")):
        activate_adapter(model, adapter)
        if own is not None:
            own.activate()
        trainer.train()


def test_clip_and_zero_grad_over_the_own_parameters_train_bit_for_bit_the_same(tmp_path: Path) -> None:
    model, trainers, owns = _pair(tmp_path, own=True)
    twin, twin_trainers, _ = _pair(tmp_path, own=False)
    _train_in_turns(model, trainers, owns)
    _train_in_turns(twin, twin_trainers, [None, None])
    # every step of both runs took the short walk
    assert [o.fast_steps for o in owns if o is not None] == [4, 4]
    assert skip_redundant_train(model).skipped >= 4  # model.train() returned at once where nothing changed
    evals = [[h["eval_loss"] for h in t.state.log_history if "eval_loss" in h] for t in trainers]
    assert evals == [[h["eval_loss"] for h in t.state.log_history if "eval_loss" in h] for t in twin_trainers]
    logs = [[(h["grad_norm"], h["loss"]) for h in t.state.log_history if "loss" in h] for t in trainers]
    twin_logs = [
        [(h["grad_norm"], h["loss"]) for h in t.state.log_history if "loss" in h] for t in twin_trainers
    ]
    assert logs == twin_logs and all(len(runs) == 4 for runs in logs)
    assert all(g > 0.05 for runs in logs for g, _ in runs)  # the clip did cut
    weights = dict(model.named_parameters())
    for name, p in twin.named_parameters():
        assert torch.equal(weights[name], p), name
    # zero_grad walked the own parameters and cleared them: no gradient is left anywhere
    assert all(p.grad is None for p in model.parameters())
    assert model.zero_grad == owns[1].zero_grad  # type: ignore[union-attr]


def test_a_trainable_parameter_outside_the_optimizer_keeps_transformers_own_walks(tmp_path: Path) -> None:
    model, trainers, owns = _pair(tmp_path, own=True)
    twin, twin_trainers, _ = _pair(tmp_path, own=False)
    from transformers import TrainerCallback

    # after the optimizer was built: a gradient outside it, counted in the clip
    class Unfreeze(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            next(p for n, p in model.named_parameters() if n.endswith("norm.weight")).requires_grad_(True)

    for t in (trainers[0], twin_trainers[0]):
        t.add_callback(Unfreeze())
    _train_in_turns(model, trainers[:1], owns[:1])
    _train_in_turns(twin, twin_trainers[:1], [None])
    assert owns[0] is not None and owns[0].fast_steps == 0  # checked at the first clip: the default walk
    assert "zero_grad" not in model.__dict__  # nn.Module's own zero_grad
    grad_norms = [h["grad_norm"] for h in trainers[0].state.log_history if "grad_norm" in h]
    assert grad_norms == [h["grad_norm"] for h in twin_trainers[0].state.log_history if "grad_norm" in h]


def test_train_returns_at_once_only_when_every_module_already_trains() -> None:
    from peft import get_peft_model

    base, _ = tiny_create_model({"model_name": "tiny"})
    model = get_peft_model(base, _lora(2), adapter_name="run_1")
    fast = skip_redundant_train(model)
    assert skip_redundant_train(model) is fast  # installed once
    model.train()
    assert fast.skipped == 1 and all(m.training for m in model.modules())
    model.eval()  # the full walk of the model's class, train(False)
    assert fast.skipped == 1 and not any(m.training for m in model.modules())
    model.train()  # modules in eval mode: the full walk
    assert fast.skipped == 1 and all(m.training for m in model.modules())
    some = next(m for n, m in model.named_modules() if n.endswith("lora_dropout.run_1"))
    some.eval()  # one module switched on its own (say, by a callback)
    model.train()
    assert fast.skipped == 1 and some.training
    # a new adapter's modules are looked at too (the list is made again when the adapters change)
    model.add_adapter("run_2", _lora(4))
    new = next(m for n, m in model.named_modules() if n.endswith("lora_A.run_2"))
    new.eval()
    model.train()
    assert fast.skipped == 1 and new.training
    model.train()
    assert fast.skipped == 2


def test_a_module_with_its_own_train_method_always_gets_the_full_walk() -> None:
    from peft import get_peft_model

    calls: list[bool] = []

    class Counting(torch.nn.Linear):
        def train(self, mode: bool = True) -> Any:
            calls.append(mode)
            return super().train(mode)

    base, _ = tiny_create_model({"model_name": "tiny"})
    base.extra = Counting(2, 2)
    model = get_peft_model(base, _lora(2), adapter_name="run_1")
    fast = skip_redundant_train(model)
    model.train()
    model.train()
    assert fast.skipped == 0 and calls == [True, True]
