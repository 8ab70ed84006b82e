"""The SFT quick start of TRL's RapidFire AI page (Portuguese, ``shared/seeds/003_*.txt``) runs end to end.

Only these lines differ from the page: the import line (``rapidfire_nb``), the model (no hub here:
``create_model`` ignores the hub name and builds the tiny test model, applying ``model_kwargs`` as
``from_pretrained`` would), the data (chatterbot tech-support pairs renamed to the Bitext columns
``instruction``/``response``; 16 train rows, 8 eval rows) and ``max_steps`` (4 instead of 128). ``fp16=True``,
``model_type="causal_lm"``, ``model_kwargs={"device_map": "auto", "dtype": "auto", "use_cache": False}``,
``num_chunks=4, seed=42`` and ``experiment.end()`` are kept.

A second variant keeps the page's ``create_model`` verbatim (``AutoModelForCausalLM.from_pretrained(name,
**model_kwargs)``, so ``device_map="auto"``/``dtype="auto"`` really reach transformers on this CPU machine) and
changes ``model_name`` to a local folder holding the tiny model instead.
"""

from __future__ import annotations

from typing import Any

import pytest


def _dataset() -> Any:
    """Stand-in for ``load_dataset("bitext/Bitext-customer-support-llm-chatbot-training-dataset")["train"]``."""
    from rapidfire_nb.data.chatterbot import load_tech_support

    train, evald = load_tech_support(n_train=16, n_eval=8, seed=42)
    rename = {"question": "instruction", "answer": "response"}
    return train.rename_columns(rename), evald.rename_columns(rename)


HUB_NAME = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"


def tiny_create_model_for(received: list[dict]) -> Any:
    """The changed ``create_model``: ignores the hub name, builds the tiny model, applies ``model_kwargs``."""

    def create_model(model_config):
        from rapidfire_nb.testing import tiny_create_model

        received.append(model_config)
        kwargs = dict(model_config["model_kwargs"])
        use_cache = kwargs.pop("use_cache", None)  # a config attribute, as from_pretrained treats it
        model, tokenizer = tiny_create_model({"model_name": "tiny", "model_kwargs": kwargs})
        if use_cache is not None:
            model.config.use_cache = use_cache
        return (model, tokenizer)

    return create_model


def page_create_model_for(received: list[dict]) -> Any:
    """The page's ``create_model``, verbatim (plus recording what it receives)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def create_model(model_config):
        received.append(model_config)
        model = AutoModelForCausalLM.from_pretrained(
            model_config["model_name"], **model_config["model_kwargs"]
        )
        tokenizer = AutoTokenizer.from_pretrained(model_config["model_name"])
        return (model, tokenizer)

    return create_model


@pytest.mark.parametrize("variant", ["tiny_create_model", "page_create_model_with_local_folder"])
def test_sft_quickstart_of_the_trl_page(
    variant: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    received: list[dict] = []
    if variant == "tiny_create_model":
        model_name, create_model = HUB_NAME, tiny_create_model_for(received)
    else:
        from rapidfire_nb.testing import tiny_create_model

        model_name, create_model = str(tmp_path / "tiny-model"), page_create_model_for(received)
        for part in tiny_create_model():
            part.save_pretrained(model_name)

    # ---------------------------------------------------------------- the page's code, as written there
    # fmt: off
    from rapidfire_nb import Experiment  # noqa: I001 (changed: rapidfireai -> rapidfire_nb; page's order kept)
    from rapidfire_nb.automl import List, RFGridSearch, RFModelConfig, RFLoraConfig, RFSFTConfig

    # Load dataset (changed: no hub here)
    train_dataset, eval_dataset = _dataset()

    # Define data formatting function
    def formatting_function(row):
        return {
            "prompt": [
                {"role": "system", "content": "You are a helpful customer support assistant."},
                {"role": "user", "content": row["instruction"]},
            ],
            "completion": [
                {"role": "assistant", "content": row["response"]}
            ]
        }

    # Initialize experiment
    experiment = Experiment(experiment_name="sft-customer-support")

    # Define multiple LoRA configurations to compare
    peft_configs = List([
        RFLoraConfig(r=8, lora_alpha=16, lora_dropout=0.1,
                     target_modules=["q_proj", "v_proj"], bias="none"),
        RFLoraConfig(r=32, lora_alpha=64, lora_dropout=0.1,
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], bias="none")
    ])

    # Define multiple training configurations
    # 2 base configs × 2 PEFT configs = 4 total training runs
    config_set = List([
        RFModelConfig(
            model_name=model_name,  # changed in the second variant only
            peft_config=peft_configs,
            training_args=RFSFTConfig(  # Wraps TRL's SFTConfig
                learning_rate=1e-3,
                per_device_train_batch_size=4,
                max_steps=4,  # changed: 128
                fp16=True,
            ),
            model_type="causal_lm",
            model_kwargs={"device_map": "auto", "dtype": "auto", "use_cache": False},
            formatting_func=formatting_function,
        ),
        RFModelConfig(
            model_name=model_name,  # changed in the second variant only
            peft_config=peft_configs,
            training_args=RFSFTConfig(
                learning_rate=1e-4,  # Different learning rate
                per_device_train_batch_size=4,
                max_steps=4,  # changed: 128
                fp16=True,
            ),
            model_type="causal_lm",
            model_kwargs={"device_map": "auto", "dtype": "auto", "use_cache": False},
            formatting_func=formatting_function,
        )
    ])

    # Define model creation function (changed: see the two variants above)

    # Create grid search over all configurations
    config_group = RFGridSearch(configs=config_set, trainer_type="SFT")

    # Run all 4 configurations concurrently with chunk-based scheduling
    experiment.run_fit(config_group, create_model, train_dataset, eval_dataset,
                       num_chunks=4, seed=42)

    # End experiment
    experiment.end()
    # fmt: on
    # ---------------------------------------------------------------- end of the page's code

    out = capsys.readouterr().out
    assert "fp16=True requested but no CUDA GPU: training in fp32 (fp16 switched off)" in out
    info = experiment.get_runs_info()
    assert list(info.run_id) == [1, 2, 3, 4]
    assert list(info.status) == ["COMPLETED"] * 4
    assert list(info.completed_steps) == [4] * 4 and list(info.total_steps) == [4] * 4
    assert list(info.chunks_done) == [4] * 4  # 16 rows / batch 4 = 4 steps, one per chunk
    assert list(zip(info.learning_rate, info["lora.r"])) == [(1e-3, 8), (1e-3, 32), (1e-4, 8), (1e-4, 32)]
    assert info.eval_loss.notna().all()
    # the model kwargs reach create_model as written; one shared base for the 4 LoRA runs
    assert received and received[0]["model_name"] == model_name
    assert received[0]["model_kwargs"] == {"device_map": "auto", "dtype": "auto", "use_cache": False}
    assert len(received) == 1
    assert experiment.path.parent == experiment.root and experiment.path.name == "sft-customer-support"
