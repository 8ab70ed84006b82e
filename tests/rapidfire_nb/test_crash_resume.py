"""Kill test (issue 6, requirement 3): SIGKILL a training process at 6 different moments, resume, compare.

One 3-run tiny experiment (LoRA with dropout, 2 epochs, 4 chunks per epoch, run 2 with gradient accumulation 3)
is trained in a child process (``_crash_child.py``) that freezes at a chosen moment; the test SIGKILLs it there,
checks what a user would see before restarting, then restarts the same experiment with the same config group.
The kills are chained on ONE experiment (each restart is itself killed, except the last), at:

1. inside an optimizer step (after the forward of a gradient-accumulation micro-batch of run 2);
2. inside a checkpoint write, after the adapter file, before the other files and the ``COMPLETE`` marker;
3. inside a checkpoint write, ``COMPLETE`` written in the temporary folder, before the rename;
4. right after a checkpoint folder was renamed into place (older checkpoint not yet removed);
5. between chunks, right after the store recorded a finished chunk;
6. right after the store recorded a run COMPLETED: before the trackers heard it and before its final weights
   were saved (the child holds the final save back, so the kill always lands there; the restart trains its last
   chunk again).

An uninterrupted reference runs concurrently in its own process. At the end every run's final adapter, every
per-step loss and every TensorBoard point must match the reference within 1e-6 (CPU, fp32).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import load_file

from rapidfire_nb._atomic import COMPLETE_MARKER
from rapidfire_nb.store import Store
from rapidfire_nb.training.checkpoint import latest_checkpoint

CHILD = Path(__file__).with_name("_crash_child.py")
REPO = Path(__file__).resolve().parents[2]
TOL = 1e-6
NAME = "crash"
# (mode:k) per incarnation: k counts occurrences in THAT process (see _crash_child.py)
KILLS = ["step:10", "ckptfile:2", "ckptmark:3", "ckptdone:2", "boundary:4", "complete:1"]
FREEZE_TIMEOUT = 120.0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _spawn(root: Path, name: str, *extra: str, log: Path) -> subprocess.Popen:
    with open(log, "w") as f:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, str(CHILD), str(root), name, *extra],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=_env(),
            cwd=str(REPO),
        )


def _finish(p: subprocess.Popen, log: Path, timeout: float = 240) -> str:
    rc = p.wait(timeout=timeout)
    out = log.read_text()
    assert rc == 0, f"child failed (rc={rc}):\n{out[-4000:]}"
    return out


def _state(exp_dir: Path) -> tuple[dict[int, dict], dict[int, dict[str, torch.Tensor]], dict[tuple, float]]:
    s = Store(exp_dir, read_only=True)
    try:
        runs = {r["run_id"]: r for r in s.runs()}
        adapters = {}
        for rid, r in runs.items():
            if r["status"] == "COMPLETED":
                adapters[rid] = load_file(str(Path(r["checkpoint_dir"]) / "adapter_model.safetensors"))
        pts, _ = s.metrics_since(0)
    finally:
        s.close()
    losses: dict[tuple, float] = {}
    for p in pts:
        if p["name"] in ("loss", "eval_loss", "grad_norm", "learning_rate", "num_tokens", "eval_num_tokens"):
            key = (p["run_id"], p["name"], p["step"])
            assert key not in losses, f"duplicate metric {key} after resume"
            losses[key] = p["value"]
    return runs, adapters, losses


def _half_written(run_dirs: list[Path]) -> list[Path]:
    """Checkpoint leftovers that are not complete checkpoint-<step> folders (temp dirs, missing marker)."""
    out = []
    for d in run_dirs:
        for p in d.glob("*checkpoint-*") if d.is_dir() else []:
            if p.is_dir() and (p.name.startswith(".") or not (p / COMPLETE_MARKER).is_file()):
                out.append(p)
    return out


def _kill_at(root: Path, mode: str, i: int, logs: Path) -> tuple[str, dict]:
    marker = logs / f"freeze-{i}.json"
    log = logs / f"crash-{i}.log"
    p = _spawn(root, NAME, mode, str(marker), log=log)
    deadline = time.monotonic() + FREEZE_TIMEOUT
    while not marker.exists():
        if p.poll() is not None:
            pytest.fail(
                f"incarnation {i} ({mode}) exited (rc={p.returncode}) before freezing:\n"
                f"{log.read_text()[-4000:]}"
            )
        if time.monotonic() > deadline:
            p.kill()
            p.wait()
            pytest.fail(
                f"incarnation {i} ({mode}) never reached its freeze point:\n{log.read_text()[-4000:]}"
            )
        time.sleep(0.05)
    info = json.loads(marker.read_text())
    os.kill(p.pid, signal.SIGKILL)
    assert p.wait(timeout=30) == -signal.SIGKILL  # reaped: its pid no longer exists
    return log.read_text(), info


def _check_after_kill(root: Path, mode: str, info: dict, out: str, i: int) -> None:
    exp_dir = root / NAME
    run_dirs = [exp_dir / "runs" / str(r) for r in (1, 2, 3)]
    s = Store(exp_dir, read_only=True)
    try:
        assert not s.writer_alive(), "the killed writer is still reported alive"
        before = {r["run_id"]: r["status"] for r in s.runs()}
    finally:
        s.close()
    assert "ONGOING" in before.values(), (mode, before)

    if i > 0:
        assert "continuing from the last chunk checkpoints" in out, out[-3000:]

    if mode.startswith(("ckptfile", "ckptmark")):
        leftovers = _half_written(run_dirs)
        assert leftovers, f"{mode}: expected a half-written checkpoint folder, found none ({info})"
        for d in run_dirs:
            best = latest_checkpoint(d)
            assert best is None or (best / COMPLETE_MARKER).is_file()
            assert best not in leftovers
    if mode.startswith("ckptfile"):
        # also a half-written folder under the real name (no COMPLETE): it must be skipped by resume
        d = next(d for d in run_dirs if latest_checkpoint(d) is not None)
        good = latest_checkpoint(d)
        fake = d / "checkpoint-999"
        shutil.copytree(good, fake)
        (fake / COMPLETE_MARKER).unlink()
        (fake / "optimizer.pt").unlink()
        assert latest_checkpoint(d) == good

    # what a user sees before restarting: the dead writer's ONGOING runs are INTERRUPTED
    from rapidfire_nb import Experiment

    exp = Experiment(NAME, experiment_path=str(root))
    try:
        after = {r["run_id"]: r["status"] for r in exp.store.runs()}
    finally:
        exp.end()
        exp.store.close()
    for rid, st in before.items():
        want = "INTERRUPTED" if st == "ONGOING" else st
        assert after[rid] == want, (mode, before, after)


def _tb_series(exp_dir: Path, run_id: int) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(exp_dir / "tensorboard" / f"run-{run_id}"), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars("train/loss")]


def test_kill_at_six_moments_then_resume_exactly(tmp_path: Path) -> None:
    t0 = time.monotonic()
    root = tmp_path / "exps"
    root.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()

    ref_log = logs / "ref.log"
    ref = _spawn(root, "ref", log=ref_log)  # the uninterrupted reference, concurrently with the crashes
    timings: list[str] = []
    try:
        for i, mode in enumerate(KILLS):
            t = time.monotonic()
            out, info = _kill_at(root, mode, i, logs)
            _check_after_kill(root, mode, info, out, i)
            timings.append(f"{mode}: {time.monotonic() - t:.1f}s {info}")
        final_log = logs / "final.log"
        out = _finish(_spawn(root, NAME, log=final_log), final_log)
        assert "continuing from the last chunk checkpoints" in out, out[-3000:]
        _finish(ref, ref_log)
    finally:
        if ref.poll() is None:
            ref.kill()
            ref.wait()

    ref_runs, ref_w, ref_l = _state(root / "ref")
    got_runs, got_w, got_l = _state(root / NAME)
    # half-written checkpoint folders of the killed processes were removed when the runs resumed
    assert not list((root / NAME / "runs").glob("*/.checkpoint-*")), list((root / NAME / "runs").glob("*/.*"))
    assert {r: x["status"] for r, x in got_runs.items()} == {1: "COMPLETED", 2: "COMPLETED", 3: "COMPLETED"}
    for rid in (1, 2, 3):
        assert (
            got_runs[rid]["completed_steps"]
            == ref_runs[rid]["completed_steps"]
            == ref_runs[rid]["total_steps"]
        )
        assert set(got_w[rid]) == set(ref_w[rid])
        for k, v in ref_w[rid].items():
            d = (got_w[rid][k] - v).abs().max().item()
            assert d <= TOL, f"run {rid} adapter {k}: max abs diff {d}"
    assert set(got_l) == set(ref_l), sorted(set(ref_l) ^ set(got_l))[:20]
    assert any(k[1] == "loss" for k in ref_l) and any(k[1] == "num_tokens" for k in ref_l)
    for k, v in ref_l.items():
        assert abs(got_l[k] - v) <= TOL, f"{k}: {got_l[k]} vs {v}"
    # TensorBoard, as its own reader shows it: each step once, the values of the uninterrupted reference (what
    # the killed processes logged after their last checkpoint is hidden by the restart marker)
    for rid in (1, 2, 3):
        ref_tb, got_tb = _tb_series(root / "ref", rid), _tb_series(root / NAME, rid)
        assert [s for s, _ in got_tb] == [s for s, _ in ref_tb] == sorted({s for s, _ in ref_tb}), rid
        assert max(abs(a - b) for (_, a), (_, b) in zip(got_tb, ref_tb)) <= TOL
    print(f"kill test: {time.monotonic() - t0:.1f}s;", "; ".join(timings))
