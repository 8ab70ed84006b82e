"""The panel in a real JupyterLab + Chromium for issue 37: a panel reopened after the experiment's kernel ended it
(``Experiment(name).panel()`` in a kernel with no ``run_fit``: what a restart leaves) has the hyperparameter
columns and every button disabled with the page's hint; a GRPO panel plots and ranks by the reward.

Screenshots go to ``artifacts/browser/``; with ``RF_UPDATE_SCREENSHOTS=1`` also to
``docs/screenshots/panel-reopened.png`` and ``docs/screenshots/panel-grpo.png``.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts" / "browser"

pytestmark = pytest.mark.browser

SFT_CELL = """\
import tempfile
from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset
root = tempfile.mkdtemp()
config = RFModelConfig(
    model_name="tiny",
    peft_config=RFLoraConfig(r=List([4, 8]), lora_alpha=16, target_modules=["q_proj", "v_proj"]),
    training_args=RFSFTConfig(learning_rate=List([1e-3, 2e-4]), per_device_train_batch_size=4, max_steps=4,
                              logging_steps=1, eval_strategy="steps", eval_steps=2),
)
exp = Experiment("sft-sweep", experiment_path=root)
exp.quiet = True
exp.run_fit(RFGridSearch(configs=config, trainer_type="SFT"), tiny_create_model, tiny_sft_dataset(16),
            tiny_sft_dataset(4, seed=1), num_chunks=2, background=False)
exp.end()
"""
REOPEN_CELL = """\
again = Experiment("sft-sweep", experiment_path=root)  # what a restarted kernel's first cell does
again.panel()
"""
GRPO_CELL = """\
from rapidfire_nb.automl import RFGRPOConfig
from rapidfire_nb.testing import length_reward, tiny_grpo_dataset
grpo = Experiment("grpo-demo", experiment_path=root)
grpo.quiet = True
grpo.run_fit(RFGridSearch(RFModelConfig(
    model_name="tiny", peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    reward_funcs=[length_reward],
    training_args=RFGRPOConfig(learning_rate=List([1e-2, 1e-3]), temperature=List([1.0, 0.6]), beta=0.0,
                               per_device_train_batch_size=4, per_device_eval_batch_size=4, num_generations=4,
                               max_completion_length=8, max_steps=4, logging_steps=1)), "GRPO"),
    tiny_create_model, tiny_grpo_dataset(16), tiny_grpo_dataset(4, seed=1), num_chunks=2, seed=3)
"""


def _keep(shot: Path, name: str) -> None:
    if os.environ.get("RF_UPDATE_SCREENSHOTS") == "1":
        dest = REPO / "docs" / "screenshots"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, dest / name)


def _column(panel: Any, key: str) -> list[tuple[int, bool, str]]:
    """(run id, starred, text of the column ``key``) of every run row."""
    rows = panel.evaluate(
        """(el, key) => { const ths = [...el.querySelectorAll('thead th')];
            const i = ths.findIndex(t => t.dataset.sortKey === key);
            return [...el.querySelectorAll('tr.rf-run-row')].map(tr => [Number(tr.dataset.runId),
              tr.dataset.best === 'true', i < 0 ? null : tr.children[i].textContent]); }""",
        key,
    )
    return [(int(r), bool(b), str(t)) for r, b, t in rows]


def test_reopened_and_grpo_panels(lab: Any) -> None:
    page = lab.page
    lab.open_notebook("kinds_demo.ipynb", [SFT_CELL, REOPEN_CELL, GRPO_CELL], timeout=90)
    lab.run_cell(0)
    lab.run_cell(1)
    panels = page.locator("[data-rf-panel]")
    panels.first.wait_for(timeout=180_000)
    reopened = panels.first
    page.wait_for_selector('[data-rf-panel] tr[data-run-id="4"][data-status="COMPLETED"]', timeout=30_000)
    heads = reopened.evaluate("el => [...el.querySelectorAll('thead th')].map(t => t.dataset.sortKey || '')")
    assert {"hp:learning_rate", "hp:lora.r", "loss", "eval_loss"} <= set(heads), heads
    lr = _column(reopened, "hp:learning_rate")
    assert [t for _, _, t in lr] == ["1e-3", "2e-4", "1e-3", "2e-4"] or len({t for _, _, t in lr}) == 2, lr
    assert reopened.locator("button[data-op]:enabled").count() == 0  # nothing here would apply an op
    assert (
        reopened.get_attribute("data-closed") == "true"
    )  # its notice line says read-only, not "ops apply..."
    tip = reopened.locator('tr[data-run-id="1"] button[data-op="clone"]').get_attribute("title") or ""
    assert "the experiment was ended; to continue: Experiment(name), then run_fit" in tip, tip
    assert "experiment ended — 4/4 runs completed; re-run Experiment(...) and run_fit(...)" in (
        reopened.locator(".rf-progress").inner_text()
    )
    time.sleep(1.0)  # plotly draws on the next frames
    page.mouse.move(2, 2)
    _keep(lab.screenshot("panel_reopened.png", reopened), "panel-reopened.png")

    lab.run_cell(2)
    page.wait_for_function("() => document.querySelectorAll('[data-rf-panel]').length === 2", timeout=120_000)
    grpo = panels.nth(1)
    page.wait_for_function(
        """() => { const p = document.querySelectorAll('[data-rf-panel]')[1];
            const rows = p.querySelectorAll('tr.rf-run-row');
            return rows.length === 4 && [...rows].every(r => r.dataset.status === 'COMPLETED'); }""",
        timeout=180_000,
    )
    assert grpo.get_attribute("data-closed") == "false"  # its kernel trains it: clones are legal
    # the four runs train as one pack (GRPO packs on a CPU): they end within moments of their first eval_reward, so
    # the cards may switch to it just after the last status (they follow the logged metric names)
    page.wait_for_function(
        """() => [...document.querySelectorAll('[data-rf-panel]')[1].querySelectorAll('.rf-card')]
            .map(c => c.dataset.metric).join() === 'reward,eval_reward'""",
        timeout=30_000,
    )
    cards = grpo.evaluate("el => [...el.querySelectorAll('.rf-card')].map(c => c.dataset.metric)")
    assert cards == ["reward", "eval_reward"], cards
    assert grpo.locator("select[data-rf-best-by]").input_value() == "eval_reward"
    heads = grpo.evaluate("el => [...el.querySelectorAll('thead th')].map(t => t.dataset.sortKey || '')")
    assert "m:reward" in heads and "m:eval_reward" in heads and "loss" not in heads, heads
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-rf-panel]')[1].querySelectorAll('tr.rf-run-row')]"
        ".some(r => r.dataset.best === 'true')",
        timeout=10_000,
    )
    deadline = time.monotonic() + 20  # the final eval's values reach the store a moment after COMPLETED
    while any(t in ("–", "-") for _, _, t in _column(grpo, "m:eval_reward")) and time.monotonic() < deadline:
        time.sleep(0.2)
    rows = _column(grpo, "m:eval_reward")
    values = {rid: float(t) for rid, _, t in rows}
    top = max(values.values())
    starred = [rid for rid, best, _ in rows if best]
    assert starred == [min(r for r, v in values.items() if v == top)], (
        rows
    )  # highest eval_reward, ties: lowest id
    time.sleep(1.0)
    page.mouse.move(2, 2)
    _keep(lab.screenshot("panel_grpo.png", grpo), "panel-grpo.png")
