"""Expansion of config groups: grid order, knobs anywhere, random search reproducibility, trainer checks."""

from __future__ import annotations

import itertools

import pytest

from rapidfire_nb.automl import (
    List,
    Range,
    RFDPOConfig,
    RFGridSearch,
    RFGRPOConfig,
    RFLoraConfig,
    RFModelConfig,
    RFRandomSearch,
    RFSFTConfig,
)
from rapidfire_nb.errors import ConfigError


def formatting_function(row):
    return {
        "prompt": [{"role": "user", "content": row["q"]}],
        "completion": [{"role": "assistant", "content": row["a"]}],
    }


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def format_reward(completions, **kwargs):
    return [0.0 for _ in completions]


def seed_example_group():
    """The SFT example of TRL's RapidFire AI page: 2 configs x 2 LoRA configs."""
    peft_configs = List(
        [
            RFLoraConfig(
                r=8, lora_alpha=16, lora_dropout=0.1, target_modules=["q_proj", "v_proj"], bias="none"
            ),
            RFLoraConfig(
                r=32,
                lora_alpha=64,
                lora_dropout=0.1,
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                bias="none",
            ),
        ]
    )
    return List(
        [
            RFModelConfig(
                model_name="TinyLlama/TinyLlama-1.1B-Chat-v1.0",
                peft_config=peft_configs,
                training_args=RFSFTConfig(
                    learning_rate=lr, per_device_train_batch_size=4, max_steps=128, fp16=True
                ),
                model_type="causal_lm",
                model_kwargs={"device_map": "auto", "dtype": "auto", "use_cache": False},
                formatting_func=formatting_function,
            )
            for lr in (1e-3, 1e-4)
        ]
    )


def test_seed_example_expands_to_four_runs_in_order():
    leaves = RFGridSearch(configs=seed_example_group(), trainer_type="SFT").expand(seed=42)
    combos = [(leaf.training["learning_rate"], leaf.lora["r"]) for leaf in leaves]
    assert combos == [(1e-3, 8), (1e-3, 32), (1e-4, 8), (1e-4, 32)]
    assert [leaf.lora["lora_alpha"] for leaf in leaves] == [16, 64, 16, 64]
    assert all(leaf.trainer_type == "SFT" and leaf.formatting_func is formatting_function for leaf in leaves)
    assert leaves[0].model_kwargs == {"device_map": "auto", "dtype": "auto", "use_cache": False}
    assert leaves[0].training == {
        "learning_rate": 1e-3,
        "per_device_train_batch_size": 4,
        "max_steps": 128,
        "fp16": True,
    }


def test_plain_list_and_single_config_are_accepted():
    group = seed_example_group()
    assert len(RFGridSearch(list(group), "sft").expand(0)) == 4
    assert len(RFGridSearch(group[0], "Sft").expand(0)) == 2


def test_knobs_inside_fields_expand_as_a_product_in_declaration_order():
    config = RFModelConfig(
        "m",
        peft_config=RFLoraConfig(r=List([4, 8]), lora_alpha=16),
        training_args=RFSFTConfig(learning_rate=List([1e-3, 1e-4]), max_steps=List([5, 10])),
        model_kwargs={"dtype": List(["float32", "bfloat16"]), "use_cache": False},
    )
    leaves = RFGridSearch(config, "SFT").expand(1)
    got = [
        (l.lora["r"], l.training["learning_rate"], l.training["max_steps"], l.model_kwargs["dtype"])
        for l in leaves
    ]
    expected = list(itertools.product([4, 8], [1e-3, 1e-4], [5, 10], ["float32", "bfloat16"]))
    assert got == expected
    assert all(l.lora["lora_alpha"] == 16 and l.model_kwargs["use_cache"] is False for l in leaves)


def test_nested_list_inside_list_alternatives():
    config = RFModelConfig("m", peft_config=List([RFLoraConfig(r=List([4, 8])), None]))
    leaves = RFGridSearch(config, "SFT").expand(0)
    assert [l.lora and l.lora["r"] for l in leaves] == [4, 8, None]


def test_attribute_set_after_construction_reaches_the_leaf():
    training = RFSFTConfig(learning_rate=1e-3)
    config = RFModelConfig("m", training_args=training)
    training.learning_rate = 5e-5
    training.max_steps = 3
    config.model_kwargs = {"dtype": "float32"}
    (leaf,) = RFGridSearch(config, "SFT").expand(0)
    assert leaf.training == {"learning_rate": 5e-5, "max_steps": 3}
    assert leaf.model_kwargs == {"dtype": "float32"}


def test_leaves_do_not_share_mutable_values():
    leaves = RFGridSearch(seed_example_group(), "SFT").expand(0)
    assert leaves[0].lora["target_modules"] is not leaves[2].lora["target_modules"]
    assert leaves[0].model_kwargs is not leaves[1].model_kwargs


def test_grid_rejects_range_and_suggests_random_search():
    config = RFModelConfig("m", training_args=RFSFTConfig(learning_rate=Range(1e-5, 1e-3, log=True)))
    with pytest.raises(ConfigError, match=r"training_args\.learning_rate.*RFRandomSearch"):
        RFGridSearch(config, "SFT")


@pytest.mark.parametrize("trainer_type", ["PPO", "", None, 3])
def test_unknown_trainer_type(trainer_type):
    with pytest.raises(ConfigError, match="trainer_type"):
        RFGridSearch(RFModelConfig("m"), trainer_type)


def test_trainer_config_must_match_trainer_type():
    with pytest.raises(ConfigError, match="RFDPOConfig but trainer_type is 'SFT'.*RFSFTConfig"):
        RFGridSearch(RFModelConfig("m", training_args=RFDPOConfig(beta=0.1)), "SFT")
    with pytest.raises(ConfigError, match="RFSFTConfig but trainer_type is 'GRPO'"):
        RFRandomSearch(RFModelConfig("m", training_args=List([RFSFTConfig()])), "GRPO", num_runs=1)


def test_configs_must_be_model_configs():
    with pytest.raises(ConfigError, match="configs"):
        RFGridSearch([], "SFT")
    with pytest.raises(ConfigError, match=r"configs\[1\]"):
        RFGridSearch([RFModelConfig("m"), RFSFTConfig()], "SFT")


def test_grpo_needs_reward_funcs():
    with pytest.raises(ConfigError, match="reward_funcs"):
        RFGridSearch(RFModelConfig("m", training_args=RFGRPOConfig(num_generations=2)), "GRPO").expand(0)
    leaves = RFGridSearch(
        RFModelConfig(
            "m",
            training_args=RFGRPOConfig(num_generations=2),
            reward_funcs=List([[length_reward], [length_reward, format_reward]]),
        ),
        "GRPO",
    ).expand(0)
    assert [l.reward_funcs for l in leaves] == [(length_reward,), (length_reward, format_reward)]
    with pytest.raises(ConfigError, match="reward_funcs is used only by GRPO"):
        RFGridSearch(RFModelConfig("m", reward_funcs=[length_reward]), "SFT").expand(0)


def test_dpo_group_expands():
    config = RFModelConfig(
        "m", training_args=RFDPOConfig(beta=List([0.1, 0.5]), loss_type="sigmoid"), ref_model_name="ref"
    )
    leaves = RFGridSearch(config, "dpo").expand(0)
    assert [(l.trainer_type, l.training["beta"], l.ref_model_name) for l in leaves] == [
        ("DPO", 0.1, "ref"),
        ("DPO", 0.5, "ref"),
    ]


def random_group():
    return RFModelConfig(
        "m",
        peft_config=List([RFLoraConfig(r=4), RFLoraConfig(r=Range(8, 64, step=8))]),
        training_args=RFSFTConfig(learning_rate=Range(1e-5, 1e-3, log=True), max_steps=List([5, 10, 20])),
    )


def test_random_search_draws_num_runs_reproducibly():
    search = RFRandomSearch(random_group(), "SFT", num_runs=6)
    first = search.expand(seed=3)
    again = RFRandomSearch(random_group(), "SFT", num_runs=6).expand(seed=3)
    other = search.expand(seed=4)
    assert len(first) == 6
    assert [l.fingerprint() for l in first] == [l.fingerprint() for l in again]
    assert [l.fingerprint() for l in first] != [l.fingerprint() for l in other]
    assert len({l.fingerprint() for l in first}) == 6
    for leaf in first:
        assert 1e-5 <= leaf.training["learning_rate"] <= 1e-3
        assert leaf.training["max_steps"] in (5, 10, 20)
        assert leaf.lora["r"] == 4 or (8 <= leaf.lora["r"] <= 64 and leaf.lora["r"] % 8 == 0)


def test_random_search_num_samples_alias_and_fixed_seed():
    leaves = RFRandomSearch(random_group(), "SFT", num_samples=3).expand(9)
    assert len(leaves) == 3
    fixed = RFRandomSearch(random_group(), "SFT", num_runs=2, seed=5)
    assert fixed.num_samples == 2
    assert [l.fingerprint() for l in fixed.expand(1)] == [l.fingerprint() for l in fixed.expand(2)]


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"num_runs": 2, "num_samples": 2},
        {"num_runs": 0},
        {"num_samples": -1},
        {"num_runs": 2.5},
        {"num_runs": True},
    ],
)
def test_random_search_count_errors(kwargs):
    with pytest.raises(ConfigError, match="num_runs|num_samples"):
        RFRandomSearch(random_group(), "SFT", **kwargs)


def test_random_search_reports_too_small_space():
    config = RFModelConfig("m", training_args=RFSFTConfig(max_steps=List([5, 10])))
    with pytest.raises(ConfigError, match="only 2 distinct"):
        RFRandomSearch(config, "SFT", num_runs=3).expand(0)
