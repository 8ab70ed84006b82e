"""Rungs survive a kernel's death (issue 34 item 2) on the tiny model: a kernel SIGKILLed inside the chunk-1
successive-halving decision, then restarted, prunes the same runs with the same reasons as a kernel never killed;
after the restart a cold clone of a pruned run is pruned at rung 1, and a resumed pruned run is judged at rung 2
against the values recorded before the restart, as without one.

The killed kernel is a child process whose policy SIGKILLs it at its second judgement of rung 1, once everything
reported before is written (the values, the rung's decision, the first judgement) and every run's chunk-1
checkpoint too (the restart continues each run after rung 1: before the fix, all four passed it); a second child
finishes the training, so the test's own kernel is a second restart.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[3]
NAME = "rungs"
CHILD = """
import os, signal, sys, time
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch
torch.set_num_threads(1)
from rapidfire_nb import Experiment
from rapidfire_nb.automl import SuccessiveHalving
from rapidfire_nb.experiment.registry import current_experiment
from rapidfire_nb.run_folder import latest_checkpoint, run_dir
from tests.rapidfire_nb.automl.test_rungs_after_restart import fit

KILL_AT = int(sys.argv[2])


class Killed(SuccessiveHalving):
    calls = 0

    def judge(self, run_id, rung, total_chunks, values):
        Killed.calls += 1
        if Killed.calls == KILL_AT:
            session = current_experiment().session
            session.recorder.flush(60)  # what was reported before this judgement
            folders = [run_dir(session.store.experiment_dir, r) for r in (1, 2, 3, 4)]
            deadline = time.monotonic() + 60
            while any(latest_checkpoint(f) is None for f in folders) and time.monotonic() < deadline:
                time.sleep(0.05)  # every run's chunk-1 checkpoint written: the restart continues from it
            os.kill(os.getpid(), signal.SIGKILL)
        return super().judge(run_id, rung, total_chunks, values)


exp = Experiment("rungs", experiment_path=sys.argv[1])
fit(exp, Killed(metric="eval_loss", mode="min", reduction_factor=2, grace_chunks=1))
exp.end()
"""


def fit(exp: Any, policy: Any) -> None:
    """The 4-run group of ``test_early_stopping_engine`` (4 chunks of one step each) with ``policy``."""
    from rapidfire_nb.testing import tiny_create_model
    from tests.helpers import qa_dataset
    from tests.rapidfire_nb.test_early_stopping_engine import NUM_CHUNKS, SEED, _group

    train, evald = qa_dataset(16, seed=0), qa_dataset(6, seed=1)
    exp.run_fit(
        _group(), tiny_create_model, train, evald, num_chunks=NUM_CHUNKS, seed=SEED, early_stopping=policy
    )


def _child(root: Path, kill_at: int) -> int:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), str(kill_at)],
        cwd=str(REPO),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, -signal.SIGKILL), done.stdout[-3000:] + done.stderr[-3000:]
    return done.returncode


def _outcome(exp: Any) -> dict[int, tuple[str, int, str | None]]:
    info = exp.get_runs_info().set_index("run_id")
    return {
        int(r): (str(row.status), int(row.completed_steps), row.stop_reason if row.stop_reason else None)
        for r, row in info.iterrows()
    }


def _then_resume_and_clone(exp: Any) -> tuple[int, int]:
    """Resume the first run pruned at rung 1 and make a cold clone of it that barely learns; wait for both."""
    info = exp.get_runs_info().set_index("run_id")
    pruned = int(info.index[(info.status == "STOPPED") & (info.completed_steps == 1)][0])
    assert exp.resume(pruned).state in ("queued", "applied")
    clone = exp.clone_modify(pruned, {"learning_rate": 1e-9}, warm_start=False)
    assert exp.wait(timeout=240)
    return pruned, clone


def test_a_kill_inside_the_rung_1_decision_changes_no_decision(tmp_path: Path) -> None:
    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import SuccessiveHalving

    def policy() -> Any:
        return SuccessiveHalving(metric="eval_loss", mode="min", reduction_factor=2, grace_chunks=1)

    ref = Experiment(NAME, experiment_path=tmp_path / "ref")  # never killed
    fit(ref, policy())
    expected = _outcome(ref)
    expected_more = _then_resume_and_clone(ref)
    expected_after = _outcome(ref)
    ref.end()

    root = tmp_path / "killed"
    assert _child(root, kill_at=2) == -signal.SIGKILL  # killed inside the chunk-1 decision
    assert _child(root, kill_at=0) == 0  # restarted: trains to the end
    exp = Experiment(NAME, experiment_path=root)  # a second restart: every run has ended
    fit(exp, policy())
    assert _outcome(exp) == expected
    assert _then_resume_and_clone(exp) == expected_more
    after = _outcome(exp)
    exp.end()
    assert after == expected_after
    pruned, clone = expected_more
    assert after[clone][0] == "STOPPED" and after[clone][1] == 1
    assert (
        after[clone][2].startswith("pruned at chunk 1/4: eval_loss")
        and "of 5 at this rung" in after[clone][2]
    )
    assert after[pruned][1] >= 2  # not pruned again at rung 1
    if (
        after[pruned][0] == "STOPPED"
    ):  # judged at rung 2 against the 2 values recorded there before the restart
        assert after[pruned][2].startswith("pruned at chunk 2/4") and "of 3 at this rung" in after[pruned][2]
