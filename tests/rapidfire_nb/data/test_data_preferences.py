"""Tests of rapidfire_nb.data.preferences (DPO pairs from the tech-support corpus)."""

from __future__ import annotations

import json

import pytest

from rapidfire_nb.data import preferences
from rapidfire_nb.data.chatterbot import SYSTEM_PROMPT, load_tech_support, load_tech_support_pairs
from rapidfire_nb.data.preferences import load_tech_support_preferences

ANSWERS = {a for _, a in load_tech_support_pairs()}


def test_shuffle_mode() -> None:
    train, eval_ = load_tech_support_preferences(n_train=64, n_eval=16, seed=42, rejected="shuffle")
    assert train.column_names == ["prompt", "chosen", "rejected"] == eval_.column_names
    assert (len(train), len(eval_)) == (64, 16)
    sft_train, sft_eval = load_tech_support(n_train=64, n_eval=16, seed=42)
    for dpo, sft in ((train, sft_train), (eval_, sft_eval)):
        for row, gold in zip(dpo, sft):
            assert row["prompt"] == [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": gold["question"]},
            ]
            assert row["chosen"] == [{"role": "assistant", "content": gold["answer"]}]
            assert row["rejected"][0]["role"] == "assistant"
            assert row["rejected"][0]["content"] in ANSWERS
            assert row["rejected"] != row["chosen"]
    again_train, again_eval = load_tech_support_preferences(
        n_train=64, n_eval=16, seed=42, rejected="shuffle"
    )
    assert again_train.to_list() == train.to_list() and again_eval.to_list() == eval_.to_list()
    # The rejections really vary across rows.
    assert len({row["rejected"][0]["content"] for row in train}) > 3


def test_generate_mode_with_tiny_model_is_cached(tmp_path, tiny_model_fn) -> None:
    model, tok = tiny_model_fn(None)
    train, eval_ = load_tech_support_preferences(
        n_train=8,
        n_eval=4,
        rejected="generate",
        model=model,
        tokenizer=tok,
        cache_dir=tmp_path,
        max_new_tokens=6,
    )
    files = list((tmp_path / "preferences").glob("*.json"))
    assert len(files) == 1
    cached = json.loads(files[0].read_text())
    assert cached["max_new_tokens"] == 6 and cached["system_prompt"] == SYSTEM_PROMPT
    questions = {row["prompt"][1]["content"] for row in list(train) + list(eval_)}
    assert set(cached["replies"]) == questions
    for row in list(train) + list(eval_):
        reply = cached["replies"][row["prompt"][1]["content"]]
        if reply and reply != row["chosen"][0]["content"]:
            assert row["rejected"][0]["content"] == reply
        assert row["rejected"] != row["chosen"]

    def no_generation(*args, **kwargs):
        raise AssertionError("the cache should have been used")

    model.generate = no_generation
    again_train, again_eval = load_tech_support_preferences(
        n_train=8,
        n_eval=4,
        rejected="generate",
        model=model,
        tokenizer=tok,
        cache_dir=tmp_path,
        max_new_tokens=6,
    )
    assert again_train.to_list() == train.to_list() and again_eval.to_list() == eval_.to_list()
    # Replies depend only on (model, question, max_new_tokens): another split extends the same file.
    del model.generate
    other, _ = load_tech_support_preferences(
        n_train=64, n_eval=2, seed=7, model=model, tokenizer=tok, cache_dir=tmp_path, max_new_tokens=6
    )
    assert list((tmp_path / "preferences").glob("*.json")) == files
    extended = json.loads(files[0].read_text())["replies"]
    assert {q: extended[q] for q in cached["replies"]} == cached["replies"]
    assert {row["prompt"][1]["content"] for row in other} <= set(extended)


def test_generate_mode_falls_back_when_reply_is_gold_or_empty(tmp_path, monkeypatch, tiny_model_fn) -> None:
    gold = dict(load_tech_support_pairs())
    fake = {q: "Some other reply." for q in gold}
    fake["My internet is not working."] = gold["My internet is not working."]
    fake["My screen is flickering."] = ""
    monkeypatch.setattr(
        preferences,
        "generate_replies",
        lambda model, tok, questions, max_new_tokens, **kwargs: {q: fake[q] for q in questions},
    )
    model, tok = tiny_model_fn(None)
    kwargs = {
        "n_train": 64,
        "n_eval": 16,
        "seed": 42,
        "model": model,
        "tokenizer": tok,
        "cache_dir": tmp_path,
    }
    gen_train, gen_eval = load_tech_support_preferences(rejected="generate", **kwargs)
    shuf_train, shuf_eval = load_tech_support_preferences(rejected="shuffle", **kwargs)
    fell_back = 0
    for gen, shuf in zip(list(gen_train) + list(gen_eval), list(shuf_train) + list(shuf_eval)):
        question = gen["prompt"][1]["content"]
        assert gen["rejected"] != gen["chosen"]
        if fake[question] in ("", gold[question]):
            assert gen["rejected"] == shuf["rejected"]
            fell_back += 1
        else:
            assert gen["rejected"][0]["content"] == "Some other reply."
    assert fell_back > 0


def test_errors() -> None:
    with pytest.raises(ValueError, match="rejected"):
        load_tech_support_preferences(rejected="random")
    with pytest.raises(ValueError, match="tokenizer"):
        load_tech_support_preferences(model=object())


def test_shuffle_with_question_split_keeps_training_answers_out_of_eval() -> None:
    """Held-out rows get rejections drawn from held-out answers only (no training answer leaks into eval)."""
    train, eval_ = load_tech_support_preferences(
        n_train=64, n_eval=32, seed=3, rejected="shuffle", split="question"
    )
    train_answers = {r["chosen"][0]["content"] for r in train}
    eval_answers = {r["chosen"][0]["content"] for r in eval_}
    assert not train_answers & eval_answers and len(eval_answers) >= 2
    assert {r["rejected"][0]["content"] for r in eval_} <= eval_answers
    assert {r["rejected"][0]["content"] for r in train} <= train_answers
    for row in list(train) + list(eval_):
        assert row["rejected"] != row["chosen"]
