"""Customer-support question/answer pairs for SFT, from the ChatterBot corpus (offline).

Source: the PyPI package ``chatterbot-corpus`` 1.3.3 (BSD licence, by Gunther Cox;
https://github.com/gunthercox/chatterbot-corpus), file ``chatterbot_corpus/data/english/tech_support.yml``.
Its YAML holds ``categories: [tech support]`` and ``conversations: [[question, answer], ...]``.

What is in it (measured on 1.3.3): 1,050 conversations, each exactly 2 turns, but only **10 distinct**
question/answer pairs, each repeated 88-121 times (e.g. "My internet is not working." -> "Restart your
router and check if the cables are connected properly."). Each question always has the same answer.
A split by rows would therefore put the very same pairs in train and eval; :func:`load_tech_support`
splits by distinct question instead (see there).

``import`` of this module is cheap: yaml and datasets are imported inside the functions.
"""

from __future__ import annotations

import functools
import importlib.util
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

__all__ = [
    "SYSTEM_PROMPT",
    "TECH_SUPPORT_FILE",
    "chat_prompt",
    "load_tech_support",
    "load_tech_support_pairs",
    "split_tech_support_pairs",
    "to_chat",
]

SYSTEM_PROMPT = "You are a helpful customer support assistant."
"""System message of every conversational row built from this corpus."""

TECH_SUPPORT_FILE = "data/english/tech_support.yml"
"""Path of the corpus file inside the ``chatterbot_corpus`` package folder."""

_INSTALL_HINT = "pip install chatterbot-corpus==1.3.3 pyyaml"


def _corpus_file() -> Path:
    spec = importlib.util.find_spec("chatterbot_corpus")
    if spec is None or spec.origin is None:
        raise ImportError(
            f"The tech-support data comes from 'chatterbot-corpus'. Install it with: {_INSTALL_HINT}"
        )
    path = Path(spec.origin).parent / TECH_SUPPORT_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing from the 'chatterbot-corpus' installation ({_INSTALL_HINT})."
        )
    return path


@functools.lru_cache(maxsize=1)
def _pairs() -> tuple[tuple[str, str], ...]:
    try:
        import yaml
    except ImportError as err:  # pragma: no cover - pyyaml is a dependency of the assets extra
        raise ImportError(
            f"Reading the ChatterBot corpus needs PyYAML. Install it with: {_INSTALL_HINT}"
        ) from err
    with open(_corpus_file(), encoding="utf-8") as handle:
        doc = yaml.safe_load(handle)
    pairs: list[tuple[str, str]] = []
    for conversation in doc.get("conversations") or []:
        turns = [str(turn).strip() for turn in conversation]
        # A conversation [t0, t1, t2, ...] is a chain: each statement answers the previous one, so every
        # consecutive pair (t0, t1), (t1, t2), ... is a question/answer pair. (tech_support.yml 1.3.3 has
        # only 2-turn conversations; other corpus files have longer ones.)
        pairs.extend((turns[i], turns[i + 1]) for i in range(len(turns) - 1))
    return tuple(pairs)


def load_tech_support_pairs() -> list[tuple[str, str]]:
    """Return every (question, answer) pair of ``tech_support.yml``, in file order, duplicates kept.

    A conversation longer than two turns would give one pair per consecutive turn pair
    (``[a, b, c]`` -> ``(a, b), (b, c)``); version 1.3.3 has only 2-turn conversations. Leading and
    trailing whitespace is stripped. Source: ``chatterbot-corpus`` 1.3.3, BSD licence.

    Returns:
        1,050 pairs for chatterbot-corpus 1.3.3, of which only 10 are distinct.

    Raises:
        ImportError: ``chatterbot-corpus`` (or PyYAML) is not installed
            (``pip install chatterbot-corpus==1.3.3 pyyaml``).
        FileNotFoundError: the installed package lacks ``data/english/tech_support.yml``.
    """
    return list(_pairs())


def split_tech_support_pairs(
    n_train: int = 128, n_eval: int = 24, seed: int = 42, split: str = "question"
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Split the tech-support pairs into train and eval lists (the logic behind :func:`load_tech_support`).

    Args:
        n_train: number of train rows (>= 1).
        n_eval: number of eval rows (>= 0).
        seed: seed of ``random.Random`` for the shuffle and the question split.
        split: ``"question"`` (default) or ``"row"``; see :func:`load_tech_support`.

    Returns:
        ``(train_pairs, eval_pairs)`` of lengths ``n_train`` and ``n_eval``.

    Raises:
        ValueError: bad sizes or ``split``, or more rows asked for than the corpus side holds.
    """
    if n_train < 1 or n_eval < 0:
        raise ValueError(f"need n_train >= 1 and n_eval >= 0, got n_train={n_train}, n_eval={n_eval}.")
    pairs = load_tech_support_pairs()
    rng = random.Random(seed)
    if split == "row":
        order = list(range(len(pairs)))
        rng.shuffle(order)
        if n_train + n_eval > len(order):
            raise ValueError(
                f"tech_support.yml has {len(order)} rows; n_train + n_eval = {n_train + n_eval} is too many."
            )
        return [pairs[i] for i in order[:n_train]], [pairs[i] for i in order[n_train : n_train + n_eval]]
    if split != "question":
        raise ValueError(f"split must be 'question' or 'row', got {split!r}.")

    questions = sorted({q for q, _ in pairs})
    rng.shuffle(questions)
    if n_eval == 0:
        n_eval_questions = 0
    else:
        # Share of distinct questions proportional to the requested rows, at least 1 on each side.
        n_eval_questions = round(len(questions) * n_eval / (n_train + n_eval))
        n_eval_questions = min(max(n_eval_questions, 1), len(questions) - 1)
    eval_questions = set(questions[:n_eval_questions])
    order = list(range(len(pairs)))
    rng.shuffle(order)
    train_rows = [pairs[i] for i in order if pairs[i][0] not in eval_questions]
    eval_rows = [pairs[i] for i in order if pairs[i][0] in eval_questions]
    if n_train > len(train_rows) or n_eval > len(eval_rows):
        raise ValueError(
            f"with split='question' and seed={seed}, the {len(questions) - n_eval_questions} train questions "
            f"have {len(train_rows)} rows and the {n_eval_questions} eval questions {len(eval_rows)} rows; "
            f"asked for n_train={n_train}, n_eval={n_eval}. Ask for fewer rows or use split='row'."
        )
    return train_rows[:n_train], eval_rows[:n_eval]


def load_tech_support(
    n_train: int = 128, n_eval: int = 24, seed: int = 42, split: str = "question"
) -> tuple[Dataset, Dataset]:
    """Load the ChatterBot tech-support pairs as train and eval datasets for SFT.

    The corpus has 1,050 rows but only 10 distinct question/answer pairs (see the module docstring), so
    the default ``split="question"`` makes train and eval disjoint by *content*: the distinct questions are
    shuffled with ``seed`` and a share proportional to ``n_eval / (n_train + n_eval)`` (at least one, at
    most all but one; 2 of 10 for the defaults) is held out for eval. Rows are then drawn in a
    ``seed``-shuffled order, duplicates kept, so train repeats its questions roughly as often as the corpus
    does. Eval loss then measures answers to questions never trained on. ``split="row"`` instead shuffles
    all 1,050 rows and cuts them (disjoint rows, but every eval pair also occurs in train: an eval loss of
    memorisation). Same arguments, same rows, in any process.

    Source: ``chatterbot-corpus`` 1.3.3, ``chatterbot_corpus/data/english/tech_support.yml``, BSD licence.

    Args:
        n_train: number of train rows (>= 1).
        n_eval: number of eval rows (>= 0).
        seed: seed of the deterministic shuffle and question split.
        split: ``"question"`` (default) or ``"row"``.

    Returns:
        ``(train, eval)`` ``datasets.Dataset`` objects with string columns ``question`` and ``answer``.
        Map them with :func:`to_chat` for TRL's conversational prompt/completion format.

    Raises:
        ValueError: bad sizes or ``split``, or more rows than the corpus side holds (with the defaults
            and seed 42, train has ~850 rows available and eval ~200).
        ImportError: ``chatterbot-corpus`` or PyYAML is not installed.
    """
    from datasets import Dataset

    train_pairs, eval_pairs = split_tech_support_pairs(n_train, n_eval, seed, split)

    def to_dataset(rows: list[tuple[str, str]]) -> Dataset:
        return Dataset.from_dict({"question": [q for q, _ in rows], "answer": [a for _, a in rows]})

    return to_dataset(train_pairs), to_dataset(eval_pairs)


def chat_prompt(question: str) -> list[dict[str, str]]:
    """The conversational prompt of a question: ``[system (SYSTEM_PROMPT), user (question)]``."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


def to_chat(row: dict[str, Any]) -> dict[str, list[dict[str, str]]]:
    """Turn a ``{"question", "answer"}`` row into TRL's conversational prompt/completion format.

    Use it as a ``formatting_function`` or with ``dataset.map(to_chat, remove_columns=[...])``.

    Args:
        row: a mapping with string keys ``question`` and ``answer``.

    Returns:
        ``{"prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}],
        "completion": [{"role": "assistant", "content": answer}]}``.

    Raises:
        KeyError: ``row`` lacks ``question`` or ``answer``.
    """
    return {
        "prompt": chat_prompt(row["question"]),
        "completion": [{"role": "assistant", "content": row["answer"]}],
    }
