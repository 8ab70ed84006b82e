"""Test support shipped with rapidfire_nb (no part of the product imports it).

* :mod:`rapidfire_nb.testing.models` — tiny random models, tokenizer and datasets for fast tests and
  benchmarks (re-exported here: ``from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset``).
* :mod:`rapidfire_nb.testing.fakes` — a scriptable fake :class:`kernel_scheduler.Executor`, a recording
  scheduler listener and a driver, for scheduler tests without torch.
* :mod:`rapidfire_nb.testing.fake_source` — a fake panel source: the real :class:`kernel_scheduler.Scheduler`
  over the fake executor, its snapshot built by :mod:`rapidfire_nb.view`, for panel tests and demos.

``import rapidfire_nb.testing`` imports neither torch nor transformers; they are imported on first use.
"""

from __future__ import annotations

from .models import (
    TINY_CHAT_TEMPLATE,
    TINY_MODEL_NAMES,
    TINY_SPECIAL_TOKENS,
    TINY_VOCAB_SIZE,
    length_reward,
    tiny_create_model,
    tiny_dpo_dataset,
    tiny_grpo_dataset,
    tiny_model,
    tiny_sft_dataset,
    tiny_tokenizer,
)

__all__ = [
    "TINY_CHAT_TEMPLATE",
    "TINY_MODEL_NAMES",
    "TINY_SPECIAL_TOKENS",
    "TINY_VOCAB_SIZE",
    "length_reward",
    "tiny_create_model",
    "tiny_dpo_dataset",
    "tiny_grpo_dataset",
    "tiny_model",
    "tiny_sft_dataset",
    "tiny_tokenizer",
]
