"""A DPO LoRA run over a gang of 2 CPU processes (gloo) sharded with FSDP2, trained chunk by chunk through
``TorchExecutor`` (``_gang_dpo_child.py`` under ``python -m torch.distributed.run --nproc_per_node 2``).

What is proved:

* the parameters are DTensors, each rank holding half the parameter bytes; the run's reference is the sharded
  base with the adapter disabled, computed by each rank on its own rows (the shared reference cache is off);
* trained in 4 chunks it ends bit-identical (0.0) to a plain TRL ``DPOTrainer(..., peft_config=...).train()``
  sharded the same way, with identical losses and reward margins on both ranks, and within float tolerance of one
  process with the same global batch (measured: adapter 2.7e-8 max abs, losses 1.2e-7);
* ``num_gpus=2`` without ``fsdp`` trains DDP replicas, within float tolerance of one process;
* end to end, ``run_fit(devices=2)`` (the device layer's gang workers, the scheduler's chunks) ends equal (0.0);
* DPO full fine-tuning and ``ref_model_name`` over a gang are refused by the executor itself too (the reference
  model is not sharded yet), before a model is touched.
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

CHILD = Path(__file__).with_name("_gang_dpo_child.py")
ADAPTER = "adapter_model.safetensors"


def _spawn(mode: str, out: Path, gang: bool = True) -> subprocess.CompletedProcess[str]:
    return spawn(mode, out, gang, child=CHILD)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gang_dpo")
    _check(_spawn("gang", out))
    _check(_spawn("one", out, gang=False))
    return out


def _ranks(out: Path) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_dpo_lora_run_is_sharded_and_keeps_its_reference_per_rank(trained: Path) -> None:
    for record in _ranks(trained):
        assert record["all_dtensor"]
        assert record["segments"] == 4  # trained in 4 run_segment calls
        assert record["local_bytes"] == pytest.approx(record["whole_bytes"] / 2, rel=0.02)
        assert record["shared_cache"] is False  # each rank computes its reference on its own rows


def test_chunked_dpo_gang_run_equals_plain_sharded_trl_and_one_process(trained: Path) -> None:
    from safetensors.torch import load_file

    r0, r1 = _ranks(trained)
    assert r0["executor_losses"] == r0["plain_losses"] == r1["executor_losses"]  # equal on both ranks
    assert r0["executor_margins"] == r0["plain_margins"] == r1["executor_margins"]
    assert len(r0["executor_losses"]) == 8 and len(set(r0["executor_losses"])) > 1
    assert any(m != 0.0 for m in r0["executor_margins"])  # the policy moved away from its reference
    final = Path(r0["final_dir"])
    assert (final / "COMPLETE").is_file() and (final / "tokenizer.json").is_file()
    ours = load_file(str(final / ADAPTER))
    assert any(float(v.abs().max()) > 0 for k, v in ours.items() if "lora_B" in k)  # trained (B starts at 0)
    assert _max_diff(ours, load_file(str(trained / "plain" / ADAPTER))) == 0.0
    one = load_file(str(trained / "one" / ADAPTER))
    assert _max_diff(ours, one) < 1e-5  # data parallel vs one process, same global batch (sums reordered)
    one_log = json.loads((trained / "one.json").read_text())
    assert r0["executor_losses"] == pytest.approx(one_log["losses"], abs=1e-5)


def test_dpo_num_gpus_without_fsdp_trains_data_parallel(trained: Path) -> None:
    from safetensors.torch import load_file

    r0, r1 = (json.loads((trained / "ddp" / f"rank{r}.json").read_text()) for r in (0, 1))
    assert not r0["all_dtensor"] and r0["local_bytes"] == r0["whole_bytes"]  # a full replica per rank
    assert r0["executor_losses"] == r1["executor_losses"] and r0["shared_cache"] is False
    ours = load_file(str(Path(r0["final_dir"]) / ADAPTER))
    assert _max_diff(ours, load_file(str(trained / "one" / ADAPTER))) < 1e-5


def test_run_fit_trains_the_dpo_gang_end_to_end_exactly(trained: Path, tmp_path: Path) -> None:
    """``run_fit(devices=2)``: check_gangs accepts it, the device layer starts the gang's two workers, the
    scheduler's 4 chunks; the gathered final adapter equals the plain sharded ``DPOTrainer``'s (0.0)."""
    from safetensors.torch import load_file

    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import List, RFDPOConfig, RFGridSearch, RFLoraConfig, RFModelConfig
    from rapidfire_nb.testing import tiny_create_model, tiny_dpo_dataset

    config = RFModelConfig(  # the config of _gang_dpo_child.spec(gang=True)
        model_name="tiny",
        num_gpus=2,
        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
        training_args=RFDPOConfig(
            learning_rate=1e-3,
            beta=0.1,
            per_device_train_batch_size=2,
            num_train_epochs=1,
            logging_steps=1,
            seed=3,
            fsdp="full_shard auto_wrap",
            fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]},
        ),
    )
    exp = Experiment("dpo_gang", experiment_path=tmp_path)
    exp.progress_lines = False
    try:
        group = RFGridSearch(configs=List([config]), trainer_type="DPO")
        exp.run_fit(group, tiny_create_model, tiny_dpo_dataset(32), None, num_chunks=4, seed=0, devices=2)
        info = exp.get_runs_info().set_index("run_id")
    finally:
        exp.end()
    assert info.loc[1, "status"] == "COMPLETED" and info.loc[1, "chunks_done"] == 4
    assert (info.loc[1, "device"], info.loc[1, "sharding"]) == ("cpu:0+cpu:1", "fsdp")
    assert info.loc[1, "loss"] == _ranks(trained)[0]["plain_losses"][-1]
    ours = load_file(str(Path(info.loc[1, "checkpoint_dir"]) / ADAPTER))
    assert _max_diff(ours, load_file(str(trained / "plain" / ADAPTER))) == 0.0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"lora": None},
            r"^num_gpus=2: DPO full fine-tuning over several devices: the reference model is not",
        ),
        ({"ref_model_name": "tiny"}, r"^num_gpus=2 with ref_model_name / ref_model_kwargs: DPO's separate"),
    ],
)
def test_executor_refuses_a_dpo_gang_with_a_reference_model_of_its_own(
    changes: dict[str, Any], message: str
) -> None:
    import dataclasses

    from rapidfire_nb.errors import ConfigError
    from rapidfire_nb.spec import LeafConfig
    from rapidfire_nb.training.kinds.dpo import DPOKind

    spec = LeafConfig(trainer_type="DPO", model_name="tiny", lora={"r": 4}, num_gpus=2)
    with pytest.raises(ConfigError, match=message):  # model, args and models are never touched
        DPOKind().trainer_kwargs(dataclasses.replace(spec, **changes), None, None, None)  # type: ignore[arg-type]
