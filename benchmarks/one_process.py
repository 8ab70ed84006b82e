"""Issue 18's own measurement: sequential plain TRL and rapidfire_nb alternating in ONE process (as in a notebook).

``overhead.py`` runs every side in a process of its own. Here, as in the issue (and as in a notebook where a user
first trains plain TRL in a cell, then calls ``run_fit``), both sides share one process: the sequential side
trains on the main thread, which leaves that thread with an OpenMP team of its own, and rapidfire_nb trains on
its device thread next to it. Three sides per repeat, in alternating order:

* ``seq``: the 4 configs one after the other with plain TRL on the main thread;
* ``rf``: the same 4 configs through ``run_fit`` (8 steps per chunk), right after a torch op on the main thread
  (whatever side ran before: a notebook cell that looked at a model);
* ``rf-keep``: the same, with the main thread's OpenMP team kept (what rapidfire_nb did before
  ``rapidfire_nb/training/openmp.py``; benchmark-side patch, library code unchanged).

Workload: the "fast steps" case of ``overhead.py`` (a tiny Llama of hidden size 256, 4 layers, 8 heads; 256
rows, batch 8, no eval set; 4 SFT LoRA configs x 32 steps). Ratios are medians of per-repeat ratios to ``seq``.

    .venv/bin/python benchmarks/one_process.py             # 5 repeats (~4 min on 2 cores)
    .venv/bin/python benchmarks/one_process.py --out benchmarks/results/one_process_fast.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIDES = ("seq", "rf", "rf-keep")


def _one(side: str, w: dict[str, Any], num_chunks: int) -> dict[str, Any]:
    import overhead_child

    import rapidfire_nb.experiment.facade as facade
    import rapidfire_nb.experiment.lifecycle as lifecycle

    out: dict[str, Any] = {"n_configs": 4}
    if side == "seq":
        overhead_child._child_base(w, out)
        return out
    keep = side == "rf-keep"
    saved = lifecycle.release_thread_team, facade.release_thread_team
    if keep:  # the library before the fix: nothing frees the main thread's team
        lifecycle.release_thread_team = facade.release_thread_team = lambda: 0  # type: ignore[assignment]
    try:
        overhead_child._child_rf(w, num_chunks, 1, out, main_torch=True)
    finally:
        lifecycle.release_thread_team, facade.release_thread_team = saved
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", help="also write the report here")
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import overhead_child
    import torch
    import transformers
    import trl

    w = overhead_child.workload("fast", 32, 8, 4, 4, with_eval=False)
    lines = [
        f"rapidfire_nb in one process with sequential TRL — {time.strftime('%Y-%m-%d %H:%M:%S')}",
        f"machine: {platform.platform()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, trl {trl.__version__}; OMP_WAIT_POLICY "
        f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}; load average 1 min {os.getloadavg()[0]:.1f} at start",
        "workload: fast steps (hidden 256, 4 layers, 8 heads), 4 SFT LoRA configs x 32 steps, batch 8, no eval set; "
        "rf: 8 steps/chunk",
    ]
    print("\n".join(lines), flush=True)
    totals: dict[str, list[float]] = {s: [] for s in SIDES}
    for rep in range(a.repeats):
        order = SIDES if rep % 2 == 0 else tuple(reversed(SIDES))
        for side in order:
            out = _one(side, w, 4)
            totals[side].append(out["total_s"])
            print(f"  repeat {rep + 1}: {side:<8} total {out['total_s']:.2f} s", flush=True)
    rows = ["", f"{'side':<60}{'median':>8}   per repeat (s, or ratio to seq)"]
    for side in SIDES:
        vals = totals[side]
        rows.append(
            f"{side + ': total (s)':<60}{statistics.median(vals):8.2f}   "
            + ", ".join(f"{v:.2f}" for v in vals)
        )
    for side in ("rf", "rf-keep"):
        ratios = [x / s for x, s in zip(totals[side], totals["seq"], strict=True)]
        what = {"rf": "rf / seq (target <= 1.05x)", "rf-keep": "rf-keep / seq (before the fix)"}[side]
        rows.append(f"{what:<60}{statistics.median(ratios):8.3f}   " + ", ".join(f"{r:.3f}" for r in ratios))
    rows.append(f"load average 1 min at end: {os.getloadavg()[0]:.1f}")
    print("\n".join(rows), flush=True)
    if a.out:
        Path(a.out).write_text("\n".join(lines + rows) + "\n")


if __name__ == "__main__":
    main()
