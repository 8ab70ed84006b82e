"""A warm clone of a run that finished before this ``run_fit`` (``end()``, then ``Experiment(name)`` and ``run_fit``
again, or a restart) is refused before it gets an id: its final state is kept only by the session that trained it.

A fresh-user pass found it given an id, then FAILED with "final state is not in this kernel (it ended before a
restart ...)" though no restart had happened. A cold clone of it still trains.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import qa_dataset, qa_to_chat


def _group():  # type: ignore[no-untyped-def]
    from rapidfire_nb.automl import RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    return RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            formatting_func=qa_to_chat,
            peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
            training_args=RFSFTConfig(per_device_train_batch_size=2, max_steps=4, max_length=32),
        ),
        "SFT",
    )


def test_a_warm_clone_of_a_run_finished_before_this_run_fit_is_refused_before_it_gets_an_id(
    tmp_path: Path,
) -> None:
    from rapidfire_nb import Experiment, OpError
    from rapidfire_nb.testing import tiny_create_model

    exp = Experiment("cont-end", experiment_path=tmp_path, quiet=True)
    exp.run_fit(_group(), tiny_create_model, qa_dataset(16), num_chunks=2, seed=1)
    exp.end()
    again = Experiment("cont-end", experiment_path=tmp_path, quiet=True)
    again.run_fit(_group(), tiny_create_model, qa_dataset(16), num_chunks=2, seed=1)
    with pytest.raises(OpError, match=r"run 1 finished before this run_fit \(at step 4\).*clone it cold"):
        again.clone_modify(1, {"max_steps": 8}, warm_start=True)
    assert [s.run_id for s in again.run_snapshots()] == [1]  # no id was given
    child = again.clone_modify(1, {"max_steps": 8}, warm_start=False)
    assert again.wait(timeout=120)
    assert again.run_snapshot(child).status.value == "COMPLETED"
    again.end()
