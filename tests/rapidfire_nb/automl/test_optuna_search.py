"""RFOptuna as a search and as an early-stopping policy, driven by hand (no training): trials asked from the
List/Range knobs, pruned at chunk ends, replaced while the budget lasts, the study on disk, a restart gets the
same runs back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("optuna")

from kernel_scheduler import ChunkResult, RunState, RunStatus  # noqa: E402
from rapidfire_nb.automl import List, Range, RFModelConfig, RFOptuna, RFSFTConfig  # noqa: E402
from rapidfire_nb.errors import ConfigError  # noqa: E402

ON = RunStatus.ONGOING


def _search(tmp: Path | None = None, **kw: Any) -> RFOptuna:
    config = RFModelConfig(
        model_name="tiny",
        training_args=RFSFTConfig(
            learning_rate=Range(1e-5, 1e-2, log=True), per_device_train_batch_size=List([2, 4]), max_steps=8
        ),
    )
    args = {"n_initial": 4, "budget": 6, "pruner": "hyperband", "seed": 3, **kw}
    search = RFOptuna(config, "SFT", **args)
    if tmp is not None:
        search.bind(tmp, num_chunks=4)
    return search


def test_the_initial_trials_come_from_the_knobs(tmp_path: Path) -> None:
    search = _search(tmp_path)
    leaves = search.expand(42)
    assert len(leaves) == 4
    for leaf in leaves:
        hp = leaf.hparams()
        assert 1e-5 <= hp["learning_rate"] <= 1e-2 and hp["per_device_train_batch_size"] in (2, 4)
    assert (tmp_path / "optuna.db").exists()
    assert search.progress() == {
        "label": search.describe(),
        "kind": "search",
        "name": "Optuna",
        "trials": 4,
        "budget": 6,
        "pruned": 0,
        "running": 4,
    }


def test_pruned_trials_are_stopped_and_replaced_until_the_budget(tmp_path: Path) -> None:
    search = _search(n_initial=8, budget=10)
    search.bind(tmp_path, num_chunks=8)
    search.expand(42)
    states = [RunState(r, ON, 0, 8) for r in range(1, 9)]
    pruned, new_ids = [], iter(range(9, 20))
    for chunk in (1, 2, 3):
        for run_id in sorted(search._trials):
            # run r's loss is r (the new trials' 0.5): Optuna's hyperband pruner stops worse ones at its rungs
            value = float(run_id) if run_id <= 8 else 0.5
            d = search.on_chunk(ChunkResult(run_id, chunk, {"eval_loss": value}), states)
            for stop in d.stops:
                assert stop.reason.startswith(
                    f"pruned by Optuna's hyperband pruner at chunk {chunk}/8: eval_loss"
                )
                pruned.append(stop.run_id)
            for new in d.new_runs:
                assert new.info["source"] == "trial"
                search.on_added(next(new_ids), new)
    assert pruned, "nothing was pruned"
    assert len(search.study.trials) == 10  # 2 replacements asked, then the budget is spent
    states_by_number = {t.number: t.state.name for t in search.study.trials}
    assert list(states_by_number.values()).count("PRUNED") == len(pruned)
    progress = search.progress()  # counted from what the search told the study, as the study says
    assert (progress["trials"], progress["budget"], progress["pruned"]) == (10, 10, len(pruned))
    assert progress["running"] == list(states_by_number.values()).count("RUNNING")


def test_a_completed_run_is_told_and_the_budget_is_respected(tmp_path: Path) -> None:
    search = _search(tmp_path, budget=5, pruner=None)
    search.expand(42)
    runs = [RunState(r, ON, 3, 4) for r in range(1, 5)]
    d = search.on_chunk(ChunkResult(1, 4, {"eval_loss": 1.5}, final=True), runs)
    assert len(d.new_runs) == 1  # trial 5 of 5
    search.on_added(5, d.new_runs[0])
    d = search.on_chunk(ChunkResult(2, 4, {"eval_loss": 2.5}, final=True), runs)
    assert not d.new_runs  # the budget is spent
    done = [t for t in search.study.trials if t.state.name == "COMPLETE"]
    assert sorted(t.value for t in done) == [1.5, 2.5]


def test_a_restart_gets_the_added_trials_back_and_fails_the_orphans(tmp_path: Path) -> None:
    """Trials asked mid-experiment are rebuilt from the study's parameters; a RUNNING trial of no run (asked as
    the kernel died) is told FAIL and counts against the budget."""
    search = _search(tmp_path, budget=7, pruner=None)
    search.expand(42)
    runs = [RunState(r, ON, 3, 4) for r in range(1, 5)]
    d = search.on_chunk(ChunkResult(1, 4, {"eval_loss": 1.5}, final=True), runs)
    search.on_added(5, d.new_runs[0])  # trial 4 -> run 5
    added_spec = d.new_runs[0].spec
    search._replace()  # trial 5: asked, and the kernel died before its run was recorded
    again = _search(tmp_path, budget=7, pruner=None)
    again.expand(42)
    rebuilt = again.restore_added({5: {"source": "trial", "trial": 4}, 9: {"source": "trial", "trial": 99}})
    assert list(rebuilt) == [5] and rebuilt[5].fingerprint() == added_spec.fingerprint()
    assert sorted(again._trials) == [2, 3, 4, 5]  # run 1's trial is complete; run 5's is running again
    states = {t.number: t.state.name for t in again.study.trials}
    assert states == {0: "COMPLETE", 1: "RUNNING", 2: "RUNNING", 3: "RUNNING", 4: "RUNNING", 5: "FAIL"}
    assert again.progress()["trials"] == 6 and again.progress()["running"] == 4
    d = again.on_chunk(ChunkResult(5, 4, {"eval_loss": 0.5}, final=True), runs)
    assert len(d.new_runs) == 1  # trial 6: the last of the budget of 7
    again.on_added(6, d.new_runs[0])
    assert not again.on_chunk(ChunkResult(2, 4, {"eval_loss": 2.5}, final=True), runs).new_runs
    assert len(again.study.trials) == 7


def test_a_restart_gets_the_same_runs_back(tmp_path: Path) -> None:
    first = [leaf.fingerprint() for leaf in _search(tmp_path).expand(42)]
    again = [leaf.fingerprint() for leaf in _search(tmp_path).expand(42)]
    assert again == first


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"objective": "eval_loss"}, "objective must be 'minimize:<metric>'"),
        ({"sampler": "grid"}, "sampler must be one of 'tpe', 'cmaes', 'random'"),
        ({"pruner": "asha"}, "pruner must be one of 'median', 'hyperband', None"),
        ({"n_initial": 0}, "n_initial must be an integer >= 1"),
        ({"budget": 2}, "budget must be an integer >= 4"),
        ({"granularity": "step"}, "granularity must be one of 'chunk', 'epoch'"),
    ],
)
def test_bad_arguments(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _search(**kw)


def test_a_trial_that_repeats_a_tried_config_is_not_trained_again_and_says_so(tmp_path: Path) -> None:
    """Optuna's samplers may ask for parameters tried already (optuna/optuna#2021): a 2-config space, 2 initial
    trials, budget 6. Each repeat is told the earlier trial's result without a run, a note names both trials, and
    once every config was tried the search stops asking (a note says why) instead of training a config twice."""
    config = RFModelConfig(
        model_name="tiny", training_args=RFSFTConfig(learning_rate=List([1e-4, 1e-3]), max_steps=8)
    )
    search = RFOptuna(config, "SFT", n_initial=2, budget=6, sampler="random", pruner=None, seed=0)
    search.bind(tmp_path, num_chunks=4)
    leaves = search.expand(42)
    runs = [RunState(r, ON, 3, 4) for r in (1, 2)]
    trained = {leaf.hparams()["learning_rate"] for leaf in leaves}
    notes: list[str] = []
    new_ids = iter(range(3, 10))
    for run_id, value in ((1, 1.5), (2, 2.5)):
        d = search.on_chunk(ChunkResult(run_id, 4, {"eval_loss": value}, final=True), runs)
        notes += d.notes
        for new in d.new_runs:
            lr = new.leaf.hparams()["learning_rate"]
            assert lr not in trained, f"config lr={lr} trained twice"
            trained.add(lr)
            search.on_added(next(new_ids), new)
    by_number = {t.number: t for t in search.study.trials}
    repeats = [n for n in by_number if n >= 2]
    assert repeats, "no trial repeated a config: the test proves nothing"
    for n in repeats:
        t = by_number[n]
        first = next(o for o in by_number.values() if o.number < 2 and o.params == t.params)
        assert t.state.name in ("COMPLETE", "FAIL")  # FAIL: its config's first trial was still training then
        if t.state.name == "COMPLETE":
            assert first.state.name == "COMPLETE" and t.value == first.value
    assert len(search.study.trials) <= 6
    assert any(
        f"RFOptuna: trial {repeats[0]} asked for the config of trial " in note and "not trained twice" in note
        for note in notes
    ), notes


def test_initial_trials_that_repeat_a_config_train_and_a_note_says_so(tmp_path: Path) -> None:
    """A fresh-user pass: with 2 configs and n_initial=4, runs 2 and 3 trained the same config with no word."""
    config = RFModelConfig(
        model_name="tiny", training_args=RFSFTConfig(learning_rate=List([1e-4, 1e-3]), max_steps=8)
    )
    search = RFOptuna(config, "SFT", n_initial=4, budget=6, sampler="random", pruner=None, seed=0)
    search.bind(tmp_path, num_chunks=4)
    leaves = search.expand(42)
    lrs = [leaf.hparams()["learning_rate"] for leaf in leaves]
    assert len(lrs) == 4 and len(set(lrs)) < 4  # 2 configs, 4 trials: repeats
    runs = [RunState(r, ON, 0, 4) for r in range(1, 5)]
    notes = list(search.on_change(runs, runs).notes)
    repeats = [i for i in range(1, 4) if lrs[i] in lrs[:i]]
    assert len(notes) == len(repeats), notes
    first = lrs.index(lrs[repeats[0]])
    assert notes[0].startswith(
        f"RFOptuna: trial {repeats[0]} (run {repeats[0] + 1}) asked for the config of trial {first} "
        f"(run {first + 1}) again; both train"
    ), notes
    assert not search.on_change(runs, runs).notes  # said once
