"""Models that already carry an adapter, and LoRA settings that act on the whole model (issue 12, items 3, 14).

Before: (a) a ``peft.PeftModel`` from ``create_model_fn`` next to ``peft_config`` trained a second adapter and left
the user's one unused, silently; (b) a frozen ``PeftModel`` without ``peft_config`` failed during training with
``element 0 of tensors does not require grad``; (c) LoRA layers injected in place (``peft.inject_adapter_in_model``)
trained right, but ``load_model`` reloaded with ``from_pretrained``, dropped the LoRA layers and re-initialised the
modules they wrap (logits 0.83 off); two LoRA runs with ``bias="lora_only"`` on one base were refused with a
message blaming ``lora.target_modules``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb import ConfigError, Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.testing import tiny_create_model
from tests.helpers import (
    TOL,
    adapter_from_folder,
    max_abs_diff,
    qa_dataset,
    qa_to_chat,
    result_series,
    train_plain_trl,
    worker_threads,
)

ARGS = {"learning_rate": 1e-2, "per_device_train_batch_size": 2, "max_steps": 2, "max_length": 32}
LORA = {"r": 2, "lora_alpha": 4, "target_modules": ["q_proj", "v_proj"]}


def _lora() -> Any:
    from peft import LoraConfig

    return LoraConfig(**LORA, task_type="CAUSAL_LM")


def _group(peft_config: Any = None, model_name: str = "tiny", **extra: Any) -> RFGridSearch:
    return RFGridSearch(
        RFModelConfig(
            model_name=model_name,
            peft_config=peft_config,
            training_args=RFSFTConfig(**{**ARGS, **extra}),
            formatting_func=qa_to_chat,
        ),
        "SFT",
    )


def peft_model_fn(config: dict[str, Any]) -> Any:
    from peft import get_peft_model

    model, tok = tiny_create_model(config)
    return get_peft_model(model, _lora()), tok


def injected_fn(config: dict[str, Any]) -> Any:
    from peft import inject_adapter_in_model
    from transformers import set_seed

    model, tok = tiny_create_model(config)
    set_seed(3)  # the same LoRA initialisation on every call
    return inject_adapter_in_model(_lora(), model), tok


def _refused(match: str, group: RFGridSearch, create_model_fn: Any) -> None:
    exp = Experiment("user-adapter")
    exp.quiet = True
    before = worker_threads()
    with pytest.raises(ConfigError, match=match):
        exp.run_fit(group, create_model_fn, qa_dataset(4), num_chunks=1, seed=0)
    assert worker_threads() - before == set() and exp.store.runs() == [], "nothing trained"
    exp.end()


@pytest.mark.parametrize(
    "create_model_fn,what",
    [
        (peft_model_fn, r"a peft.PeftModel \(adapters \['default'\]\)"),
        (injected_fn, "a model with LoRA layers injected in place"),
    ],
)
def test_a_users_adapter_next_to_peft_config_is_refused(create_model_fn: Any, what: str) -> None:
    _refused(
        rf"create_model_fn returned {what} .*RFModelConfig.peft_config is set too.*never trained.*peft_config=None",
        _group(RFLoraConfig(**LORA)),
        create_model_fn,
    )


def test_a_model_without_trainable_parameters_is_refused_before_training(tmp_path: Path) -> None:
    from peft import PeftModel

    model, _ = peft_model_fn({"model_name": "tiny"})
    model.save_pretrained(str(tmp_path / "adapter"))

    def frozen_fn(config: dict[str, Any]) -> Any:
        base, tok = tiny_create_model(config)
        return PeftModel.from_pretrained(base, str(tmp_path / "adapter")), tok  # is_trainable=False

    _refused(r"no trainable parameters .*is_trainable=True", _group(), frozen_fn)


def _logits(model: Any) -> Any:
    import torch

    with torch.no_grad():
        return model(torch.arange(3, 40).unsqueeze(0)).logits


@pytest.mark.parametrize("create_model_fn", [injected_fn, peft_model_fn])
def test_load_model_returns_the_trained_weights_of_a_model_carrying_adapter_layers(
    create_model_fn: Any,
) -> None:
    exp = Experiment("own-adapter")
    exp.quiet = True
    exp.run_fit(_group(), create_model_fn, qa_dataset(4), num_chunks=1, seed=0)
    trained = exp.session.executor.runs[1].worker.trainer.model  # type: ignore[union-attr]
    trained.eval()
    fresh = _logits(create_model_fn({"model_name": "tiny"})[0].eval())
    expected = _logits(trained)
    assert (expected - fresh).abs().max().item() > 1e-4, "training changed the adapter"
    loaded, _ = exp.load_model(1)
    assert (_logits(loaded) - expected).abs().max().item() == 0.0
    exp.end()
    again = Experiment("own-adapter")  # a later kernel: rebuilt from the run's final folder
    again.quiet = True
    again.run_fit(_group(), create_model_fn, qa_dataset(4), num_chunks=1, seed=0)
    reloaded, _ = again.load_model(1)
    assert (_logits(reloaded) - expected).abs().max().item() == 0.0
    again.end()


def test_lora_runs_with_bias_get_their_own_base_and_train_exactly(tmp_path: Path) -> None:
    train = qa_dataset(4)
    bias_lora = {**LORA, "bias": "lora_only"}
    configs = List(
        [
            RFModelConfig(
                model_name="tiny-qwen2",  # Qwen2's q/k/v projections have biases (Llama's have none)
                peft_config=RFLoraConfig(**bias_lora),
                training_args=RFSFTConfig(**{**ARGS, "learning_rate": lr}),
                formatting_func=qa_to_chat,
            )
            for lr in (1e-2, 5e-3)
        ]
    )
    lines: list[str] = []
    exp = Experiment("bias-runs")
    exp.on_message(lines.append)
    exp.run_fit(RFGridSearch(configs, "SFT"), tiny_create_model, train, num_chunks=2, seed=0)
    assert list(exp.get_runs_info().status) == ["COMPLETED", "COMPLETED"]
    assert any(
        "lora.bias='lora_only' trains bias terms" in line and "own base copy" in line for line in lines
    )
    executor = exp.session.executor  # type: ignore[union-attr]
    assert executor.runs[1].base is not executor.runs[2].base
    for rid in (1, 2):
        spec = executor.runs[rid].spec
        ref = train_plain_trl(spec, tiny_create_model, train, None, 0, tmp_path / str(rid))
        saved = adapter_from_folder(exp.path / "runs" / str(rid) / "final")
        assert any(k.endswith("bias") for k in saved), "the LoRA bias is trained and saved"
        assert max_abs_diff(saved, ref.final) <= TOL
    exp.end()


def test_a_lora_run_with_trainable_tokens_gets_its_own_base_and_the_others_still_share(
    tmp_path: Path,
) -> None:
    """Before: PEFT's token adapter, shared by every adapter added after it, made ``get_peft_model_state_dict``
    raise ``KeyError: 'token_adapter.trainable_tokens_delta.run_3'`` and took ``run_fit`` down before training."""
    train = qa_dataset(4)
    loras = [LORA, {**LORA, "trainable_token_indices": [3, 5, 7]}, {**LORA, "r": 4}]
    configs = List(
        [
            RFModelConfig(
                model_name="tiny",
                peft_config=RFLoraConfig(**lora),
                training_args=RFSFTConfig(**ARGS),
                formatting_func=qa_to_chat,
            )
            for lora in loras
        ]
    )
    lines: list[str] = []
    exp = Experiment("token-runs")
    exp.on_message(lines.append)
    exp.run_fit(RFGridSearch(configs, "SFT"), tiny_create_model, train, num_chunks=2, seed=0)
    assert list(exp.get_runs_info().status) == ["COMPLETED"] * 3
    assert any(
        "lora.trainable_token_indices trains rows" in line and "own base copy" in line for line in lines
    )
    executor = exp.session.executor  # type: ignore[union-attr]
    assert executor.runs[1].base is executor.runs[3].base is not executor.runs[2].base
    for rid in (2, 3):
        spec = executor.runs[rid].spec
        ref = train_plain_trl(spec, tiny_create_model, train, None, 0, tmp_path / str(rid))
        saved = adapter_from_folder(exp.path / "runs" / str(rid) / "final")
        if rid == 2:
            assert any("trainable_tokens" in k for k in saved), "the token rows are trained and saved"
        assert max_abs_diff(saved, ref.final) <= TOL
    exp.end()


def test_lora_and_full_fine_tuning_runs_mix_in_either_order() -> None:
    train = qa_dataset(4)
    lora = RFModelConfig(
        model_name="tiny",
        peft_config=RFLoraConfig(**LORA),
        training_args=RFSFTConfig(**ARGS),
        formatting_func=qa_to_chat,
    )
    full = RFModelConfig(
        model_name="tiny",
        training_args=RFSFTConfig(**{**ARGS, "learning_rate": 1e-4}),
        formatting_func=qa_to_chat,
    )
    losses: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for order, group in (("lora-first", [lora, full]), ("full-first", [full, lora])):
        exp = Experiment(order)  # LoRA first was refused: "mixing LoRA and full fine-tuning runs on one base"
        exp.run_fit(RFGridSearch(List(group), "SFT"), tiny_create_model, train, num_chunks=2, seed=0)
        assert list(exp.get_runs_info().status) == ["COMPLETED", "COMPLETED"]
        results = exp.get_results()
        ids = {"lora": 1, "full": 2} if order == "lora-first" else {"full": 1, "lora": 2}
        losses[order] = {kind: result_series(results, rid, "loss") for kind, rid in ids.items()}
        exp.end()
    assert losses["lora-first"] == losses["full-first"]  # each run trains as it would in the other order
    assert len(losses["lora-first"]["full"]) == 2
