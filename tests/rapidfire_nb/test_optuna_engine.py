"""RFOptuna on the tiny model, across a kernel restart: the header's line (trials asked / budget) in the panel
snapshot, the store's meta (what the server page reads) and ``%rapidfire``; a trial asked mid-experiment is
rebuilt from the study after the restart and continues as the same run, and the study stays within its budget
with the same trial numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import qa_dataset, qa_to_chat

pytest.importorskip("optuna")

SEED = 5
NUM_CHUNKS = 4  # 16 rows, batch 4: 4 steps, one per chunk


def _search() -> Any:
    from rapidfire_nb.automl import Range, RFLoraConfig, RFModelConfig, RFOptuna, RFSFTConfig

    config = RFModelConfig(
        model_name="tiny",
        peft_config=RFLoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(
            learning_rate=Range(1e-5, 3e-3, log=True),
            per_device_train_batch_size=4,
            num_train_epochs=1,
            max_length=48,
        ),
        formatting_func=qa_to_chat,
    )
    # no pruner: a completed trial is replaced while the budget lasts (trial 2 is asked when run 1 completes)
    return RFOptuna(config, "SFT", n_initial=2, budget=3, sampler="random", pruner=None, seed=SEED)


def _trials(folder: Path) -> dict[int, str]:
    import optuna

    study = optuna.load_study(study_name="rapidfire", storage=f"sqlite:///{folder / 'optuna.db'}")
    return {t.number: t.state.name for t in study.trials}


def test_an_added_trial_continues_after_a_restart_within_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernel_scheduler import RunStatus
    from rapidfire_nb import Experiment
    from rapidfire_nb.experiment.recorder import Recorder
    from rapidfire_nb.magic import _status
    from rapidfire_nb.server.manager import ExperimentsManager
    from rapidfire_nb.store import Store
    from rapidfire_nb.testing import tiny_create_model

    train, evald = qa_dataset(16, seed=0), qa_dataset(6, seed=1)
    exp = Experiment("optuna", experiment_path=tmp_path)
    first: list[str] = []
    exp.on_message(first.append)
    stopped: list[int] = []
    on_run = Recorder.on_run

    def stop_the_added_trial(self: Recorder, snap: Any) -> None:  # the scheduler thread, after its chunk 1
        on_run(self, snap)
        if snap.run_id == 3 and snap.segments_done == 1 and snap.status is RunStatus.ONGOING and not stopped:
            stopped.append(exp.session.submit("stop", 3, source="api").run_id)

    monkeypatch.setattr(Recorder, "on_run", stop_the_added_trial)
    exp.run_fit(_search(), tiny_create_model, train, evald, num_chunks=NUM_CHUNKS, seed=SEED, background=True)
    assert exp.wait(timeout=300)
    monkeypatch.setattr(Recorder, "on_run", on_run)
    assert stopped == [3]
    assert any("run 3: Optuna trial 2 joins the rotation" in s for s in first), first
    line = "Optuna: 3 of 3 trials asked · 0 pruned · 1 running"
    assert exp.panel_snapshot()["early_stopping"] == line
    before = {r["run_id"]: r for r in exp.store.runs()}
    assert [before[r]["status"] for r in (1, 2, 3)] == ["COMPLETED", "COMPLETED", "STOPPED"]
    assert before[3]["source"] == "trial" and before[3]["completed_steps"] == 1
    fingerprint = exp.session.spec(3).fingerprint()
    exp.end()
    folder = tmp_path / "optuna"
    assert _trials(folder) == {0: "COMPLETE", 1: "COMPLETE", 2: "RUNNING"}
    with Store(folder, read_only=True) as store:  # what the server page and a restarted kernel read
        assert store.get_meta("added_runs") == {"3": {"source": "trial", "trial": 2}}
        assert store.get_meta("early_stopping")["trials"] == 3
    assert ExperimentsManager(tmp_path).snapshot("optuna")["early_stopping"] == line

    again = Experiment("optuna", experiment_path=tmp_path)  # a new kernel (the same process)
    assert again.panel_snapshot()["early_stopping"] == line  # before run_fit: the store's
    said: list[str] = []
    again.on_message(said.append)
    again.run_fit(
        _search(), tiny_create_model, train, evald, num_chunks=NUM_CHUNKS, seed=SEED, background=True
    )
    assert again.wait(timeout=300)
    three = again.session.scheduler.run_snapshot(3)
    assert three is not None and (three.status, three.step) == (RunStatus.STOPPED, 1)  # as it was left
    assert three.spec.fingerprint() == fingerprint  # rebuilt from the trial's parameters in the study
    assert any("run 3 stays STOPPED at step 1" in s for s in said), said
    assert again.panel_snapshot()["early_stopping"] == line
    again.resume(3)
    assert again.wait(timeout=300)
    after = {r["run_id"]: r for r in again.store.runs()}
    assert sorted(after) == [1, 2, 3] and after[3]["status"] == "COMPLETED"
    assert after[3]["completed_steps"] == after[3]["total_steps"] == 4
    assert _trials(folder) == {0: "COMPLETE", 1: "COMPLETE", 2: "COMPLETE"}  # the same trials, within budget
    done = "Optuna: 3 of 3 trials asked · 0 pruned · 0 running"
    assert again.panel_snapshot()["early_stopping"] == done
    info = again.get_runs_info()
    assert "stop_reason" in info.columns
    printed: list[str] = []
    monkeypatch.setattr("builtins.print", lambda *a, **k: printed.append(" ".join(map(str, a))))
    _status(again)  # %rapidfire status
    assert printed == [f"[rapidfire] {done}"]
    again.end()
