"""A panel opened in a kernel that does not train the experiment (after a restart) is built from the store as the
``/rapidfire/`` page is: hyperparameter columns, editable fields, no legal op, the page's hints (issue 37)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb.view import ENDED_HINT, NO_KERNEL_HINT, StoreRows, reopened_snapshot, store_snapshot


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store written by a finished, ended ``run_fit``: two tiny SFT runs differing in learning rate."""
    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
    from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset

    root = tmp_path_factory.mktemp("reopened")
    config = RFModelConfig(
        model_name="tiny",
        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(
            learning_rate=List([1e-3, 5e-4]), per_device_train_batch_size=4, max_steps=2, logging_steps=1
        ),
    )
    exp = Experiment("again", experiment_path=root)
    exp.quiet = True
    exp.run_fit(
        RFGridSearch(configs=config, trainer_type="SFT"),
        tiny_create_model,
        tiny_sft_dataset(8),
        num_chunks=1,
        background=False,
    )
    exp.end()
    return root


def _reopen(root: Path) -> Any:
    from rapidfire_nb import Experiment

    exp = Experiment("again", experiment_path=root)  # a new kernel's first cell: no run_fit, no session
    exp.quiet = True
    return exp


def test_reopened_panel_has_the_hparam_columns_and_no_legal_op(finished: Path) -> None:
    exp = _reopen(finished)
    try:
        snap = exp.panel_snapshot()
        page = store_snapshot("again", StoreRows.read(exp.store), writer_alive=False)
    finally:
        exp.end()
    assert snap["hparam_columns"] == page["hparam_columns"] == ["learning_rate"]
    assert [r["hparams"] for r in snap["runs"]] == [{"learning_rate": 1e-3}, {"learning_rate": 5e-4}]
    assert [r["editable"]["learning_rate"] for r in snap["runs"]] == [1e-3, 5e-4]
    assert [r["status"] for r in snap["runs"]] == ["COMPLETED", "COMPLETED"]
    for run in snap["runs"]:  # the ended experiment offers nothing: every button says how to continue
        assert run["legal_ops"] == []
        assert set(run["op_hints"].values()) == {ENDED_HINT}
        assert set(run["op_hints"]) == {"stop", "resume", "delete", "clone"}
    assert snap["ended"] is True and snap["source"] == "store"
    assert snap["progress"] == (
        "experiment ended — 2/2 runs completed; re-run Experiment(...) and run_fit(...) to continue it"
    )
    page_runs = [{k: r[k] for k in ("hparams", "editable", "status", "legal_ops")} for r in page["runs"]]
    assert [
        {k: r[k] for k in ("hparams", "editable", "status", "legal_ops")} for r in snap["runs"]
    ] == page_runs


def _rows(ended: bool) -> StoreRows:
    meta: dict[str, Any] = {
        "created_at": 1000.0,
        "num_chunks": 2,
        "hparam_columns": ["lora.r"],
        "editable_fields": {"1": {"lora.r": "int"}, "2": {"lora.r": "int"}},
        "ended_at": 2000.0 if ended else None,
    }
    runs = [
        {"run_id": 1, "status": "ONGOING", "hparams": {"lora.r": 8, "seed": 1}, "chunks_done": 1},
        {"run_id": 2, "status": "STOPPED", "hparams": {"lora.r": 16, "seed": 1}, "chunks_done": 1},
    ]
    ops = [
        {
            "op_id": "a",
            "run_id": 2,
            "kind": "stop",
            "state": "applied",
            "source": "early_stopping",
            "message": "stopped",
            "payload": {"reason": "pruned at rung 1: eval_loss 2.1 not in the best 1/2", "chunk": 1},
            "requested_at": 1.0,
            "applied_at": 2.0,
        },
    ]
    return StoreRows(meta=meta, runs=runs, latest={1: {"loss": 1.5, "eval_loss": 1.7}}, ops=ops)


def test_reopened_snapshot_after_a_crash_says_no_kernel_runs_it() -> None:
    snap = reopened_snapshot("exp", _rows(ended=False), now=3000.0)
    one, two = snap["runs"]
    assert (
        one["status"] == "INTERRUPTED"
        and one["hparams"] == {"lora.r": 8}
        and one["editable"] == {"lora.r": 8}
    )
    assert one["legal_ops"] == two["legal_ops"] == []
    assert set(one["op_hints"].values()) == {NO_KERNEL_HINT}
    assert two["pruned"] is True and two["stop_reason"].startswith("pruned at rung 1")  # the stop reason kept
    assert [o["op_id"] for o in snap["ops"]] == ["a"] and snap["ended"] is False
    assert snap["progress"] == (
        "not training in this kernel — 0/2 runs completed; 1 interrupted (run_fit with the same arguments "
        "continues them)"
    )


def test_reopened_snapshot_while_another_kernel_trains_keeps_ongoing() -> None:
    from rapidfire_nb.view import ELSEWHERE_HINT

    snap = reopened_snapshot("exp", _rows(ended=False), elsewhere=True, now=3000.0)
    assert snap["runs"][0]["status"] == "ONGOING" and snap["runs"][0]["legal_ops"] == []
    assert set(snap["runs"][0]["op_hints"].values()) == {ELSEWHERE_HINT}


def test_reopened_snapshot_of_an_ended_experiment_and_the_page_say_ended() -> None:
    snap = reopened_snapshot("exp", _rows(ended=True), now=3000.0)
    page = store_snapshot("exp", _rows(ended=True), writer_alive=True, now=3000.0)
    for s in (snap, page):
        assert s["ended"] is True and all(r["legal_ops"] == [] for r in s["runs"])
        assert {h for r in s["runs"] for h in r["op_hints"].values()} == {ENDED_HINT}
