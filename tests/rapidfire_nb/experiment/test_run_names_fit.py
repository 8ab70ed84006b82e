"""Run names through a real (tiny) ``run_fit``: a name template filled per run reaches ``get_runs_info()``, the panel's
snapshot and TensorBoard (folder ``run-<id>`` kept, the name as its text summary), and survives an
``Experiment(name)`` reopen (a new kernel: read from the store). An experiment trained before its runs had names
reopens with the same group named: the fingerprints are equal, so ``run_fit`` continues it instead of refusing it,
and its runs take the names (a name is a label: a run may be renamed so)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def _group(**labels: Any) -> Any:
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    config = RFModelConfig(
        model_name="tiny",
        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(
            learning_rate=List([1e-3, 5e-4]), per_device_train_batch_size=4, max_steps=2, logging_steps=1
        ),
        **labels,
    )
    return RFGridSearch(configs=config, trainer_type="SFT")


def _fit(root: Path, name: str, group: Any) -> Any:
    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset

    exp = Experiment(name, experiment_path=root)
    exp.quiet = True
    exp.run_fit(group, tiny_create_model, tiny_sft_dataset(8), num_chunks=1, background=False)
    return exp


@pytest.fixture(scope="module")
def named(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("named")
    exp = _fit(root, "named", _group(run_name="lr{learning_rate:.0e}", tags=["tiny"]))
    info, snap = exp.get_runs_info(), exp.panel_snapshot()
    exp.end()
    return {"root": root, "info": info, "snap": snap}


def test_the_names_reach_get_runs_info_and_the_panel_next_to_the_ids(named: dict[str, Any]) -> None:
    info = named["info"]
    assert list(info.columns[:3]) == ["run_id", "run_name", "status"]
    assert list(info.run_id) == [1, 2] and list(info.run_name) == ["lr1e-03", "lr5e-04"]
    assert list(info.tags) == [["tiny"], ["tiny"]] and list(info.status) == ["COMPLETED", "COMPLETED"]
    assert "run_name" not in info.columns[3:] and info.config[0]["run_name"] == "lr1e-03"
    runs = named["snap"]["runs"]
    assert [(r["run_id"], r["run_name"], r["tags"]) for r in runs] == [
        (1, "lr1e-03", ["tiny"]),
        (2, "lr5e-04", ["tiny"]),
    ]
    assert named["snap"]["hparam_columns"] == ["learning_rate"]  # the name is no hyperparameter column


def test_tensorboard_keeps_run_folders_and_shows_the_name(named: dict[str, Any]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rapidfire_nb.tracking.tensorboard import NAME_TAG

    board = named["root"] / "named" / "tensorboard"
    assert sorted(p.name for p in board.iterdir()) == ["run-1", "run-2"]
    acc = EventAccumulator(str(board / "run-2"), size_guidance={"tensors": 0}).Reload()
    assert acc.Tensors(NAME_TAG)[0].tensor_proto.string_val[0].decode() == "**run 2**: lr5e-04  \ntags: tiny"
    assert "train/loss" in acc.Tags()["scalars"]


def test_the_names_survive_a_reopen_from_the_store(named: dict[str, Any]) -> None:
    from rapidfire_nb import Experiment

    exp = Experiment("named", experiment_path=named["root"])  # a new kernel's first cell
    exp.quiet = True
    try:
        info, snap = exp.get_runs_info(), exp.panel_snapshot()
    finally:
        exp.end()
    assert list(info.run_name) == ["lr1e-03", "lr5e-04"] and list(info.tags) == [["tiny"], ["tiny"]]
    assert [r["run_name"] for r in snap["runs"]] == ["lr1e-03", "lr5e-04"]


def test_an_experiment_trained_before_names_reopens_with_the_group_named(tmp_path: Path) -> None:
    _fit(tmp_path, "unnamed", _group()).end()
    again = _fit(tmp_path, "unnamed", _group(run_name="lr{learning_rate}"))  # same fingerprints: continued
    try:
        info = again.get_runs_info()
    finally:
        again.end()
    assert list(info.run_id) == [1, 2] and list(info.status) == ["COMPLETED", "COMPLETED"]
    assert list(info.run_name) == ["lr0.001", "lr0.0005"]  # the same runs (ids, statuses), named now
