"""A run that leaves a device (``TorchExecutor.drop_run``) and comes back to it later continues exactly.

On several devices a run may be taken over by another device and later back: its adapter is deleted from the
shared base when it leaves and built again, from its checkpoint, when it returns (also when it was the base's
only adapter).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.helpers import adapter_state, max_abs_diff, qa_dataset, qa_to_chat


def _leaf(lr: float) -> Any:
    from rapidfire_nb.automl import RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    config = RFModelConfig(
        model_name="tiny",
        formatting_func=qa_to_chat,
        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(
            learning_rate=lr, per_device_train_batch_size=2, num_train_epochs=1, max_length=48
        ),
    )
    return RFGridSearch(configs=config, trainer_type="SFT").expand(7)[0]


def _executor(exp_dir: Path) -> Any:
    from rapidfire_nb.spec.bundles import GroupSettings, TrainingCallbacks
    from rapidfire_nb.testing import tiny_create_model
    from rapidfire_nb.training.executor import TorchExecutor

    group = GroupSettings("SFT", tiny_create_model, num_chunks=3, seed=7)
    return TorchExecutor(group, qa_dataset(12, seed=0), None, exp_dir, TrainingCallbacks())


def _train(ex: Any, run_id: int, start: Any, chunks: int) -> None:
    done = start.segments_done
    for _ in range(chunks):
        ex.run_segment(run_id, start.plan.boundary(done)).result(120)
        done += 1


def test_a_run_that_left_and_came_back_trains_exactly(tmp_path: Path) -> None:
    ref = _executor(tmp_path / "ref")
    start = ref.add_run(1, _leaf(1e-3))
    _train(ref, 1, start, 3)
    expected = adapter_state(ref.runs[1].worker.trainer.model, adapter_name=ref.runs[1].adapter)
    ref.close()

    ex = _executor(tmp_path / "moved")
    start = ex.add_run(1, _leaf(1e-3))  # the base's only adapter
    _train(ex, 1, start, 1)
    ex.flush()
    checkpoint = ex.checkpoint_dir(1)
    ex.drop_run(1)  # it leaves this device ...
    ex.device.run(lambda: None)  # (the release runs on the device thread)
    assert not ex.has_run(1)
    back = ex.add_run(1, _leaf(1e-3), resume_from=checkpoint)  # ... and comes back from its checkpoint
    assert back.segments_done == 1
    _train(ex, 1, back, 2)
    got = adapter_state(ex.runs[1].worker.trainer.model, adapter_name=ex.runs[1].adapter)
    ex.close()
    assert max_abs_diff(got, expected) == 0.0
