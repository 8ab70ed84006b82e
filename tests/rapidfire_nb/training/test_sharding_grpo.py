"""A GRPO LoRA run over a gang of 2 CPU processes (gloo) sharded with FSDP2, trained chunk by chunk through
``TorchExecutor`` (``_gang_grpo_child.py`` under ``python -m torch.distributed.run --nproc_per_node 2``).

What is proved:

* the parameters are DTensors, each rank holding half the parameter bytes;
* the sharded model's ``generate`` keeps the ranks in step (``synced_gpus=True``, from the mark ``shard_model``
  sets): rank 0 asking for 2 new tokens and rank 1 for 6, both run 6 forwards and get their 2 and 6 tokens;
* trained in 4 chunks (each rank generating its half of every group) it ends bit-identical (0.0) to a plain TRL
  ``GRPOTrainer(..., peft_config=...).train()`` sharded the same way, with identical losses, rewards, KL and
  completion lengths on both ranks;
* one process with the same global batch samples other completions (TRL seeds each rank's sampling with
  ``seed + rank``), so it is not close: measured adapter 0.077 max abs (lora_B entries up to 0.042), the mean
  reward differing from the first step;
* end to end, ``run_fit(devices=2)`` (the device layer's gang workers, the scheduler's chunks) ends equal (0.0);
* the generation batch is counted over the gang before training (``per_device_train_batch_size x num_gpus``), and
  GRPO full fine-tuning over a gang is refused by the executor itself too.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.rapidfire_nb.training._gang_launch import check as _check
from tests.rapidfire_nb.training._gang_launch import max_diff as _max_diff
from tests.rapidfire_nb.training._gang_launch import spawn

CHILD = Path(__file__).with_name("_gang_grpo_child.py")
ADAPTER = "adapter_model.safetensors"


def _spawn(mode: str, out: Path, gang: bool = True) -> subprocess.CompletedProcess[str]:
    return spawn(mode, out, gang, child=CHILD)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gang_grpo")
    _check(_spawn("gang", out))
    _check(_spawn("one", out, gang=False))
    return out


def _ranks(out: Path) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_grpo_lora_run_is_sharded(trained: Path) -> None:
    for record in _ranks(trained):
        assert record["all_dtensor"]
        assert record["segments"] == 4  # trained in 4 run_segment calls
        assert record["local_bytes"] == pytest.approx(record["whole_bytes"] / 2, rel=0.02)


def test_sharded_generate_keeps_the_ranks_in_step(trained: Path) -> None:
    r0, r1 = (r["uneven_generate"] for r in _ranks(trained))
    assert (r0["asked"], r0["new_tokens"]) == (2, 2) and (r1["asked"], r1["new_tokens"]) == (6, 6)
    assert (
        r0["forwards"] == r1["forwards"] == 6
    )  # rank 0 ran rank 1's forwards too (its all-gathers answered)


def test_chunked_grpo_gang_run_equals_plain_sharded_trl(trained: Path) -> None:
    from safetensors.torch import load_file

    r0, r1 = _ranks(trained)
    assert r0["executor"] == r0["plain"] == r1["executor"] == r1["plain"]  # every metric, every step
    assert len(r0["executor"]["loss"]) == 8 and len(set(r0["executor"]["reward"])) > 1
    assert r0["executor"]["kl"][-1] > 0  # the policy moved away from its reference (the base, adapter off)
    final = Path(r0["final_dir"])
    assert (final / "COMPLETE").is_file() and (final / "tokenizer.json").is_file()
    ours = load_file(str(final / ADAPTER))
    assert any(float(v.abs().max()) > 0 for k, v in ours.items() if "lora_B" in k)  # trained (B starts at 0)
    assert _max_diff(ours, load_file(str(trained / "plain" / ADAPTER))) == 0.0
    one = json.loads((trained / "one.json").read_text())
    assert len(one["loss"]) == 8  # the same steps; other samples (seed + rank per rank), so other rewards
    assert one["reward"] != r0["executor"]["reward"]
    assert 0.0 < _max_diff(ours, load_file(str(trained / "one" / ADAPTER))) < 0.5


def test_run_fit_trains_the_grpo_gang_end_to_end_exactly(trained: Path, tmp_path: Path) -> None:
    """``run_fit(devices=2)``: check_gangs accepts it, the device layer starts the gang's two workers, the
    scheduler's 4 chunks; the gathered final adapter equals the plain sharded ``GRPOTrainer``'s (0.0)."""
    from safetensors.torch import load_file

    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import List, RFGridSearch, RFGRPOConfig, RFLoraConfig, RFModelConfig
    from rapidfire_nb.testing import length_reward, tiny_create_model, tiny_grpo_dataset

    config = RFModelConfig(  # the config of _gang_grpo_child.spec(gang=True)
        model_name="tiny",
        num_gpus=2,
        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
        reward_funcs=[length_reward],
        training_args=RFGRPOConfig(
            per_device_train_batch_size=2,
            num_generations=4,
            steps_per_generation=1,
            max_completion_length=6,
            num_train_epochs=1,
            learning_rate=1e-2,
            beta=0.04,
            logging_steps=1,
            seed=3,
            fsdp="full_shard auto_wrap",
            fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]},
        ),
    )
    exp = Experiment("grpo_gang", experiment_path=tmp_path)
    exp.progress_lines = False
    try:
        group = RFGridSearch(configs=List([config]), trainer_type="GRPO")
        exp.run_fit(group, tiny_create_model, tiny_grpo_dataset(8), None, num_chunks=4, seed=0, devices=2)
        info = exp.get_runs_info().set_index("run_id")
    finally:
        exp.end()
    assert info.loc[1, "status"] == "COMPLETED" and info.loc[1, "chunks_done"] == 4
    assert (info.loc[1, "device"], info.loc[1, "sharding"]) == ("cpu:0+cpu:1", "fsdp")
    assert info.loc[1, "loss"] == _ranks(trained)[0]["plain"]["loss"][-1]
    ours = load_file(str(Path(info.loc[1, "checkpoint_dir"]) / ADAPTER))
    assert _max_diff(ours, load_file(str(trained / "plain" / ADAPTER))) == 0.0


def test_generation_batch_counts_the_gang_and_full_fine_tuning_is_refused() -> None:
    from rapidfire_nb.errors import ConfigError
    from rapidfire_nb.spec import LeafConfig
    from rapidfire_nb.testing import length_reward
    from rapidfire_nb.training.kinds.grpo import GRPOKind, check_generation_batch

    training = {"per_device_train_batch_size": 2, "num_generations": 4, "steps_per_generation": 1}
    grpo = {"trainer_type": "GRPO", "model_name": "tiny", "reward_funcs": (length_reward,)}
    gang = LeafConfig(**grpo, lora={"r": 4}, training=training, num_gpus=2)
    check_generation_batch(gang)  # 2 rows x 2 ranks: one whole group of 4
    with pytest.raises(
        ConfigError, match=r"generation batch of 2 completions \(per_device_train_batch_size=2 x"
    ):
        check_generation_batch(LeafConfig(**grpo, training=training))
    with pytest.raises(
        ConfigError,
        match=r"of 2 completions \(per_device_train_batch_size=1 x num_gpus=2 x steps_per_generation=1\)",
    ):
        check_generation_batch(
            LeafConfig(
                **grpo,
                training={**training, "per_device_train_batch_size": 1, "num_generations": 8},
                num_gpus=2,
            )
        )
    full = LeafConfig(**grpo, num_gpus=2)
    with pytest.raises(ConfigError, match=r"^num_gpus=2: GRPO full fine-tuning over several devices"):
        GRPOKind().trainer_kwargs(full, None, None, None)  # type: ignore[arg-type]
