"""Successive halving on the tiny model: the losers are STOPPED at their rung with the reason (ops log,
``get_runs_info()``'s ``stop_reason``, the panel snapshot, the cell), the survivors complete and equal plain TRL,
and a user's resume of a pruned run trains it on (not pruned again at the same rung)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import TOL, adapter_from_folder, max_abs_diff, qa_dataset, qa_to_chat, train_plain_trl

SEED = 11
NUM_CHUNKS = 4
LEARNING_RATES = [3e-3, 1e-5, 1e-3, 3e-5]  # 16 rows, batch 4: 4 steps, one per chunk


def _group() -> Any:
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    configs = [
        RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(
                r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]
            ),
            training_args=RFSFTConfig(
                learning_rate=lr, per_device_train_batch_size=4, num_train_epochs=1, max_length=48
            ),
            formatting_func=qa_to_chat,
        )
        for lr in LEARNING_RATES
    ]
    return RFGridSearch(configs=List(configs), trainer_type="SFT")


def _chunk_end_eval(results: Any, run_id: int, step: int) -> float:
    rows = results[(results.run_id == run_id) & (results.step == step)].dropna(subset=["eval_loss"])
    return float(rows.eval_loss.iloc[-1])


@pytest.fixture(scope="module")
def halved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import SuccessiveHalving
    from rapidfire_nb.testing import tiny_create_model

    root = tmp_path_factory.mktemp("halving")
    train, evald = qa_dataset(16, seed=0), qa_dataset(6, seed=1)
    lines: list[str] = []
    exp = Experiment("halving", experiment_path=root)
    exp.on_message(lines.append)
    policy = SuccessiveHalving(metric="eval_loss", mode="min", reduction_factor=2, grace_chunks=1)
    exp.run_fit(
        _group(), tiny_create_model, train, evald, num_chunks=NUM_CHUNKS, seed=SEED, early_stopping=policy
    )
    info = exp.get_runs_info().set_index("run_id")
    results = exp.get_results()
    ops = exp.ops()
    snapshot = exp.panel_snapshot()
    return {
        "exp": exp,
        "info": info,
        "results": results,
        "ops": ops,
        "snapshot": snapshot,
        "lines": lines,
        "train": train,
        "eval": evald,
        "root": root,
    }


def test_the_worst_half_stops_at_each_rung_with_the_reason(halved: dict[str, Any]) -> None:
    import pandas as pd

    info, results = halved["info"], halved["results"]
    at1 = {rid: _chunk_end_eval(results, rid, 1) for rid in info.index}
    ranked = sorted(at1, key=at1.__getitem__)
    at2 = {rid: _chunk_end_eval(results, rid, 2) for rid in ranked[:2]}  # rung 1: the best 2 of 4 go on
    best, second = sorted(at2, key=at2.__getitem__)  # rung 2: the best 1 of 2
    assert list(info.index[info.status == "COMPLETED"]) == [best]
    assert info.loc[best, "completed_steps"] == 4 and pd.isna(info.loc[best, "stop_reason"])
    assert info.loc[second, "completed_steps"] == 2
    assert info.loc[second, "stop_reason"] == (
        f"pruned at chunk 2/4: eval_loss {at2[second]:.4g} not in the best 1 of 2 at this rung "
        f"(cutoff {at2[best]:.4g})"
    )
    for rid in ranked[2:]:
        assert info.loc[rid, "status"] == "STOPPED" and info.loc[rid, "completed_steps"] == 1
        assert info.loc[rid, "stop_reason"] == (
            f"pruned at chunk 1/4: eval_loss {at1[rid]:.4g} not in the best 2 of 4 at this rung "
            f"(cutoff {at1[ranked[1]]:.4g})"
        )
    ops = halved["ops"]
    stops = ops[ops.source == "early_stopping"]
    assert sorted(stops.run_id) == sorted([second, *ranked[2:]]) and set(stops.state) == {"applied"}
    said = "\n".join(halved["lines"])
    assert all(f"run {rid} pruned at chunk 1/4: eval_loss" in said for rid in ranked[2:]), said
    runs = {r["run_id"]: r for r in halved["snapshot"]["runs"]}
    assert runs[second]["pruned"] and runs[second]["stop_reason"] == info.loc[second, "stop_reason"]
    assert not runs[best]["pruned"] and runs[best]["stop_reason"] is None
    assert sum(info.completed_steps) == 4 + 2 + 1 + 1  # of 16 without early stopping


def test_survivors_equal_plain_trl(halved: dict[str, Any]) -> None:
    from rapidfire_nb.testing import tiny_create_model

    info = halved["info"]
    leaves = _group().expand(SEED)
    for rid in info.index[info.status == "COMPLETED"]:
        ref = train_plain_trl(
            leaves[rid - 1],
            tiny_create_model,
            halved["train"],
            halved["eval"],
            SEED,
            halved["root"] / f"plain-{rid}",
        )
        saved = adapter_from_folder(info.loc[rid, "checkpoint_dir"])
        assert max_abs_diff(saved, ref.final) <= TOL, f"run {rid} differs from plain TRL"


def test_a_user_resume_of_a_pruned_run_trains_it_on(halved: dict[str, Any]) -> None:
    exp, info = halved["exp"], halved["info"]
    pruned = int(info.index[(info.status == "STOPPED") & (info.completed_steps == 1)][0])
    ack = exp.resume(pruned)
    assert ack.state in ("queued", "applied"), ack
    assert exp.wait(timeout=120)
    after = exp.get_runs_info().set_index("run_id").loc[pruned]
    assert after.completed_steps >= 2  # not pruned again at chunk 1
    if after.status == "STOPPED":  # judged on arrival at rung 2 against the survivors' values there
        assert after.stop_reason.startswith("pruned at chunk 2/4: eval_loss")
        assert "of 3 at this rung" in after.stop_reason
    else:
        assert after.status == "COMPLETED"
    exp.end()


def test_after_the_kernel_the_store_still_says_why(halved: dict[str, Any]) -> None:
    """Read back by a new Experiment object (no scheduler): the reasons come from the stored ops log."""
    from rapidfire_nb import Experiment

    before = halved["info"]
    again = Experiment("halving", experiment_path=halved["root"])
    info = again.get_runs_info().set_index("run_id")
    for rid in before.index[(before.status == "STOPPED") & (before.completed_steps == 2)]:
        assert info.loc[rid, "stop_reason"] == before.loc[rid, "stop_reason"]
    whole = again.panel_snapshot()
    snap = {r["run_id"]: r for r in whole["runs"]}
    assert sum(1 for r in snap.values() if r["pruned"]) == int((info.status == "STOPPED").sum())
    pruned = sum(1 for r in snap.values() if r["pruned"])  # the header's line, from the store's meta
    saved = sum(r["total_steps"] - r["completed_steps"] for r in snap.values() if r["pruned"])
    budget = sum(r["total_steps"] for r in snap.values())
    assert saved > 0 and whole["early_stopping"] == (
        f"successive halving (η=2) on eval_loss: {pruned} pruned (saved {saved} of {budget} steps), no rung left"
    )
    again.end()
