"""``rapidfire_nb.spec.fsdp``: the user's ``fsdp`` / ``fsdp_config`` and ``num_gpus`` read into a ShardingPlan."""

from __future__ import annotations

from typing import Any

import pytest

from rapidfire_nb.errors import ConfigError
from rapidfire_nb.spec.fsdp import ShardingPlan, sharding_plan, without_fsdp_fields

SEEDS_CONFIG: dict[str, Any] = {  # the seeds' TRL page: Llama-3.1-8B with LoRA over several GPUs
    "fsdp": "full_shard auto_wrap",
    "fsdp_config": {
        "sharding_strategy": "FULL_SHARD",
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
        "offload_params": False,
        "cpu_ram_efficient_loading": True,
    },
}


def test_the_seeds_config_is_an_fsdp_plan() -> None:
    plan = sharding_plan({"learning_rate": 1e-4, **SEEDS_CONFIG}, 2)
    assert plan.sharding == "fsdp" and plan.num_gpus == 2
    assert plan.wrap_policy == "TRANSFORMER_BASED_WRAP" and plan.layer_classes == ("LlamaDecoderLayer",)
    assert plan.reshard_after_forward is True and plan.offload_params is False
    assert plan.cpu_ram_efficient_loading is True and len(plan.notes) == 1


def test_one_device_and_ddp() -> None:
    assert sharding_plan({}, None) == ShardingPlan(sharding=None, num_gpus=1)
    assert sharding_plan({"learning_rate": 1e-4}, 1).sharding is None
    assert sharding_plan({}, 4) == ShardingPlan(sharding="ddp", num_gpus=4)
    assert sharding_plan({"fsdp": ""}, 2).sharding == "ddp"
    assert sharding_plan({"fsdp": False, "fsdp_config": None}, 2).sharding == "ddp"


def test_fsdp_on_one_device_trains_unsharded_with_a_note() -> None:
    plan = sharding_plan(SEEDS_CONFIG, None)
    assert plan.sharding is None and plan.num_gpus == 1
    assert "num_gpus > 1" in plan.notes[0] and "unsharded" in plan.notes[0]
    with pytest.raises(ConfigError, match="hybrid_shard"):  # still checked
        sharding_plan({"fsdp": "hybrid_shard"}, 1)


@pytest.mark.parametrize(
    ("fsdp", "config", "reshard"),
    [
        (True, None, True),
        ("full_shard", None, True),
        ("shard_grad_op auto_wrap", None, False),
        (["shard_grad_op"], {}, False),
        ("auto_wrap", {"sharding_strategy": "SHARD_GRAD_OP"}, False),
        ("full_shard", {"reshard_after_forward": False}, False),
        ("shard_grad_op", {"fsdp_reshard_after_forward": "true"}, True),  # accelerate's prefixed YAML names
    ],
)
def test_resharding_follows_the_strategy_or_the_explicit_key(fsdp: Any, config: Any, reshard: bool) -> None:
    training = {"fsdp": fsdp} if config is None else {"fsdp": fsdp, "fsdp_config": config}
    assert sharding_plan(training, 2).reshard_after_forward is reshard


def test_wrap_policies_and_offload() -> None:
    assert (
        sharding_plan({"fsdp": True, "fsdp_config": {"auto_wrap_policy": "NO_WRAP"}}, 2).wrap_policy
        == "NO_WRAP"
    )
    plan = sharding_plan(
        {"fsdp": "full_shard", "fsdp_config": {"transformer_layer_cls_to_wrap": "Qwen2DecoderLayer"}}, 2
    )
    assert plan.layer_classes == ("Qwen2DecoderLayer",)
    assert sharding_plan({"fsdp": "full_shard"}, 2).layer_classes == ()  # the model's _no_split_modules
    assert sharding_plan({"fsdp": "full_shard offload"}, 2).offload_params
    assert sharding_plan({"fsdp": True, "fsdp_config": {"cpu_offload": True}}, 2).offload_params


@pytest.mark.parametrize(
    ("training", "num_gpus", "words"),
    [
        ({}, 0, ["num_gpus", "positive int"]),
        ({}, True, ["num_gpus"]),
        ({}, 1.5, ["num_gpus"]),
        ({"fsdp": "hybrid_shard"}, 2, ["hybrid_shard", "FSDP1", "full_shard"]),
        ({"fsdp": "no_shard"}, 2, ["no_shard", "DDP"]),
        ({"fsdp": "ful_shard"}, 2, ["ful_shard", "unknown", "full_shard"]),
        ({"fsdp": "full_shard shard_grad_op"}, 2, ["keep one"]),
        ({"fsdp": 3}, 2, ["training_args.fsdp must be"]),
        ({"fsdp_config": {"auto_wrap_policy": "NO_WRAP"}}, 2, ["fsdp_config is set but fsdp is not"]),
        ({"fsdp": True, "fsdp_config": "fsdp.json"}, 2, ["must be a dict", "json.load"]),
        ({"fsdp": True, "fsdp_config": {"offload_param": True}}, 2, ["offload_param", "offload_params"]),
        ({"fsdp": True, "fsdp_config": {"sharding_strategy": "HYBRID_SHARD"}}, 2, ["sharding_strategy"]),
        ({"fsdp": "full_shard", "fsdp_config": {"sharding_strategy": "SHARD_GRAD_OP"}}, 2, ["agree"]),
        (
            {"fsdp": True, "fsdp_config": {"auto_wrap_policy": "SIZE_BASED_WRAP"}},
            2,
            ["SIZE_BASED_WRAP", "TRANSFORMER"],
        ),
        ({"fsdp": True, "fsdp_config": {"auto_wrap_policy": "EVERYTHING"}}, 2, ["auto_wrap_policy"]),
        ({"fsdp": True, "fsdp_config": {"min_num_params": 1000}}, 2, ["min_num_params"]),
        ({"fsdp": True, "fsdp_config": {"version": 1}}, 2, ["version", "FSDP2"]),
        (
            {"fsdp": True, "fsdp_config": {"activation_checkpointing": True}},
            2,
            ["gradient_checkpointing=True"],
        ),
        ({"fsdp": True, "fsdp_config": {"offload_params": "yes"}}, 2, ["offload_params", "True or False"]),
        ({"fsdp": True, "fsdp_config": {"state_dict_type": "LOCAL"}}, 2, ["state_dict_type"]),
        (
            {
                "fsdp": True,
                "fsdp_config": {"auto_wrap_policy": "NO_WRAP", "transformer_layer_cls_to_wrap": ["X"]},
            },
            2,
            ["transformer_layer_cls_to_wrap", "TRANSFORMER_BASED_WRAP"],
        ),
        ({"fsdp": True, "fsdp_config": {"transformer_layer_cls_to_wrap": []}}, 2, ["class name"]),
    ],
)
def test_bad_settings_are_refused_naming_the_field(
    training: dict[str, Any], num_gpus: Any, words: list[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        sharding_plan(training, num_gpus)
    for word in words:
        assert word in str(info.value)


def test_the_keys_transformers_writes_into_fsdp_config_are_accepted_off() -> None:
    """TrainingArguments fills an fsdp_config dict it is given in place (a spec's from an older build)."""
    config = SEEDS_CONFIG["fsdp_config"]
    plan = sharding_plan(
        {"fsdp": SEEDS_CONFIG["fsdp"], "fsdp_config": {**config, "xla": False, "xla_fsdp_v2": False}}, 2
    )
    assert plan == sharding_plan(SEEDS_CONFIG, 2)
    with pytest.raises(ConfigError, match="XLA"):
        sharding_plan({"fsdp": True, "fsdp_config": {"xla": True}}, 2)


def test_validating_a_spec_leaves_its_fsdp_config_and_fingerprint_as_they_were() -> None:
    from rapidfire_nb.spec import LeafConfig

    leaf = LeafConfig(trainer_type="SFT", model_name="tiny", lora={"r": 4}, training={**SEEDS_CONFIG})
    before = leaf.fingerprint()
    leaf.validate()
    assert leaf.training["fsdp_config"] == SEEDS_CONFIG["fsdp_config"] and leaf.fingerprint() == before


def test_without_fsdp_fields_leaves_the_rest() -> None:
    training = {"learning_rate": 1e-4, **SEEDS_CONFIG}
    assert without_fsdp_fields(training) == {"learning_rate": 1e-4}
    assert "fsdp" in training  # not changed


def test_the_seeds_recipe_is_accepted_its_fsdp1_keys_named_in_a_note() -> None:
    """The TRL page's FSDP example (the seeds) as written: its FSDP1 tuning keys have no FSDP2 counterpart."""
    config = {
        "sharding_strategy": "FULL_SHARD",
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "backward_prefetch": "backward_pre",
        "forward_prefetch": True,
        "use_orig_params": False,
        "cpu_ram_efficient_loading": True,
        "offload_params": True,
        "sync_module_states": True,
        "limit_all_gathers": True,
    }
    plan = sharding_plan({"fsdp": "full_shard auto_wrap", "fsdp_config": config}, 2)
    assert (plan.sharding, plan.num_gpus, plan.reshard_after_forward, plan.offload_params) == (
        "fsdp",
        2,
        True,
        True,
    )
    assert plan.notes[-1:] == (
        "training_args.fsdp_config backward_prefetch, forward_prefetch, use_orig_params, sync_module_states, "
        "limit_all_gathers: FSDP1 settings, ignored by FSDP2 (which shards here: it prefetches the next unit's "
        "all-gather and limits them on its own, keeps the parameters as they are, and every rank builds the same "
        "weights)",
    )
