"""How long ops and the other runs wait while a clone is built (issue 34 item 5), before and after the builder thread.

Two tiny-model SFT runs train in rotation on a 20,000-row training set (10 steps a chunk); a cold clone of run 1
with another ``max_length`` is asked for (its build tokenizes the 20,000 rows); while it is built, a stop or resume
of run 2 is sent every 0.5 s after the previous one was answered. Measured from the clone request until the clone
is built:

* ``op_wait_max_s`` / ``op_wait_median_s`` over ``ops``: how long those ops waited for their answer (a stop of
  run 2 while it trains applies at its chunk boundary, ~10 steps; otherwise at once);
* ``longest_stall_s``: the longest time in which no run made an optimizer step (sampled every 20 ms);
* ``steps_meanwhile``: optimizer steps runs 1 and 2 made meanwhile;
* ``build_s``: the clone's request to the op's answer ("run 3 created").

``before``: ``TorchExecutor.prepare_run`` returns None (the whole build on the device thread, the scheduler thread
waiting for it, as before); ``after``: the rows are tokenized on the builder thread.

Usage: ``.venv/bin/python benchmarks/clone_build_wait.py [rows [modes...]]`` (default: 20000 rows, before and
after). Prints one JSON line per mode.
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
    from rapidfire_nb.testing import tiny_sft_dataset

    return tiny_sft_dataset(n, seed=0)  # conversational prompt/completion rows


def _group() -> Any:
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    def config(lr: float) -> Any:
        return RFModelConfig(
            model_name="tiny",
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
        exp.run_fit(
            _group(), tiny_create_model, _rows(n_rows), num_chunks=n_rows // 20, seed=1, background=True
        )
        sched = exp.session.scheduler
        while min(s.step for s in sched.snapshot()) < 20:  # both runs train
            time.sleep(0.05)
        t0 = time.monotonic()
        clone = exp.submit_op("clone", 1, changes={"max_length": 40}, warm_start=False, source="api")
        waits, op, op_at, next_op = [], None, 0.0, t0 + 0.5
        steps0 = _steps(sched)
        last_change, last_steps, longest = t0, steps0, 0.0
        while True:
            now = time.monotonic()
            if op is not None and sched.ack(op.op_id).state != "queued":
                waits.append(now - op_at)
                op, next_op = None, now + 0.5
            building = sched.ack(clone.op_id).state == "queued"
            if op is None and building and now >= next_op:  # a stop or resume of run 2 while the clone builds
                kind = "stop" if sched.run_snapshot(2).status.value == "ONGOING" else "resume"
                op, op_at = exp.submit_op(kind, 2, source="api"), now
            steps = _steps(sched)
            if steps != last_steps:
                longest, last_change, last_steps = max(longest, now - last_change), now, steps
            if not building and op is None:
                break
            time.sleep(0.02)
        built = time.monotonic() - t0
        longest = max(longest, time.monotonic() - last_change)
        out = {
            "mode": mode,
            "rows": n_rows,
            "build_s": round(built, 2),
            "clone": sched.ack(clone.op_id).message,
            "ops": len(waits),
            "op_wait_max_s": round(max(waits, default=0.0), 2),
            "op_wait_median_s": round(sorted(waits)[len(waits) // 2], 2) if waits else None,
            "longest_stall_s": round(longest, 2),
            "steps_meanwhile": _steps(sched) - steps0,
            "prepared_off_thread": exp.session.executor.prepared.prepared,
        }
        exp.stop([s.run_id for s in sched.snapshot() if s.status.in_rotation()])  # end() waits for them
        exp.end()
        return out
    finally:
        TorchExecutor.prepare_run = original  # type: ignore[method-assign]


def _steps(sched: Any) -> int:
    return sum(s.step for s in sched.snapshot() if s.run_id in (1, 2))


def main() -> None:
    n_rows = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    with tempfile.TemporaryDirectory() as tmp:
        for mode in sys.argv[2:] or ("before", "after"):
            print(json.dumps(measure(mode, n_rows, Path(tmp))), flush=True)


if __name__ == "__main__":
    main()
