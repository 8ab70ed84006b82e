"""build_training_args / build_lora_config: CPU adaptation with notes, seed precedence, invalid values."""

from __future__ import annotations

import warnings

import pytest

from rapidfire_nb.automl import LeafConfig
from rapidfire_nb.errors import ConfigError
from rapidfire_nb.spec import build_lora_config, build_training_args


def reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def sft(**training):
    return LeafConfig(trainer_type="SFT", model_name="m", training=training, lora={"r": 4})


def test_cpu_switches_fp16_off_with_a_note(tmp_path):
    args, notes = build_training_args(
        sft(fp16=True, learning_rate=1e-3), str(tmp_path / "out"), 42, cuda_available=False
    )
    assert type(args).__name__ == "SFTConfig"
    assert args.use_cpu is True and args.fp16 is False and args.bf16 is False
    assert "fp16=True requested but no CUDA GPU: training in fp32 (fp16 switched off)" in notes
    assert args.gradient_checkpointing is False
    assert any(n.startswith("gradient_checkpointing switched off") for n in notes)
    assert args.learning_rate == 1e-3
    assert args.output_dir == str(tmp_path / "out") and not (tmp_path / "out").exists()


def test_cpu_keeps_explicit_gradient_checkpointing_and_detects_cuda(tmp_path):
    args, notes = build_training_args(
        sft(gradient_checkpointing=True), str(tmp_path), 0
    )  # this machine: no CUDA
    assert args.use_cpu is True
    assert args.gradient_checkpointing is True and args.activation_checkpointing is True
    assert not any("gradient_checkpointing" in n for n in notes)
    assert not any("fp16" in n or "bf16" in n for n in notes)  # nothing was asked: nothing to say


def test_seed_precedence(tmp_path):
    assert build_training_args(sft(), str(tmp_path), 42, cuda_available=False)[0].seed == 42
    assert build_training_args(sft(seed=7), str(tmp_path), 42, cuda_available=False)[0].seed == 7


def test_rapidfire_overrides_and_defaults(tmp_path):
    args, notes = build_training_args(sft(), str(tmp_path), 1, cuda_available=False)
    assert args.report_to in ("none", [], ["none"])
    assert str(getattr(args.save_strategy, "value", args.save_strategy)) == "no"
    assert args.disable_tqdm is True and args.dataloader_num_workers == 0 and args.logging_steps == 1
    user = sft(
        report_to="wandb",
        save_strategy="steps",
        logging_steps=5,
        dataloader_num_workers=2,
        output_dir="/somewhere/else",
    )
    args, notes = build_training_args(user, str(tmp_path), 1, cuda_available=False)
    assert args.logging_steps == 5 and args.dataloader_num_workers == 2
    assert args.output_dir == str(tmp_path)
    joined = "\n".join(notes)
    assert "report_to='wandb'" in joined and "save_strategy='steps'" in joined and "output_dir=" in joined
    assert "use Experiment(name, tracking=['mlflow', 'trackio', 'wandb'])" in joined  # where it goes instead


def test_gpu_without_bf16_switches_bf16_off(tmp_path):
    args, notes = build_training_args(
        sft(bf16=True), str(tmp_path), 0, cuda_available=True, bf16_supported=False
    )
    assert args.bf16 is False and args.use_cpu is False
    assert notes[0].startswith("bf16=True requested but this GPU does not support bf16")
    args, notes = build_training_args(sft(), str(tmp_path), 0, cuda_available=True, bf16_supported=False)
    assert args.bf16 is False and any("TRL's default bf16=True" in n for n in notes)


def test_no_transformers_deprecation_noise(tmp_path):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        build_training_args(sft(), str(tmp_path), 0, cuda_available=False)
    assert not [w for w in record if "checkpointing" in str(w.message)]


def test_warmup_ratio_carries_over_as_a_fraction(tmp_path):
    args, _ = build_training_args(sft(warmup_steps=0.1), str(tmp_path), 0, cuda_available=False)
    assert args.get_warmup_steps(100) == 10


@pytest.mark.parametrize(
    ("training", "match"),
    [
        ({"learning_rate": "abc"}, "learning_rate expects float"),
        ({"lr_scheduler_type": "bogus"}, "rejected lr_scheduler_type"),
        ({"learnig_rate": 1e-3}, "did you mean `learning_rate`"),
    ],
)
def test_invalid_training_values(tmp_path, training, match):
    with pytest.raises(ConfigError, match=match):
        build_training_args(sft(**training), str(tmp_path), 0, cuda_available=False)


def test_dpo_and_grpo_build_on_cpu(tmp_path):
    dpo = LeafConfig(trainer_type="DPO", model_name="m", training={"beta": 0.2, "loss_type": "sigmoid"})
    args, _ = build_training_args(dpo, str(tmp_path), 3, cuda_available=False)
    assert type(args).__name__ == "DPOConfig" and args.beta == 0.2 and args.loss_type == ["sigmoid"]
    grpo = LeafConfig(
        trainer_type="GRPO",
        model_name="m",
        reward_funcs=(reward,),
        training={"num_generations": 2, "per_device_train_batch_size": 2, "max_completion_length": 8},
    )
    args, _ = build_training_args(grpo, str(tmp_path), 3, cuda_available=False)
    assert type(args).__name__ == "GRPOConfig" and args.num_generations == 2 and args.use_cpu is True


def test_build_lora_config():
    assert build_lora_config(LeafConfig(trainer_type="SFT", model_name="m")) is None
    lora = build_lora_config(
        LeafConfig(
            trainer_type="SFT", model_name="m", lora={"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}
        )
    )
    assert (
        lora.r == 4
        and lora.lora_alpha == 8
        and str(getattr(lora.task_type, "value", lora.task_type)) == "CAUSAL_LM"
    )
    with pytest.raises(ConfigError, match=r"lora\.r.*positive integer"):
        build_lora_config(LeafConfig(trainer_type="SFT", model_name="m", lora={"r": -1}))
    with pytest.raises(ConfigError, match=r"lora\.bias"):
        build_lora_config(LeafConfig(trainer_type="SFT", model_name="m", lora={"bias": "nope"}))
