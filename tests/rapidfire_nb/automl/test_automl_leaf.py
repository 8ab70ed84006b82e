"""LeafConfig: hparams naming, fingerprints, create_model_fn's dict, with_changes validation."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rapidfire_nb.automl import LeafConfig, List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.errors import ConfigError


def formatting_function(row):
    return row


def other_formatting(row):
    return row


def group():
    return RFModelConfig(
        "tiny-model",
        formatting_func=formatting_function,
        peft_config=RFLoraConfig(r=List([8, 16]), lora_alpha=16, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(learning_rate=1e-3, max_steps=8, fp16=True),
        model_kwargs={"dtype": "float32"},
    )


def leaves():
    return RFGridSearch(group(), "SFT").expand(42)


def test_hparams_use_one_naming_scheme():
    hp = leaves()[1].hparams()
    assert hp["model_name"] == "tiny-model"
    assert hp["learning_rate"] == 1e-3 and hp["max_steps"] == 8 and hp["fp16"] is True
    assert hp["lora.r"] == 16 and hp["lora.target_modules"] == ["q_proj", "v_proj"]
    assert hp["model_kwargs.dtype"] == "float32"
    assert hp["formatting_func"] == f"{__name__}.formatting_function"
    assert "num_train_epochs" not in hp  # only what the user set
    json.dumps(hp)


def test_fingerprint_stable_across_expansions_and_changes():
    a, b = leaves(), leaves()
    assert [x.fingerprint() for x in a] == [y.fingerprint() for y in b]
    assert a == b
    assert a[0].fingerprint() != a[1].fingerprint()
    changed = a[0].with_changes({"learning_rate": 5e-4})
    assert changed.fingerprint() != a[0].fingerprint()
    assert json.loads(a[0].fingerprint())["formatting_func"] == f"{__name__}.formatting_function"
    assert hash(a[0]) == hash(b[0])


def test_to_json_is_plain_data():
    data = leaves()[0].to_json()
    assert data["lora"] == {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
    assert data["trainer_type"] == "SFT"
    assert json.loads(json.dumps(data)) == data


def test_model_config_dict_matches_rapidfireai_and_is_a_copy():
    leaf = leaves()[0]
    cfg = leaf.model_config_dict()
    assert set(cfg) >= {
        "model_name",
        "model_kwargs",
        "tokenizer",
        "tokenizer_kwargs",
        "model_type",
        "peft_config",
        "training_args",
        "ref_model_name",
        "ref_model_kwargs",
        "formatting_func",
        "reward_funcs",
        "generation_config",
    }
    assert cfg["model_name"] == "tiny-model" and cfg["model_kwargs"] == {"dtype": "float32"}
    assert cfg["peft_config"]["r"] == 8 and cfg["training_args"]["learning_rate"] == 1e-3
    assert cfg["formatting_func"] is formatting_function
    cfg["model_kwargs"]["dtype"] = "bfloat16"
    cfg["training_args"]["learning_rate"] = 1.0
    assert leaf.model_kwargs == {"dtype": "float32"} and leaf.training["learning_rate"] == 1e-3


def test_with_changes_applies_each_naming_scheme_key():
    leaf = leaves()[0]
    new = leaf.with_changes(
        {
            "learning_rate": 2e-4,
            "lora.r": 4,
            "model_kwargs.dtype": "bfloat16",
            "model_name": "other-model",
            "num_train_epochs": 2,
        }
    )
    assert new.training == {"learning_rate": 2e-4, "max_steps": 8, "fp16": True, "num_train_epochs": 2}
    assert (
        new.lora["r"] == 4 and new.model_kwargs == {"dtype": "bfloat16"} and new.model_name == "other-model"
    )
    assert leaf.training["learning_rate"] == 1e-3 and leaf.lora["r"] == 8  # original untouched


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"learnig_rate": 1e-4}, "did you mean `learning_rate`"),
        ({"lora.rr": 4}, "did you mean `lora.r`"),
        ({"learning_rate": "abc"}, "learning_rate expects float"),
        ({"lora.r": -1}, r"lora\.r.*positive integer"),
        (
            {"lr_scheduler_type": "bogus"},
            r"SFTConfig rejected lr_scheduler_type: ValueError: bogus is not a valid SchedulerType",
        ),
        ({"formatting_func": other_formatting}, "allow_functions=True"),
        ({"reward_funcs": [other_formatting]}, "allow_functions=True"),
        ({"learning_rate": List([1e-4, 1e-5])}, "concrete values"),
        ({"model_name": 3}, "model_name"),
    ],
)
def test_with_changes_rejects(changes, match):
    with pytest.raises(ConfigError, match=match):
        leaves()[0].with_changes(changes)


def test_with_changes_functions_need_allow_functions():
    new = leaves()[0].with_changes({"formatting_func": other_formatting}, allow_functions=True)
    assert new.formatting_func is other_formatting
    assert new.hparams()["formatting_func"].endswith("other_formatting")


def test_with_changes_maps_renamed_names():
    leaf = leaves()[0]
    with pytest.warns(FutureWarning, match="warmup_steps"):
        new = leaf.with_changes({"warmup_ratio": 0.1})
    assert new.training["warmup_steps"] == 0.1
    with pytest.warns(FutureWarning, match="dtype"):
        new = leaf.with_changes({"model_kwargs.torch_dtype": "bfloat16"})
    assert new.model_kwargs == {"dtype": "bfloat16"}


def test_lora_change_on_full_fine_tuning_run_is_rejected():
    (leaf,) = RFGridSearch(RFModelConfig("m", training_args=RFSFTConfig(max_steps=2)), "SFT").expand(0)
    with pytest.raises(ConfigError, match="without LoRA"):
        leaf.with_changes({"lora.r": 4})


def test_leaf_rejects_knobs_and_is_frozen():
    with pytest.raises(ConfigError, match="training.learning_rate"):
        LeafConfig(trainer_type="SFT", model_name="m", training={"learning_rate": List([1e-3, 1e-4])})
    leaf = LeafConfig(trainer_type="sft", model_name="m")
    assert leaf.trainer_type == "SFT" and leaf.model_kwargs == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        leaf.model_name = "x"  # type: ignore[misc]
