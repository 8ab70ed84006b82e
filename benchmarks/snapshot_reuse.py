"""A boundary snapshot's cost on the real model: buffers reused against a fresh clone each time.

``Snapshotter.take`` on SmolLM2-135M-Instruct with two LoRA adapters (r=8 on q/v and r=32 on q/k/v/o, the
configs of ``overhead.py``'s smollm2 case), each with AdamW state after one step, one thread. Per adapter it takes
``--repeats`` snapshots twice, each let go at once as the run's ``last`` snapshot is at the next boundary: with no
spare set kept (``SPARE_BUFFERS = 0``: each snapshot a clone, what every snapshot cost before the reuse; the
allocator gets the freed memory back) and as the executor does (the next copies into its tensors), and prints the
medians and their ratio. The first snapshot of each series is left out (it clones in both). Run it a few times:
a clone's cost depends on whether the allocator gave the freed memory back to the system (then it faults in
fresh pages), which changes from one process to the next.

::

    .venv/bin/python benchmarks/snapshot_reuse.py              # ~1 min on 2 CPUs
    .venv/bin/python benchmarks/snapshot_reuse.py --repeats 51
"""

from __future__ import annotations

import argparse
import statistics
import time
import types


def _series(trainer: object, adapter: str, repeats: int, spares: int) -> tuple[float, int]:
    from rapidfire_nb.training.checkpoint import Snapshotter
    from rapidfire_nb.training.rng import capture_rng

    kind = type("BenchSnapshotter", (Snapshotter,), {"SPARE_BUFFERS": spares})
    snapshotter = kind(1, trainer, adapter)
    seconds = []
    for _ in range(repeats + 1):
        rng = capture_rng()
        t0 = time.perf_counter()
        snap = snapshotter.take(rng)
        seconds.append(time.perf_counter() - t0)
        del snap  # let go, as the run's last snapshot is once the next one is taken
    return statistics.median(seconds[1:]), snapshotter.reused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=31, help="snapshots per series (default 31)")
    a = parser.parse_args()
    if a.repeats < 1:
        parser.error("--repeats: use 1 or more")

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, TrainerState, TrainingArguments

    from rapidfire_nb.data import smollm2_path

    torch.set_num_threads(1)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(smollm2_path()),
        LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
    )
    model.add_adapter(
        "r32", LoraConfig(r=32, lora_alpha=64, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    )
    args = TrainingArguments(output_dir="/tmp/rf-snapshot-reuse", report_to=[], use_cpu=True)
    print(f"Snapshotter.take, SmolLM2-135M-Instruct, 1 thread, {a.repeats} snapshots per series (medians)")
    for adapter in ("default", "r32"):
        model.set_adapter(adapter)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-4)
        for p in params:
            p.grad = torch.randn_like(p)
        optimizer.step()  # AdamW state: two tensors per parameter
        trainer = types.SimpleNamespace(
            model=model,
            optimizer=optimizer,
            lr_scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0),
            state=TrainerState(),
            args=args,
        )
        mb = sum(p.numel() * p.element_size() for p in params) / 1e6
        cloned, _ = _series(trainer, adapter, a.repeats, spares=0)
        reused, count = _series(trainer, adapter, a.repeats, spares=1)
        print(
            f"  {adapter:8s} adapter {mb:5.1f} MB + AdamW {2 * mb:5.1f} MB: cloned {cloned * 1e3:6.2f} ms, "
            f"reused {reused * 1e3:6.2f} ms ({count} of {a.repeats + 1} reused), ratio {reused / cloned:.2f}"
        )


if __name__ == "__main__":
    main()
