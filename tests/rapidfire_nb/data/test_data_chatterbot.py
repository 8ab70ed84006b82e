"""Tests of rapidfire_nb.data.chatterbot (ChatterBot tech-support corpus, offline)."""

from __future__ import annotations

import pytest

from rapidfire_nb.data import chatterbot
from rapidfire_nb.data.chatterbot import (
    SYSTEM_PROMPT,
    load_tech_support,
    load_tech_support_pairs,
    to_chat,
)


def test_pairs_from_the_corpus() -> None:
    pairs = load_tech_support_pairs()
    assert len(pairs) == 1050  # chatterbot-corpus 1.3.3
    assert len(set(pairs)) == 10  # ... of which only 10 are distinct
    assert pairs[0] == ("My system is overheating.", "Ensure air vents aren't blocked and clean any dust.")
    assert (
        "My internet is not working.",
        "Restart your router and check if the cables are connected properly.",
    ) in pairs
    # One answer per question.
    assert len({q for q, _ in pairs}) == len({a for _, a in pairs}) == 10


def test_longer_conversations_give_consecutive_pairs(tmp_path, monkeypatch) -> None:
    corpus = tmp_path / "tech_support.yml"
    corpus.write_text("conversations:\n- - a\n  - b\n  - c\n- - ' d '\n  - e\n", encoding="utf-8")
    monkeypatch.setattr(chatterbot, "_corpus_file", lambda: corpus)
    chatterbot._pairs.cache_clear()
    try:
        assert load_tech_support_pairs() == [("a", "b"), ("b", "c"), ("d", "e")]
    finally:
        chatterbot._pairs.cache_clear()


def test_load_tech_support_split_by_question() -> None:
    train, eval_ = load_tech_support(n_train=128, n_eval=24, seed=42)
    assert train.column_names == ["question", "answer"] and eval_.column_names == ["question", "answer"]
    assert (len(train), len(eval_)) == (128, 24)
    train_q, eval_q = set(train["question"]), set(eval_["question"])
    assert not train_q & eval_q  # disjoint by content, not only by row
    assert (len(train_q), len(eval_q)) == (8, 2)
    pairs = set(load_tech_support_pairs())
    assert all((row["question"], row["answer"]) in pairs for row in train)

    again_train, again_eval = load_tech_support(n_train=128, n_eval=24, seed=42)
    assert again_train.to_list() == train.to_list() and again_eval.to_list() == eval_.to_list()
    other_train, _ = load_tech_support(n_train=128, n_eval=24, seed=0)
    assert other_train.to_list() != train.to_list()


def test_load_tech_support_split_by_row() -> None:
    train, eval_ = load_tech_support(n_train=1000, n_eval=50, split="row")
    assert (len(train), len(eval_)) == (1000, 50)
    with pytest.raises(ValueError, match="1050 rows"):
        load_tech_support(n_train=1000, n_eval=51, split="row")


def test_load_tech_support_errors() -> None:
    with pytest.raises(ValueError, match="fewer rows"):
        load_tech_support(n_train=1000, n_eval=24)
    with pytest.raises(ValueError, match="split"):
        load_tech_support(split="random")
    with pytest.raises(ValueError, match="n_train"):
        load_tech_support(n_train=0)


def test_load_tech_support_without_eval() -> None:
    train, eval_ = load_tech_support(n_train=16, n_eval=0)
    assert (len(train), len(eval_)) == (16, 0)


def test_to_chat_shape() -> None:
    row = {"question": "My mouse is not responding.", "answer": "Try another USB port."}
    assert to_chat(row) == {
        "prompt": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "My mouse is not responding."},
        ],
        "completion": [{"role": "assistant", "content": "Try another USB port."}],
    }
    assert SYSTEM_PROMPT == "You are a helpful customer support assistant."
    train, _ = load_tech_support(n_train=4, n_eval=1)
    mapped = train.map(to_chat, remove_columns=["question", "answer"])
    assert mapped.column_names == ["prompt", "completion"]
    assert mapped[0]["completion"][0]["content"] == train[0]["answer"]
