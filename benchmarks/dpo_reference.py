"""DPO's shared reference (issue 38 item 4): 4 LoRA DPO runs time-sliced with the reference computed once per
micro-batch against each run computing its own (``RAPIDFIRE_DPO_SHARED_REFERENCE=0``, plain TRL's way).

SmolLM2-135M-Instruct (fp32), DPO pairs from the construction FAQ (``load_faq_preferences(rejected="shuffle")``:
chosen = the company's answer, rejected = another question's answer; CC BY 4.0), 4 LoRA configs on one shared base
(``beta`` 0.05 / 0.1 / 0.2 / 0.5, r=8 on q/v), ``--steps`` optimizer steps per run in ``--chunks`` chunks. Each
side runs in its own process (so neither warms the other's caches), alternating over ``--repeats`` pairs. Printed
per side: the wall time of ``run_fit`` (everything: trainers built, chunk switches, checkpoints) with the preference
pairs trained per second (4 runs x steps x batch / time), the time inside ``DPOTrainer.training_step`` (forward,
reference, backward: what sharing changes), the cache's counters (computed / hits); within the shared side, the
median step that computed the reference against one that reused it (measured a few seconds apart, so a busy
machine weighs on both alike) and the k=4 throughput ratio they imply; then the throughput ratios shared / alone
of both times and the largest difference between the two sides' per-step losses and final adapters (0.0
expected).

    .venv/bin/python benchmarks/dpo_reference.py                    # ~10 min on 2 quiet CPU cores
    .venv/bin/python benchmarks/dpo_reference.py --steps 4 --repeats 1 --out benchmarks/results/dpo_reference_latest.txt
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
BETAS = (0.05, 0.1, 0.2, 0.5)


def _child(a: argparse.Namespace) -> None:
    """One side: the 4 runs through ``run_fit``; writes times, counters, losses and adapters to ``a.child``."""
    import torch

    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import List, RFDPOConfig, RFGridSearch, RFLoraConfig, RFModelConfig
    from rapidfire_nb.data import create_smollm2, load_faq_preferences
    from rapidfire_nb.training.kinds import dpo_reference

    train, _ = load_faq_preferences(n_train=a.steps * a.batch, n_eval=8, seed=42, rejected="shuffle")
    group = RFGridSearch(
        RFModelConfig(
            model_name="SmolLM2-135M-Instruct",
            peft_config=RFLoraConfig(
                r=8, lora_alpha=16, lora_dropout=0.05, target_modules=["q_proj", "v_proj"]
            ),
            training_args=RFDPOConfig(
                beta=List(list(BETAS)),
                learning_rate=5e-5,
                per_device_train_batch_size=a.batch,
                max_steps=a.steps,
                max_length=a.max_length,
                logging_steps=1,
                eval_strategy="no",
            ),
        ),
        "DPO",
    )
    create_smollm2()  # converted and in the page cache before timing
    stepping = _time_training_steps()
    with tempfile.TemporaryDirectory() as root:
        exp = Experiment("dpo-reference", experiment_path=root, overwrite=True)
        exp.quiet = True
        t0 = time.perf_counter()
        exp.run_fit(group, create_smollm2, train, None, num_chunks=a.chunks, seed=42)
        seconds = time.perf_counter() - t0
        ex = exp.session.executor
        cache = dpo_reference.cache_of(ex.models)
        adapters = {
            str(rid): {
                k: v.detach().clone()
                for k, v in run.worker.trainer.model.state_dict().items()
                if f".{run.adapter}." in k
            }
            for rid, run in ex.runs.items()
        }
        results = exp.get_results().dropna(subset=["loss"])
        exp.end()
    torch.save(adapters, a.child + ".pt")
    out = {
        "seconds": seconds,
        "stepping": sum(t for t, _ in stepping),
        "hit_steps": [t for t, hit in stepping if hit],
        "own_steps": [t for t, hit in stepping if not hit],
        "computed": cache.computed,
        "hits": cache.hits,
        "unshared": cache.unshared,
        "losses": [[int(r), int(s), float(v)] for r, s, v in zip(results.run_id, results.step, results.loss)],
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    Path(a.child).write_text(json.dumps(out))


def _time_training_steps() -> list[tuple[float, bool]]:
    """Record every ``DPOTrainer.training_step`` (forward, reference, backward): its seconds and whether its
    reference came from the cache (a hit) rather than a forward."""
    from trl import DPOTrainer

    spent: list[tuple[float, bool]] = []
    original = DPOTrainer.training_step

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        cache = getattr(self, "_rapidfire_reference_cache", None)
        hits = cache.hits if cache is not None else 0
        t0 = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            spent.append((time.perf_counter() - t0, cache is not None and cache.hits > hits))

    DPOTrainer.training_step = timed
    return spent


def _side(a: argparse.Namespace, shared: bool, workdir: str, i: int) -> dict[str, Any]:
    out = os.path.join(workdir, f"{'shared' if shared else 'alone'}-{i}.json")
    env = {**os.environ, "RAPIDFIRE_DPO_SHARED_REFERENCE": "1" if shared else "0"}
    cmd = [sys.executable, __file__, "--child", out, *_sizes(a)]
    subprocess.run(cmd, check=True, env=env, cwd=str(ROOT))
    got: dict[str, Any] = json.loads(Path(out).read_text())
    got["adapters"] = out + ".pt"
    return got


def _sizes(a: argparse.Namespace) -> list[str]:
    return [
        f"--steps={a.steps}",
        f"--batch={a.batch}",
        f"--chunks={a.chunks}",
        f"--max-length={a.max_length}",
    ]


def _interleaved(got: dict[str, Any]) -> str:
    """The shared side's own steps (reference computed) against its hits, measured minutes apart at most: the
    step-time ratio, and the throughput ratio it implies at k runs, k * own / (own + (k - 1) * hit)."""
    import statistics

    own, hit = statistics.median(got["own_steps"]), statistics.median(got["hit_steps"])
    return (
        f"    within the shared side: median step {own:.2f} s computing the reference ({len(got['own_steps'])} "
        f"steps), {hit:.2f} s reusing it ({len(got['hit_steps'])}): {own / hit:.3f}x per step, implied "
        f"k=4 throughput {4 * own / (own + 3 * hit):.3f}x"
    )


def _max_difference(x: dict[str, Any], y: dict[str, Any]) -> float:
    import torch

    losses = max(abs(p[2] - q[2]) for p, q in zip(sorted(x["losses"]), sorted(y["losses"])))
    assert [p[:2] for p in sorted(x["losses"])] == [q[:2] for q in sorted(y["losses"])], "other steps logged"
    ax, ay = torch.load(x["adapters"]), torch.load(y["adapters"])
    weights = max(float((ax[r][k] - ay[r][k]).abs().max()) for r in ax for k in ax[r])
    return max(losses, weights)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps per run")
    ap.add_argument("--batch", type=int, default=4, help="preference pairs per step")
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2, help="pairs of sides, alternating which goes first")
    ap.add_argument("--out", default=None, help="also write the report to this file")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        _child(a)
        return
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    say(
        f"DPO shared reference: 4 LoRA runs (beta {', '.join(map(str, BETAS))}) on SmolLM2-135M-Instruct fp32, "
        f"{a.steps} steps x batch {a.batch} pairs, max_length {a.max_length}, {a.chunks} chunks; "
        f"load {os.getloadavg()[0]:.2f} at start"
    )
    times: dict[str, list[float]] = {"shared": [], "alone": []}
    steps: dict[str, list[float]] = {"shared": [], "alone": []}
    with tempfile.TemporaryDirectory() as work:
        for i in range(a.repeats):
            order = (True, False) if i % 2 == 0 else (False, True)
            sides = {}
            for shared in order:
                got = _side(a, shared, work, i)
                name = "shared" if shared else "alone"
                sides[name] = got
                times[name].append(got["seconds"])
                steps[name].append(got["stepping"])
                pairs = 4 * a.steps * a.batch / got["seconds"]
                say(
                    f"  repeat {i + 1} {name:6s}: run_fit {got['seconds']:7.1f} s ({pairs:5.2f} pairs/s), in training "
                    f"steps {got['stepping']:7.1f} s; reference computed "
                    f"{got['computed']} / shared {got['hits']} / unshared {got['unshared']} (torch {got['torch']}, "
                    f"{got['threads']} threads)"
                )
            say(_interleaved(sides["shared"]))
            say(
                f"  repeat {i + 1}: max |difference| shared vs alone (losses, adapters) = "
                f"{_max_difference(sides['shared'], sides['alone'])}"
            )
    best = {k: min(v) for k, v in times.items()}
    best_steps = {k: min(v) for k, v in steps.items()}
    say(
        f"throughput shared / alone (target >= 1.2x at k=4), best of {a.repeats}: run_fit "
        f"{best['alone'] / best['shared']:.3f}x ({best['shared']:.1f} s vs {best['alone']:.1f} s), training steps "
        f"{best_steps['alone'] / best_steps['shared']:.3f}x ({best_steps['shared']:.1f} s vs "
        f"{best_steps['alone']:.1f} s); load {os.getloadavg()[0]:.2f} at end"
    )
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
