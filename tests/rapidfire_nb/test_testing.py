"""Tests of rapidfire_nb.testing: tiny tokenizer, tiny models and tiny datasets."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from rapidfire_nb import testing
from rapidfire_nb.testing import (
    TINY_CHAT_TEMPLATE,
    TINY_VOCAB_SIZE,
    length_reward,
    tiny_create_model,
    tiny_dpo_dataset,
    tiny_grpo_dataset,
    tiny_model,
    tiny_sft_dataset,
    tiny_tokenizer,
)

CPU_ARGS = {
    "use_cpu": True,
    "bf16": False,
    "fp16": False,
    "activation_checkpointing": False,  # TRL turns it on by default; transformers 5 renamed it
    "dataloader_num_workers": 0,
    "report_to": "none",
    "save_strategy": "no",
    "logging_steps": 1,
    "max_steps": 2,
    "per_device_train_batch_size": 4,
    "seed": 0,
}


def _state_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_tiny_model_is_deterministic_and_leaves_global_rng_alone() -> None:
    torch.manual_seed(1234)
    random.seed(99)
    np.random.seed(7)
    torch_state = torch.get_rng_state()
    py_state = random.getstate()
    np_state = np.random.get_state()

    first = tiny_model()
    second = tiny_model()

    assert _state_equal(first, second)
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert random.getstate() == py_state
    assert np.array_equal(np.random.get_state()[1], np_state[1])
    assert not _state_equal(first, tiny_model(seed=1))


def test_tiny_model_shape() -> None:
    model = tiny_model()
    cfg = model.config
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (
        64,
        2,
        4,
        2,
    )
    assert cfg.intermediate_size == 128
    assert cfg.vocab_size == len(tiny_tokenizer()) == TINY_VOCAB_SIZE == 512
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (3, 0, 2)
    assert model.generation_config.eos_token_id == 2
    assert type(tiny_model(arch="qwen2")).__name__ == "Qwen2ForCausalLM"
    with pytest.raises(ValueError, match="arch"):
        tiny_model(arch="gpt2")


def test_tiny_tokenizer_chat_template_round_trip() -> None:
    tok = tiny_tokenizer()
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 3 plus 4?"},
        {"role": "assistant", "content": "The answer is 7."},
    ]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 3 plus 4?<|im_end|>\n"
        "<|im_start|>assistant\nThe answer is 7.<|im_end|>\n"
    )
    ids = tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    assert tok.decode(ids) == text
    assert ids.count(tok.convert_tokens_to_ids("<|im_end|>")) == 3
    prompt = tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n") and text.startswith(prompt)
    assert (tok.eos_token, tok.pad_token, tok.eos_token_id, tok.pad_token_id) == ("<|im_end|>", "<pad>", 2, 3)
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]) == [0, 1, 2, 3]
    assert tok.chat_template == TINY_CHAT_TEMPLATE
    # Deterministic vocabulary, and each call is a fresh object.
    other = tiny_tokenizer()
    assert other is not tok and other.get_vocab() == tok.get_vocab()
    assert len(tok("My internet is not working.")["input_ids"]) < 15  # merges learnt from the corpus


def test_tiny_create_model_same_weights_every_call(tiny_model_fn) -> None:
    model_a, tok_a = tiny_model_fn(None)
    model_b, _ = tiny_create_model({"model_name": "tiny-llama", "model_kwargs": {"device_map": "cpu"}})
    assert _state_equal(model_a, model_b)
    assert model_a is not model_b
    assert len(tok_a) == model_a.config.vocab_size
    qwen, _ = tiny_create_model({"model_name": "tiny-qwen2", "model_kwargs": {"torch_dtype": "float64"}})
    assert type(qwen).__name__ == "Qwen2ForCausalLM"
    assert next(qwen.parameters()).dtype == torch.float64
    eager, _ = tiny_create_model({"model_kwargs": {"attn_implementation": "eager"}})
    assert eager.config._attn_implementation == "eager"
    with pytest.raises(ValueError, match="model_name"):
        tiny_create_model({"model_name": "gpt2"})
    with pytest.raises(TypeError, match="load_in_8bit"):
        tiny_create_model({"model_kwargs": {"load_in_8bit": True}})


def test_tiny_datasets() -> None:
    sft = tiny_sft_dataset(8, seed=3)
    assert sft.column_names == ["prompt", "completion"] and len(sft) == 8
    assert sft[0]["prompt"][0]["role"] == "user" and sft[0]["completion"][0]["role"] == "assistant"
    assert sft.to_list() == tiny_sft_dataset(8, seed=3).to_list()
    assert sft.to_list() != tiny_sft_dataset(8, seed=4).to_list()

    dpo = tiny_dpo_dataset(16)
    assert dpo.column_names == ["prompt", "chosen", "rejected"] and len(dpo) == 16
    assert all(row["chosen"] != row["rejected"] for row in dpo)

    grpo = tiny_grpo_dataset(5)
    assert grpo.column_names == ["prompt", "answer"] and len(grpo) == 5
    for row in grpo:
        a, b = (int(w.rstrip("?")) for w in row["prompt"][0]["content"].split() if w.rstrip("?").isdigit())
        assert row["answer"] == str(a + b)
    with pytest.raises(ValueError):
        tiny_sft_dataset(0)


def test_length_reward() -> None:
    completions = [[{"role": "assistant", "content": "abc"}], "hello", [{"role": "assistant", "content": ""}]]
    assert length_reward(completions, prompts=None, answer=["1", "2", "3"]) == [3.0, 5.0, 0.0]


def test_tiny_assets_train_with_trl(tmp_path) -> None:
    """One short SFT and one GRPO run on the tiny assets change every weight (CPU, ~2 s)."""
    from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

    model, tok = tiny_create_model()
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    trainer = SFTTrainer(
        model=model,
        processing_class=tok,
        train_dataset=tiny_sft_dataset(8),
        args=SFTConfig(output_dir=str(tmp_path / "sft"), max_length=64, **CPU_ARGS),
    )
    trainer.train()
    assert all(not torch.equal(before[k], v) for k, v in model.named_parameters())

    model, tok = tiny_create_model()
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    trainer = GRPOTrainer(
        model=model,
        processing_class=tok,
        reward_funcs=[length_reward],
        train_dataset=tiny_grpo_dataset(8),
        args=GRPOConfig(
            output_dir=str(tmp_path / "grpo"), num_generations=4, max_completion_length=8, **CPU_ARGS
        ),
    )
    trainer.train()
    logged = [h for h in trainer.state.log_history if "reward_std" in h]
    assert logged and all(h["reward_std"] > 0 for h in logged)
    changed = sum(not torch.equal(before[k], v) for k, v in model.named_parameters())
    assert changed == len(before)


def test_import_does_not_import_torch() -> None:
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys; import rapidfire_nb.testing, rapidfire_nb.data; "
        "heavy = [m for m in ('torch', 'transformers', 'datasets', 'trl', 'reasoning_gym') "
        "if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    root = (
        Path(testing.__file__).resolve().parents[2]
    )  # the package folder rapidfire_nb/testing/ -> repo root
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
