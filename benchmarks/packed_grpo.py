"""Packed GRPO (issues 38 and 39 part 2): 4 GRPO LoRA runs as one pack (``packing=True``: every step one fused
forward/backward, every rollout one batched, sampled ``generate`` for the 4 runs) against today's time-slicing
(``packing=False``), on the GRPO tutorial's data.

SmolLM2-135M-Instruct (fp32), GSM8K problems (``load_gsm8k``; MIT) with the tutorial's ``correctness_reward`` and
``format_reward``, 4 runs (learning rates 1e-5, 3e-5, 1e-4, 3e-4; r=8 on q/v; ``num_generations=4``, batch 4:
one prompt per step), ``--steps`` optimizer steps in ``--chunks`` chunks, ``--completion`` new tokens per
completion. Each side runs in its own process, alternating over ``--repeats`` pairs. Printed per side: the wall
time of ``run_fit`` and the time spent in ``generate`` (the rollouts); then the ratios time-sliced / packed (above
1: packed is faster) and the largest difference between the sides' logged losses, rewards and final adapters
(0.0 expected: every packed run samples and trains as it does alone).

    .venv/bin/python benchmarks/packed_grpo.py                  # ~10 min on 2 quiet CPU cores
    .venv/bin/python benchmarks/packed_grpo.py --steps 2 --repeats 1 --out benchmarks/results/packed_grpo_latest.txt
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
LEARNING_RATES = (1e-5, 3e-5, 1e-4, 3e-4)
NAMES = ("loss", "reward", "completions/mean_length")


def _child(a: argparse.Namespace) -> None:
    """One side: the 4 runs through ``run_fit``; writes its times, logged values and adapters to ``a.child``."""
    import torch
    from peft import PeftModelForCausalLM

    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import List, RFGridSearch, RFGRPOConfig, RFLoraConfig, RFModelConfig
    from rapidfire_nb.data import correctness_reward, create_smollm2, format_reward, load_gsm8k

    train, _ = load_gsm8k(n_train=a.steps, n_eval=4, seed=42)
    group = RFGridSearch(
        RFModelConfig(
            model_name="SmolLM2-135M-Instruct",
            peft_config=RFLoraConfig(
                r=8, lora_alpha=16, lora_dropout=0.05, target_modules=["q_proj", "v_proj"]
            ),
            reward_funcs=[correctness_reward, format_reward],
            training_args=RFGRPOConfig(
                learning_rate=List(list(LEARNING_RATES)),
                num_generations=4,
                per_device_train_batch_size=4,
                max_steps=a.steps,
                max_completion_length=a.completion,
                logging_steps=1,
            ),
        ),
        "GRPO",
    )
    create_smollm2()  # converted and in the page cache before timing
    generating = [0.0]
    original = PeftModelForCausalLM.generate

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            generating[0] += time.perf_counter() - t0

    PeftModelForCausalLM.generate = timed  # the rollouts (a pack's batched generate calls the class's own)
    with tempfile.TemporaryDirectory() as root:
        exp = Experiment("packed-grpo", experiment_path=root, overwrite=True)
        exp.quiet = True
        t0 = time.perf_counter()
        exp.run_fit(
            group, create_smollm2, train, None, num_chunks=a.chunks, seed=42, packing=a.packing == "on"
        )
        seconds = time.perf_counter() - t0
        ex = exp.session.executor
        adapters = {
            str(rid): {
                k: v.detach().clone()
                for k, v in run.worker.trainer.model.state_dict().items()
                if f".{run.adapter}." in k
            }
            for rid, run in ex.runs.items()
        }
        drivers = list(ex.packs._drivers.values()) if ex.packs is not None else []
        results = exp.get_results()
        exp.end()
    torch.save(adapters, a.child + ".pt")
    logged = [
        [int(r), int(s), name, float(v)]
        for name in NAMES
        if name in results.columns
        for r, s, v in zip(results.run_id, results.step, results[name])
        if v == v  # not NaN
    ]
    out = {
        "seconds": seconds,
        "generating": generating[0],
        "logged": logged,
        "fused": sum(d.fused_steps for d in drivers),
        "together": sum(d.generated_together for d in drivers),
    }
    Path(a.child).write_text(json.dumps(out))


def _side(a: argparse.Namespace, packing: str, workdir: str, i: int) -> dict[str, Any]:
    out = os.path.join(workdir, f"{packing}-{i}.json")
    cmd = [sys.executable, __file__, "--child", out, f"--packing={packing}"]
    cmd += [f"--steps={a.steps}", f"--chunks={a.chunks}", f"--completion={a.completion}"]
    subprocess.run(cmd, check=True, cwd=str(ROOT))
    got: dict[str, Any] = json.loads(Path(out).read_text())
    got["adapters"] = out + ".pt"
    return got


def _max_difference(x: dict[str, Any], y: dict[str, Any]) -> float:
    import torch

    px, py = sorted(map(tuple, x["logged"])), sorted(map(tuple, y["logged"]))
    assert [p[:3] for p in px] == [q[:3] for q in py], "the sides logged other values"
    logged = max((abs(p[3] - q[3]) for p, q in zip(px, py)), default=0.0)
    ax, ay = torch.load(x["adapters"]), torch.load(y["adapters"])
    weights = max(float((ax[r][k] - ay[r][k]).abs().max()) for r in ax for k in ax[r])
    return max(logged, weights)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps per run (one prompt each)")
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--completion", type=int, default=48, help="max_completion_length (tokens)")
    ap.add_argument("--repeats", type=int, default=2, help="pairs of sides, alternating which goes first")
    ap.add_argument("--out", default=None, help="also write the report to this file")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--packing", default="on", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        _child(a)
        return
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    say(
        f"packed GRPO: 4 LoRA runs on SmolLM2-135M-Instruct fp32, GSM8K, {a.steps} steps x 1 prompt x 4 completions "
        f"of <= {a.completion} tokens, {a.chunks} chunks; load {os.getloadavg()[0]:.2f} at start"
    )
    with tempfile.TemporaryDirectory() as work:
        for i in range(a.repeats):
            sides = {}
            for packing in ("on", "off") if i % 2 == 0 else ("off", "on"):
                sides[packing] = got = _side(a, packing, work, i)
                say(
                    f"  repeat {i + 1}, packing={'True' if packing == 'on' else 'False'}: run_fit {got['seconds']:.1f} s, "
                    f"generate {got['generating']:.1f} s, fused steps {got['fused']}, batched rollouts {got['together']}"
                )
            on, off = sides["on"], sides["off"]
            say(
                f"  repeat {i + 1}: time-sliced / packed: run_fit {off['seconds'] / on['seconds']:.3f}x, generate "
                f"{off['generating'] / on['generating']:.3f}x; max |difference| {_max_difference(on, off):.3g}; "
                f"load {os.getloadavg()[0]:.2f}"
            )
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
