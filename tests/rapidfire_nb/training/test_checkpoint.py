"""Boundary snapshots (training/checkpoint.py): what a snapshot holds, taken the cheap way (issue 18).

The snapshotter finds the adapter's tensors when it is made, before the trainer trains; a snapshot copies the
tensors and freezes the trainer state in O(1) per logged step, and ``trainer_state.json`` is built when written.
These tests pin that the cheap way holds the same values as the costly one did.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, get_peft_model_state_dict
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from trl import SFTConfig, SFTTrainer

from rapidfire_nb.testing import tiny_sft_dataset
from rapidfire_nb.testing.models import tiny_model, tiny_tokenizer
from rapidfire_nb.training.checkpoint import Snapshotter, write_snapshot
from rapidfire_nb.training.rng import capture_rng


def _trainer(tmp_path: Path, max_steps: int) -> Any:
    args = SFTConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=max_steps,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        logging_steps=1,
        max_length=32,
        save_strategy="no",
        report_to=[],
        bf16=False,
        use_cpu=True,
    )
    trainer = SFTTrainer(
        model=tiny_model(),
        args=args,
        train_dataset=tiny_sft_dataset(16),
        processing_class=tiny_tokenizer(),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer


def test_a_snapshotter_made_before_training_snapshots_the_trained_adapter(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, max_steps=3)
    snapshotter = Snapshotter(1, trainer, "default")  # as the executor makes it: before train()
    before = {k: v.detach().clone() for k, v in get_peft_model_state_dict(trainer.model).items()}
    trainer.train()
    snap = snapshotter.take(capture_rng())
    live = get_peft_model_state_dict(trainer.model)
    assert snap.step == 3 and set(snap.weights) == set(live)
    assert all(torch.equal(snap.weights[k], live[k]) for k in live)
    # training moved the adapter: the snapshot is the trained one, not the one at construction
    lora_b = [k for k in live if "lora_B" in k]
    assert lora_b and all(not torch.equal(snap.weights[k], before[k]) for k in lora_b)
    # a private copy: changing the live weights leaves the snapshot as it was
    key = lora_b[0]
    with torch.no_grad():
        trainer.model.get_parameter(key.replace(".weight", ".default.weight")).add_(1.0)
    assert not torch.equal(snap.weights[key], get_peft_model_state_dict(trainer.model)[key])


def test_the_snapshot_trainer_state_is_frozen_and_written_as_transformers_writes_it(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, max_steps=4)
    snapshotter = Snapshotter(1, trainer, "default")
    trainer.train()
    snap = snapshotter.take(capture_rng())
    expected = tmp_path / "expected.json"
    trainer.state.save_to_json(str(expected))
    assert snap.trainer_state_json() == expected.read_text()
    n_logs = len(trainer.state.log_history)
    assert n_logs >= 4
    # later steps append to the live state; the snapshot keeps what it had
    trainer.state.log_history.append({"loss": 1.0, "step": 5})
    trainer.state.global_step = 5
    trainer.state.stateful_callbacks.setdefault("extra", {})["x"] = 1
    state = json.loads(snap.trainer_state_json())
    assert state["global_step"] == 4 and len(state["log_history"]) == n_logs
    assert "extra" not in state["stateful_callbacks"]
    target = tmp_path / "checkpoint-4"
    write_snapshot(snap, target)
    assert json.loads((target / "trainer_state.json").read_text()) == state
    assert (target / "adapter_model.safetensors").is_file() and (target / "COMPLETE").is_file()
