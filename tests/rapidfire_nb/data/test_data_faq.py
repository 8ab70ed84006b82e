"""The main job's data: the English construction FAQ (``zaragoza-construction-faq``), split by question."""

from __future__ import annotations

import pytest

from rapidfire_nb.data import (
    FAQ_ATTRIBUTION,
    FAQ_SYSTEM_PROMPT,
    faq_to_chat,
    load_construction_faq,
    load_construction_faq_pairs,
    load_faq_preferences,
    rouge_l,
)


def test_the_faq_has_hundreds_of_distinct_pairs() -> None:
    pairs = load_construction_faq_pairs()
    assert len(pairs) == 503 and len(set(pairs)) == 503  # zaragoza-construction-faq 1.2.1
    assert len({q for q, _ in pairs}) == 497  # 6 questions have two answers each
    assert pairs[0] == (
        "What is a bygglov (building permit)?",
        pairs[0][1],
    ) and pairs[0][1].startswith("A bygglov is an official decision")
    assert "CC BY 4.0" in FAQ_ATTRIBUTION and "Zaragoza AB" in FAQ_ATTRIBUTION


def test_train_and_eval_are_disjoint_by_question() -> None:
    train, eval_ = load_construction_faq(n_eval=100, seed=42)
    assert train.column_names == eval_.column_names == ["question", "answer"]
    train_q, eval_q = set(train["question"]), set(eval_["question"])
    assert not train_q & eval_q
    assert len(eval_q) == 100 and len(eval_) == 100 and len(train) == 403 and len(train_q) == 397
    assert len(train) + len(eval_) == 503
    small, same_eval = load_construction_faq(n_train=160, n_eval=100, seed=42)
    assert len(small) == len(set(small["question"])) == 160 and same_eval.to_list() == eval_.to_list()
    assert small.to_list() == load_construction_faq(n_train=160, n_eval=100, seed=42)[0].to_list()
    assert load_construction_faq(n_eval=100, seed=0)[1].to_list() != eval_.to_list()
    # a question with two answers keeps both on its side
    pairs = load_construction_faq_pairs()
    twice = {q for q in {p[0] for p in pairs} if sum(p[0] == q for p in pairs) == 2}
    for q in twice:
        assert train["question"].count(q) + eval_["question"].count(q) == 2
        assert q not in train_q or q not in eval_q


def test_bad_sizes_say_what_is_available() -> None:
    with pytest.raises(ValueError, match=r"n_train must be in 1\.\.403"):
        load_construction_faq(n_train=404, n_eval=100)
    with pytest.raises(ValueError, match=r"n_eval must be in 0\.\.496"):
        load_construction_faq(n_eval=497)


def test_faq_rows_as_chat() -> None:
    row = {"question": "Do I need a permit for a carport?", "answer": "Usually yes."}
    assert faq_to_chat(row) == {
        "prompt": [
            {"role": "system", "content": FAQ_SYSTEM_PROMPT},
            {"role": "user", "content": "Do I need a permit for a carport?"},
        ],
        "completion": [{"role": "assistant", "content": "Usually yes."}],
    }


def test_faq_preferences_shuffle_by_part() -> None:
    train, eval_ = load_faq_preferences(n_train=64, n_eval=16, seed=3, rejected="shuffle")
    assert len(train) == 64 and len({r["prompt"][-1]["content"] for r in eval_}) == 16
    assert len(eval_) == 17, "seed 3 holds out one of the 6 questions with two answers: both rows"
    for part in (train, eval_):
        for row in part:
            assert row["chosen"][0]["content"] != row["rejected"][0]["content"]
    eval_answers = {r["chosen"][0]["content"] for r in eval_}
    assert all(r["rejected"][0]["content"] in eval_answers for r in eval_), (
        "held-out rows reject held-out answers"
    )
    assert eval_[0]["prompt"][0]["content"] == FAQ_SYSTEM_PROMPT


def test_rouge_l() -> None:
    same = "A building permit is required for new construction."
    assert rouge_l(([same], [same])) == {"rougeL": 1.0}
    assert rouge_l((["nothing alike"], [same])) == {"rougeL": 0.0}
    half = rouge_l((["A permit is required.", same], [same, same]))["rougeL"]
    assert 0.5 < half < 1.0
    assert rouge_l((["Buildings require permits"], ["building permit required"]))["rougeL"] > 0  # stemmed
    with pytest.raises(ValueError, match="2 predictions but 1 references"):
        rouge_l(([same, same], [same]))
