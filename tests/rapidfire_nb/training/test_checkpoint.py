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


def _tensors(snap: Any) -> list[torch.Tensor]:
    out = list(snap.weights.values())
    for state in snap.optimizer["state"].values():
        out += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return out


def _ptrs(snap: Any) -> set[int]:
    return {t.data_ptr() for t in _tensors(snap)}


def _equal(a: Any, b: Any) -> bool:
    ta, tb = _tensors(a), _tensors(b)
    return len(ta) == len(tb) and all(torch.equal(x, y) for x, y in zip(ta, tb))


def _train_more(trainer: Any, steps: int) -> None:
    """More real optimizer steps on the same trainer: the live adapter and AdamW state move."""
    model, opt = trainer.model, trainer.optimizer
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    for _ in range(steps):
        model(**batch).loss.backward()
        opt.step()
        opt.zero_grad()


def test_a_let_go_snapshot_lends_its_tensors_to_the_next_and_the_copy_is_exact(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, max_steps=3)
    snapshotter = Snapshotter(1, trainer, "default")
    trainer.train()
    first = snapshotter.take(capture_rng())
    ptrs = _ptrs(first)
    assert snapshotter.reused == 0 and len(ptrs) == len(_tensors(first)) > 4
    del first  # the run's last snapshot was replaced and the writer is done with it
    _train_more(trainer, 2)
    reused = snapshotter.take(capture_rng())
    assert snapshotter.reused == 1
    assert _ptrs(reused) == ptrs  # copied into the let-go snapshot's tensors, no new ones
    # a run that ends or stops keeps no spare set (the executor drops it then)
    probe = Snapshotter(1, trainer, "default")
    probe.take(capture_rng())  # let go at once: its tensors are the spare set
    assert probe.spares == 1 and probe.drop_spares() == 1 and probe.spares == 0
    # exactly what a fresh clone holds, and written the same way
    fresh = Snapshotter(1, trainer, "default").take(capture_rng())
    assert _equal(reused, fresh) and not (_ptrs(fresh) & ptrs)
    write_snapshot(reused, tmp_path / "reused")
    write_snapshot(fresh, tmp_path / "fresh")
    for name in ("adapter_model.safetensors", "optimizer.pt"):
        assert (tmp_path / "reused" / name).read_bytes() == (tmp_path / "fresh" / name).read_bytes(), name


def test_a_held_snapshot_or_a_shallow_copy_of_it_is_never_written_over(tmp_path: Path) -> None:
    import copy

    trainer = _trainer(tmp_path, max_steps=3)
    snapshotter = Snapshotter(1, trainer, "default")
    trainer.train()
    held = snapshotter.take(capture_rng())
    kept = {k: v.clone() for k, v in held.weights.items()}
    shallow = copy.copy(snapshotter.take(capture_rng()))  # as a warm clone copies its parent's snapshot
    shallow_values = [t.clone() for t in _tensors(shallow)]
    for _ in range(3):
        _train_more(trainer, 1)
        snapshotter.take(capture_rng())  # let go at once: these may reuse each other, never held ones
    assert all(torch.equal(held.weights[k], v) for k, v in kept.items())
    assert all(torch.equal(a, b) for a, b in zip(_tensors(shallow), shallow_values))
    assert not (_ptrs(held) & _ptrs(shallow))
    # the pool keeps one spare set: three let-go snapshots reused it twice
    assert snapshotter.reused == 2


def test_full_fine_tuning_snapshots_clone_every_time(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, max_steps=2)
    trainer.train()
    snapshotter = Snapshotter(1, trainer, None)
    first = snapshotter.take(capture_rng())
    assert len(first.weights) > 10 and first.lease is None
    del first  # nothing is kept for the next: a spare set would be a second copy of the whole model
    second = snapshotter.take(capture_rng())
    assert snapshotter.reused == 0 and second.lease is None
    live = trainer.model.state_dict()
    assert all(torch.equal(second.weights[k], v) for k, v in live.items())
