"""Memory over a long experiment: RSS after every round (every run one more chunk), flat after the first round?

Trains ``--runs`` LoRA configs of the tiny model (rapidfire_nb.testing) for ``--epochs`` epochs of ``--chunks``
chunks with an eval set, in one process, and prints, after each round, the process's RSS, glibc's heap in use
(``mallinfo2``: what native allocations hold, unlike RSS it does not count freed-but-kept pages) and the Python
objects traced by ``tracemalloc`` (``--trace``), then the same after ``end()``. The bar: flat after round 1.

    .venv/bin/python benchmarks/memory.py                    # 8 runs x 8 chunks x 3 epochs (~1-2 min)
    .venv/bin/python benchmarks/memory.py --trace --top 15   # + the Python allocations that grew most
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rss_mb() -> float:
    """Resident set size of this process (MB), from /proc/self/status."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_mb() -> tuple[float, float]:
    """glibc's ``(bytes in use, bytes free but kept)`` in MB (main arena + mmapped), or NaN off glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return float("nan"), float("nan")
    return (info.uordblks + info.hblkhd) / 2**20, info.fordblks / 2**20


def sqlite_mb() -> float:
    """Memory SQLite holds (page caches of every connection, statements), in MB (``sqlite3_memory_used``)."""
    import sqlite3  # noqa: F401  (loads the library Python uses)

    try:
        lib = ctypes.CDLL("libsqlite3.so.0")
        lib.sqlite3_memory_used.restype = ctypes.c_int64
        return float(lib.sqlite3_memory_used()) / 2**20
    except (OSError, AttributeError):
        return float("nan")


def _group(runs: int, steps: int) -> object:
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
    from tests.helpers import qa_to_chat

    return RFGridSearch(
        List(
            [
                RFModelConfig(
                    model_name="tiny",
                    peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
                    training_args=RFSFTConfig(
                        learning_rate=1e-3 * (1 + i),
                        per_device_train_batch_size=2,
                        max_steps=steps,
                        max_length=48,
                    ),
                    formatting_func=qa_to_chat,
                )
                for i in range(runs)
            ]
        ),
        "SFT",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-chunk", type=int, default=1)
    parser.add_argument("--eval-rows", type=int, default=8)
    parser.add_argument("--trace", action="store_true", help="also trace Python allocations (slower)")
    parser.add_argument("--top", type=int, default=10, help="with --trace: allocation sites to show")
    parser.add_argument("--group", default="traceback", choices=["traceback", "lineno", "filename"])
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) before each reading (diagnosis)")
    args = parser.parse_args()
    os.environ.setdefault("RF_HOME", f"/tmp/rf-memory-{os.getpid()}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model
    from tests.helpers import qa_dataset

    rows = args.chunks * args.steps_per_chunk * 2  # batch 2: one epoch = chunks x steps per chunk
    steps = rows // 2 * args.epochs
    train = qa_dataset(rows)
    evals = qa_dataset(args.eval_rows, seed=1) if args.eval_rows else None
    exp = Experiment(f"memory-{os.getpid()}", overwrite=True)
    exp.quiet = True
    print(
        f"{args.runs} runs x {args.chunks} chunks x {args.epochs} epochs, {steps} steps per run, pid {os.getpid()}"
    )
    print(
        f"{'round':>5} {'RSS MB':>8} {'dRSS':>7} {'heap MB':>8} {'free MB':>8} {'sqlite':>7} {'py MB':>7} {'s':>6}"
    )
    t0 = time.perf_counter()
    exp.run_fit(
        _group(args.runs, steps),
        tiny_create_model,
        train,
        evals,
        num_chunks=args.chunks,
        seed=0,
        background=True,
    )
    rounds = args.chunks * args.epochs
    first = None
    snaps = []
    for k in range(1, rounds + 1):
        exp.wait(chunks=k)
        gc.collect()
        if args.trim:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        if args.trace and k == 1:
            tracemalloc.start(25)
        rss, (heap, free) = rss_mb(), heap_mb()
        py = tracemalloc.get_traced_memory()[0] / 2**20 if tracemalloc.is_tracing() else float("nan")
        first = first if first is not None else rss
        print(
            f"{k:>5} {rss:>8.1f} {rss - first:>+7.1f} {heap:>8.1f} {free:>8.1f} {sqlite_mb():>7.2f} {py:>7.2f} "
            f"{time.perf_counter() - t0:>6.1f}"
        )
        if args.trace and k in (2, rounds):
            snaps.append(tracemalloc.take_snapshot())
    writer = exp.session.executor._writer if exp.session is not None else None  # type: ignore[attr-defined]
    exp.end()
    gc.collect()
    rss, (heap, free) = rss_mb(), heap_mb()
    print(
        f"{'end':>5} {rss:>8.1f} {rss - (first or rss):>+7.1f} {heap:>8.1f} {free:>8.1f} {sqlite_mb():>7.2f}"
    )
    if getattr(writer, "replaced", None) is not None:
        print(f"checkpoint snapshots replaced by a newer one before being written: {writer.replaced}")
    per_switch = (rss - (first or rss)) / max(1, (rounds - 1) * args.runs)
    print(
        f"growth after round 1: {rss - (first or rss):+.1f} MB = {per_switch * 1024:+.1f} KB per chunk switch"
    )
    if len(snaps) == 2:
        print(f"\nPython allocations that grew most between round 2 and round {rounds}:")
        for stat in snaps[1].compare_to(snaps[0], args.group)[: args.top]:
            print(
                f"  {stat.size_diff / 1024:+9.1f} KB {stat.count_diff:+6d} blocks  {(stat.traceback.format()[-1].strip() if args.group != 'filename' else stat.traceback[0].filename)}"
            )


if __name__ == "__main__":
    main()
