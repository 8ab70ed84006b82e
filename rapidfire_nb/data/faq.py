"""Customer questions and a company's answers for SFT: the English FAQ of ``zaragoza-construction-faq`` (offline).

Source and licence: the PyPI package ``zaragoza-construction-faq`` 1.2.1, "Swedish Construction FAQ" by Zaragoza
AB (Helsingborg, Sweden; https://github.com/zaragoza-ab/swedish-construction-faq-1000, DOI 10.5281/zenodo.19630803),
licensed **CC BY 4.0** (https://creativecommons.org/licenses/by/4.0/): use it with this attribution. File
``zaragoza_construction_faq/data/faq-en-alpaca.jsonl``: ``instruction`` (a customer's question), ``input``
(empty), ``output`` (the company's answer; median 223 characters, ~56 SmolLM2 tokens), about building permits,
renovation, contracts, tax deductions and the like, grounded in Swedish law.

What is in it (measured on 1.2.1): 503 rows, all 503 question/answer pairs distinct, 497 distinct questions (6
questions have two answers each). :func:`load_construction_faq` splits by question, so no eval question is ever
trained on.

``import`` of this module is cheap: datasets is imported inside the functions.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

__all__ = [
    "FAQ_ATTRIBUTION",
    "FAQ_FILE",
    "FAQ_SYSTEM_PROMPT",
    "faq_prompt",
    "faq_to_chat",
    "load_construction_faq",
    "load_construction_faq_pairs",
    "split_construction_faq",
]

FAQ_FILE = "data/faq-en-alpaca.jsonl"
"""Path of the English FAQ inside the ``zaragoza_construction_faq`` package folder."""

FAQ_SYSTEM_PROMPT = (
    "You are the customer support assistant of a Swedish construction company. Answer the customer's question "
    "briefly and accurately."
)
"""System message of every conversational row built from the FAQ."""

FAQ_ATTRIBUTION = (
    "Swedish Construction FAQ by Zaragoza AB (zaragoza-construction-faq 1.2.1, English FAQ), CC BY 4.0, "
    "https://creativecommons.org/licenses/by/4.0/ — DOI 10.5281/zenodo.19630803"
)
"""The attribution the dataset's licence asks for (print it where the data is used)."""

_INSTALL_HINT = "pip install zaragoza-construction-faq==1.2.1"


def _faq_file() -> Path:
    spec = importlib.util.find_spec("zaragoza_construction_faq")
    if spec is None or spec.origin is None:
        raise ImportError(
            f"The FAQ data comes from 'zaragoza-construction-faq'. Install it with: {_INSTALL_HINT}"
        )
    path = Path(spec.origin).parent / FAQ_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing from the 'zaragoza-construction-faq' installation ({_INSTALL_HINT})."
        )
    return path


@functools.lru_cache(maxsize=1)
def _pairs() -> tuple[tuple[str, str], ...]:
    pairs = []
    for line in _faq_file().read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            question = " ".join(str(row["instruction"]).split())
            extra = str(row.get("input") or "").strip()
            pairs.append((f"{question}\n{extra}" if extra else question, str(row["output"]).strip()))
    return tuple(pairs)


def load_construction_faq_pairs() -> list[tuple[str, str]]:
    """Every (question, answer) pair of the English FAQ, in file order (whitespace in questions collapsed).

    Returns:
        503 pairs for zaragoza-construction-faq 1.2.1 (497 distinct questions).

    Raises:
        ImportError: ``zaragoza-construction-faq`` is not installed.
        FileNotFoundError: the installed package lacks ``data/faq-en-alpaca.jsonl``.
    """
    return list(_pairs())


def split_construction_faq(
    n_train: int | None = None, n_eval: int = 100, seed: int = 42
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Split the FAQ by question (the logic behind :func:`load_construction_faq`).

    The distinct questions are shuffled with ``random.Random(seed)``; the first ``n_eval`` of them are held out,
    every row of a question goes to its side (so a question with two answers is never on both). Train rows come
    in a ``seed``-shuffled order and are cut to ``n_train``; eval rows keep the shuffled question order.

    Args:
        n_train: train rows (``None``: all rows of the other questions, 403 with the defaults).
        n_eval: held-out questions (>= 0, fewer than the 497 distinct questions); eval rows are their rows.
        seed: the shuffle's seed.

    Returns:
        ``(train_pairs, eval_pairs)``.

    Raises:
        ValueError: bad sizes (the message says what is available).
    """
    pairs = load_construction_faq_pairs()
    questions = list(dict.fromkeys(q for q, _ in pairs))
    if n_eval < 0 or n_eval >= len(questions):
        raise ValueError(f"n_eval must be in 0..{len(questions) - 1} (held-out questions), got {n_eval}.")
    rng = random.Random(seed)
    rng.shuffle(questions)
    held_out = set(questions[:n_eval])
    by_question: dict[str, list[tuple[str, str]]] = {}
    for pair in pairs:
        by_question.setdefault(pair[0], []).append(pair)
    eval_pairs = [pair for q in questions[:n_eval] for pair in by_question[q]]
    train_pairs = [pair for pair in pairs if pair[0] not in held_out]
    rng.shuffle(train_pairs)
    if n_train is not None:
        if n_train < 1 or n_train > len(train_pairs):
            raise ValueError(
                f"n_train must be in 1..{len(train_pairs)} (the rows of the {len(questions) - n_eval} questions not "
                f"held out), got {n_train}."
            )
        train_pairs = train_pairs[:n_train]
    return train_pairs, eval_pairs


def load_construction_faq(
    n_train: int | None = None, n_eval: int = 100, seed: int = 42
) -> tuple[Dataset, Dataset]:
    """Load the English construction FAQ as train and eval datasets for SFT, split by question.

    ``n_eval`` distinct questions are held out (their rows are the eval set), so ``eval_loss`` and generation
    metrics measure answers to questions never trained on; see :func:`split_construction_faq`. Same arguments,
    same rows, in any process.

    Source: ``zaragoza-construction-faq`` 1.2.1 by Zaragoza AB, CC BY 4.0 (:data:`FAQ_ATTRIBUTION`).

    Args:
        n_train: train rows (``None``: all 403 rows of the other questions with the defaults).
        n_eval: held-out questions (100 by default: 101 eval rows with seed 42).
        seed: seed of the question split and the row order.

    Returns:
        ``(train, eval)`` ``datasets.Dataset`` objects with string columns ``question`` and ``answer``. Map
        them with :func:`faq_to_chat` for TRL's conversational prompt/completion format.

    Raises:
        ValueError: bad sizes.
        ImportError: ``zaragoza-construction-faq`` is not installed.
    """
    from datasets import Dataset

    train_pairs, eval_pairs = split_construction_faq(n_train, n_eval, seed)

    def to_dataset(rows: list[tuple[str, str]]) -> Dataset:
        return Dataset.from_dict({"question": [q for q, _ in rows], "answer": [a for _, a in rows]})

    return to_dataset(train_pairs), to_dataset(eval_pairs)


def faq_prompt(question: str) -> list[dict[str, str]]:
    """The conversational prompt of a question: ``[system (FAQ_SYSTEM_PROMPT), user (question)]``."""
    return [{"role": "system", "content": FAQ_SYSTEM_PROMPT}, {"role": "user", "content": question}]


def faq_to_chat(row: dict[str, Any]) -> dict[str, list[dict[str, str]]]:
    """Turn a ``{"question", "answer"}`` row into TRL's conversational prompt/completion format.

    Use it as ``RFModelConfig(formatting_func=faq_to_chat)``.

    Args:
        row: a mapping with string keys ``question`` and ``answer``.

    Returns:
        ``{"prompt": [system, user], "completion": [{"role": "assistant", "content": answer}]}``.

    Raises:
        KeyError: ``row`` lacks ``question`` or ``answer``.
    """
    return {
        "prompt": faq_prompt(row["question"]),
        "completion": [{"role": "assistant", "content": row["answer"]}],
    }
