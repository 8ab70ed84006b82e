"""A clone's rows tokenized off the device thread (issue 34 item 5) are TRL's own, and the clone ends bit-identical
to the same clone built on the device thread (as before the builder thread existed).

The tiny model; 24 rows, batch 2; run 1 trains 12 steps in 4 chunks; a cold clone with another ``max_length`` is
asked for while run 1 trains.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import adapter_from_folder, max_abs_diff, qa_dataset, qa_to_chat, result_series

SEED = 5


def _group() -> Any:
    from rapidfire_nb.automl import RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    return RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            formatting_func=qa_to_chat,
            peft_config=RFLoraConfig(
                r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"]
            ),
            training_args=RFSFTConfig(
                learning_rate=2e-3,
                per_device_train_batch_size=2,
                max_steps=12,
                max_length=32,
                logging_steps=1,
            ),
        ),
        "SFT",
    )


def _clone_weights(
    root: Path, name: str, off_thread: bool, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """Train run 1, clone it cold with ``max_length=28`` while it trains; the clone's final adapter and how many
    runs got rows tokenized off the device thread."""
    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model
    from rapidfire_nb.training.executor import TorchExecutor

    if not off_thread:  # the build as before: everything on the device thread
        monkeypatch.setattr(TorchExecutor, "prepare_run", lambda self, run_id, spec, device=None: None)
    exp = Experiment(name, experiment_path=root, quiet=True)
    exp.run_fit(_group(), tiny_create_model, qa_dataset(24), qa_dataset(6, seed=1), num_chunks=4, seed=SEED)
    child = exp.clone_modify(1, {"max_length": 28}, warm_start=False)
    assert exp.wait(timeout=240)
    snap = exp.run_snapshot(child)
    assert snap is not None and snap.status.value == "COMPLETED", snap.error
    executor = exp.session.executor
    out = {"prepared": executor.prepared.prepared, "child": child}
    info = exp.get_runs_info()
    out["weights"] = adapter_from_folder(info[info.run_id == child].iloc[0].checkpoint_dir)
    out["eval_loss"] = result_series(exp.get_results(), child, "eval_loss")
    exp.end()
    monkeypatch.undo()
    return out


def test_a_clone_built_from_rows_tokenized_off_the_device_thread_is_bit_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _clone_weights(tmp_path, "sync-build", False, monkeypatch)
    after = _clone_weights(tmp_path, "async-build", True, monkeypatch)
    assert (before["prepared"], after["prepared"]) == (0, 1)  # the clone's rows came from the builder thread
    assert before["child"] == after["child"] == 2
    assert max_abs_diff(after["weights"], before["weights"]) == 0.0
    assert after["eval_loss"] == before["eval_loss"] and len(after["eval_loss"]) >= 4


def test_sft_rows_are_the_rows_sft_trainer_prepares_itself() -> None:
    from trl import SFTTrainer

    from rapidfire_nb.spec import build_training_args
    from rapidfire_nb.testing import tiny_create_model
    from rapidfire_nb.training.prepared_rows import sft_rows

    leaf = next(iter(_group().expand(SEED))).with_changes({"max_length": 28})
    args, _ = build_training_args(leaf, output_dir="unused", default_seed=SEED)
    rows = qa_dataset(24).map(qa_to_chat, remove_columns=["question", "answer"])
    model, tok = tiny_create_model({"model_name": "tiny"})
    prepared = sft_rows(args, rows, None, tok)
    assert prepared is not None and prepared[1] is None
    own = SFTTrainer(model=model, args=args, train_dataset=rows, processing_class=tok).train_dataset
    again = SFTTrainer(model=model, args=args, train_dataset=prepared[0], processing_class=tok).train_dataset
    assert len(own) == len(again) == 24
    for column in ("input_ids", "labels"):
        assert own[column] == prepared[0][column] == again[column], column
    assert any(-100 in labels for labels in own["labels"])  # completion-only loss: the prompt is masked


def test_packing_is_left_to_the_trainer() -> None:
    from rapidfire_nb.spec import build_training_args
    from rapidfire_nb.testing import tiny_create_model
    from rapidfire_nb.training.prepared_rows import sft_rows

    leaf = next(iter(_group().expand(SEED))).with_changes({"packing": True})
    args, _ = build_training_args(leaf, output_dir="unused", default_seed=SEED)
    _, tok = tiny_create_model({"model_name": "tiny"})
    assert sft_rows(args, qa_dataset(4).map(qa_to_chat), None, tok) is None


def test_the_builder_thread_honours_deletes_bad_input_and_the_spec() -> None:
    import threading

    from rapidfire_nb.errors import ConfigError
    from rapidfire_nb.training.prepared_rows import RowPreparer

    release, seen = threading.Event(), []

    def inputs(run_id: int, spec: Any) -> tuple[Any, Any, Any, Any]:
        if spec == "bad":
            raise ConfigError("max_length: must be > 0")
        seen.append(run_id)
        assert release.wait(10)
        return None, ["raw"], None, "tokenizer"

    prep = RowPreparer(inputs, lambda args, train, eval_rows, tok: (["tokenized"], None))
    spec = object()
    first, deleted = prep.start(1, spec), prep.start(2, spec)
    assert first is not None and deleted is not None
    prep.discard(2)  # deleted before its preparation began: never prepared
    release.set()
    first.result(timeout=10)
    assert deleted.cancelled() and seen == [1]
    assert prep.rows(1, object(), ["raw"], None, _Args()) == (["raw"], None)  # another spec: its own rows
    bad = prep.start(3, "bad")
    assert bad is not None
    with pytest.raises(ConfigError, match="max_length"):
        bad.result(timeout=10)
    third = prep.start(4, spec)
    assert third is not None
    third.result(timeout=10)
    args = _Args()
    assert prep.rows(4, spec, ["raw"], None, args) == (["tokenized"], None)
    assert args.dataset_kwargs == {"skip_prepare_dataset": True} and prep.prepared == 1
    prep.close()


class _Args:
    dataset_kwargs: Any = None
