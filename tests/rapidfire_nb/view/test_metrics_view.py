"""rapidfire_nb.view.metrics_view: the trainer kind's metrics (and run_fit's choice) met with the logged values."""

from __future__ import annotations

import math
from typing import Any

import pytest

from rapidfire_nb.errors import ConfigError
from rapidfire_nb.schema.trainer_kinds import TRAINER_KINDS, check_metric_choice, metric_mode
from rapidfire_nb.view import StoreRows, final_summary, store_snapshot
from rapidfire_nb.view.metrics_view import best_run, metric_choice, metric_title, resolve_metrics


def _pick(kind: str, latest: dict[int, dict[str, float]], chosen: Any = None) -> dict[str, Any]:
    meta = {"trainer_type": kind, "panel_metrics": chosen}
    names = {n for row in latest.values() for n in row}
    return resolve_metrics(metric_choice(meta), latest, names)


def test_sft_keeps_its_losses() -> None:
    got = _pick("SFT", {1: {"loss": 2.0, "eval_loss": 2.5}, 2: {"loss": 1.0, "eval_loss": 3.0}})
    assert got == {
        "panel_metrics": ["loss", "eval_loss"],
        "metric_columns": ["loss", "eval_loss"],
        "best_by": {"metric": "eval_loss", "mode": "min"},
    }
    assert _pick("SFT", {1: {"loss": 2.0}})["best_by"]["metric"] == "loss"  # no eval set: the train loss
    assert _pick("SFT", {1: {"loss": 2.0}})["metric_columns"] == ["loss"]  # an absent column is not shown


def test_grpo_ranks_by_eval_reward_highest_first_and_hides_zero_losses() -> None:
    latest = {
        1: {"loss": 0.0, "reward": 0.5, "eval_reward": 0.25},
        2: {"loss": 0.0, "reward": 0.5, "eval_reward": 0.75},
    }
    got = _pick("GRPO", latest)
    assert got["panel_metrics"] == ["reward", "eval_reward"]
    assert got["metric_columns"] == ["reward", "eval_reward"]  # loss 0 for every run: not a column
    assert got["best_by"] == {"metric": "eval_reward", "mode": "max"}
    runs = [{"run_id": r, "status": "COMPLETED", "metrics": m} for r, m in latest.items()]
    assert best_run(runs, "eval_reward", "max") == (2, 0.75)
    assert best_run(runs, "loss", "min") == (1, 0.0)  # a tie goes to the lower id
    no_eval = _pick("GRPO", {1: {"reward": 0.5, "reward_std": 0.1}})
    assert no_eval["panel_metrics"] == ["reward", "reward_std"] and no_eval["best_by"]["metric"] == "reward"


def test_dpo_ranks_by_reward_accuracy_then_margin() -> None:
    got = _pick("DPO", {1: {"loss": 0.7, "rewards/accuracies": 0.5, "eval_rewards/accuracies": 1.0}})
    assert got["best_by"] == {"metric": "eval_rewards/accuracies", "mode": "max"}
    assert got["panel_metrics"] == ["loss", "eval_rewards/accuracies"]
    train_only = _pick("DPO", {1: {"loss": 0.7, "rewards/accuracies": 0.5, "rewards/margins": 0.1}})
    assert train_only["best_by"]["metric"] == "rewards/accuracies"
    assert train_only["panel_metrics"] == ["loss", "rewards/accuracies"]
    assert train_only["metric_columns"] == ["loss", "rewards/accuracies", "rewards/margins"]


def test_before_anything_is_logged_the_plots_columns_show() -> None:
    assert _pick("GRPO", {})["metric_columns"] == ["reward", "eval_reward"]
    assert _pick("SFT", {})["metric_columns"] == ["loss", "eval_loss"]


def test_run_fits_choice_overrides_the_kind() -> None:
    got = _pick("GRPO", {1: {"kl": 0.1, "reward": 1.0}}, {"plots": ["kl"], "best_by": "kl"})
    assert got["panel_metrics"] == ["kl"] and got["best_by"] == {"metric": "kl", "mode": "min"}
    assert got["metric_columns"] == ["kl", "reward"]


def test_the_choice_is_checked_against_trls_names() -> None:
    assert check_metric_choice("GRPO", ["reward", "rewards/my_func/mean"], "eval_reward") == (
        ("reward", "rewards/my_func/mean"),
        "eval_reward",
    )
    assert check_metric_choice("SFT", None, "eval_rougeL") == (
        None,
        "eval_rougeL",
    )  # compute_metrics' own names
    for kind, plots, best, field in (
        ("GRPO", ["reward", "accuracy"], None, "panel_metrics"),
        ("GRPO", None, "eval_rougeL", "best_by"),  # GRPO takes no compute_metrics
        ("DPO", None, "reward", "best_by"),
        ("SFT", "loss", None, "panel_metrics"),
        ("SFT", ["loss", "eval_loss", "epoch"], None, "panel_metrics"),
    ):
        with pytest.raises(ConfigError, match=field):
            check_metric_choice(kind, plots, best)


def test_every_default_is_a_name_its_kind_logs() -> None:
    for kind, facts in TRAINER_KINDS.items():
        m = facts.metrics
        for name in (*(n for p in m.plots for n in p), *m.columns, *m.best_by):
            check_metric_choice(kind, [name], name)  # no ConfigError
    assert [
        metric_mode(n) for n in ("eval_loss", "eval_reward", "rewards/accuracies", "rewards/margins", "kl")
    ] == [
        "min",
        "max",
        "max",
        "max",
        "min",
    ]
    assert [metric_title(n) for n in ("loss", "eval_loss", "reward", "eval_rewards/accuracies")] == [
        "Loss",
        "Eval loss",
        "Reward",
        "Eval rewards/accuracies",
    ]


def test_store_snapshot_and_summary_of_a_grpo_store() -> None:
    rows = StoreRows(
        meta={"trainer_type": "GRPO", "created_at": 1.0, "metric_names": ["eval_reward", "loss", "reward"]},
        runs=[
            {"run_id": 1, "status": "COMPLETED", "hparams": {}},
            {"run_id": 2, "status": "COMPLETED", "hparams": {}},
        ],
        latest={
            1: {"loss": 0.0, "reward": 0.5, "eval_reward": 0.5},
            2: {"loss": 0.0, "reward": 0.5, "eval_reward": 0.75},
        },
    )
    snap = store_snapshot("g", rows, writer_alive=False, now=2.0)
    assert snap["runs"][1]["metrics"] == {"reward": 0.5, "eval_reward": 0.75, "loss": 0.0}
    assert snap["best_by"]["metric"] == "eval_reward"
    assert "best eval_reward 0.7500 (run 2)" in final_summary(snap)
    assert "eval_loss" not in final_summary(snap) and not math.isnan(snap["runs"][0]["metrics"]["reward"])


def test_text_progress_lines_carry_the_kinds_metrics() -> None:
    from rapidfire_nb.view import format_chunk_line

    run = {
        "run_id": 2,
        "status": "ONGOING",
        "chunks_done": 1,
        "loss": 0.0,
        "metrics": {"loss": 0.0, "reward": 0.75},
    }
    assert format_chunk_line(run, num_chunks=2) == "run 2  chunk 1/2  loss 0  reward 0.75"


def test_a_plots_column_waits_for_the_first_chunk_before_it_is_dropped() -> None:
    choice = metric_choice({"trainer_type": "SFT"})
    early = resolve_metrics(choice, {1: {"loss": 2.0}}, ["loss"], settled=False)
    assert early["metric_columns"] == [
        "loss",
        "eval_loss",
    ]  # no eval yet in chunk 1: the column keeps its place
    assert resolve_metrics(choice, {1: {"loss": 2.0}}, ["loss"], settled=True)["metric_columns"] == ["loss"]
    grpo = resolve_metrics(
        metric_choice({"trainer_type": "GRPO"}), {1: {"loss": 0.0, "reward": 1.0}}, [], False
    )
    assert grpo["metric_columns"] == ["reward", "eval_reward"]  # a zero loss goes at once, eval_reward waits


def test_an_eval_name_without_a_compute_metrics_is_refused() -> None:
    """A fresh-user pass: ``best_by="eval_los"`` on SFT runs without ``compute_metrics`` was accepted, and end()
    silently dropped its "best ..." part. Any ``eval_<name>`` is taken only when a run has a compute_metrics."""
    from rapidfire_nb.errors import ConfigError
    from rapidfire_nb.schema.trainer_kinds import check_metric_choice

    with pytest.raises(ConfigError, match=r"best_by: 'eval_los' is not a metric a SFT run logs"):
        check_metric_choice("SFT", None, "eval_los", user_metrics=False)
    assert check_metric_choice("SFT", None, "eval_rougeL", user_metrics=True) == (None, "eval_rougeL")
    assert (
        check_metric_choice("SFT", ["loss", "eval_loss"], "eval_loss", user_metrics=False)[1] == "eval_loss"
    )


def test_an_early_stopping_metric_the_runs_never_log_is_refused_before_training(tmp_path: Any) -> None:
    """A fresh-user pass: SuccessiveHalving(metric="eval_los") was accepted; training then only noted that no run
    logged it, and nothing was pruned."""
    from rapidfire_nb import ConfigError, Experiment
    from rapidfire_nb.automl import RFGridSearch, RFModelConfig, RFSFTConfig, SuccessiveHalving
    from rapidfire_nb.testing import tiny_create_model
    from tests.helpers import qa_dataset, qa_to_chat

    group = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            formatting_func=qa_to_chat,
            training_args=RFSFTConfig(per_device_train_batch_size=2, max_steps=4, max_length=32),
        ),
        "SFT",
    )
    built: list[int] = []

    def create(config: Any) -> Any:
        built.append(1)
        return tiny_create_model(config)

    exp = Experiment("es-typo", experiment_path=tmp_path, quiet=True)
    with pytest.raises(
        ConfigError, match=r"early_stopping's metric: 'eval_los' is not a metric a SFT run logs"
    ):
        exp.run_fit(
            group, create, qa_dataset(16), qa_dataset(4), early_stopping=SuccessiveHalving(metric="eval_los")
        )
    assert built == []


def test_a_failed_run_is_never_the_best() -> None:
    """A run whose compute_metrics failed keeps a finite eval_loss from that evaluation: it is not a result."""
    runs = [
        {"run_id": 1, "status": "COMPLETED", "eval_loss": 6.2},
        {"run_id": 2, "status": "FAILED", "eval_loss": 6.0},
        {"run_id": 3, "status": "DELETED", "eval_loss": 5.0},
    ]
    assert best_run(runs, "eval_loss", "min") == (1, 6.2)
    assert best_run(runs[1:], "eval_loss", "min") is None
