"""Kill -9 on a quantized shared base, then resume: the runs end equal to an uninterrupted run (issue 35).

The child (``_quantized.py``) trains two LoRA runs on one 4-bit NF4 tiny base (6 steps, 3 chunks); it is SIGKILLed
inside its 4th training step, after the first chunk checkpoints, then started again: it continues from the last
chunk checkpoints, and its saved adapters equal those of an uninterrupted child (max abs diff 0.0; the resume keeps
the adapters in bf16, as TRL cast them, where PEFT's load alone would turn them to float32).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip(
    "bitsandbytes", reason="bitsandbytes is not installed (pip install 'rapidfire_nb[quantization]')"
)

CHILD = Path(__file__).with_name("_quantized.py")
REPO = Path(__file__).resolve().parents[3]


def _spawn(folder: Path, root: Path, name: str, *extra: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    log = open(root / f"{name}-{len(extra)}.log", "wb")  # noqa: SIM115 - the child keeps the descriptor
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(folder), str(root), name, *extra],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=str(REPO),
    )


def _finish(p: subprocess.Popen[bytes], root: Path, name: str) -> str:
    rc = p.wait(timeout=240)
    out = (root / f"{name}-0.log").read_text()
    assert rc == 0, out[-4000:]
    return out


def _adapters(exp_dir: Path) -> dict[int, dict[str, object]]:
    from safetensors.torch import load_file

    from rapidfire_nb.store import Store

    s = Store(exp_dir, read_only=True)
    try:
        runs = {r["run_id"]: r for r in s.runs()}
    finally:
        s.close()
    assert {r: x["status"] for r, x in runs.items()} == {1: "COMPLETED", 2: "COMPLETED"}
    return {
        rid: load_file(str(Path(r["checkpoint_dir"]) / "adapter_model.safetensors"))
        for rid, r in runs.items()
    }


def test_kill_9_on_a_4bit_base_then_resume_exactly(tmp_path: Path) -> None:
    from _quantized import save_tiny  # type: ignore[import-not-found]

    folder = tmp_path / "tiny"
    save_tiny(folder)
    root = tmp_path / "exps"
    root.mkdir()
    ref = _spawn(folder, root, "ref")  # the uninterrupted reference, beside the crash
    p = _spawn(folder, root, "crash", "4")
    deadline = time.monotonic() + 180
    while not (folder / "frozen").exists():
        assert p.poll() is None, (root / "crash-1.log").read_text()[-4000:]
        assert time.monotonic() < deadline, "the child never reached its 4th step"
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    assert p.wait(timeout=30) == -signal.SIGKILL
    out = _finish(_spawn(folder, root, "crash"), root, "crash")
    assert "continuing from the last chunk checkpoints" in out, out[-3000:]
    _finish(ref, root, "ref")
    want, got = _adapters(root / "ref"), _adapters(root / "crash")
    for rid in (1, 2):
        assert set(got[rid]) == set(want[rid])
        for k, v in want[rid].items():
            assert str(v.dtype) == "torch.bfloat16", k  # type: ignore[attr-defined]
            assert (got[rid][k] - v).abs().max().item() == 0.0, f"run {rid} {k}"  # type: ignore[operator]
