"""Packs (``rapidfire_nb.spec.packs``): which runs may share one forward/backward, why not, and what is said."""

from __future__ import annotations

from typing import Any

import pytest

from rapidfire_nb.errors import ConfigError
from rapidfire_nb.spec import LeafConfig
from rapidfire_nb.spec.packs import (
    PackPlan,
    check_packing_option,
    ids_text,
    pack_key,
    packing_applies,
    packing_note,
    plan_packs,
    refuse_unpackable,
    why_not_packed,
)

LORA = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
TRAINING = {"per_device_train_batch_size": 4, "max_steps": 6, "learning_rate": 1e-4}


def _leaf(
    training: dict[str, Any] | None = None,
    lora: dict[str, Any] | None = LORA,
    kind: str = "SFT",
    **fields: Any,
) -> LeafConfig:
    return LeafConfig(
        trainer_type=kind, model_name="tiny", lora=lora, training={**TRAINING, **(training or {})}, **fields
    )


def _reward(prompts: Any, completions: Any, **kwargs: Any) -> list[float]:
    return [0.0] * len(completions)


@pytest.mark.parametrize(
    "changes",
    [
        {"learning_rate": 3e-3},
        {"lr_scheduler_type": "cosine", "lr_scheduler_kwargs": {}},
        {"warmup_steps": 3},
        {"weight_decay": 0.1},
        {"max_grad_norm": 0.5},
        {"optim": "sgd", "adam_beta1": 0.8, "adam_beta2": 0.9, "adam_epsilon": 1e-6},
        {"loss_type": "dft"},
        {"output_dir": "/elsewhere", "logging_steps": 1, "eval_steps": 2, "eval_strategy": "steps"},
        {"save_steps": 3, "save_strategy": "steps", "report_to": "none", "per_device_eval_batch_size": 1},
    ],
)
def test_the_runs_own_optimizer_schedule_loss_and_bookkeeping_do_not_split_a_pack(
    changes: dict[str, Any],
) -> None:
    assert pack_key(_leaf(changes), "SFT") == pack_key(_leaf(), "SFT") is not None


@pytest.mark.parametrize(
    "lora",
    [
        {"r": 32, "lora_alpha": 64},
        {"lora_dropout": 0.1},
        {"target_modules": "all-linear"},
        {"use_rslora": True, "init_lora_weights": "gaussian"},
    ],
)
def test_the_runs_own_adapter_does_not_split_a_pack(lora: dict[str, Any]) -> None:
    assert pack_key(_leaf(lora={**LORA, **lora}), "SFT") == pack_key(_leaf(), "SFT")


def test_labels_and_evaluation_only_fields_do_not_split_a_pack() -> None:
    named = _leaf(
        run_name="lr {learning_rate}", tags=("a",), compute_metrics=_reward, generation_config={"x": 1}
    )
    assert pack_key(named, "SFT") == pack_key(_leaf(), "SFT")


def test_dpo_beta_and_loss_do_not_split_a_pack() -> None:
    base = _leaf({"beta": 0.1}, kind="DPO")
    other = _leaf({"beta": 0.5, "loss_type": ["sigmoid"], "label_smoothing": 0.1}, kind="DPO")
    assert pack_key(base, "DPO") == pack_key(other, "DPO") is not None


@pytest.mark.parametrize(
    "changes",
    [
        {"per_device_train_batch_size": 2},
        {"seed": 7},
        {"data_seed": 3},
        {"gradient_accumulation_steps": 2},
        {"max_length": 64},
        {"max_steps": 9},
        {"num_train_epochs": 2},
        {"gradient_checkpointing": True},  # TRL's default, but set: kept on CPU (left out: switched off)
        {"gradient_checkpointing": False},
        {"bf16": True},
        {"group_by_length": True},  # a field this module does not know: splits (conservative)
    ],
)
def test_what_changes_the_batches_or_the_forward_splits_a_pack(changes: dict[str, Any]) -> None:
    first, second = pack_key(_leaf(changes), "SFT"), pack_key(_leaf(), "SFT")
    assert first is not None and second is not None
    assert first != second


def test_the_base_and_the_lora_layout_split_a_pack() -> None:
    plain = pack_key(_leaf(), "SFT")
    assert pack_key(_leaf(model_kwargs={"dtype": "bfloat16"}), "SFT") != plain
    assert (
        pack_key(LeafConfig(trainer_type="SFT", model_name="other", lora=LORA, training=TRAINING), "SFT")
        != plain
    )
    assert pack_key(_leaf(lora={**LORA, "rank_pattern": {"q_proj": 4}}), "SFT") != plain
    assert pack_key(_leaf(), "DPO") != plain  # another trainer kind


def test_a_formatting_function_splits_by_identity_not_by_name() -> None:
    first, second = (lambda row: row), (lambda row: {**row})  # one qualified name: "<lambda>"
    assert pack_key(_leaf(formatting_func=first), "SFT") == pack_key(_leaf(formatting_func=first), "SFT")
    assert pack_key(_leaf(formatting_func=first), "SFT") != pack_key(_leaf(formatting_func=second), "SFT")


def test_a_field_set_to_its_default_equals_one_left_out_but_a_seed_is_run_fits() -> None:
    # TRL's defaults: 8 rows per device, no gradient accumulation; a secret never splits a pack
    assert pack_key(_leaf({"gradient_accumulation_steps": 1, "hub_token": "x"}), "SFT") == pack_key(
        _leaf(), "SFT"
    )
    assert pack_key(_leaf(lora={**LORA, "bias": "none", "use_dora": False}), "SFT") == pack_key(
        _leaf(), "SFT"
    )
    own_seed = _leaf({"seed": 42})
    # a run without a seed trains with run_fit's: equal to an explicit 42 only when run_fit's seed is 42
    assert pack_key(own_seed, "SFT") != pack_key(_leaf(), "SFT")
    assert pack_key(own_seed, "SFT", default_seed=42) == pack_key(_leaf(), "SFT", default_seed=42)
    assert pack_key(own_seed, "SFT", default_seed=7) != pack_key(_leaf(), "SFT", default_seed=7)


@pytest.mark.parametrize(
    ("spec", "kind", "reason"),
    [
        (_leaf(lora=None), "SFT", "full fine-tuning"),
        (_leaf(lora={**LORA, "use_dora": True}), "SFT", "DoRA"),
        (
            _leaf(lora={**LORA, "modules_to_save": ["lm_head"]}),
            "SFT",
            "modules_to_save (whole modules trained)",
        ),
        (_leaf(lora={**LORA, "bias": "all"}), "SFT", "LoRA bias training (trains the base's biases)"),
        (
            _leaf(lora={**LORA, "init_lora_weights": "pissa"}),
            "SFT",
            "init_lora_weights='pissa' (changes the base or needs data)",
        ),
        (_leaf({"packing": True}), "SFT", "SFT packing=True (rows packed into one sequence)"),
        (_leaf({"padding_free": True}), "SFT", "padding_free (rows concatenated into one sequence)"),
        (_leaf({"neftune_noise_alpha": 5.0}), "SFT", "NEFTune noise in the shared embedding"),
    ],
)
def test_runs_that_cannot_pack_say_why(spec: LeafConfig, kind: str, reason: str) -> None:
    assert why_not_packed(spec, kind) == reason
    assert pack_key(spec, kind) is None


def test_a_packable_run_has_no_reason() -> None:
    assert why_not_packed(_leaf({"packing": False, "padding_free": False}), "SFT") is None


def test_the_packing_option() -> None:
    assert [check_packing_option(v) for v in ("auto", True, False)] == ["auto", True, False]
    for bad in ("yes", "Auto", 1, 0, None):
        with pytest.raises(ConfigError, match=r"^packing must be 'auto' .* True .* or False .*got "):
            check_packing_option(bad)
    assert packing_applies("auto", "cuda:0") and not packing_applies("auto", "cpu")
    assert packing_applies("auto", "cpu", "GRPO") and not packing_applies(
        "auto", "cpu", "DPO"
    )  # rollouts pay
    assert packing_applies(True, "cpu") and not packing_applies(False, "cuda:0")


def test_ids_text() -> None:
    assert [ids_text(ids) for ids in ([3], [2, 1], [1, 2, 3, 4], [7, 1, 2, 3, 5])] == [
        "run 3",
        "runs 1 and 2",
        "runs 1-4",
        "runs 1-3, 5 and 7",
    ]


def _group() -> dict[int, LeafConfig]:
    return {
        1: _leaf(),
        2: _leaf({"learning_rate": 1e-3}, lora={**LORA, "r": 16}),
        3: _leaf({"warmup_steps": 2}),
        4: _leaf({"weight_decay": 0.1}),
        5: _leaf(lora=None),
        6: _leaf({"per_device_train_batch_size": 2}),
    }


def test_the_plan_and_the_line_said_at_the_start() -> None:
    plan = plan_packs(_group(), "SFT")
    assert plan == PackPlan(
        packs=((1, 2, 3, 4),),
        alone={5: "full fine-tuning", 6: "differs from run 1 in per_device_train_batch_size"},
    )
    assert [plan.pack_of(i) for i in range(1, 7)] == [1, 1, 1, 1, None, None]
    assert packing_note(plan, "auto", "cuda:0") == (
        "packing: runs 1-4 train as one pack (one forward/backward per step); run 5 alone (full fine-tuning); "
        "run 6 alone (differs from run 1 in per_device_train_batch_size)"
    )
    assert packing_note(plan, True, "cpu") == packing_note(plan, "auto", "cuda:0")
    assert packing_note(plan, "auto", "cpu") == (
        "packing='auto': not on this device (cpu: measured no gain; packing=True forces it)"
    )
    assert packing_note(plan, False, "cuda:0") is None


def test_two_packs_and_nothing_to_say() -> None:
    runs = {1: _leaf(), 2: _leaf({"seed": 3}), 3: _leaf({"learning_rate": 1.0}), 4: _leaf({"seed": 3})}
    plan = plan_packs(runs, "SFT", default_seed=42)
    assert plan.packs == ((1, 3), (2, 4)) and dict(plan.alone) == {}
    assert packing_note(plan, "auto", "cuda") == (
        "packing: runs 1 and 3 and runs 2 and 4 train as 2 packs (one forward/backward per pack and step)"
    )
    lonely = plan_packs({1: _leaf(), 2: _leaf(lora=None)}, "SFT")
    assert lonely.alone == {1: "no other run to pack with", 2: "full fine-tuning"}
    assert packing_note(lonely, "auto", "cuda:0") is None  # "auto" and no pack: nothing to say


def test_packing_true_refuses_a_group_where_no_two_runs_share_a_pack() -> None:
    runs = {1: _leaf(lora=None), 2: _leaf({"per_device_train_batch_size": 2}), 3: _leaf()}
    with pytest.raises(ConfigError) as refused:
        refuse_unpackable(runs, "SFT", default_seed=42)
    assert str(refused.value) == (
        "packing=True: no two runs can share a pack: run 1 full fine-tuning, runs 2 and 3 differ in "
        "per_device_train_batch_size. Packed runs need LoRA and equal configs apart from their optimizer, "
        "schedule, loss and adapter settings; use packing='auto' or packing=False to train these runs time-sliced"
    )
    refuse_unpackable(
        {**runs, 4: _leaf({"learning_rate": 0.5})}, "SFT", default_seed=42
    )  # 3 and 4 pack: accepted
