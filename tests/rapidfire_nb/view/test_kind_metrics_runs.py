"""Metrics by trainer kind on real tiny GRPO and DPO runs (issue 37 item 2): the snapshot's default plots, table
columns and best run, ``end()``'s summary, ``get_runs_info()`` and the static copy use the kind's metrics, read from
what TRL really logged (GRPO ``reward``/``eval_reward``, highest first; DPO ``rewards/accuracies``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFDPOConfig, RFGridSearch, RFGRPOConfig, RFLoraConfig, RFModelConfig
from rapidfire_nb.errors import ConfigError
from rapidfire_nb.panel.static import render_html, render_text
from rapidfire_nb.testing import length_reward, tiny_create_model, tiny_dpo_dataset, tiny_grpo_dataset
from rapidfire_nb.view import best_run

LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])


def _grpo_group() -> RFGridSearch:
    args = dict(
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        beta=0.0,
        logging_steps=1,
        max_steps=2,
    )
    return RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(**LORA),
            reward_funcs=[length_reward],
            training_args=RFGRPOConfig(
                learning_rate=List([1e-2, 1e-3]), temperature=List([1.0, 0.5]), **args
            ),
        ),
        "GRPO",
    )


def _fit(root: Path, name: str, group: Any, train: Any, evald: Any, **kw: Any) -> dict[str, Any]:
    exp = Experiment(name, experiment_path=root)
    lines: list[str] = []
    exp.on_message(lines.append)
    exp.run_fit(group, tiny_create_model, train, evald, num_chunks=1, seed=1, background=False, **kw)
    out = {"snap": exp.panel_snapshot(), "info": exp.get_runs_info(), "points": exp.store.metrics_since(0)[0]}
    exp.end()
    out["lines"] = lines
    return out


@pytest.fixture(scope="module")
def grpo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("grpo_kind")
    return _fit(root, "grpo", _grpo_group(), tiny_grpo_dataset(8, seed=0), tiny_grpo_dataset(4, seed=1))


@pytest.fixture(scope="module")
def dpo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("dpo_kind")
    group = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(**LORA),
            training_args=RFDPOConfig(
                beta=List([0.1, 0.5]),
                learning_rate=1e-3,
                per_device_train_batch_size=4,
                max_steps=2,
                max_length=48,
                logging_steps=1,
            ),
        ),
        "DPO",
    )
    return _fit(root, "dpo", group, tiny_dpo_dataset(8, seed=0), tiny_dpo_dataset(4, seed=1))


def test_grpo_snapshot_plots_and_ranks_by_reward_highest_first(grpo: dict[str, Any]) -> None:
    snap = grpo["snap"]
    names = set(snap["metric_names"])
    assert {"reward", "reward_std", "rewards/length_reward/mean", "eval_reward"} <= names  # TRL's own names
    assert snap["panel_metrics"] == ["reward", "eval_reward"]
    assert snap["best_by"] == {"metric": "eval_reward", "mode": "max"}
    rewards = {r["run_id"]: r["metrics"]["eval_reward"] for r in snap["runs"]}
    top = max(rewards.values())
    assert best_run(snap["runs"], "eval_reward", "max") == (
        min(k for k, v in rewards.items() if v == top),
        top,
    )
    # GRPO's losses (0.0 in training, ~1e-9 at evaluation) are not shown; rewards are
    assert [r["metrics"]["loss"] for r in snap["runs"]] == [0.0] * 4
    assert all(abs(r["metrics"]["eval_loss"]) < 1e-6 for r in snap["runs"])
    assert snap["metric_columns"] == ["reward", "eval_reward"]


def test_grpo_end_summary_names_the_reward(grpo: dict[str, Any]) -> None:
    snap = grpo["snap"]
    best_id, value = best_run(snap["runs"], "eval_reward", "max")  # type: ignore[misc]
    summary = [line for line in grpo["lines"] if "ended:" in line]
    assert summary, grpo["lines"]
    assert re.search(
        rf"best eval_reward {re.escape(f'{value:#.4g}'.rstrip('.'))} \(run {best_id}\)", summary[-1]
    )
    assert "eval_loss" not in summary[-1]


def test_grpo_runs_info_has_the_reward_and_the_ranking(grpo: dict[str, Any]) -> None:
    info = grpo["info"]
    assert "reward" in info.columns and "eval_reward" in info.columns
    best_id, _ = best_run(grpo["snap"]["runs"], "eval_reward", "max")  # type: ignore[misc]
    assert info.attrs["best_by"] == {"metric": "eval_reward", "mode": "max", "run_id": best_id}


def test_grpo_static_copy_draws_rewards_and_stars_the_best(grpo: dict[str, Any]) -> None:
    snap = grpo["snap"]
    html = render_html(snap, grpo["points"])
    assert 'alt="reward by optimizer step"' in html and 'alt="eval_reward by optimizer step"' in html
    assert 'alt="loss by optimizer step"' not in html
    best_id, _ = best_run(snap["runs"], "eval_reward", "max")  # type: ignore[misc]
    assert re.search(rf'<tr data-run-id="{best_id}"[^>]*>.*?run {best_id}</b> ★', html)
    assert ">Reward</th>" in html and ">Eval reward</th>" in html
    assert "eval_reward " in render_text(snap)


def test_dpo_ranks_by_the_reward_accuracy(dpo: dict[str, Any]) -> None:
    snap = dpo["snap"]
    assert {"rewards/accuracies", "rewards/margins", "eval_rewards/accuracies"} <= set(snap["metric_names"])
    assert snap["panel_metrics"] == ["loss", "eval_rewards/accuracies"]
    assert snap["best_by"] == {"metric": "eval_rewards/accuracies", "mode": "max"}
    assert "loss" in snap["metric_columns"] and "eval_rewards/accuracies" in snap["metric_columns"]
    assert dpo["info"].attrs["best_by"]["metric"] == "eval_rewards/accuracies"
    assert any("best eval_rewards/accuracies" in line for line in dpo["lines"]), dpo["lines"]


def test_run_fit_choice_of_plots_and_ranking(tmp_path: Path) -> None:
    exp = Experiment("chosen", experiment_path=tmp_path)
    group, train = _grpo_group(), tiny_grpo_dataset(8, seed=0)
    for kw, field in (
        ({"panel_metrics": ["reward", "eval_loss2"]}, "panel_metrics"),
        ({"best_by": "accuracy"}, "best_by"),
        ({"panel_metrics": "reward"}, "panel_metrics"),
    ):
        with pytest.raises(ConfigError, match=field):  # before anything loads or trains
            exp.run_fit(group, tiny_create_model, train, num_chunks=1, background=False, **kw)
    assert exp.store.runs() == []
    exp.end()
