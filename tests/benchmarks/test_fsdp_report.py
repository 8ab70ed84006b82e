"""benchmarks/fsdp.py's report on made-up records: the held bytes and their ratio to the one-device row, the median
step time and its ratio, the CUDA column only when measured, and the diffs line."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import fsdp as bench  # noqa: E402

MB = 2**20


def _record(params: int, grads: int, optim: int, steps: list[float], cuda: float | None = None) -> dict:
    return {
        "params": params * MB,
        "grads": grads * MB,
        "optim": optim * MB,
        "step_s": steps,
        "train_s": sum(steps),
        "losses": [1.0] * len(steps),
        "rss_peak_mb": 2000.0,
        "rss_end_mb": 1500.0,
        "cuda_peak_mb": cuda,
        "device": "CPU",
    }


def _got(cuda: float | None = None) -> dict:
    one = _record(500, 500, 1000, [2.0, 1.0, 3.0], cuda)
    rank = _record(250, 250, 500, [4.0, 1.5, 2.0], None if cuda is None else cuda / 4)
    rank["segments"] = 2
    return {"one": one, "ranks": [rank, dict(rank)], "diff": 1.5e-8, "tensors": 8, "loss_diff": 0.0}


SIZES = {"name": "m", "batch": 2, "max_length": 64}


def test_rows_give_held_bytes_and_step_time_against_the_one_device_row() -> None:
    lines = bench.report_kind("full", _got(), SIZES)
    assert lines[0].startswith("== full fine-tuning: m fp32, 3 steps of global batch 4 (gang: 2 ranks x 2")
    assert "CUDA" not in lines[1]
    one, rank0 = lines[2].split(), lines[3].split()
    assert one[2:7] == ["500.0", "500.0", "1000.0", "2000.0", "1.00x"]
    assert rank0[3:8] == ["250.0", "250.0", "500.0", "1000.0", "0.50x"]  # held: half of one device
    assert one[-3:] == ["2.00", "1.00x", "6.0"]  # median step 2.0 s, train 6.0 s
    assert rank0[-3:] == ["2.00", "1.00x", "7.5"]
    assert "max |final weights gang - one device| = 1.500e-08 over 8 tensors (model.safetensors)" in lines[6]


def test_cuda_column_when_measured_and_small_sizes_keep_two_decimals() -> None:
    got = _got(cuda=800.0)
    got["ranks"][0]["grads"] = got["ranks"][1]["grads"] = int(0.5 * MB)
    lines = bench.report_kind("lora", got, SIZES)
    assert "CUDA peak" in lines[1]
    rank0 = lines[3].split()
    assert rank0[4] == "0.50"  # gradients under 10 MB: two decimals
    assert rank0[11:13] == ["200", "0.25x"]  # CUDA peak: 800 MB on one GPU, 200 MB per rank
