"""``run_fit(devices=2)`` with a config of ``num_gpus=2`` and ``fsdp``: the whole path (the gang's two worker
processes started by the device layer, each a ``WorkerHost`` that joined the gang, the scheduler's chunks) ends
bit-identical to a plain TRL ``trainer.train()`` sharded the same way under ``torch.distributed.run``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.rapidfire_nb.training.test_sharding import WEIGHTS, _check, _max_diff, _spawn


def _group() -> Any:
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    config = RFModelConfig(  # the config of _gang_child.spec("lora", gang=True)
        model_name="tiny",
        num_gpus=2,
        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
        training_args=RFSFTConfig(
            learning_rate=1e-3,
            per_device_train_batch_size=2,
            num_train_epochs=1,
            logging_steps=1,
            seed=3,
            fsdp="full_shard auto_wrap",
            fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]},
        ),
    )
    return RFGridSearch(configs=List([config]), trainer_type="SFT")


def test_run_fit_trains_a_sharded_gang_exactly(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset

    exp = Experiment("gang", experiment_path=tmp_path / "exp")
    notes: list[str] = []
    exp.on_message(notes.append)
    exp.progress_lines = False
    exp.run_fit(_group(), tiny_create_model, tiny_sft_dataset(32), None, num_chunks=4, seed=0, devices=2)
    info = exp.get_runs_info().set_index("run_id")
    model, _tok = exp.load_model(1)  # the gathered adapter on a fresh base, no FSDP
    exp.end()
    assert info.loc[1, "status"] == "COMPLETED" and info.loc[1, "chunks_done"] == 4
    assert info.loc[1, "device"] == "cpu:0+cpu:1" and info.loc[1, "sharding"] == "fsdp"
    assert any("gangs on cpu:0+cpu:1" in n for n in notes)
    final = Path(info.loc[1, "checkpoint_dir"])
    ours = load_file(str(final / WEIGHTS["lora"]))
    loaded = {n: p for n, p in model.named_parameters() if "lora_" in n}
    assert len(loaded) == len(ours) == 8 and not any("DTensor" in type(p).__name__ for p in loaded.values())
    _check(_spawn("plain", tmp_path / "ref"))
    assert _max_diff(ours, load_file(str(tmp_path / "ref" / "lora" / "plain" / WEIGHTS["lora"]))) == 0.0
