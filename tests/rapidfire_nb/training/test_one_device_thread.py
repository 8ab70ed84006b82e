"""All of an experiment's torch work happens on its one device thread; checkpoints follow ``checkpoint_every``.

Every run's ``train()`` is a greenlet on that thread (one OpenMP team, as a plain ``trainer.train()``), and
``create_model_fn`` and trainer building run there too, so the caller's thread starts no OpenMP team. Three runs
on the tiny model, 16 rows, batch 4 (4 steps), 4 chunks.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.helpers import adapter_state, max_abs_diff, qa_dataset, qa_to_chat


def _group(lrs: tuple[float, ...] = (1e-3, 3e-4, 1e-4)) -> Any:
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    return RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(
                r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"]
            ),
            formatting_func=qa_to_chat,
            training_args=RFSFTConfig(
                learning_rate=List(list(lrs)),
                per_device_train_batch_size=4,
                num_train_epochs=1,
                max_length=32,
            ),
        ),
        trainer_type="SFT",
    )


def test_every_run_trains_on_the_one_device_thread(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import Trainer

    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model

    steps: dict[str, set[str]] = {}
    original = Trainer.training_step

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        steps.setdefault(str(self.args.output_dir).split("/runs/")[1], set()).add(
            threading.current_thread().name
        )
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "training_step", spy)
    made_on: list[str] = []

    def create(config: dict) -> Any:
        made_on.append(threading.current_thread().name)
        return tiny_create_model(config)

    exp = Experiment("one-thread", experiment_path=tmp_path, quiet=True)
    exp.run_fit(_group(), create, qa_dataset(16), None, num_chunks=4, seed=3)
    assert {s.status.value for s in exp.run_snapshots()} == {"COMPLETED"}
    threads = set().union(*steps.values())
    assert sorted(steps) == ["1/trainer", "2/trainer", "3/trainer"]
    assert len(threads) == 1 and threads.pop().startswith("rapidfire-device-")
    assert made_on and all(name.startswith("rapidfire-device-") for name in made_on)
    handoffs = exp.session.executor.handoffs
    assert handoffs.count == 3 * 4 - 1  # 12 segments, one hand-off between two of them
    exp.end()


def test_checkpoints_every_second_chunk_and_warm_clones_still_work(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model
    from rapidfire_nb.training.checkpoint import CheckpointWriter

    written: list[tuple[int, int]] = []
    original = CheckpointWriter.submit

    def spy(self: Any, snap: Any, run_dir: Any) -> Any:
        written.append((snap.run_id, snap.step))
        return original(self, snap, run_dir)

    monkeypatch.setattr(CheckpointWriter, "submit", spy)
    exp = Experiment("every-2", experiment_path=tmp_path, quiet=True)
    exp.run_fit(
        _group((1e-3,)), tiny_create_model, qa_dataset(16), None, num_chunks=4, seed=3, checkpoint_every=2
    )
    # boundaries at steps 1, 2, 3: only chunk 2 is a multiple of 2; the end (step 4) is written as the finished
    # run's final state whatever the cadence (what a continuation after end() or a restart reads)
    assert written == [(1, 2), (1, 4)]
    # the warm start comes from the in-memory snapshot of run 1's final state (step 4): a warm clone of a
    # COMPLETED run continues it, to its own larger max_steps
    child = exp.clone_modify(1, {"learning_rate": 5e-4, "max_steps": 6}, warm_start=True)
    exp.wait()
    snap = exp.run_snapshot(child)
    assert (snap.status.value, snap.step) == ("COMPLETED", 6)
    assert exp.get_results().query(f"run_id == {child}")["step"].tolist() == [
        5,
        6,
    ]  # its own chunk ends, after 4
    exp.end()


def test_checkpoint_every_is_checked(tmp_path: Any) -> None:
    from rapidfire_nb import ConfigError, Experiment
    from rapidfire_nb.testing import tiny_create_model

    exp = Experiment("bad-every", experiment_path=tmp_path, quiet=True)
    with pytest.raises(ConfigError, match="checkpoint_every must be an integer >= 1"):
        exp.run_fit(_group(), tiny_create_model, qa_dataset(16), checkpoint_every=0)


def test_the_cached_adapter_tensors_follow_training(tmp_path: Any) -> None:
    """The snapshot reuses which tensors make up the adapter; its values are the live ones when it is taken."""
    import torch
    from peft import get_peft_model_state_dict

    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model

    exp = Experiment("snap-cache", experiment_path=tmp_path, quiet=True)
    exp.run_fit(
        _group((1e-2,)), tiny_create_model, qa_dataset(16), None, num_chunks=4, seed=3, background=True
    )
    exp.wait()
    run = exp.session.executor.runs[1]
    fresh = {
        k: v.detach().clone()
        for k, v in get_peft_model_state_dict(run.base.model, adapter_name=run.adapter).items()
    }
    assert run.last is not None and run.last.step == 4  # the final state (a warm clone continues from it)
    assert max_abs_diff(run.last.weights, fresh) == 0.0
    live = dict(run.base.model.named_parameters())
    name = next(k for k in live if "lora_B" in k and run.adapter in k)
    with torch.no_grad():
        live[name].add_(1.0)  # the adapter changes after the snapshot, as training would
    changed = {
        k: v.detach().clone()
        for k, v in get_peft_model_state_dict(run.base.model, adapter_name=run.adapter).items()
    }
    later = run.snapshotter.take(run.last.rng)
    assert max_abs_diff(later.weights, changed) == 0.0, "the cached tensors are the live ones"
    assert max_abs_diff(run.last.weights, fresh) == 0.0, "an earlier snapshot is a copy, not the live tensors"
    assert max_abs_diff(later.weights, fresh) > 0.0
    assert adapter_state(run.base.model, adapter_name=run.adapter).keys()
    exp.end()
