"""The row check follows the run's config and TRL's formats, and names the column, the row and the shape
(issue 12, items 13 and 17).

Before: ``dataset_text_field="sentence"`` was refused (the columns were hard-coded per trainer kind) although
plain TRL trains it; a ``formatting_func`` returning ``{"prompt": ["text"], ...}`` failed inside TRL with
``AttributeError: 'list' object has no attribute 'endswith'``, and one returning ``{"messages": "hello"}`` was
reported as "num_chunks: the training set is empty".
"""

from __future__ import annotations

from typing import Any

import pytest

from rapidfire_nb import ConfigError, Experiment
from rapidfire_nb.automl import (
    RFDPOConfig,
    RFGridSearch,
    RFGRPOConfig,
    RFModelConfig,
    RFSFTConfig,
)
from rapidfire_nb.testing import length_reward, tiny_create_model
from rapidfire_nb.training.formats import CHAT, TEXT, TEXT_OR_CHAT, RowFormat, row_problem
from rapidfire_nb.training.kinds import get_kind
from tests.helpers import qa_dataset, worker_threads

SFT_ARGS = {"learning_rate": 1e-3, "per_device_train_batch_size": 2, "max_steps": 2, "max_length": 32}


def _sft(formatting_func: Any = None, **extra: Any) -> RFGridSearch:
    return RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            training_args=RFSFTConfig(**{**SFT_ARGS, **extra}),
            formatting_func=formatting_func,
        ),
        "SFT",
    )


def _sentences(n: int) -> Any:
    from datasets import Dataset

    return Dataset.from_dict({"sentence": [f"The {i}th sentence of the corpus." for i in range(n)]})


def _refused_before_training(match: str, group: RFGridSearch, rows: Any) -> str:
    exp = Experiment("bad-rows")
    exp.quiet = True
    before = worker_threads()
    with pytest.raises(ConfigError, match=match) as err:
        exp.run_fit(group, tiny_create_model, rows, num_chunks=1, seed=0)
    assert worker_threads() - before == set() and exp.store.runs() == [], "nothing trained"
    exp.end()
    return str(err.value)


def test_dataset_text_field_names_the_text_column_as_in_plain_trl() -> None:
    exp = Experiment("text-field")
    exp.quiet = True
    exp.run_fit(_sft(dataset_text_field="sentence"), tiny_create_model, _sentences(4), num_chunks=2, seed=0)
    assert list(exp.get_runs_info().status) == ["COMPLETED"]
    exp.end()
    # without the field, the message lists the column the config names
    msg = _refused_before_training(
        r"need the columns prompt/completion or messages or text for SFT", _sft(), _sentences(4)
    )
    assert "['sentence']" in msg


@pytest.mark.parametrize(
    "returned,match",
    [
        (
            {"prompt": ["text"], "completion": ["more"]},
            r"formatting_func '[^']*fn' returned a row SFT cannot train \(row 0 of train_dataset\): prompt = \['text'\] "
            r"\(a list of str\); expected prompt/completion both strings, or both lists of \{'role'",
        ),
        ({"prompt": ["text"]}, r"it has prompt but no completion \(its columns: prompt\)"),
        (
            {"messages": "hello"},
            r"messages = 'hello' \(a str\); expected messages a non-empty list of role/content",
        ),
        ({"messages": []}, r"messages = \[\] \(an empty list\)"),
        ({"messages": [{"text": "hi"}]}, r"\(a list of dict without 'role'/'content' keys\)"),
        (
            {"prompt": "q", "completion": [{"role": "assistant", "content": "a"}]},
            r"prompt a string, completion messages: mixed",
        ),
        ({"text": 5}, r"text = 5 \(a int\); expected text a string"),
    ],
)
def test_a_formatting_func_returning_the_wrong_shape_is_named_before_training(
    returned: Any, match: str
) -> None:
    def fn(row: dict) -> dict:
        return returned

    _refused_before_training(match, _sft(fn), qa_dataset(4))


def test_the_row_index_of_the_first_bad_row_is_named() -> None:
    def fn(row: dict) -> dict:
        text = row["question"] + " " + row["answer"]
        return {"text": text if not row["question"].startswith(bad) else [text]}

    rows = qa_dataset(6)
    bad = rows[3]["question"]
    index = [r["question"] for r in rows].index(bad)
    _refused_before_training(rf"\(row {index} of train_dataset\): text = \[", _sft(fn), rows)


def test_a_dataset_without_formatting_func_is_checked_too() -> None:
    from datasets import Dataset

    rows = Dataset.from_dict({"messages": ["hello", "there"]})
    _refused_before_training(
        r"train_dataset row 0 cannot be trained by SFT: messages = 'hello' \(a str\)", _sft(), rows
    )


def test_a_missing_value_in_any_row_of_a_raw_dataset_is_named() -> None:
    from datasets import Dataset

    rows = Dataset.from_dict({"prompt": ["a"] * 15 + [None], "completion": ["b"] * 16})
    _refused_before_training(  # was TRL's "You need to specify either `text` or `text_target`"
        r"train_dataset row 15 cannot be trained by SFT: column 'prompt' is None \(a missing value\); expected "
        r"prompt/completion both strings.*train_dataset.filter\(lambda row: row\['prompt'\] is not None\)",
        _sft(),
        rows,
    )


def test_dpo_and_grpo_rows_are_checked_against_their_formats() -> None:
    from datasets import Dataset

    mixed = Dataset.from_dict(
        {"prompt": ["q"], "chosen": ["a"], "rejected": [[{"role": "assistant", "content": "b"}]]}
    )
    dpo = RFGridSearch(
        RFModelConfig(
            model_name="tiny", training_args=RFDPOConfig(per_device_train_batch_size=1, max_steps=1)
        ),
        "DPO",
    )
    _refused_before_training(r"DPO: prompt a string, chosen a string, rejected messages: mixed", dpo, mixed)
    prompts = Dataset.from_dict({"prompt": [["What is 1+1?"]] * 4})
    grpo = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            training_args=RFGRPOConfig(per_device_train_batch_size=2, num_generations=2, max_steps=1),
            reward_funcs=[length_reward],
        ),
        "GRPO",
    )
    _refused_before_training(
        r"prompt = \['What is 1\+1\?'\] \(a list of str\); expected prompt a string", grpo, prompts
    )


def test_formats_follow_the_config_and_trl_order() -> None:
    from rapidfire_nb.spec import LeafConfig

    sft = get_kind("SFT")
    leaf = LeafConfig("SFT", "tiny", training={"dataset_text_field": "sentence"})
    assert [f.columns for f in sft.row_formats(leaf)] == [
        ("input_ids",),
        ("conversations",),
        ("prompt", "completion"),
        ("messages",),
        ("sentence",),
    ]
    assert sft.row_formats(leaf)[-1].expected() == "sentence a string (dataset_text_field)"
    assert [f.columns for f in get_kind("DPO").row_formats()] == [
        ("prompt", "chosen", "rejected"),
        ("chosen", "rejected"),
    ]
    chat = [{"role": "user", "content": "hi"}]
    formats = (
        RowFormat(("prompt", "completion"), TEXT_OR_CHAT),
        RowFormat(("messages",), CHAT),
        RowFormat(("text",), TEXT),
    )
    assert (
        row_problem({"prompt": chat, "completion": chat, "text": 1}, formats) is None
    )  # prompt wins, as in TRL
    assert row_problem({"messages": chat}, formats) is None
    assert row_problem({"other": "x"}, formats) == "no format"


def test_rows_trl_drops_after_tokenizing_are_named_and_all_of_them_refused() -> None:
    """TRL drops the rows whose prompt alone fills ``max_length``; before, all of them dropped was reported as
    "num_chunks: the training set is empty (rows_per_epoch=0)"."""

    def fn(row: dict) -> dict:
        return {"prompt": row["question"], "completion": " " + row["answer"]}

    _refused_before_training(
        r"train_dataset: the trainer dropped all 4 rows after tokenizing them: their prompt alone fills max_length=8 "
        r"tokens.*raise max_length, or use truncation_mode='keep_end'",
        _sft(fn, max_length=8),
        qa_dataset(4),
    )
    from datasets import Dataset, concatenate_datasets

    long = Dataset.from_dict({"question": ["why " * 60], "answer": ["because"]})
    lines: list[str] = []
    exp = Experiment("dropped-rows")
    exp.on_message(lines.append)
    exp.run_fit(
        _sft(fn, max_length=48),
        tiny_create_model,
        concatenate_datasets([qa_dataset(4), long]),
        num_chunks=1,
        seed=0,
    )
    assert any(
        "run 1: train_dataset: the trainer dropped 1 of 5 rows after tokenizing them" in line
        for line in lines
    )
    exp.end()
