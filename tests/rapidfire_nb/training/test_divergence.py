"""A run whose loss, grad norm or eval loss becomes NaN/inf ends FAILED ("diverged at step N: loss is NaN"),
everywhere a status shows, its NaN never shown as 0, its neighbour untouched and exact (issue 12, item 1).

Before: the diverged run (full fine-tuning, ``optim="sgd"``, ``learning_rate=1e30``) ended COMPLETED with
``loss 0.0`` from step 2 on — transformers' ``logging_nan_inf_filter`` replaces the NaN and rapidfire_nb logs every
step — so, sorted by loss, it looked like the best run.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFModelConfig, RFSFTConfig
from rapidfire_nb.testing import tiny_create_model
from rapidfire_nb.training.divergence import Diverged, check_logs
from tests.helpers import formatted, qa_dataset, qa_to_chat, result_series

ARGS = {
    "optim": "sgd",
    "max_grad_norm": 0.0,
    "per_device_train_batch_size": 2,
    "max_steps": 4,
    "max_length": 32,
}


def _group(*lrs: float, **extra: Any) -> RFGridSearch:
    configs = [
        RFModelConfig(
            model_name="tiny",
            peft_config=None,
            training_args=RFSFTConfig(learning_rate=lr, **ARGS, **extra),
            formatting_func=qa_to_chat,
        )
        for lr in lrs
    ]
    return RFGridSearch(List(configs), "SFT")


def _plain_losses(exp: Experiment, run_id: int, train: Any, tmp: Path) -> list[tuple[int, float]]:
    """The same run as a plain ``SFTTrainer(...).train()`` (full fine-tuning, no chunks)."""
    from trl import SFTTrainer

    from rapidfire_nb.spec import build_training_args

    spec = exp.run_snapshot(run_id).spec  # type: ignore[union-attr]
    args, _ = build_training_args(spec, output_dir=str(tmp), default_seed=0)
    model, tok = tiny_create_model(spec.model_config_dict())
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=formatted(train, qa_to_chat), processing_class=tok
    )
    trainer.train()
    return [(int(h["step"]), float(h["loss"])) for h in trainer.state.log_history if "loss" in h]


def test_a_diverged_run_fails_and_shows_no_number_its_neighbour_stays_exact(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train, evals = qa_dataset(8), qa_dataset(4, seed=1)
    lines: list[str] = []
    exp = Experiment("diverged")
    exp.on_message(lines.append)
    exp.run_fit(_group(1e30, 1e-3), tiny_create_model, train, evals, num_chunks=2, seed=0)
    reason = "diverged at step 2: loss is NaN"
    info = exp.get_runs_info().set_index("run_id")
    assert (info.loc[1, "status"], info.loc[1, "error"], info.loc[1, "completed_steps"]) == (
        "FAILED",
        reason,
        1,
    )
    assert info.loc[2, "status"] == "COMPLETED"
    results = exp.get_results()
    mine = results[results.run_id == 1]
    assert list(mine.step) == [1], "nothing of the NaN step was recorded"
    assert math.isfinite(mine.loss.iloc[0]) and mine.loss.iloc[0] > 1.0
    assert (results.loss != 0.0).all(), "no loss shown as 0"
    assert f"run 1 · FAILED: {reason}" in [line.removeprefix("[rapidfire] ") for line in lines]
    snap = {r["run_id"]: r for r in exp.panel_snapshot()["runs"]}
    assert (snap[1]["status"], snap[1]["error"]) == ("FAILED", reason) and snap[1]["loss"] != 0.0
    assert "clone" in snap[1]["legal_ops"] and "resume" not in snap[1]["legal_ops"]
    exp.end()
    acc = EventAccumulator(str(exp.path / "tensorboard" / "run-1"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == [1]
    assert not (exp.path / "runs" / "1" / "final").exists(), "no NaN weights saved as the run's result"
    # the neighbour: per-step losses equal a plain TRL run's (0.0 on CPU fp32)
    assert result_series(results, 2, "loss") == _plain_losses(exp, 2, train, tmp_path)


def test_with_the_nan_filter_off_the_logged_nan_ends_the_run() -> None:
    exp = Experiment("diverged-unfiltered")
    exp.quiet = True
    exp.run_fit(
        _group(1e30, logging_nan_inf_filter=False), tiny_create_model, qa_dataset(8), num_chunks=2, seed=0
    )
    row = exp.get_runs_info().iloc[0]
    assert (row.status, row.error) == ("FAILED", "diverged at step 2: loss is NaN")
    steps = exp.get_results().set_index("step").loss
    assert math.isfinite(steps[1]) and math.isnan(steps[2]), (
        "the logged NaN is stored as NaN, not as a number"
    )
    exp.end()


@pytest.mark.parametrize(
    "logs,reason",
    [
        ({"loss": 1.5, "grad_norm": math.inf}, "diverged at step 7: grad_norm is inf"),
        ({"eval_loss": math.nan, "eval_runtime": 0.1}, "diverged at step 7: eval_loss is NaN"),
        ({"loss": -math.inf}, "diverged at step 7: loss is -inf"),
    ],
)
def test_grad_norm_and_eval_loss_are_watched_too(logs: dict[str, float], reason: str) -> None:
    with pytest.raises(Diverged, match=f"^{reason}$"):
        check_logs(7, logs)
    check_logs(
        7, {"loss": 1.5, "grad_norm": 2.0, "eval_loss": 0.5, "entropy": math.nan}
    )  # others: not watched


def test_an_infinite_grad_norm_ends_the_run_at_its_step(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import Trainer

    original = Trainer._get_grad_norm

    def exploding(self: Any, model: Any, grad_norm: Any = None) -> Any:
        value = original(self, model, grad_norm=grad_norm)
        return math.inf if self.state.global_step == 2 else value  # the norm of step 3's gradients

    monkeypatch.setattr(Trainer, "_get_grad_norm", exploding)
    exp = Experiment("diverged-grad-norm")
    exp.quiet = True
    exp.run_fit(_group(1e-3), tiny_create_model, qa_dataset(8), num_chunks=2, seed=0)
    row = exp.get_runs_info().iloc[0]
    assert (row.status, row.error, row.completed_steps) == (
        "FAILED",
        "diverged at step 3: grad_norm is inf",
        3,
    )
    norms = exp.get_results().set_index("step").grad_norm
    assert list(norms.index) == [1, 2, 3] and norms[3] == math.inf, "recorded as logged: inf, not a number"
    exp.end()


def test_max_grad_norm_none_trains_as_no_clipping() -> None:
    configs = [
        RFModelConfig(
            model_name="tiny",
            training_args=RFSFTConfig(learning_rate=1e-3, **{**ARGS, "max_grad_norm": norm}),
            formatting_func=qa_to_chat,
        )
        for norm in (None, 0.0)
    ]
    lines: list[str] = []
    exp = Experiment("max-grad-norm-none")
    exp.on_message(lines.append)
    exp.run_fit(RFGridSearch(List(configs), "SFT"), tiny_create_model, qa_dataset(8), num_chunks=2, seed=0)
    results = exp.get_results()
    assert list(exp.get_runs_info().status) == ["COMPLETED", "COMPLETED"]
    assert result_series(results, 1, "loss") == result_series(results, 2, "loss")
    assert any("max_grad_norm=None read as max_grad_norm=0.0" in line for line in lines)
    exp.end()
