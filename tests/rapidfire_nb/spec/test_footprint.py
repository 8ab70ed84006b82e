"""The run-size estimator (issue 34 item 7) against real counts: PEFT's trainable parameters, and the bytes the
checkpoint writer puts on disk.

The estimator is torch-free; these tests build the real models (the tiny ones, and SmolLM2-, Qwen3- and
Mistral-shaped ones on the meta device: shapes without memory), apply PEFT LoRA and compare.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb.spec.footprint import (
    BaseShapes,
    estimate,
    format_bytes,
)

SMOLLM2_135M = {  # HuggingFaceTB/SmolLM2-135M's config.json
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
}
QWEN3 = {
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 24,
    "vocab_size": 300,
}
MISTRAL = {**QWEN3, "model_type": "mistral", "head_dim": None}

LORAS: list[dict[str, Any]] = [
    {"r": 8},  # PEFT's default targets: q_proj, v_proj
    {"r": 16, "target_modules": "all-linear"},
    {"r": 4, "target_modules": ["q_proj", "k_proj", "down_proj"], "modules_to_save": ["lm_head"]},
    {"r": 8, "bias": "all", "use_dora": True},
    {
        "r": 8,
        "target_modules": ["v_proj", "o_proj"],
        "bias": "lora_only",
        "rank_pattern": {"v_proj": 3},
        "layers_to_transform": [1],
    },
    {"r": 5, "target_modules": r".*\.(v_proj|up_proj)", "exclude_modules": ["model.layers.0.mlp.up_proj"]},
    {"r": 2, "modules_to_save": ["embed_tokens"]},
]


def _configs() -> dict[str, Any]:
    from rapidfire_nb.testing.models import tiny_model_config

    return {
        "tiny": tiny_model_config("tiny"),
        "tiny-qwen2": tiny_model_config("tiny-qwen2"),
        "smollm2-135m": SMOLLM2_135M,
        "qwen3": QWEN3,
        "mistral": MISTRAL,
    }


def _meta_model(config: dict[str, Any]) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config.items() if k != "model_type" and v is not None}
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **fields))


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen2", "smollm2-135m", "qwen3", "mistral"])
def test_trainable_parameters_equal_peft_s_exactly(name: str) -> None:
    import warnings

    from peft import LoraConfig, get_peft_model

    config = _configs()[name]
    shapes = BaseShapes.from_config(config)
    assert shapes is not None
    model = _meta_model(config)
    params = list(model.parameters())
    full = estimate(shapes, None)
    assert (full.trainable_params, full.trainable_tensors) == (sum(p.numel() for p in params), len(params))
    for lora in LORAS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PEFT's note on adapting a tied layer
            peft_model = get_peft_model(_meta_model(config), LoraConfig(**lora))
        trainable = [p for p in peft_model.parameters() if p.requires_grad]
        fp = estimate(shapes, lora)
        assert fp.trainable_params == sum(p.numel() for p in trainable), (name, lora)
        assert fp.trainable_tensors == len(trainable), (name, lora)


def test_the_tiny_config_is_the_tiny_model_s() -> None:
    from rapidfire_nb.testing.models import tiny_model, tiny_model_config

    for name, arch in (("tiny", "llama"), ("tiny-qwen2", "qwen2")):
        real = tiny_model(arch=arch).config.to_dict()
        assert BaseShapes.from_config(real) == BaseShapes.from_config(tiny_model_config(name))


def test_smollm2_numbers_and_the_issue_s_tiny_clone() -> None:
    smol = BaseShapes.from_config(SMOLLM2_135M)
    assert smol is not None and smol.total_params() == 134_515_008  # the published 134.5 M
    r16 = estimate(smol, {"r": 16, "target_modules": "all-linear"})
    assert r16.trainable_params == 4_884_480
    assert r16.weights_bytes == 4 * 4_884_480 and r16.memory_bytes == 4 * r16.weights_bytes + 420 * 4
    assert estimate(smol, None, optim="sgd").optimizer_bytes == 0
    bf16 = BaseShapes.from_config({**SMOLLM2_135M, "torch_dtype": "bfloat16"})
    assert bf16 is not None and estimate(bf16, None).weights_bytes == 2 * 134_515_008
    from rapidfire_nb.testing.models import tiny_model_config

    tiny = BaseShapes.from_config(tiny_model_config())
    assert tiny is not None
    huge = estimate(tiny, {"r": 65536})  # the issue's clone: q_proj 64->64, v_proj 64->32, 2 layers
    assert huge.trainable_params == 65536 * (64 + 64 + 64 + 32) * 2 == 29_360_128
    assert 350e6 < huge.checkpoint_bytes < 354e6  # "337 MB" (MiB) per checkpoint in the issue
    assert huge.min_rank_dim == 32
    assert format_bytes(huge.checkpoint_bytes) == "352 MB"


def test_unknown_layouts_are_not_estimated() -> None:
    assert BaseShapes.from_config({"model_type": "gpt2", "n_embd": 64}) is None
    assert BaseShapes.from_config({"model_type": "llama"}) is None  # sizes missing


LORA_RUNS: list[dict[str, Any] | None] = [
    {"r": 32, "lora_alpha": 8, "target_modules": "all-linear"},
    {"r": 16, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "modules_to_save": ["lm_head"]},
    None,  # full fine-tuning
]


def test_checkpoint_size_is_what_the_writer_puts_on_disk(tmp_path: Path, monkeypatch: Any) -> None:
    """One tiny run_fit, three runs (LoRA of two shapes and full fine-tuning), boundary at step 2: every
    checkpoint folder the writer wrote is within 2 % of the estimate (measured: within 0.3 %)."""
    import rapidfire_nb.training.checkpoint as checkpoint
    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
    from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset
    from rapidfire_nb.testing.models import tiny_model_config

    written: dict[int, int] = {}
    write = checkpoint.write_snapshot

    def measured(snap: Any, target: Path) -> None:
        write(snap, target)
        written[snap.run_id] = sum(f.stat().st_size for f in Path(target).iterdir())

    monkeypatch.setattr(checkpoint, "write_snapshot", measured)
    configs = [
        RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(**lora) if lora else None,
            training_args=RFSFTConfig(
                learning_rate=1e-3, per_device_train_batch_size=2, max_steps=4, max_length=32
            ),
        )
        for lora in LORA_RUNS
    ]
    exp = Experiment("footprint", experiment_path=str(tmp_path))
    exp.quiet = True
    try:
        exp.run_fit(
            RFGridSearch(configs=List(configs), trainer_type="SFT"),
            tiny_create_model,
            tiny_sft_dataset(8),
            num_chunks=2,
            seed=0,
            background=False,
        )
    finally:
        exp.end()
    shapes = BaseShapes.from_config(tiny_model_config())
    assert shapes is not None
    assert sorted(written) == [1, 2, 3]
    for run_id, lora in enumerate(LORA_RUNS, start=1):
        estimated = estimate(shapes, lora).checkpoint_bytes
        assert abs(estimated - written[run_id]) <= 0.02 * written[run_id], (
            run_id,
            estimated,
            written[run_id],
        )


@pytest.mark.parametrize("lora", [{"r": 8, "target_modules": "all-linear"}, {"r": 4, "use_dora": True}, None])
def test_device_memory_is_the_weights_gradients_and_adamw_state_after_a_step(
    lora: dict[str, Any] | None,
) -> None:
    """``memory_bytes`` equals the bytes of the trainable tensors, their ``.grad`` and ``torch.optim.AdamW``'s
    state after one step, exactly (the shared base not counted)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from rapidfire_nb.testing.models import tiny_model, tiny_model_config

    model = tiny_model()
    if lora is not None:
        model = get_peft_model(model, LoraConfig(**lora))
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3)
    ids = torch.arange(16).reshape(2, 8)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()

    def size(t: Any) -> int:
        return int(t.numel() * t.element_size())

    states = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    actual = sum(size(p) + size(p.grad) for p in trainable) + sum(size(t) for t in states)
    shapes = BaseShapes.from_config(tiny_model_config())
    assert shapes is not None
    assert estimate(shapes, lora).memory_bytes == actual


def test_activation_bytes_per_micro_batch_of_smollm2() -> None:
    """Per token: 30 layers x (8 x 576 + 2 x 3 x 64 + 5 x 1536) + 49,152 logits = 429,312 elements; fp32."""
    from rapidfire_nb.spec.footprint import activation_bytes

    smol = BaseShapes.from_config(SMOLLM2_135M)
    assert smol is not None
    assert activation_bytes(smol, 1) == 429_312 * 4
    assert (
        activation_bytes(smol, 4 * 256, dtype_bytes=2) == 4 * 256 * 429_312 * 2
    )  # 4 rows of 256, bf16: ~0.88 GB
