"""Child process of ``test_continue_after_kill.py``: trains run 1 of the tiny experiment to its end, waits for its
final state on disk, then dies by SIGKILL (no ``end()``: a kernel killed after training).

Usage: ``python _continue_child.py <experiments_root> <experiment_name> <torch_threads>``
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import torch

torch.set_num_threads(int(sys.argv[3]))  # the parent's arithmetic

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from rapidfire_nb import Experiment  # noqa: E402
from rapidfire_nb.testing import tiny_create_model  # noqa: E402
from tests.helpers import qa_dataset  # noqa: E402
from tests.rapidfire_nb.experiment.test_continue_after_end import PARENT_STEPS, _group  # noqa: E402

root, name = Path(sys.argv[1]), sys.argv[2]
exp = Experiment(name, experiment_path=root, quiet=True)
exp.run_fit(_group(), tiny_create_model, qa_dataset(16), num_chunks=2, seed=1, background=True)
assert exp.wait(timeout=120)
final_state = root / name / "runs" / "1" / f"checkpoint-{PARENT_STEPS}" / "COMPLETE"
deadline = time.monotonic() + 60
while not final_state.is_file() and time.monotonic() < deadline:
    time.sleep(0.05)
print("final state on disk" if final_state.is_file() else "no final state", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
