"""How long ops and the other runs wait while a clone is built (issue 34 item 5), before and after the builder thread.

Two tiny-model SFT runs train in rotation on a 20,000-row training set (10 steps a chunk); a cold clone of run 1
with another ``max_length`` is asked for (its build tokenizes the 20,000 rows), then, 0.3 s later, a stop of run 2.
Measured from the clone request until the clone is built:

* ``stop_answered_s``: how long the stop of run 2 took to be answered (applied at run 2's chunk boundary, or at
  once when run 2 is parked);
* ``longest_stall_s``: the longest time in which no run made an optimizer step (sampled every 20 ms);
* ``steps_meanwhile``: optimizer steps runs 1 and 2 made meanwhile;
* ``build_s``: the clone's request to the op's answer ("run 3 created").

``before``: ``TorchExecutor.prepare_run`` returns None (the whole build on the device thread, the scheduler thread
waiting for it, as before); ``after``: the rows are tokenized on the builder thread.

Usage: ``.venv/bin/python benchmarks/clone_build_wait.py [rows]`` (default 20000). Prints one JSON line per mode.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _rows(n: int) -> Any:
    from datasets import Dataset

    from rapidfire_nb.testing import tiny_sft_dataset

    rows = tiny_sft_dataset(n, seed=0)
    return Dataset.from_dict({"question": rows["question"], "answer": rows["answer"]})


def _to_chat(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "prompt": [{"role": "user", "content": row["question"]}],
        "completion": [{"role": "assistant", "content": row["answer"]}],
    }


def _group() -> Any:
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    def config(lr: float) -> Any:
        return RFModelConfig(
            model_name="tiny",
            formatting_func=_to_chat,
            peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
            training_args=RFSFTConfig(
                learning_rate=lr, per_device_train_batch_size=2, max_steps=2000, max_length=48
            ),
        )

    return RFGridSearch(configs=List([config(1e-3), config(2e-3)]), trainer_type="SFT")


def measure(mode: str, n_rows: int, root: Path) -> dict[str, Any]:
    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model
    from rapidfire_nb.training.executor import TorchExecutor

    original = TorchExecutor.prepare_run
    if mode == "before":
        TorchExecutor.prepare_run = lambda self, run_id, spec, device=None: None  # type: ignore[method-assign]
    try:
        exp = Experiment(f"clone-build-{mode}", experiment_path=root, quiet=True)
        exp.run_fit(_group(), tiny_create_model, _rows(n_rows), num_chunks=n_rows // 20, seed=1)
        sched = exp.session.scheduler
        while min(s.step for s in sched.snapshot()) < 20:  # both runs train
            time.sleep(0.05)
        t0 = time.monotonic()
        clone = exp.submit_op("clone", 1, changes={"max_length": 40}, warm_start=False, source="api")
        stop_at, stop, stop_answered = t0 + 0.3, None, None
        steps0 = _steps(sched)
        last_change, last_steps, longest = t0, steps0, 0.0
        while True:
            now = time.monotonic()
            if stop is None and now >= stop_at:
                stop = exp.submit_op("stop", 2, source="api")
            if stop is not None and stop_answered is None and sched.ack(stop.op_id).state != "queued":
                stop_answered = now - stop_at
            steps = _steps(sched)
            if steps != last_steps:
                longest, last_change, last_steps = max(longest, now - last_change), now, steps
            if sched.ack(clone.op_id).state != "queued" and stop_answered is not None:
                break
            time.sleep(0.02)
        built = time.monotonic() - t0
        longest = max(longest, time.monotonic() - last_change)
        out = {
            "mode": mode,
            "rows": n_rows,
            "build_s": round(built, 2),
            "clone": sched.ack(clone.op_id).message,
            "stop_answered_s": round(stop_answered, 2),
            "longest_stall_s": round(longest, 2),
            "steps_meanwhile": _steps(sched) - steps0,
            "prepared_off_thread": exp.session.executor.prepared.prepared,
        }
        exp.end()
        return out
    finally:
        TorchExecutor.prepare_run = original  # type: ignore[method-assign]


def _steps(sched: Any) -> int:
    return sum(s.step for s in sched.snapshot() if s.run_id in (1, 2))


def main() -> None:
    n_rows = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("before", "after"):
            print(json.dumps(measure(mode, n_rows, Path(tmp))), flush=True)


if __name__ == "__main__":
    main()
