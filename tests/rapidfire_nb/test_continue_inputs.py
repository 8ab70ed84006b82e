"""Continuing an interrupted experiment needs the inputs it was started with (num_chunks, seed, datasets).

The store is written as a crashed kernel leaves it (same config group, runs INTERRUPTED); ``run_fit`` with a
different ``num_chunks``/``seed``/dataset must refuse before any model is built, naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb.experiment import dataset_fingerprint
from rapidfire_nb.experiment.inputs import check_same_inputs


def _never(_cfg: Any) -> Any:
    raise AssertionError("create_model_fn called: the mismatch was not caught before training")


def _group() -> Any:
    from rapidfire_nb.automl import List, RFGridSearch, RFModelConfig, RFSFTConfig

    return RFGridSearch(
        List([RFModelConfig("tiny", training_args=RFSFTConfig(learning_rate=lr)) for lr in (1e-3, 1e-4)]),
        "SFT",
    )


def _given(num_chunks: int, seed: int, train: Any, eval_: Any) -> dict[str, Any]:
    """What ``FitInputs.meta()`` holds for these inputs (what ``check_same_inputs`` compares)."""
    return {
        "num_chunks": num_chunks,
        "seed": seed,
        "train_data": dataset_fingerprint(train),
        "eval_data": dataset_fingerprint(eval_),
        "eval_generation_samples": None,
    }


def _rows(n: int, text: str = "b") -> Any:
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [f"q{i}" for i in range(n)], "completion": [text] * n})


@pytest.fixture
def crashed(tmp_path: Path) -> Path:
    from rapidfire_nb.store import Store

    with Store(tmp_path / "crashed") as store:
        store.update_meta(
            {
                "name": "crashed",
                "fingerprint": json.dumps([x.fingerprint() for x in _group().expand(5)]),
                "num_chunks": 4,
                "seed": 5,
                "train_data": dataset_fingerprint(_rows(16)),
                "eval_data": dataset_fingerprint(_rows(4, "e")),
            }
        )
        store.upsert_run(1, status="INTERRUPTED", source="fit")
        store.upsert_run(2, status="COMPLETED", source="fit")
    return tmp_path


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_chunks": 2}, r"num_chunks=2, but it was started with num_chunks=4"),
        ({"seed": 7}, r"seed=7, but it was started with seed=5"),
        ({"train_dataset": _rows(16, "other")}, r"different train_dataset .*16 rows vs 16"),
        ({"train_dataset": _rows(12)}, r"different train_dataset .*12 rows vs 16"),
        ({"eval_dataset": None}, r"different eval_dataset: none, but it was started with 4 rows"),
    ],
)
def test_different_inputs_are_refused_before_training(
    crashed: Path, kwargs: dict[str, Any], message: str
) -> None:
    from rapidfire_nb import Experiment
    from rapidfire_nb.errors import ExperimentError

    args = {"train_dataset": _rows(16), "eval_dataset": _rows(4, "e"), "num_chunks": 4, "seed": 5, **kwargs}
    exp = Experiment("crashed", experiment_path=crashed)
    try:
        with pytest.raises(ExperimentError, match=message) as err:
            exp.run_fit(_group(), _never, **args)
        assert "unfinished runs [1]" in str(
            err.value
        ) and "same num_chunks, seed, eval_generation_samples and datasets" in str(err.value)
    finally:
        exp.end()


def test_an_eval_set_where_there_was_none(tmp_path: Path) -> None:
    from rapidfire_nb import Experiment
    from rapidfire_nb.errors import ExperimentError
    from rapidfire_nb.store import Store

    with Store(tmp_path / "noeval") as store:
        store.update_meta(
            {"num_chunks": 4, "seed": 5, "train_data": dataset_fingerprint(_rows(16)), "eval_data": None}
        )
    exp = Experiment("noeval", experiment_path=tmp_path)
    with pytest.raises(
        ExperimentError, match="different eval_dataset: 4 rows, but it was started without one"
    ):
        check_same_inputs(exp.experiment_name, exp.store.meta(), _given(4, 5, _rows(16), _rows(4)), [1])
    check_same_inputs(exp.experiment_name, exp.store.meta(), _given(4, 5, _rows(16), None), [1])
    exp.end()


def test_same_inputs_pass_the_check(crashed: Path) -> None:
    from rapidfire_nb import Experiment

    exp = Experiment("crashed", experiment_path=crashed)
    check_same_inputs(
        exp.experiment_name, exp.store.meta(), _given(4, 5, _rows(16), _rows(4, "e")), [1]
    )  # no error
    exp.end()


def test_dataset_fingerprint() -> None:
    a = dataset_fingerprint(_rows(100))
    assert a == dataset_fingerprint(_rows(100)) and a["rows"] == 100
    assert dataset_fingerprint(_rows(100, "x")) != a
    assert dataset_fingerprint(None) is None
    assert dataset_fingerprint(_rows(0)) == {"rows": 0, "sha256": dataset_fingerprint(_rows(0))["sha256"]}


def test_reattached_panel_says_what_waits(crashed: Path) -> None:
    """Before run_fit in a new kernel the panel's header names the interrupted runs instead of "idle 0/0"."""
    from rapidfire_nb import Experiment

    exp = Experiment("crashed", experiment_path=crashed)
    snap = exp.panel_snapshot()
    assert snap["progress"] == (
        "not training in this kernel — 1/2 runs completed; 1 interrupted (run_fit with "
        "the same arguments continues them)"
    )
    assert {r["run_id"]: r["status"] for r in snap["runs"]} == {1: "INTERRUPTED", 2: "COMPLETED"}
    exp.end()


def test_ic_ops_before_run_fit_say_how_to_continue(crashed: Path) -> None:
    from rapidfire_nb import Experiment
    from rapidfire_nb.errors import ExperimentError

    exp = Experiment("crashed", experiment_path=crashed)
    with pytest.raises(
        ExperimentError, match="not training in this kernel: call run_fit with the same arguments"
    ):
        exp.stop(1)
    exp.end()


def test_a_checkpoint_with_a_missing_or_empty_file_counts_as_damaged(tmp_path: Path) -> None:
    from rapidfire_nb.run_folder import readable_checkpoint

    ck = tmp_path / "checkpoint-9"
    ck.mkdir()
    (ck / "trainer_state.json").write_text('{"global_step": 9}')
    for name in ("adapter_model.safetensors", "optimizer.pt", "scheduler.pt"):
        (ck / name).write_bytes(b"x")
    assert readable_checkpoint(ck)
    (ck / "optimizer.pt").write_bytes(b"")
    assert not readable_checkpoint(ck)
    (ck / "optimizer.pt").write_bytes(b"x")
    (ck / "adapter_model.safetensors").unlink()
    assert not readable_checkpoint(ck)
    (ck / "model.safetensors").write_bytes(b"x")  # full fine-tuning
    assert readable_checkpoint(ck)
    (ck / "trainer_state.json").write_text("{")
    assert not readable_checkpoint(ck)
