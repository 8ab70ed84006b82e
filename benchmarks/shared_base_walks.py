"""What a training step walks on a shared base: transformers' whole-model walks against the run's own parameters.

Every optimizer step, transformers' ``Trainer`` calls ``model.train()``, clips over ``model.parameters()`` and calls
``model.zero_grad()``; on a base shared by N LoRA runs each walk also covers the other runs' adapters.
``training/own_params.py`` replaces them for the training run: ``skip_redundant_train`` (``train()`` returns at once
when every module already trains) and ``OwnParameters`` (clip and ``zero_grad`` over the run's own parameters).
This script times each walk both ways on SmolLM2-135M-Instruct, one run's adapter active (r=32 on q/k/v/o) and
``--adapters`` in all on the base (overhead.py's smollm2 configs, alternating r=8 q/v and r=32 q/k/v/o), with the
gradients of one real backward given back to the parameters before each clip and ``zero_grad`` (that is timed
alone and taken off). It checks that both clips return the same norm, bit for bit. Per walk: the median milliseconds of
``--repeats`` calls, both ways, and the saving per optimizer step.

::

    .venv/bin/python benchmarks/shared_base_walks.py                  # ~1 min on 2 CPUs
    .venv/bin/python benchmarks/shared_base_walks.py --adapters 1     # one adapter, as on a plain run's model
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
import types
from collections.abc import Callable
from typing import Any


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--adapters", type=int, default=4, help="LoRA adapters on the shared base (default 4)"
    )
    parser.add_argument("--repeats", type=int, default=101, help="calls per walk and way (default 101)")
    a = parser.parse_args()
    if a.adapters < 1 or a.repeats < 1:
        parser.error("--adapters and --repeats: use 1 or more")

    import torch
    from accelerate import Accelerator
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from rapidfire_nb.data import smollm2_path
    from rapidfire_nb.training.adapters import activate_adapter
    from rapidfire_nb.training.own_params import OwnParameters, skip_redundant_train

    def lora(i: int) -> LoraConfig:
        if i % 2 == 0:
            return LoraConfig(
                r=32, lora_alpha=64, lora_dropout=0.1, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
            )
        return LoraConfig(r=8, lora_alpha=16, lora_dropout=0.1, target_modules=["q_proj", "v_proj"])

    torch.manual_seed(0)  # the adapters' initialisation, the batch and dropout: the same norms every run
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(smollm2_path()), lora(0), adapter_name="run_1"
    )
    for i in range(1, a.adapters):
        model.add_adapter(f"run_{i + 1}", lora(i))
    activate_adapter(model, "run_1")
    model.train()
    own_params = [p for p in model.parameters() if p.requires_grad]
    ids = torch.randint(0, 49_000, (1, 64))
    model(input_ids=ids, labels=ids).loss.backward()
    grads = [p.grad.clone() for p in own_params]

    def restore() -> None:
        for p, g in zip(own_params, grads):
            p.grad = g.clone()

    timed_grads = [g.clone() for g in grads]

    def give_back() -> (
        None
    ):  # the timed calls: the same tensors again (a clip scales them in place, same work)
        for p, g in zip(own_params, timed_grads):
            p.grad = g

    max_grad_norm = 1.0
    accelerator = Accelerator(cpu=True)
    optimizer = torch.optim.AdamW(own_params, lr=1e-4)
    trainer = types.SimpleNamespace(
        model=model,
        optimizer=optimizer,
        accelerator=accelerator,
        args=types.SimpleNamespace(max_grad_norm=max_grad_norm),
    )
    own = OwnParameters(trainer)
    # what install() keeps: the trainer's own clip, over every parameter
    own._default_clip = lambda m: accelerator.clip_grad_norm_(m.parameters(), max_grad_norm)

    restore()
    default_norm = accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
    restore()
    own_norm = own.clip(model)
    if not own._own or own.fast_steps != 1:
        raise SystemExit("OwnParameters kept the default walks: the benchmark's run is not a plain LoRA run")
    if not torch.equal(default_norm, own_norm):
        raise SystemExit(f"the clips differ: {default_norm.item()!r} against {own_norm.item()!r}")

    restore_ms = _median_ms(give_back, a.repeats)
    rows = [
        ("train()", _median_ms(lambda: type(model).train(model), a.repeats), None),
        (
            "clip",
            _median_ms(
                lambda: (give_back(), accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)),
                a.repeats,
            )
            - restore_ms,
            _median_ms(lambda: (give_back(), own.clip(model)), a.repeats) - restore_ms,
        ),
        (
            "zero_grad",
            _median_ms(lambda: (give_back(), type(model).zero_grad(model)), a.repeats) - restore_ms,
            _median_ms(lambda: (give_back(), own.zero_grad()), a.repeats) - restore_ms,
        ),
    ]
    skip = skip_redundant_train(model)
    rows[0] = ("train()", rows[0][1], _median_ms(lambda: model.train(), a.repeats))
    if skip.skipped < a.repeats:
        raise SystemExit("skip_redundant_train did not skip: a module of the model has its own train()")

    modules = sum(1 for _ in model.modules())
    print("shared-base walks — " + time.strftime("%Y-%m-%d %H:%M:%S"))
    print(
        f"machine: {platform.platform()}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"SmolLM2-135M-Instruct, {a.adapters} adapter(s) on the base ({modules} modules), run_1 training "
        f"({sum(p.numel() for p in own_params):,} trainable parameters); medians of {a.repeats} calls"
    )
    print(f"clip norms: transformers {default_norm.item()!r}, own {own_norm.item()!r} (equal)")
    print(f"{'walk':<10} {'transformers':>13} {'own':>9} {'saved':>9}")
    total = 0.0
    for name, before, after in rows:
        total += before - after
        print(f"{name:<10} {before:10.2f} ms {after:6.2f} ms {before - after:6.2f} ms")
    print(f"{'per step':<10} {'':>13} {'':>9} {total:6.2f} ms")


if __name__ == "__main__":
    main()
