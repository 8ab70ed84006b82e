"""Bad input gives a clear ConfigError before any training; failures during training stay with their run.

"Before any training" is checked three ways: no worker thread was ever asked to train (``RunWorker.run_until``
is spied on), no metric row exists in the store, and no run is left in the store (a corrected ``run_fit``
on the same experiment then trains normally).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from rapidfire_nb import ConfigError, Experiment, ExperimentError
from rapidfire_nb.automl import List, Range, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.testing import tiny_create_model
from tests.helpers import qa_dataset, qa_to_chat, worker_threads

LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def group(
    formatting_func: Any = qa_to_chat, model_name: str | List = "tiny", **training: Any
) -> RFGridSearch:
    args = {"learning_rate": 1e-3, "per_device_train_batch_size": 4, "num_train_epochs": 1, "max_length": 32}
    args.update(training)
    return RFGridSearch(
        RFModelConfig(
            model_name=model_name,
            peft_config=RFLoraConfig(**LORA),
            training_args=RFSFTConfig(**args),
            formatting_func=formatting_func,
        ),
        "SFT",
    )


@pytest.fixture
def trained(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every ``RunWorker.run_until(stop_step)`` call, as ``(run_id, stop_step)``."""
    from rapidfire_nb.training.worker import RunWorker

    calls: list[tuple[int, int]] = []
    original = RunWorker.run_until

    def spy(self: Any, stop_step: int) -> Any:
        calls.append((self.run_id, stop_step))
        return original(self, stop_step)

    monkeypatch.setattr(RunWorker, "run_until", spy)
    return calls


def assert_nothing_trained(exp: Experiment, trained: list[tuple[int, int]], threads_before: set[str]) -> None:
    assert trained == [], "a run started training"
    assert worker_threads() - threads_before == set(), "a worker thread was started"
    points, _ = exp.store.metrics_since(0)
    assert points == []
    assert exp.store.runs() == []
    assert exp.get_runs_info().empty


def fails_before_training(
    trained: list[tuple[int, int]], match: str, *args: Any, **kwargs: Any
) -> Experiment:
    exp = Experiment("bad-input")
    exp.quiet = True
    before = worker_threads()
    with pytest.raises(ConfigError, match=match):
        exp.run_fit(*args, **kwargs)
    assert_nothing_trained(exp, trained, before)
    return exp


# ------------------------------------------------------------------------------------------------ data
def test_empty_train_set(trained: list) -> None:
    from datasets import Dataset

    empty = Dataset.from_dict({"question": [], "answer": []})
    fails_before_training(trained, "train_dataset is empty", group(), tiny_create_model, empty)


@pytest.mark.parametrize("num_chunks", [0, -1])
def test_num_chunks_below_one(trained: list, num_chunks: int) -> None:
    fails_before_training(
        trained, "num_chunks", group(), tiny_create_model, qa_dataset(8), num_chunks=num_chunks
    )


def test_num_chunks_above_steps_per_epoch_then_a_corrected_call_trains(trained: list) -> None:
    # 8 rows, batch 4 -> 2 optimizer steps per epoch: 3 chunks cannot be planned
    exp = fails_before_training(
        trained,
        r"num_chunks=3 .*2 optimizer steps per epoch",
        group(),
        tiny_create_model,
        qa_dataset(8),
        num_chunks=3,
    )
    exp.run_fit(group(), tiny_create_model, qa_dataset(8), num_chunks=2)
    info = exp.get_runs_info()
    assert list(info.status) == ["COMPLETED"] and list(info.completed_steps) == [2]
    assert trained == [(1, 1), (1, 2)]
    exp.end()


def test_num_chunks_above_the_steps_per_epoch_of_one_run_names_it(trained: list) -> None:
    # 16 rows: batch 2 -> 8 steps per epoch, batch 8 -> 2 steps per epoch; 4 chunks only fit the first run
    fails_before_training(
        trained,
        r"num_chunks=4 .*2 optimizer steps per epoch.*\(run 2\)",
        group(per_device_train_batch_size=List([2, 8])),
        tiny_create_model,
        qa_dataset(16),
        num_chunks=4,
    )


def nothing_useful(row: dict) -> dict:
    return {"instruction": row["question"], "output": row["answer"]}


def test_rows_missing_the_needed_columns_after_formatting(trained: list) -> None:
    exp = fails_before_training(
        trained,
        r"prompt/completion",
        group(formatting_func=nothing_useful),
        tiny_create_model,
        qa_dataset(8),
        num_chunks=2,
    )
    assert exp is not None
    # the same without any formatting_func: question/answer rows are not SFT rows
    fails_before_training(
        trained,
        r"formatting_func",
        group(formatting_func=None),
        tiny_create_model,
        qa_dataset(8),
        num_chunks=2,
    )


def broken_format(row: dict) -> dict:
    return {"prompt": [{"role": "user", "content": row["instruction"]}]}


def test_formatting_func_raising_on_the_first_row_is_named(trained: list) -> None:
    fails_before_training(
        trained,
        r"broken_format.*KeyError",
        group(formatting_func=broken_format),
        tiny_create_model,
        qa_dataset(8),
        num_chunks=2,
    )


def fails_on_row_3(row: dict) -> dict:
    if row["question"].startswith("Row 3:"):
        raise ValueError("cannot format this row")
    return qa_to_chat(row)


def test_formatting_func_raising_on_a_later_row_is_a_config_error(trained: list) -> None:
    """Not only the first row: any row the function cannot format is bad input, found before training."""
    fails_before_training(
        trained,
        r"fails_on_row_3",
        group(formatting_func=fails_on_row_3),
        tiny_create_model,
        qa_dataset(8, tag=True),
        num_chunks=2,
    )


# ------------------------------------------------------------------------------------------------ configs
@pytest.mark.parametrize(
    ("make", "suggestion"),
    [
        (lambda: RFSFTConfig(learnig_rate=1e-3), "learning_rate"),
        (lambda: RFSFTConfig(per_device_train_batchsize=4), "per_device_train_batch_size"),
        (lambda: RFLoraConfig(r=8, lora_alpah=16), "lora_alpha"),
        (lambda: RFModelConfig(model_name="tiny", formating_func=qa_to_chat), "formatting_func"),
    ],
)
def test_unknown_config_field_suggests_the_closest_name(make: Any, suggestion: str) -> None:
    with pytest.raises(ConfigError, match=f"did you mean `{suggestion}`"):
        make()


def test_unknown_field_set_after_construction_is_rejected() -> None:
    cfg = RFSFTConfig(learning_rate=1e-3)
    with pytest.raises(ConfigError, match="did you mean `num_train_epochs`"):
        cfg.num_train_epoch = 2
    model = RFModelConfig(model_name="tiny")
    with pytest.raises(ConfigError, match="did you mean `peft_config`"):
        model.peft_cfg = RFLoraConfig(r=4)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((1e-3, 1e-4), {}, "start must be < end"),
        ((5, 5), {}, "start must be < end"),
        ((0.0, 1e-3), {"log": True}, "log=True.*> 0"),
        ((-1.0, 1.0), {"log": True}, "log=True.*> 0"),
    ],
)
def test_bad_range(args: tuple, kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Range(*args, **kwargs)


def test_lora_target_modules_missing_from_the_model(trained: list) -> None:
    gs = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            formatting_func=qa_to_chat,
            peft_config=RFLoraConfig(r=4, target_modules=["qkv_proj"]),
            training_args=RFSFTConfig(per_device_train_batch_size=4, num_train_epochs=1, max_length=32),
        ),
        "SFT",
    )
    fails_before_training(
        trained, r"lora\.target_modules", gs, tiny_create_model, qa_dataset(8), num_chunks=2
    )


# ------------------------------------------------------------------------------------------------ create_model_fn
def model_only(model_config: dict) -> Any:
    return tiny_create_model(model_config)[0]


def tokenizer_then_model(model_config: dict) -> Any:
    model, tok = tiny_create_model(model_config)
    return tok, model


def three_things(model_config: dict) -> Any:
    model, tok = tiny_create_model(model_config)
    return model, tok, None


def model_and_none(model_config: dict) -> Any:
    return tiny_create_model(model_config)[0], None


@pytest.mark.parametrize("create", [model_only, tokenizer_then_model, three_things, model_and_none])
def test_create_model_fn_not_returning_model_and_tokenizer(trained: list, create: Any) -> None:
    fails_before_training(
        trained,
        r"create_model_fn must return a \(model, tokenizer\)",
        group(),
        create,
        qa_dataset(8),
        num_chunks=2,
    )


# ------------------------------------------------------------------------------------------------ CPU precision
def test_fp16_and_bf16_on_cpu_are_switched_off_with_a_visible_note(
    capsys: pytest.CaptureFixture[str],
) -> None:
    exp = Experiment("precision")
    gs = RFGridSearch(
        List(
            [
                RFModelConfig(
                    model_name="tiny",
                    peft_config=RFLoraConfig(**LORA),
                    formatting_func=qa_to_chat,
                    training_args=RFSFTConfig(
                        learning_rate=1e-3,
                        per_device_train_batch_size=4,
                        max_length=32,
                        num_train_epochs=1,
                        **{flag: True},
                    ),
                )
                for flag in ("fp16", "bf16")
            ]
        ),
        "SFT",
    )
    exp.run_fit(gs, tiny_create_model, qa_dataset(8), num_chunks=2)
    out = capsys.readouterr().out
    assert "fp16=True requested but no CUDA GPU: training in fp32 (fp16 switched off)" in out
    assert "bf16=True requested but no CUDA GPU: training in fp32 (bf16 switched off)" in out
    info = exp.get_runs_info()
    assert list(info.status) == ["COMPLETED", "COMPLETED"]
    assert list(info.completed_steps) == [2, 2]
    for run in exp.session.executor.runs.values():
        assert run.worker.trainer.args.fp16 is False and run.worker.trainer.args.bf16 is False
    exp.end()


# ------------------------------------------------------------------------------------------------ failures
class Bomb(RuntimeError):
    pass


def create_model_with_bomb(model_config: dict) -> Any:
    """Like tiny_create_model, but the model named "bomb" raises in the forward pass of its 3rd training step."""
    name = model_config["model_name"]
    model, tok = tiny_create_model({**model_config, "model_name": "tiny"})
    if name == "bomb":
        calls = {"n": 0}

        def hook(module: Any, args: Any) -> None:
            if module.training:
                calls["n"] += 1
                if calls["n"] == 3:
                    raise Bomb("boom at training step 3")

        model.model.embed_tokens.register_forward_pre_hook(hook)
    return model, tok


def test_a_run_failing_during_training_is_failed_and_the_others_complete(trained: list) -> None:
    import pandas as pd

    exp = Experiment("one-fails")
    exp.quiet = True
    # 8 rows, batch 2 -> 4 steps, 2 chunks (boundaries 2, 4): the bomb goes off in chunk 2
    exp.run_fit(
        group(model_name=List(["tiny", "bomb", "tiny-qwen2"]), per_device_train_batch_size=2),
        create_model_with_bomb,
        qa_dataset(8),
        num_chunks=2,
    )
    info = exp.get_runs_info().set_index("run_id")
    assert list(info.status) == ["COMPLETED", "FAILED", "COMPLETED"]
    assert list(info.completed_steps) == [4, 2, 4]
    assert "Bomb" in info.loc[2, "error"] and "boom at training step 3" in info.loc[2, "error"]
    assert pd.isna(info.loc[1, "error"]) and pd.isna(info.loc[3, "error"])
    assert exp.store.runs()[1]["status"] == "FAILED"
    # the failed run never came back into the rotation after its failure
    assert [c for c in trained if c[0] == 2] == [(2, 2), (2, 4)]
    assert sorted(c for c in trained if c[0] != 2) == [(1, 2), (1, 4), (3, 2), (3, 4)]
    exp.end()


def raising_metrics(eval_prediction: Any) -> dict:
    raise RuntimeError("metrics exploded")


def test_a_run_whose_compute_metrics_raises_is_failed_and_the_other_completes() -> None:
    exp = Experiment("metrics-fail")
    exp.quiet = True
    gs = RFGridSearch(
        List(
            [
                RFModelConfig(
                    model_name="tiny",
                    peft_config=RFLoraConfig(**LORA),
                    formatting_func=qa_to_chat,
                    compute_metrics=metrics,
                    training_args=RFSFTConfig(
                        per_device_train_batch_size=4, num_train_epochs=1, max_length=32
                    ),
                )
                for metrics in (raising_metrics, None)
            ]
        ),
        "SFT",
    )
    exp.run_fit(gs, tiny_create_model, qa_dataset(8), qa_dataset(4, seed=1), num_chunks=2)
    info = exp.get_runs_info().set_index("run_id")
    assert list(info.status) == ["FAILED", "COMPLETED"]
    assert "metrics exploded" in info.loc[1, "error"]
    assert info.loc[1, "completed_steps"] == 1  # failed in its first chunk-end evaluation
    assert info.loc[2, "completed_steps"] == 2
    exp.end()


# ------------------------------------------------------------------------------------------------ experiment state
def test_run_fit_while_training_is_an_error_pointing_to_ic_ops() -> None:
    go = threading.Event()
    blocked = threading.Event()

    def create_blocking(model_config: dict) -> Any:
        model, tok = tiny_create_model(model_config)

        def hook(module: Any, args: Any) -> None:
            if module.training and not go.is_set():
                blocked.set()
                go.wait(60)

        model.model.embed_tokens.register_forward_pre_hook(hook)
        return model, tok

    exp = Experiment("busy")
    exp.quiet = True
    errors: list[BaseException] = []

    def first() -> None:
        try:
            exp.run_fit(group(), create_blocking, qa_dataset(8), num_chunks=2)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=first, daemon=True)
    thread.start()
    try:
        assert blocked.wait(60), "training never started"
        deadline = time.monotonic() + 30  # the store hears of ONGOING right after the segment was handed out
        while list(exp.get_runs_info().status) != ["ONGOING"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(exp.get_runs_info().status) == ["ONGOING"]
        with pytest.raises(ExperimentError, match=r"is training; use its IC Ops"):
            exp.run_fit(group(), tiny_create_model, qa_dataset(8), num_chunks=2)
        with pytest.raises(ExperimentError, match="is training"):
            exp.run_fit(group(learning_rate=5e-4), tiny_create_model, qa_dataset(8), num_chunks=2)
    finally:
        go.set()
        thread.join(60)
    assert not thread.is_alive() and errors == []
    assert list(exp.get_runs_info().status) == ["COMPLETED"]
    exp.end()


def test_rerun_same_group_shows_finished_runs_and_different_group_is_an_error(
    trained: list, capsys: pytest.CaptureFixture[str]
) -> None:
    exp = Experiment("rerun")
    train = qa_dataset(8)
    exp.run_fit(group(), tiny_create_model, train, num_chunks=2)
    first_points, _ = exp.store.metrics_since(0)
    assert trained == [(1, 1), (1, 2)]
    capsys.readouterr()

    # the same group again: nothing is retrained, the finished run is shown
    exp.run_fit(group(), tiny_create_model, train, num_chunks=2)
    assert "already in this experiment" in capsys.readouterr().out
    assert trained == [(1, 1), (1, 2)]
    assert exp.store.metrics_since(0)[0] == first_points
    assert list(exp.get_runs_info().status) == ["COMPLETED"]

    # a different group: a clear error naming both ways out
    with pytest.raises(
        ExperimentError, match=r"(?s)different config group.*new experiment name.*overwrite=True"
    ):
        exp.run_fit(group(learning_rate=5e-4), tiny_create_model, train, num_chunks=2)
    exp.end()

    # the same, after reopening the experiment by name (its history is visible)
    again = Experiment("rerun")
    assert list(again.get_runs_info().status) == ["COMPLETED"]
    with pytest.raises(ExperimentError, match=r"(?s)new experiment name.*overwrite=True"):
        again.run_fit(group(learning_rate=5e-4), tiny_create_model, train, num_chunks=2)
    t0 = time.monotonic()
    again.run_fit(group(), tiny_create_model, train, num_chunks=2)
    assert time.monotonic() - t0 < 30
    assert trained == [(1, 1), (1, 2)], "a finished run was retrained after reopening"
    assert again.store.metrics_since(0)[0] == first_points
    info = again.get_runs_info()
    assert list(info.status) == ["COMPLETED"] and list(info.completed_steps) == [2]
    again.end()

    fresh = Experiment("rerun", overwrite=True)
    assert fresh.get_runs_info().empty
