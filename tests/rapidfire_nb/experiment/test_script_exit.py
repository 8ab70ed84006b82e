"""A plain script that ends, or raises, while its runs train in the background (``run_fit(background=True)``).

Before: Python finalized the interpreter while the device thread was inside a torch op and the process aborted
("terminate called without an active exception", exit status 134; 3 of 3 normal ends on a busy machine). Now the
runs are parked at the end of their current chunk, written, and the script keeps its own exit status: 0 after
its last line, 1 after an uncaught exception; one line says how to continue, and the store holds the runs
STOPPED at a chunk boundary.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent(
    """
    import sys, time
    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import RFGridSearch, RFModelConfig, RFSFTConfig
    from rapidfire_nb.testing import tiny_create_model
    from tests.helpers import qa_dataset, qa_to_chat

    group = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            formatting_func=qa_to_chat,
            training_args=RFSFTConfig(per_device_train_batch_size=2, num_train_epochs=4, max_length=32),
        ),
        "SFT",
    )
    exp = Experiment("bg", experiment_path=sys.argv[1])
    exp.run_fit(group, tiny_create_model, qa_dataset(256), num_chunks=8, seed=1, background=True)
    time.sleep(1.0)
    print("LAST LINE", flush=True)
    if sys.argv[2] == "raise":
        raise RuntimeError("the user's own error")
    """
)


@pytest.mark.parametrize("how", ["end", "raise"])
def test_a_script_ending_while_runs_train_parks_them_and_keeps_its_exit_status(
    tmp_path: Path, how: str
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path), how],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    expected = 1 if how == "raise" else 0
    assert proc.returncode == expected, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    assert "terminate called" not in proc.stderr
    assert "LAST LINE" in proc.stdout
    assert (
        "the script ended while runs [1] trained in the background: stopping them at the end of their current "
        "chunk" in proc.stdout
    )
    assert "STOPPED (checkpoints and weights saved). To continue, run the script again with " in proc.stdout
    assert ("RuntimeError: the user's own error" in proc.stderr) == (how == "raise")

    from rapidfire_nb.store import Store

    with Store(tmp_path / "bg") as store:
        run = store.get_run(1)
    assert run is not None and run["status"] == "STOPPED"
    assert run["completed_steps"] < 512 and run["completed_steps"] % 16 == 0  # parked at a chunk boundary
