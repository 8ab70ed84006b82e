"""Absurd numbers in run_fit, a config or a clone (API, or POSTed through the server's ops inbox) are refused at
once; an experiment reopened with such a clone stored by an older version does not hang (issue 12, item 5).

Before: the clone was accepted and its chunk plan materialised one entry per chunk of 10**12 steps on the
scheduler thread (the heartbeat stopped, memory grew ~150 MB/s), and every reopen did it again.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from rapidfire_nb import ConfigError, Experiment
from rapidfire_nb.automl import RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.testing import tiny_create_model
from tests.helpers import qa_dataset, qa_to_chat

ABSURD = {"max_steps": 10**12}


def _group() -> RFGridSearch:
    return RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]),
            training_args=RFSFTConfig(
                learning_rate=1e-3, per_device_train_batch_size=4, max_steps=2, max_length=32
            ),
            formatting_func=qa_to_chat,
        ),
        "SFT",
    )


def _fit(exp: Experiment) -> None:
    exp.run_fit(_group(), tiny_create_model, qa_dataset(8), num_chunks=2, seed=0)


def _op_state(exp: Experiment, op_id: str) -> tuple[str, str] | None:
    ops = exp.ops()
    rows = ops[ops.op_id == op_id] if len(ops) else ops
    return (rows.iloc[0]["state"], rows.iloc[0]["message"]) if len(rows) else None


def test_an_absurd_clone_is_refused_at_once_through_the_api_and_the_inbox() -> None:
    exp = Experiment("absurd-clone")
    exp.quiet = True
    _fit(exp)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"max_steps=1000000000000 is out of range.*1,000,000,000"):
        exp.clone_modify(1, ABSURD)
    assert time.perf_counter() - t0 < 1.0
    # what the server's POST .../ops does: leave the op in the inbox for the kernel
    exp.store.post_inbox_op("posted-absurd", "clone", 1, {"changes": ABSURD, "warm_start": False})
    t0 = time.perf_counter()
    while _op_state(exp, "posted-absurd") is None and time.perf_counter() - t0 < 10:
        time.sleep(0.05)
    state = _op_state(exp, "posted-absurd")
    assert (
        state is not None and state[0] == "rejected" and "max_steps=1000000000000 is out of range" in state[1]
    )
    assert time.perf_counter() - t0 < 3.0  # the idle scheduler polls the inbox about once a second
    assert [s.run_id for s in exp.run_snapshots()] == [1], "no run was made for either clone"
    exp.end()


def test_a_stored_absurd_clone_fails_on_reopen_instead_of_hanging() -> None:
    exp = Experiment("absurd-reopen")
    exp.quiet = True
    _fit(exp)
    exp.end()
    # a clone saved by a version without bounds: its row and its recipe in the store
    store: Any = exp.store
    parent = exp.get_runs_info().iloc[0]
    store.upsert_run(2, status="NEW", source="clone", parent_id=1, warm_start=False, config=None, hparams={})
    store.set_meta("clones", {"2": {"parent": int(parent.run_id), "changes": ABSURD, "warm": False}})
    again = Experiment("absurd-reopen")
    again.quiet = True
    t0 = time.perf_counter()
    _fit(again)
    assert time.perf_counter() - t0 < 30
    info = again.get_runs_info().set_index("run_id")
    assert info.loc[1, "status"] == "COMPLETED"
    assert info.loc[2, "status"] == "FAILED"
    assert "cannot be rebuilt after the restart" in info.loc[2, "error"]
    assert "max_steps=1000000000000 is out of range" in info.loc[2, "error"]
    again.end()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"num_chunks": 10**6}, r"num_chunks must be an integer from 1 to 10,000, got 1000000"),
        (
            {"seed": 2**40},
            r"seed must be an integer from 0 to 4,294,967,295 \(numpy's range\), got 1099511627776",
        ),
        ({"seed": -1}, r"seed must be an integer from 0 to 4,294,967,295"),
        (
            {"eval_generation_samples": 0},
            r"eval_generation_samples must be a positive integer \(eval rows to generate for, the same seeded sample "
            r"for every run\) or None \(every eval row\), got 0",
        ),
        (
            {"eval_generation_samples": True},
            r"eval_generation_samples must be a positive integer .* got True",
        ),
        ({"eval_generation_samples": 2.5}, r"eval_generation_samples must be a positive integer .* got 2.5"),
    ],
)
def test_run_fit_bounds_num_chunks_and_the_seed(kwargs: dict[str, Any], match: str) -> None:
    exp = Experiment("bounded-fit")
    exp.quiet = True
    with pytest.raises(ConfigError, match=match):
        exp.run_fit(_group(), tiny_create_model, qa_dataset(8), **{"num_chunks": 2, "seed": 0, **kwargs})
    exp.end()


def test_epochs_times_the_data_are_bounded_before_training() -> None:
    """``num_train_epochs`` is bounded alone (10**6); with the data it gives more than 10**9 steps here."""
    group = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            training_args=RFSFTConfig(per_device_train_batch_size=1, num_train_epochs=10**6, max_length=32),
            formatting_func=qa_to_chat,
        ),
        "SFT",
    )
    exp = Experiment("bounded-epochs")
    exp.quiet = True
    t0 = time.perf_counter()
    with pytest.raises(
        ConfigError,
        match=r"num_train_epochs=1e\+06 x 1001 optimizer steps per epoch = 1,001,000,000 steps \(run 1\), more than "
        r"the 1,000,000,000 rapidfire_nb accepts; lower num_train_epochs or set max_steps",
    ):
        exp.run_fit(group, tiny_create_model, qa_dataset(1001), num_chunks=1, seed=0)
    assert time.perf_counter() - t0 < 30 and exp.store.runs() == []
    exp.end()


def test_zero_epochs_name_the_field_before_training() -> None:
    group = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            training_args=RFSFTConfig(per_device_train_batch_size=4, num_train_epochs=0, max_length=32),
            formatting_func=qa_to_chat,
        ),
        "SFT",
    )
    exp = Experiment("zero-epochs")
    exp.quiet = True
    with pytest.raises(  # was: "num_chunks: rows_per_step, total_steps and step_multiple must be >= 1"
        ConfigError,
        match=r"run 1 would train 0 optimizer steps: num_train_epochs=0 with max_steps=-1; set num_train_epochs "
        r">= 1 or max_steps >= 1",
    ):
        exp.run_fit(group, tiny_create_model, qa_dataset(8), num_chunks=2, seed=0)
    assert exp.store.runs() == []
    exp.end()
