"""Packed GRPO (issues 38 and 39 part 2), tiny model, CPU fp32: 3 LoRA runs (their own learning rates; run 3 its own
sampling temperature) train as one pack. Every step's training forward and backward is one fused pass, runs 1 and 2
sample their completions in one batched ``generate`` (run 3, another temperature, samples alone in its pack), and
every run ends equal to a plain ``GRPOTrainer(...).train()`` (0.0): weights, losses, rewards, completion lengths.
"""

from __future__ import annotations

from typing import Any

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFGRPOConfig, RFLoraConfig, RFModelConfig
from rapidfire_nb.testing import length_reward, tiny_create_model, tiny_grpo_dataset
from tests.helpers import adapter_state, max_abs_diff
from tests.rapidfire_nb.test_dpo_grpo import LORA, SEED, assert_same_series, digit_reward, plain_trl

COMMON = dict(
    num_generations=4,
    max_completion_length=12,
    beta=0.04,
    logging_steps=1,
    num_train_epochs=1,
    per_device_train_batch_size=4,
    steps_per_generation=1,
)


def test_grpo_runs_pack_sample_together_and_equal_plain_trl(tmp_path: Any) -> None:
    group = RFGridSearch(
        List(
            [
                RFModelConfig(
                    model_name="tiny",
                    peft_config=RFLoraConfig(**LORA),
                    reward_funcs=[length_reward, digit_reward],
                    training_args=RFGRPOConfig(learning_rate=lr, temperature=t, **COMMON),
                )
                for lr, t in ((1e-2, 1.0), (3e-3, 1.0), (1e-3, 0.7))
            ]
        ),
        "GRPO",
    )
    train = tiny_grpo_dataset(6, seed=0)
    exp = Experiment("grpo-packed", experiment_path=tmp_path)
    exp.run_fit(group, tiny_create_model, train, num_chunks=2, seed=SEED, packing=True)
    ex = exp.session.executor
    assert ex.packs is not None
    counts = [(d.fused_steps, d.alone_steps, d.generated_together) for d in ex.packs._drivers.values()]
    mine = {rid: adapter_state(r.worker.trainer.model, adapter_name=r.adapter) for rid, r in ex.runs.items()}
    info = exp.get_runs_info().set_index("run_id")
    results = exp.get_results()
    exp.end()
    assert list(info.status) == ["COMPLETED"] * 3 and list(info["pack"]) == [1, 1, 1]
    assert counts == [(6, 0, 6)]  # 6 steps fused; 6 rollouts of runs 1-2 in one generate each
    for rid, leaf in enumerate(group.expand(SEED), start=1):
        ref = plain_trl(leaf, tiny_create_model, train, None, tmp_path / f"plain-{rid}")
        assert max_abs_diff(mine[rid], ref["weights"]) == 0.0, rid
        assert_same_series(results, rid, ref["log"], ("loss", "reward", "kl", "completions/mean_length"))
