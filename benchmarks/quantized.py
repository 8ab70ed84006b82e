"""Quantized shared bases (issue 35): SmolLM2-135M-Instruct in 4-bit NF4 with 1, 4 and 8 LoRA runs, against fp32.

Each case runs in a child process of its own (a clean peak): ``run_fit`` of N LoRA runs (r=8 on q/k/v/o, batch 2,
``--steps`` optimizer steps each, one chunk per step) on one base loaded with the seeds' recipe
(``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=bfloat16, bnb_4bit_use_double_quant=True,
bnb_4bit_quant_type="nf4")``) or in full precision (fp32). Printed per case: the base's own bytes with the runs'
adapters in it (``get_memory_footprint``), the resident memory the load added, the peak memory (CUDA:
``max_memory_allocated``; CPU: the process's peak RSS, which also holds Python, torch, the datasets and, for 4-bit,
the full-precision weights read before they are quantized), the load's seconds, the time per optimizer step
((``run_fit`` time - load time) / steps of all runs: it still holds each run's trainer build), and the ratios of
the peaks: 4-bit vs fp32 at the same N, and N runs vs 1 run (target: 8 runs <= 1.2 x 1 run).

    .venv/bin/python benchmarks/quantized.py             # 6 cases, 2 steps per run (~3-5 min on 2 CPU cores)
    .venv/bin/python benchmarks/quantized.py --steps 3 --runs 1 4
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


LOADS: list[tuple[float, float]] = []  # (seconds, resident MB added) of each create_model_fn call


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _create(model_config: dict[str, Any]) -> Any:
    from rapidfire_nb.data.smollm2 import create_smollm2

    rss, t = _rss_mb(), time.perf_counter()
    out = create_smollm2(model_config)
    LOADS.append((time.perf_counter() - t, _rss_mb() - rss))
    return out


def child(bits: int, runs: int, steps: int) -> dict[str, Any]:
    """One case: ``runs`` LoRA runs on one base (``bits`` 4, or 32 for full precision); returns its figures."""
    import tempfile

    import torch
    from transformers import BitsAndBytesConfig

    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
    from rapidfire_nb.testing import tiny_sft_dataset

    kwargs: dict[str, Any] = {}
    if bits == 4:
        kwargs = {
            "quantization_config": BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_compute_dtype=torch.bfloat16,
                bnb_4bit_use_double_quant=True,
                bnb_4bit_quant_type="nf4",
            ),
            "device_map": "auto",
        }
    lrs = [1e-4 * (i + 1) for i in range(runs)]
    configs = [
        RFModelConfig(
            model_name="SmolLM2-135M-Instruct",
            model_kwargs=kwargs,
            peft_config=RFLoraConfig(
                r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
            ),
            training_args=RFSFTConfig(
                learning_rate=lr,
                max_steps=steps,
                per_device_train_batch_size=2,
                max_length=64,
                logging_steps=1,
            ),
        )
        for lr in lrs
    ]
    cuda = torch.cuda.is_available()
    exp = Experiment(f"q{bits}-{runs}", experiment_path=tempfile.mkdtemp())
    exp.quiet = True
    t0 = time.perf_counter()
    exp.run_fit(RFGridSearch(List(configs), "SFT"), _create, tiny_sft_dataset(2 * steps), num_chunks=steps)
    seconds = time.perf_counter() - t0
    base = next(iter(exp.session.executor.runs.values())).base.model.get_base_model()
    out = {
        "bits": bits,
        "runs": runs,
        "base_mb": base.get_memory_footprint() / 2**20,
        "peak_mb": (torch.cuda.max_memory_allocated() / 2**20)
        if cuda
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_kind": "cuda max_memory_allocated" if cuda else "peak RSS",
        "load_s": sum(t for t, _ in LOADS),
        "load_rss_mb": sum(m for _, m in LOADS),
        "s_per_step": (seconds - sum(t for t, _ in LOADS)) / (steps * runs),
        "completed": int((exp.get_runs_info().status == "COMPLETED").sum()),
    }
    exp.end()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2, help="optimizer steps per run")
    p.add_argument("--runs", type=int, nargs="+", default=[1, 4, 8], help="LoRA runs per case")
    p.add_argument("--child", nargs=3, type=int, metavar=("BITS", "RUNS", "STEPS"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(*a.child)), flush=True)
        return
    rows: dict[tuple[int, int], dict[str, Any]] = {}
    for bits in (4, 32):
        for runs in a.runs:
            cmd = [sys.executable, __file__, "--child", str(bits), str(runs), str(a.steps)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
            if not line:
                print(f"{bits}-bit x {runs}: failed\n{done.stderr[-2000:]}")
                continue
            rows[bits, runs] = json.loads(line[-1][7:])
    print(f"SmolLM2-135M-Instruct, LoRA r=8 q/k/v/o, batch 2, {a.steps} steps per run ({_kind(rows)})")
    print(
        "| base | runs | base MB | RSS of the load MB | peak MB | vs fp32 | vs 1 run | load s | s/step | completed |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (bits, runs), r in rows.items():
        full, one = rows.get((32, runs)), rows.get((bits, min(a.runs)))
        vs_full = f"{r['peak_mb'] / full['peak_mb']:.2f}x" if full else "-"
        vs_one = f"{r['peak_mb'] / one['peak_mb']:.2f}x" if one else "-"
        name = "4-bit NF4" if bits == 4 else "fp32"
        print(
            f"| {name} | {runs} | {r['base_mb']:.0f} | {r['load_rss_mb']:.0f} | {r['peak_mb']:.0f} | {vs_full} | "
            f"{vs_one} | {r['load_s']:.1f} | {r['s_per_step']:.2f} | {r['completed']}/{runs} |"
        )
    worst = rows.get((4, max(a.runs))), rows.get((4, min(a.runs)))
    if worst[0] and worst[1]:
        ratio = worst[0]["peak_mb"] / worst[1]["peak_mb"]
        print(f"4-bit: {max(a.runs)} runs / {min(a.runs)} run peak = {ratio:.2f}x (target <= 1.2x)")


def _kind(rows: dict[tuple[int, int], dict[str, Any]]) -> str:
    return next(iter(rows.values()))["peak_kind"] if rows else "no result"


if __name__ == "__main__":
    main()
