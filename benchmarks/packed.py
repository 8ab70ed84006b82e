"""Packed generation (issue 39 part 1): the main job with batched generation eval against run-by-run generation.

The main job (``examples/sft_customer_support.py``: 4 SFT LoRA configs on SmolLM2-135M-Instruct, the construction
FAQ, 4 chunks, ROUGE-L of greedy answers to 12 held-out questions at every chunk end) runs twice in this process,
in alternating order over ``--repeats`` pairs: ``run_fit(..., batch_generation=True)`` (the default: the 4 runs
answer in one ``generate`` of 48 rows at each round's end) and ``batch_generation=False`` (each run generates its
12 answers alone at its chunk end, as before). Printed per mode: the wall time of ``run_fit`` (training,
evaluation and generation), the generating time (the sum of the runs' ``eval_generation_seconds``: a batched
evaluation gives each run its share of the batch), and the ratios batched / alone (below 1: batched is faster).
The generated answers must be the same: every run's ``eval_rougeL`` at every step is compared and the largest
difference printed (0.0 expected: greedy decoding gives each run exactly its answers alone).

    .venv/bin/python benchmarks/packed.py                  # 1 pair at the demo's sizes (~10 min on 2 CPU cores)
    .venv/bin/python benchmarks/packed.py --max-steps 4 --repeats 2
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _fit(a: argparse.Namespace, batch: bool, root: str, data: tuple[Any, Any]) -> dict[str, Any]:
    from examples.sft_customer_support import config_group
    from rapidfire_nb import Experiment
    from rapidfire_nb.data import create_smollm2

    exp = Experiment(f"packed-{'batched' if batch else 'alone'}", experiment_path=root, overwrite=True)
    exp.quiet = True
    t0 = time.perf_counter()
    exp.run_fit(
        config_group(a),
        create_smollm2,
        *data,
        num_chunks=a.num_chunks,
        seed=42,
        eval_generation_samples=a.samples,
        batch_generation=batch,
    )
    seconds = time.perf_counter() - t0
    results = exp.get_results()
    exp.end()
    rouge = results.dropna(subset=["eval_rougeL"]).sort_values(["run_id", "step"])
    return {
        "seconds": seconds,
        "generating": float(results["eval_generation_seconds"].sum()),
        "rouge": {(int(r), int(s)): float(v) for r, s, v in zip(rouge.run_id, rouge.step, rouge.eval_rougeL)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-steps", type=int, default=12, help="optimizer steps per run (the demo's 12)")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--n-train", type=int, default=48)
    ap.add_argument("--n-eval", type=int, default=20)
    ap.add_argument("--num-chunks", type=int, default=4)
    ap.add_argument("--samples", type=int, default=12, help="eval questions answered per evaluation")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=1, help="pairs of runs (alternating order)")
    a = ap.parse_args()

    import torch

    from rapidfire_nb.data import load_construction_faq, smollm2_path

    smollm2_path()
    data = load_construction_faq(n_train=a.n_train, n_eval=a.n_eval, seed=42)
    print(
        f"main job: 4 runs x {a.max_steps} steps, {a.num_chunks} chunks, {a.samples} answers of "
        f"{a.max_new_tokens} tokens per evaluation; torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="rapidfire-packed-") as root:
        for i in range(a.repeats):
            for batch in (True, False) if i % 2 == 0 else (False, True):
                out = _fit(a, batch, root, data)
                runs[batch].append(out)
                mode = "batched" if batch else "alone"
                print(f"  {mode:8s} run_fit {out['seconds']:7.1f} s, generating {out['generating']:6.1f} s")
    best = {b: min(runs[b], key=lambda o: o["seconds"]) for b in runs}
    diff = max(
        abs(x["rouge"][k] - y["rouge"][k]) for x in runs[True] for y in runs[False] for k in x["rouge"]
    )
    same_points = all(set(x["rouge"]) == set(y["rouge"]) for x in runs[True] for y in runs[False])
    print()
    print(f"{'mode':10s} {'run_fit s':>10s} {'generating s':>13s}")
    for b in (False, True):
        print(f"{'batched' if b else 'alone':10s} {best[b]['seconds']:10.1f} {best[b]['generating']:13.1f}")
    print(
        f"ratio batched / alone (best of {a.repeats}): run_fit {best[True]['seconds'] / best[False]['seconds']:.3f}x, "
        f"generating {best[True]['generating'] / best[False]['generating']:.3f}x "
        f"(generating {best[False]['generating'] / best[True]['generating']:.2f}x faster)"
    )
    print(f"eval_rougeL batched vs alone: same points {same_points}, largest difference {diff:.1e}")


if __name__ == "__main__":
    main()
