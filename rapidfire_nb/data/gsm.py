"""GSM8K-style math word problems with a verifier, for GRPO (offline).

Source: the PyPI package ``reasoning-gym`` 0.1.25 (Apache-2.0; https://github.com/open-thought/reasoning-gym),
dataset ``gsm_symbolic``: problems generated locally from symbolic GSM8K templates, each with a numeric
answer. ``reasoning_gym.create_dataset("gsm_symbolic", size=n, seed=s)`` builds 1,000 rows in ~0.03 s
(the first ``import reasoning_gym`` takes ~1 s).

Rewards follow TRL's reward-function protocol: ``f(prompts, completions, **columns) -> list[float]``, where
every extra dataset column (here ``answer``) arrives as a keyword argument holding one value per
completion. Completions are conversational (``[{"role": "assistant", "content": ...}]``) or plain strings.

reasoning_gym and datasets are imported inside the functions.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

__all__ = [
    "REASONING_SYSTEM_PROMPT",
    "correctness_reward",
    "extract_answer",
    "format_reward",
    "load_gsm_symbolic",
]

REASONING_SYSTEM_PROMPT = (
    "Respond in the following format:\n"
    "<reasoning>\n...\n</reasoning>\n"
    "<answer>\n...\n</answer>\n"
    "Think step by step inside <reasoning>, then put only the final number inside <answer>."
)
"""System message asking for ``<reasoning>...</reasoning><answer>...</answer>``."""

_INSTALL_HINT = "pip install reasoning-gym==0.1.25"
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_FORMAT_RE = re.compile(r"\s*<reasoning>.*?</reasoning>\s*<answer>.*?</answer>\s*", re.DOTALL)
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}\b)")


def _import_reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as err:
        raise ImportError(
            f"The gsm_symbolic data comes from 'reasoning-gym'. Install it with: {_INSTALL_HINT}"
        ) from err
    return reasoning_gym


def load_gsm_symbolic(n_train: int = 64, n_eval: int = 16, seed: int = 42) -> tuple[Dataset, Dataset]:
    """Load gsm_symbolic math problems as GRPO train and eval sets.

    One ``reasoning_gym`` dataset of ``n_train + n_eval`` rows is generated with ``seed``; the first
    ``n_train`` rows are train, the rest eval (disjoint rows; the generator draws each row's template and
    numbers from its own seed). Same arguments, same rows, in any process.

    Source: ``reasoning-gym`` 0.1.25, ``gsm_symbolic``, Apache-2.0.

    Args:
        n_train: number of train rows (>= 1).
        n_eval: number of eval rows (>= 0).
        seed: the dataset's seed.

    Returns:
        ``(train, eval)`` ``datasets.Dataset`` objects with columns ``prompt`` (conversational
        ``[{"role": "system", "content": REASONING_SYSTEM_PROMPT}, {"role": "user", "content": question}]``)
        and ``answer`` (the numeric answer as a string, e.g. ``"70"``), which TRL passes to
        :func:`correctness_reward` as ``answer=[...]``.

    Raises:
        ValueError: ``n_train < 1`` or ``n_eval < 0``.
        ImportError: ``reasoning-gym`` is not installed (``pip install reasoning-gym==0.1.25``).
    """
    from datasets import Dataset

    if n_train < 1 or n_eval < 0:
        raise ValueError(f"need n_train >= 1 and n_eval >= 0, got n_train={n_train}, n_eval={n_eval}.")
    rg = _import_reasoning_gym()
    ds = rg.create_dataset("gsm_symbolic", size=n_train + n_eval, seed=seed)
    rows = [ds[i] for i in range(n_train + n_eval)]

    def to_dataset(part: list[dict[str, Any]]) -> Dataset:
        return Dataset.from_dict(
            {
                "prompt": [
                    [
                        {"role": "system", "content": REASONING_SYSTEM_PROMPT},
                        {"role": "user", "content": row["question"]},
                    ]
                    for row in part
                ],
                "answer": [str(row["answer"]) for row in part],
            }
        )

    return to_dataset(rows[:n_train]), to_dataset(rows[n_train:])


def _text(completion: Any) -> str:
    """The text of one TRL completion: a string, or the contents of a conversational message list."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    return "".join(str(message.get("content", "")) for message in completion)


def extract_answer(text: str) -> str | None:
    """Extract the final answer from a reply.

    Args:
        text: the model's reply.

    Returns:
        The stripped content of the last ``<answer>...</answer>`` block; else the last number in the text
        (thousands separators removed, e.g. ``"1,234"`` -> ``"1234"``); else ``None``.
    """
    blocks = _ANSWER_RE.findall(text)
    if blocks:
        return str(blocks[-1]).strip()
    numbers = _NUMBER_RE.findall(text)
    if numbers:
        return str(numbers[-1]).replace(",", "")
    return None


@functools.lru_cache(maxsize=1)
def _scorer() -> Any:
    # GSMSymbolicDataset.score_answer(answer, entry) reads only entry["answer"] (0.1.25): it takes the
    # first number in ``answer`` and returns 1.0 if it equals float(entry["answer"]), 0.01 for another
    # number, 0.0 for none. Any instance scores the same way.
    return _import_reasoning_gym().create_dataset("gsm_symbolic", size=1, seed=0)


def correctness_reward(prompts: Any, completions: list[Any], answer: list[Any], **kwargs: Any) -> list[float]:
    """GRPO reward: 2.0 when the extracted answer is correct, else 0.0.

    The answer is taken with :func:`extract_answer`; thousands separators are removed; correctness is
    decided by reasoning_gym's own scorer, ``GSMSymbolicDataset.score_answer(extracted, {"answer": a})``
    returning 1.0 (numeric equality of the first number in the extracted text).

    Args:
        prompts: ignored (TRL passes them).
        completions: one reply per row: a string or a conversational ``[{"role", "content"}]`` list.
        answer: the dataset's ``answer`` column, one value per completion.
        **kwargs: other columns and TRL extras, ignored.

    Returns:
        One float per completion, 2.0 or 0.0.

    Raises:
        ValueError: ``completions`` and ``answer`` differ in length.
        ImportError: ``reasoning-gym`` is not installed.
    """
    if len(completions) != len(answer):
        raise ValueError(f"got {len(completions)} completions but {len(answer)} answers.")
    scorer = _scorer()
    rewards = []
    for completion, gold in zip(completions, answer):
        extracted = extract_answer(_text(completion))
        if extracted is not None:
            extracted = _THOUSANDS_RE.sub("", extracted)
        score = scorer.score_answer(extracted, {"answer": str(gold)})
        rewards.append(2.0 if score == 1.0 else 0.0)
    return rewards


def format_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """GRPO reward: 0.5 when the reply is ``<reasoning>...</reasoning>`` then ``<answer>...</answer>``.

    Whitespace around and between the two blocks is allowed; nothing else may precede or follow them.

    Args:
        completions: replies, strings or conversational ``[{"role", "content"}]`` lists.
        **kwargs: TRL extras (``prompts``, dataset columns, ...), ignored.

    Returns:
        One float per completion, 0.5 or 0.0.
    """
    return [0.5 if _FORMAT_RE.fullmatch(_text(c)) else 0.0 for c in completions]
