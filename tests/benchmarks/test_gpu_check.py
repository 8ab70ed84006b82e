"""benchmarks/gpu_check.py without a GPU: ``--dry-run`` lists the sections (the FSDP2 gang's too) and exits 0;
``--cpu-smoke`` runs the ``fsdp`` section's gang on 2 CPU ranks (gloo, the tiny model) and reports each rank holding
half the one-device bytes with the same final weights; without ``--cpu-smoke`` and with fewer than 2 GPUs the
section says it is skipped."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    }
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_dry_run_lists_the_fsdp_section_and_exits_0() -> None:
    done = _run("--dry-run", "--sections", "env,fsdp")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(4c) FSDP2 gang: one run sharded over 2 GPUs vs one GPU: at most 60 s" in done.stdout
    assert "dry run: imports and arguments OK" in done.stdout


def test_fsdp_section_says_it_is_skipped_with_fewer_than_two_gpus(tmp_path: Path) -> None:
    import torch

    if torch.cuda.device_count() >= 2:
        pytest.skip("2 GPUs here: the section runs for real")
    done = _run("--sections", "fsdp", "--out", str(tmp_path / "r.txt"), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    report = (tmp_path / "r.txt").read_text()
    assert "== (4c) FSDP2 gang: one run sharded over 2 GPUs vs one GPU: OK" in report
    assert f"SKIPPED: {torch.cuda.device_count()} CUDA GPU(s) here; a gang of 2 needs 2 GPUs" in report


def test_cpu_smoke_fsdp_section_trains_a_gang_of_two_cpu_ranks(tmp_path: Path) -> None:
    done = _run("--cpu-smoke", "--sections", "fsdp", "--out", str(tmp_path / "r.txt"))
    assert done.returncode == 0, done.stdout + done.stderr
    report = (tmp_path / "r.txt").read_text()
    assert "== (4c) FSDP2 gang: one run sharded over 2 GPUs vs one GPU: OK" in report, report
    diffs = [float(x) for x in re.findall(r"max \|final weights gang - one device\| = (\S+)", report)]
    assert len(diffs) == 2 and all(d < 1e-5 for d in diffs), report  # LoRA, full: data parallel = one process
    for rank in (0, 1):  # each rank holds half of what one device holds (parameters, gradients, AdamW state)
        rows = re.findall(rf"gang rank {rank} .*? (\d\.\d\d)x ", report)
        assert rows and all(r == "0.50" for r in rows[:2]), report
