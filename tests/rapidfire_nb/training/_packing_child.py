"""Child process of ``test_packing_ops.py``'s kill test: trains a pack of 3 runs (``members(3)``) with ``packing=True``.

Usage: ``python _packing_child.py <experiments_root> <name> [<run> <step> <marker_file>]``

With a run and a step, the child freezes when the executor records that run's boundary at that step (with the
pack, a boundary held while the run was trained ahead, recorded at its turn), after every checkpoint written
before it is on disk; it writes ``<marker_file>`` first, so the parent knows when to SIGKILL it. Each packed
segment is printed as ``PACK <run> <stop step> <members>``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))


def _freeze_at(run: int, step: int, marker: Path) -> None:
    from rapidfire_nb.experiment.registry import current_experiment
    from rapidfire_nb.training.executor import TorchExecutor

    original = TorchExecutor._on_boundary

    def on_boundary(self: TorchExecutor, run_id: int, at: int, rng: dict[str, Any]) -> None:
        if (run_id, at) == (run, step):
            current_experiment().session.recorder.flush(30)  # the boundaries before it: recorded ...
            self.flush()  # ... and their checkpoints on disk
            marker.write_text(f"{run_id} {at}")
            time.sleep(600)  # the parent SIGKILLs us here
            os._exit(3)  # pragma: no cover
        original(self, run_id, at, rng)

    TorchExecutor._on_boundary = on_boundary  # type: ignore[method-assign]


def _print_packs() -> None:
    from rapidfire_nb.training.pack_runs import PackRuns

    original = PackRuns._members

    def members(self: PackRuns, run_id: int, stop_step: int) -> Any:
        out = original(self, run_id, stop_step)
        if out:
            print("PACK", run_id, stop_step, ",".join(str(m.run_id) for m in out), flush=True)
        return out

    PackRuns._members = members  # type: ignore[method-assign]


def main() -> None:
    import torch

    torch.set_num_threads(1)
    root, name = sys.argv[1], sys.argv[2]
    if len(sys.argv) > 3:
        _freeze_at(int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]))
    _print_packs()
    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import List, RFGridSearch
    from rapidfire_nb.testing import tiny_create_model
    from tests.helpers import qa_dataset
    from tests.rapidfire_nb.training.test_packing_ops import NUM_CHUNKS, SEED, members

    exp = Experiment(name, experiment_path=root)
    exp.run_fit(
        RFGridSearch(configs=List(members(3)), trainer_type="SFT"),
        tiny_create_model,
        qa_dataset(16, seed=0),
        qa_dataset(4, seed=1),
        num_chunks=NUM_CHUNKS,
        seed=SEED,
        packing=True,
    )
    exp.end()


if __name__ == "__main__":
    main()
