"""Two experiments training at once in one process train exactly as each would alone (the device arbiter).

Experiment A (2 LoRA runs) and experiment B (another LoRA run, another seed) are trained alone, one after the
other, then both in the background in one process, B started while A trains. Every run's per-step losses and
final adapter weights must be the same (0.0): each run's RNG stream and the shared device are its own while it
trains. lora_dropout > 0, so a run whose RNG was touched by the other experiment would differ.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from tests.helpers import (
    adapter_from_folder,
    max_abs_diff,
    metric_points,
    qa_dataset,
    qa_to_chat,
    result_series,
)

N_TRAIN = 24
NUM_CHUNKS = 3


def _group(lrs: tuple[float, ...]) -> Any:
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    configs = List(
        [
            RFModelConfig(
                model_name="tiny",
                formatting_func=qa_to_chat,
                peft_config=RFLoraConfig(
                    r=4, lora_alpha=8, lora_dropout=0.2, target_modules=["q_proj", "v_proj"]
                ),
                training_args=RFSFTConfig(
                    learning_rate=lr,
                    per_device_train_batch_size=4,
                    num_train_epochs=1,
                    max_length=32,
                    logging_steps=1,
                ),
            )
            for lr in lrs
        ]
    )
    return RFGridSearch(configs=configs, trainer_type="SFT")


GROUPS = {"a": (_group((1e-3, 3e-3)), 7), "b": (_group((2e-3,)), 8)}
RUNS = {"a": [1, 2], "b": [1]}


def _start(name: str, root: Path) -> Any:
    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model

    exp = Experiment(name, experiment_path=root)
    exp.on_message(lambda line: None)
    group, seed = GROUPS[name[0]]
    exp.run_fit(
        group, tiny_create_model, qa_dataset(N_TRAIN), num_chunks=NUM_CHUNKS, seed=seed, background=True
    )
    return exp


def _outcome(exp: Any, steps_at: list[tuple[float, str]] | None = None) -> dict[int, Any]:
    assert exp.wait(timeout=300)
    results, info = exp.get_results(), exp.get_runs_info()
    if (
        steps_at is not None
    ):  # when each step logged, stamped on the training thread (not when a line printed)
        steps_at += [(p["wall_time"], exp.experiment_name) for p in metric_points(exp, "loss")]
    exp.end()
    out = {}
    for row in info.itertuples():
        assert row.status == "COMPLETED", (exp, row.run_id, row.error)
        out[row.run_id] = (
            result_series(results, row.run_id, "loss"),
            adapter_from_folder(row.checkpoint_dir),
        )
    return out


def test_two_experiments_at_once_train_as_each_alone(tmp_path: Path) -> None:
    alone = {name: _outcome(_start(name, tmp_path)) for name in ("a-alone", "b-alone")}
    steps_at: list[tuple[float, str]] = []
    a = _start("a-both", tmp_path)
    b = _start("b-both", tmp_path)  # builds its runs while A trains (it waits for A's chunk to end)
    both = {"a-both": _outcome(a, steps_at), "b-both": _outcome(b, steps_at)}

    # they took turns: a step of A trained after B's first step and before B's last (the messages printed
    # by each experiment's recorder thread are no clock for this: each prints in its own batches)
    owners = [who for _, who in sorted(steps_at)]
    first_b, last_b = owners.index("b-both"), len(owners) - 1 - owners[::-1].index("b-both")
    assert "a-both" in owners[first_b:last_b], owners

    for name in ("a", "b"):
        ref, got = alone[f"{name}-alone"], both[f"{name}-both"]
        assert sorted(got) == sorted(ref) == RUNS[name]
        for rid in ref:
            (ref_loss, ref_adapter), (loss, adapter) = ref[rid], got[rid]
            assert len(loss) == N_TRAIN // 4, loss
            assert [s for s, _ in loss] == [s for s, _ in ref_loss]
            worst_loss = max(abs(x - y) for (_, x), (_, y) in zip(loss, ref_loss))
            assert worst_loss == 0.0, (name, rid, loss, ref_loss)
            assert max_abs_diff(adapter, ref_adapter) == 0.0, (name, rid)
    assert threading.active_count() < 50
