"""Which config keys are secrets, and what is stored/shown instead (issue 12); pure, no torch."""

from __future__ import annotations

import json

import pytest

from rapidfire_nb.redact import REDACTED, first_secret_key, is_secret_key, omit_secrets, redact
from rapidfire_nb.spec import LeafConfig

SECRET_KEYS = [
    "hub_token",
    "push_to_hub_token",
    "token",
    "HF_TOKEN",
    "hubToken",
    "use_auth_token",
    "access_token",
    "model_kwargs.token",
    "tokenizer_kwargs.token",
    "wandb_api_key",
    "apiKey",
    "password",
    "db_passwd",
    "client_secret",
    "aws_secret_access_key",
    "private_key",
    "Authorization",
]
# "token" as a piece of text, not a credential: these hyperparameters stay visible
TEXT_KEYS = [
    "tokenizer",
    "tokenizer_kwargs.use_fast",
    "max_new_tokens",
    "generation_config.max_new_tokens",
    "suppress_tokens",
    "alora_invocation_tokens",
    "include_num_input_tokens_seen",
    "average_tokens_across_devices",
    "pad_token",
    "eos_token",
    "bos_token_id",
    "pad_token_id",
    "decoder_start_token_id",
    "trainable_token_indices",
    "generation_config.token_healing",
    "learning_rate",
    "lora.r",
    "author",
    "keyword",
]


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_secret_keys(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize("key", TEXT_KEYS)
def test_token_words_that_are_not_secrets(key: str) -> None:
    assert not is_secret_key(key)


def test_redact_walks_dicts_and_lists_and_keeps_harmless_values() -> None:
    value = {
        "hub_token": "hf_x",
        "model_kwargs": {"token": "hf_y", "dtype": "float32", "use_auth_token": True},
        "callbacks": [{"api_key": "k", "name": "w"}],
        "password": None,
        "pad_token": "<pad>",
    }
    assert redact(value) == {
        "hub_token": REDACTED,
        "model_kwargs": {"token": REDACTED, "dtype": "float32", "use_auth_token": True},
        "callbacks": [{"api_key": REDACTED, "name": "w"}],
        "password": None,
        "pad_token": "<pad>",
    }
    assert value["hub_token"] == "hf_x"  # a copy
    assert omit_secrets(value) == {
        "model_kwargs": {"dtype": "float32"},
        "callbacks": [{"name": "w"}],
        "pad_token": "<pad>",
    }
    assert first_secret_key({"a": {"token": 1}}, "generation_config") == "generation_config.a.token"
    assert (
        first_secret_key(1e-3, "learning_rate") is None and first_secret_key("x", "hub_token") == "hub_token"
    )


def _leaf(**training: object) -> LeafConfig:
    return LeafConfig(
        trainer_type="SFT",
        model_name="m",
        model_kwargs={"token": "hf_model"},
        training={"learning_rate": 1e-3, **training},
    )


def test_a_spec_keeps_its_secrets_in_memory_only() -> None:
    leaf = _leaf(hub_token="hf_hub")
    assert (
        leaf.training["hub_token"] == "hf_hub"
        and leaf.model_config_dict()["model_kwargs"]["token"] == "hf_model"
    )
    views = [
        json.dumps(leaf.to_json()),
        json.dumps(leaf.hparams()),
        leaf.fingerprint(),
        repr(leaf),
        str(leaf),
    ]
    assert not [v for v in views if "hf_hub" in v or "hf_model" in v], views
    assert leaf.hparams()["hub_token"] == REDACTED and leaf.to_json()["model_kwargs"] == {"token": REDACTED}
    # the fingerprint leaves secrets out (key and value): a rotated token, or none, is the same config
    assert leaf.fingerprint() == _leaf(hub_token="hf_rotated").fingerprint() == _leaf().fingerprint()
    assert "hub_token" not in leaf.fingerprint()


def test_a_spec_without_secrets_keeps_its_fingerprint() -> None:
    leaf = LeafConfig(
        trainer_type="SFT", model_name="m", training={"learning_rate": 1e-3, "pad_token": "<p>"}
    )
    labels = {"run_name", "tags"}  # labels, never part of a fingerprint (spec/leaf.py)
    plain = {k: v for k, v in leaf.to_json().items() if k not in labels}
    assert leaf.fingerprint() == json.dumps(plain, sort_keys=True, separators=(",", ":"))
    assert leaf.hparams()["pad_token"] == "<p>"
