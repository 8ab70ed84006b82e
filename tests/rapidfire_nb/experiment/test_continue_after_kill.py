"""Continuing a run after its kernel was killed (issue 34 item 4, the restart half): a child process trains run 1 to
its end and dies by SIGKILL without ``end()``; ``Experiment(name)`` + ``run_fit`` in this process then continues it
warm to 8 steps, bit-identical to the continuation made in the session that trained it (here, in this process).

The experiment is ``test_continue_after_end``'s (run 1 ends at step 3, inside its first chunk; ``lora_dropout``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from tests.rapidfire_nb.experiment.test_continue_after_end import MORE, PARENT_STEPS, _continue, _fit

CHILD = Path(__file__).with_name("_continue_child.py")


def test_a_run_finished_in_a_killed_kernel_is_continued_exactly_after_the_restart(tmp_path: Path) -> None:
    from tests.helpers import max_abs_diff

    in_session = _fit("cont-in-session", tmp_path)
    want = _continue(in_session)
    in_session.end()

    child = subprocess.run(
        [sys.executable, str(CHILD), str(tmp_path), "cont-killed", str(torch.get_num_threads())],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == -9, child.stderr[-2000:]
    assert "final state on disk" in child.stdout, child.stdout + child.stderr[-2000:]
    again = _fit("cont-killed", tmp_path)  # the dead writer's lock is free; run 1 is COMPLETED in the store
    got = _continue(again)
    again.end()
    assert (got["snap"].status.value, got["snap"].step) == ("COMPLETED", MORE)
    assert f"warm from run 1's final state, step {PARENT_STEPS}" in got["message"]
    assert got["loss"] == want["loss"]
    assert max_abs_diff(got["weights"], want["weights"]) == 0.0
