"""Continuing a run that finished before this ``run_fit`` (``end()``, then ``Experiment(name)`` and ``run_fit`` again,
or a restart): its final state (adapter, optimizer, scheduler, RNG, step) is kept on disk as its one checkpoint, so
``clone_modify(1, {"max_steps": 8}, warm_start=True)`` continues it exactly as in the session that trained it.

Before: it was refused ("final state ... only the run_fit session that trained it keeps"). A run whose final state
is not on disk is still refused before it gets an id, saying why; a cold clone of it still trains.

Tiny model, 16 rows, batch 2 (8 steps an epoch), 2 chunks (boundaries 4 and 8): run 1 ends at step 3, inside
chunk 1, so its final state is not a chunk boundary. ``lora_dropout > 0``: the RNG is carried on too.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import adapter_from_folder, max_abs_diff, qa_dataset, qa_to_chat, result_series

PARENT_STEPS = 3
MORE = 8


def _group():  # type: ignore[no-untyped-def]
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
                max_steps=PARENT_STEPS,
                max_length=32,
                logging_steps=1,
            ),
        ),
        "SFT",
    )


def _fit(name: str, root: Path) -> Any:
    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model

    exp = Experiment(name, experiment_path=root, quiet=True)
    exp.run_fit(_group(), tiny_create_model, qa_dataset(16), num_chunks=2, seed=1)
    assert exp.wait(timeout=120)
    return exp


def _continue(exp: Any) -> dict[str, Any]:
    """Continue run 1 to ``MORE`` steps; the continuation's final adapter, losses, snapshot and op message."""
    child = exp.clone_modify(1, {"max_steps": MORE}, warm_start=True)
    assert exp.wait(timeout=120)
    info, ops = exp.get_runs_info(), exp.ops()
    clone_op = ops[(ops.kind == "clone") & (ops.run_id == 1)].iloc[-1]
    return {
        "child": child,
        "snap": exp.run_snapshot(child),
        "weights": adapter_from_folder(info[info.run_id == child].iloc[0].checkpoint_dir),
        "loss": result_series(exp.get_results(), child, "loss"),
        "message": clone_op.message,
    }


def _parent_row(exp: Any) -> dict[str, Any]:
    """Run 1's progress as ``get_runs_info`` shows it (from the store once the experiment ended)."""
    keys = ("status", "completed_steps", "total_steps", "chunks_done", "epoch", "checkpoint_dir")
    row = exp.get_runs_info().set_index("run_id").loc[1]
    return {k: row[k] for k in keys}


def test_a_run_finished_before_this_run_fit_is_continued_exactly_as_in_its_own_session(
    tmp_path: Path,
) -> None:
    in_session = _fit("cont-in-session", tmp_path)
    want = _continue(in_session)
    in_session.end()

    first = _fit("cont-end", tmp_path)
    first.end()
    folder = tmp_path / "cont-end" / "runs" / "1"
    assert sorted(p.name for p in folder.glob("checkpoint-*")) == [f"checkpoint-{PARENT_STEPS}"]  # one, final
    again = _fit("cont-end", tmp_path)  # run 1 is COMPLETED from the store: no trainer built for it
    parent_before = _parent_row(again)
    got = _continue(again)
    again.end()
    # the clone leaves the parent's stored row as it was (its epoch was written 0.0: a run restored from the
    # store has no chunk plan, and the clone op's snapshot of it was stored)
    assert parent_before["epoch"] == pytest.approx(PARENT_STEPS / 8)
    assert _parent_row(again) == parent_before

    assert got["child"] == want["child"] == 2
    for out in (want, got):
        snap = out["snap"]
        assert (snap.status.value, snap.step, snap.parent_id, snap.warm_start) == ("COMPLETED", MORE, 1, True)
        assert f"warm from run 1's final state, step {PARENT_STEPS}: it continues run 1" in out["message"]
    assert [s for s, _ in got["loss"]] == list(range(PARENT_STEPS + 1, MORE + 1))
    assert got["loss"] == want["loss"]
    assert max_abs_diff(got["weights"], want["weights"]) == 0.0


def test_a_run_whose_final_state_is_not_on_disk_is_refused_before_it_gets_an_id(tmp_path: Path) -> None:
    from rapidfire_nb import OpError

    _fit("cont-gone", tmp_path).end()
    for ckpt in (tmp_path / "cont-gone" / "runs" / "1").glob("checkpoint-*"):
        shutil.rmtree(ckpt)
    again = _fit("cont-gone", tmp_path)
    with pytest.raises(
        OpError,
        match=rf"run 1 finished before this run_fit \(at step {PARENT_STEPS}\).*not on disk: no checkpoint of it "
        r"is on disk \(it was removed\); clone it cold",
    ):
        again.clone_modify(1, {"max_steps": MORE}, warm_start=True)
    assert [s.run_id for s in again.run_snapshots()] == [1]  # no id was given
    child = again.clone_modify(1, {"max_steps": MORE}, warm_start=False)
    assert again.wait(timeout=120)
    assert again.run_snapshot(child).status.value == "COMPLETED"
    again.end()


def test_wait_returns_once_the_continuation_trained_while_its_rows_are_tokenized_off_the_loop(
    tmp_path: Path,
) -> None:
    """``wait()`` after continuing a finished run in a reopened experiment (``background=True``) returns once the
    continuation trained. 2,000 rows: its rows are tokenized off the loop, then it is built on the loop; before,
    ``wait()`` returned True during that build (nothing pending, nothing else to train) with the child NEW."""
    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model

    exp = Experiment("cont-wait", experiment_path=tmp_path, quiet=True)
    exp.run_fit(_group(), tiny_create_model, qa_dataset(2000), num_chunks=2, seed=1)
    exp.end()
    again = Experiment("cont-wait", experiment_path=tmp_path, quiet=True)
    again.run_fit(_group(), tiny_create_model, qa_dataset(2000), num_chunks=2, seed=1, background=True)
    child = again.clone_modify(1, {"max_steps": MORE}, warm_start=True)
    assert again.wait(timeout=120)
    snap, loss = again.run_snapshot(child), result_series(again.get_results(), child, "loss")
    again.end()
    assert (snap.status.value, snap.step) == ("COMPLETED", MORE)
    assert [s for s, _ in loss] == list(range(PARENT_STEPS + 1, MORE + 1))
