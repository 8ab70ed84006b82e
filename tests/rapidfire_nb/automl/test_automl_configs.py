"""Config wrappers: name/value checks against TRL/PEFT fields, recording, renamed names."""

from __future__ import annotations

import warnings

import pytest

from rapidfire_nb import schema as fields
from rapidfire_nb.automl import (
    List,
    Range,
    RFDPOConfig,
    RFGRPOConfig,
    RFLoraConfig,
    RFModelConfig,
    RFSFTConfig,
)
from rapidfire_nb.automl.configs import MODEL_FIELDS
from rapidfire_nb.errors import ConfigError


def test_wrapper_records_arguments_without_building_trl():
    cfg = RFSFTConfig(learning_rate=1e-3, fp16=True, max_steps=List([5, 10]))
    assert cfg.kwargs["learning_rate"] == 1e-3
    assert cfg.kwargs["fp16"] is True  # kept as written: TRL's checks come after CPU adaptation
    assert cfg.max_steps == List([5, 10])
    assert list(cfg.kwargs) == ["learning_rate", "fp16", "max_steps"]


def test_unset_field_reads_the_wrapped_default():
    cfg = RFSFTConfig(learning_rate=1e-3)
    assert cfg.num_train_epochs == 3.0
    assert cfg.max_length == 1024
    assert RFLoraConfig().r == 8
    assert "num_train_epochs" not in cfg.kwargs


@pytest.mark.parametrize(
    ("cls", "bad", "good"),
    [
        (RFSFTConfig, "learnig_rate", "learning_rate"),
        (RFDPOConfig, "bta", "beta"),
        (RFGRPOConfig, "num_generation", "num_generations"),
        (RFLoraConfig, "lora_alhpa", "lora_alpha"),
    ],
)
def test_unknown_field_names_class_field_and_closest(cls, bad, good):
    with pytest.raises(ConfigError) as info:
        cls(**{bad: 1})
    message = str(info.value)
    assert cls.__name__ in message
    assert f"`{bad}`" in message
    assert f"did you mean `{good}`" in message


def test_attribute_set_after_construction_is_checked_and_kept():
    cfg = RFSFTConfig(learning_rate=1e-3)
    cfg.learning_rate = 1e-4
    cfg.max_steps = 7
    assert cfg.kwargs == {"learning_rate": 1e-4, "max_steps": 7}
    with pytest.raises(ConfigError, match="did you mean `max_steps`"):
        cfg.max_step = 3
    with pytest.raises(ConfigError, match="learning_rate expects float"):
        cfg.learning_rate = "abc"
    with pytest.raises(AttributeError, match="learning_rate"):
        _ = cfg.learnig_rate
    del cfg.max_steps
    assert "max_steps" not in cfg.kwargs


@pytest.mark.parametrize(
    ("cls", "kwargs", "match"),
    [
        (RFSFTConfig, {"learning_rate": "abc"}, "learning_rate expects float"),
        (RFSFTConfig, {"max_steps": 1.5}, "max_steps expects int"),
        (RFSFTConfig, {"fp16": "yes"}, "fp16 expects bool"),
        (RFSFTConfig, {"learning_rate": List([1e-3, "x"])}, "learning_rate expects float"),
        (RFSFTConfig, {"max_steps": Range(1.0, 5.5)}, "max_steps"),
        (RFLoraConfig, {"r": -1}, "`r` should be a positive integer"),
        (RFLoraConfig, {"r": 0}, "`r` should be a positive integer"),
        (RFLoraConfig, {"bias": "some"}, "bias expects"),
        (RFLoraConfig, {"lora_dropout": 1.5}, "lora_dropout"),
        (RFSFTConfig, {"per_device_train_batch_size": 0}, "per_device_train_batch_size"),
    ],
)
def test_bad_values_rejected_at_construction(cls, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        cls(**kwargs)


def test_values_trl_normalises_are_accepted():
    assert RFDPOConfig(loss_type="sigmoid", beta=0.1).loss_type == "sigmoid"  # TRL wraps it in a list
    RFLoraConfig(target_modules="all-linear", task_type="CAUSAL_LM")
    RFSFTConfig(learning_rate=1, num_train_epochs=2, report_to=["none"], eval_strategy="steps")


def test_renamed_trainer_names_warn_and_map():
    with pytest.warns(FutureWarning) as record:
        cfg = RFSFTConfig(warmup_ratio=0.1, evaluation_strategy="steps", max_seq_length=256)
    assert cfg.kwargs == {"warmup_steps": 0.1, "eval_strategy": "steps", "max_length": 256}
    ours = [
        w for w in record if issubclass(w.category, FutureWarning)
    ]  # not torch.jit's, when TRL loads here
    texts = [str(w.message) for w in ours]
    assert len(texts) == 3
    assert "`warmup_ratio` no longer exists" in texts[0] and "`warmup_steps=0.1`" in texts[0]
    assert "`eval_strategy='steps'`" in texts[1] and "`max_length=256`" in texts[2]
    assert all(w.filename == __file__ for w in ours)  # attributed to the user's line


def test_renamed_name_with_knob_and_impossible_ratio():
    with pytest.warns(FutureWarning):
        cfg = RFSFTConfig(warmup_ratio=List([0.05, 0.1]))
    assert cfg.warmup_steps == List([0.05, 0.1])
    with pytest.raises(ConfigError, match="warmup_ratio=1.0"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        RFSFTConfig(warmup_ratio=1.0)
    with pytest.raises(ConfigError, match="both"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        RFSFTConfig(warmup_ratio=0.1, warmup_steps=5)


@pytest.mark.parametrize("rename", fields.RENAMES, ids=lambda r: r.old)
def test_rename_table_matches_installed_trl(rename):
    cls = fields.trainer_config_class("SFT")
    assert rename.old not in fields.field_names(cls)
    assert rename.new in fields.field_names(cls)
    assert fields.find_rename(cls, rename.old) is rename


def test_model_kwargs_torch_dtype_maps_to_dtype():
    with pytest.warns(FutureWarning, match="`torch_dtype` is deprecated.*`dtype="):
        cfg = RFModelConfig("m", model_kwargs={"torch_dtype": "bfloat16", "use_cache": False})
    assert cfg.model_kwargs == {"dtype": "bfloat16", "use_cache": False}
    with pytest.raises(ConfigError, match="both"):
        RFModelConfig("m", model_kwargs={"torch_dtype": "bfloat16", "dtype": "float32"})


def test_model_config_field_checks():
    with pytest.raises(ConfigError, match="training_args"):
        RFModelConfig("m", training_args={"learning_rate": 1e-3})
    with pytest.raises(ConfigError, match="formatting_func"):
        RFModelConfig("m", formatting_func="not a function")
    with pytest.raises(ConfigError, match="model_name"):
        RFModelConfig("")
    with pytest.raises(ConfigError, match="did you mean `peft_config`"):
        RFModelConfig("m").peft_confg = None
    # a misspelt or missing model_name is our ConfigError, not Python's "missing argument" TypeError
    with pytest.raises(ConfigError, match="no field `model_nam`; did you mean `model_name`"):
        RFModelConfig(model_nam="m")
    with pytest.raises(ConfigError, match="needs `model_name`"):
        RFModelConfig(peft_config=RFLoraConfig(r=4))
    cfg = RFModelConfig("m", peft_config=[RFLoraConfig(r=4), RFLoraConfig(r=8)])
    assert isinstance(cfg.peft_config, List) and len(cfg.peft_config) == 2  # plain list = alternatives


def test_reward_funcs_plain_list_is_one_alternative():
    def a(completions, **kw):
        return [0.0] * len(completions)

    def b(completions, **kw):
        return [1.0] * len(completions)

    assert RFModelConfig("m", reward_funcs=[a, b]).reward_funcs == (a, b)
    assert RFModelConfig("m", reward_funcs=a).reward_funcs == (a,)
    alternatives = RFModelConfig("m", reward_funcs=List([[a], [a, b]])).reward_funcs
    assert alternatives == List([(a,), (a, b)])
    with pytest.raises(ConfigError, match="reward_funcs"):
        RFModelConfig("m", reward_funcs=[a, 3])


def test_wrapper_attributes_do_not_shadow_fields():
    own = {"kwargs", "copy", "wrapped_class"}
    for cls in (RFSFTConfig, RFDPOConfig, RFGRPOConfig, RFLoraConfig):
        assert not own & fields.field_names(cls.wrapped_class())
    trainer_fields = set().union(
        *(fields.field_names(fields.trainer_config_class(t)) for t in fields.TRAINER_TYPES)
    )
    labels = {
        "run_name",
        "tags",
    }  # not hparams keys; run_name is TRL's own field on purpose (one name, two places)
    assert not trainer_fields & (set(MODEL_FIELDS) - labels)  # hparams keys stay unambiguous


def test_copy_is_independent():
    cfg = RFLoraConfig(r=8, target_modules=["q_proj"])
    dup = cfg.copy()
    assert dup == cfg
    dup.r = 16
    assert cfg.r == 8
