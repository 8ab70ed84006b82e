"""Tests of rapidfire_nb.data.gsm (reasoning-gym gsm_symbolic for GRPO)."""

from __future__ import annotations

import pytest

from rapidfire_nb.data.gsm import (
    REASONING_SYSTEM_PROMPT,
    correctness_reward,
    extract_answer,
    format_reward,
    load_gsm_symbolic,
)


def _reply(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def test_load_gsm_symbolic() -> None:
    train, eval_ = load_gsm_symbolic(n_train=16, n_eval=4, seed=42)
    assert train.column_names == ["prompt", "answer"] == eval_.column_names
    assert (len(train), len(eval_)) == (16, 4)
    row = train[0]
    assert row["prompt"][0] == {"role": "system", "content": REASONING_SYSTEM_PROMPT}
    assert row["prompt"][1]["role"] == "user"
    assert row["prompt"][1]["content"].startswith("There are 12 students playing basketball")
    assert row["answer"] == "70"
    assert all(
        isinstance(a, str) and float(a) == float(a) for a in list(train["answer"]) + list(eval_["answer"])
    )
    train_q = {r["prompt"][1]["content"] for r in train}
    assert not train_q & {r["prompt"][1]["content"] for r in eval_}
    again, _ = load_gsm_symbolic(n_train=16, n_eval=4, seed=42)
    assert again.to_list() == train.to_list()
    with pytest.raises(ValueError):
        load_gsm_symbolic(n_train=0)


def test_extract_answer() -> None:
    assert extract_answer("<reasoning>12*2=24</reasoning>\n<answer>\n 70 \n</answer>") == "70"
    assert extract_answer("<answer>1</answer> then <answer>2</answer>") == "2"
    assert extract_answer("so it is 12, then 1,234 in total.") == "1234"
    assert extract_answer("-3.5 degrees") == "-3.5"
    assert extract_answer("no number here") is None


def test_correctness_reward() -> None:
    train, _ = load_gsm_symbolic(n_train=2, n_eval=0, seed=42)
    gold = train["answer"]  # ["70", ...]
    completions = [
        _reply(f"<reasoning>Add them up.</reasoning>\n<answer>{gold[0]}</answer>"),
        _reply("<reasoning>Guess.</reasoning>\n<answer>3</answer>"),
    ]
    assert correctness_reward(train["prompt"], completions, answer=gold) == [2.0, 0.0]
    assert correctness_reward(None, [f"The total is {gold[0]}.", "I don't know."], answer=gold) == [2.0, 0.0]
    assert correctness_reward(None, ["<answer>1,234</answer>"], answer=["1234"]) == [2.0]
    assert correctness_reward(None, ["<answer>70.0</answer>"], answer=["70"]) == [2.0]
    with pytest.raises(ValueError):
        correctness_reward(None, ["1"], answer=["1", "2"])


def test_format_reward() -> None:
    good = "<reasoning>\nstep\n</reasoning>\n<answer>\n7\n</answer>\n"
    assert format_reward([_reply(good), good, "<answer>7</answer>", "7", "x" + good]) == [
        0.5,
        0.5,
        0.0,
        0.0,
        0.0,
    ]
