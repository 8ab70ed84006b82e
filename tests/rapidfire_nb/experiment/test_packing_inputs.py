"""``run_fit(packing=...)`` checked before training: the option's values, and ``packing=True`` refusing a group where
no two runs can share a pack (naming each run and why)."""

from __future__ import annotations

from typing import Any

import pytest


def _rows(n: int) -> Any:
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [f"q{i}" for i in range(n)], "completion": ["a"] * n})


def _group(*configs: Any) -> Any:
    from rapidfire_nb.automl import List, RFGridSearch

    return RFGridSearch(List(list(configs)), "SFT")


def _lora(batch: int = 2, lr: float = 1e-3, r: int = 4) -> Any:
    from rapidfire_nb.automl import RFLoraConfig, RFModelConfig, RFSFTConfig

    return RFModelConfig(
        "tiny",
        peft_config=RFLoraConfig(r=r, lora_alpha=8, target_modules=["q_proj"]),
        training_args=RFSFTConfig(learning_rate=lr, per_device_train_batch_size=batch, max_steps=4),
    )


def _full() -> Any:
    from rapidfire_nb.automl import RFModelConfig, RFSFTConfig

    return RFModelConfig("tiny", training_args=RFSFTConfig(per_device_train_batch_size=2, max_steps=4))


def _check(group: Any, **kw: Any) -> Any:
    from rapidfire_nb.experiment.inputs import FitArgs, check_fit_inputs

    return check_fit_inputs(FitArgs(group, lambda cfg: None, _rows(8), num_chunks=2, seed=3, **kw))


def test_packing_defaults_to_auto_and_takes_true_or_false() -> None:
    group = _group(_lora(lr=1e-3), _lora(lr=1e-4, r=8))
    assert _check(group).packing == "auto"
    assert _check(group, packing=True).packing is True  # 1 and 2 differ only in lr and rank: one pack
    assert _check(group, packing=False).packing is False


@pytest.mark.parametrize("bad", ["yes", "AUTO", 1, None])
def test_another_packing_value_is_refused_naming_the_values(bad: Any) -> None:
    from rapidfire_nb import ConfigError

    with pytest.raises(ConfigError, match=r"^packing must be 'auto' \(.*True \(.*False \(.*got "):
        _check(_group(_lora(), _lora(lr=1e-4)), packing=bad)


def test_packing_true_refuses_a_group_where_no_two_runs_share_a_pack() -> None:
    from rapidfire_nb import ConfigError

    group = _group(_full(), _lora(batch=2), _lora(batch=4))
    with pytest.raises(ConfigError) as refused:
        _check(group, packing=True)
    assert str(refused.value).startswith(
        "packing=True: no two runs can share a pack: run 1 full fine-tuning, runs 2 and 3 differ in "
        "per_device_train_batch_size. "
    )
    assert "use packing='auto' or packing=False" in str(refused.value)
    assert _check(group).packing == "auto"  # "auto" trains them time-sliced, as before
