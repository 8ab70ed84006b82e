"""The schema's value checks (rapidfire_nb.schema): bounds on every number a config or a clone may set.

Pure checks: no model is built and nothing trains. An absurd number (a typo, or a clone POSTed with
``max_steps=10**12``) is refused where the config is written, with a message naming the field and the range.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from rapidfire_nb import ConfigError
from rapidfire_nb.automl import RFDPOConfig, RFGRPOConfig, RFLoraConfig, RFSFTConfig


@pytest.mark.parametrize(
    "cls,field,value,match",
    [
        (RFSFTConfig, "max_steps", 10**12, r"max_steps=1000000000000 is out of range.*-1 to 1,000,000,000"),
        (RFSFTConfig, "num_train_epochs", math.inf, r"num_train_epochs=inf is out of range.*0 to 1,000,000"),
        (RFSFTConfig, "num_train_epochs", 10**7, r"num_train_epochs=10000000 is out of range"),
        (RFSFTConfig, "per_device_train_batch_size", 10**9, r"per_device_train_batch_size=.*1 to 1,048,576"),
        (RFSFTConfig, "per_device_eval_batch_size", 10**9, r"per_device_eval_batch_size=.*\(rows\)"),
        (RFSFTConfig, "gradient_accumulation_steps", 10**9, r"gradient_accumulation_steps=.*micro-batches"),
        (RFSFTConfig, "max_length", 10**9, r"max_length=1000000000 is out of range.*\(tokens\)"),
        (RFSFTConfig, "warmup_steps", 1e12, r"warmup_steps=.*optimizer steps"),
        (RFSFTConfig, "seed", 2**40, r"seed=1099511627776 is out of range.*4,294,967,295"),
        (RFSFTConfig, "seed", -1, r"seed=-1 is out of range"),
        (RFSFTConfig, "learning_rate", math.inf, r"learning_rate=inf is not allowed: give a finite"),
        (RFSFTConfig, "dataloader_num_workers", 10**6, r"dataloader_num_workers=.*worker processes"),
        (RFDPOConfig, "max_length", 10**9, r"DPOConfig.max_length="),
        (RFGRPOConfig, "num_generations", 10**9, r"num_generations=.*completions per prompt"),
        (RFGRPOConfig, "max_completion_length", 10**12, r"max_completion_length=.*tokens"),
        (RFGRPOConfig, "steps_per_generation", 10**9, r"steps_per_generation="),
        (RFGRPOConfig, "num_iterations", 10**9, r"num_iterations="),
        (RFLoraConfig, "r", 10**9, r"r=1000000000 is out of range.*the LoRA rank"),
    ],
)
def test_an_absurd_number_is_refused_where_the_config_is_written(
    cls: Any, field: str, value: Any, match: str
) -> None:
    (
        RFSFTConfig(seed=1),
        RFGRPOConfig(seed=1),
        RFLoraConfig(r=1),
    )  # trl and peft are imported on first use: not timed
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=match):
        cls(**{field: value})
    assert time.perf_counter() - t0 < 1.0


def test_the_bounds_leave_every_default_and_ordinary_value_alone() -> None:
    RFSFTConfig(max_steps=-1, num_train_epochs=3.5, learning_rate=1e30, seed=2**32 - 1, max_length=None)
    RFGRPOConfig(num_generations=8, max_completion_length=4096, steps_per_generation=4)
    RFLoraConfig(r=256, lora_alpha=512)


def test_max_grad_norm_none_means_no_clipping_as_it_did_in_transformers_4() -> None:
    """TRL's config takes ``max_grad_norm=None`` but transformers 5 fails at the first step (``None > 0``): the
    None is read as 0.0 (no clipping), with a note, in configs and in clones. Before: ``expects float, got None``."""
    from rapidfire_nb.spec import LeafConfig, build_training_args

    RFSFTConfig(max_grad_norm=None)
    leaf = LeafConfig("SFT", "tiny", training={"max_grad_norm": None, "max_steps": 2})
    args, notes = build_training_args(leaf, output_dir="unused", default_seed=0, cuda_available=False)
    assert args.max_grad_norm == 0.0
    assert (
        "max_grad_norm=None read as max_grad_norm=0.0 (no gradient clipping, as transformers 4 read None)"
        in notes
    )
    clone = LeafConfig("SFT", "tiny", training={"max_steps": 2}).with_changes({"max_grad_norm": None})
    assert clone.training["max_grad_norm"] is None
    with pytest.raises(ConfigError, match=r"learning_rate expects float, got None"):
        RFSFTConfig(learning_rate=None)  # a None that never meant anything stays refused
