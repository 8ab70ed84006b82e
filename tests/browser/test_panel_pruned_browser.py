"""The panel in a real JupyterLab + Chromium for issue 37: runs pruned by early stopping wear a ✂ PRUNED badge
(their status stays STOPPED), the header counts them apart from the user's stops, the reason sits inline in the
Status cell (no reason row: the rows below do not move), and each pruned curve ends in a ✂ marker. A stop queued
for the training run shows STOPPING… until it applies, and Resume (its tooltip: "cancel the pending stop") cancels it.

Fed by the fake source (its stops from source ``early_stopping`` are the policy's). Screenshots go to
``artifacts/browser/``; with ``RF_UPDATE_SCREENSHOTS=1`` also to ``docs/screenshots/panel-pruned.png``.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.browser

REASON = "eval_loss 1.93 not in the best 2 of 4 at rung 1 (cutoff 1.88)"
CELL = """\
from rapidfire_nb.testing.fake_source import FakeSource
from rapidfire_nb.panel import RunPanel
source = FakeSource(4, total_steps=240, num_chunks=4, steps_per_tick=2, tick_s=0.05, eval_every=20,
                    experiment="sft-pruned")
panel = RunPanel(source)
panel
"""
PRUNE_CELL = f"""\
for rid in (2, 3):  # what the early-stopping policy submits at a rung
    source.submit_op("stop", rid, source="early_stopping", reason={REASON!r})
source.submit_op("stop", 4)  # the user's own stop
"""
SLOW_CELL = """\
slow = FakeSource(2, total_steps=4000, num_chunks=2, steps_per_tick=1, tick_s=0.01, experiment="sft-slow")
RunPanel(slow)
"""


def test_pruned_runs_are_marked_and_nothing_moves(lab: Any) -> None:
    page = lab.page
    lab.open_notebook("pruned_demo.ipynb", [CELL, PRUNE_CELL, SLOW_CELL])
    lab.run_cell(0)
    panel = page.locator("[data-rf-panel]")
    panel.wait_for(timeout=30_000)
    page.wait_for_function(
        "() => Number(document.querySelector('[data-rf-plots]').dataset.points) > 20", timeout=30_000
    )
    # run 2 has a curve before it is pruned (its ✂ marker ends it): the fake source trains runs chunk by chunk
    page.wait_for_function(
        """() => { const c = document.querySelector('[data-rf-panel] tr[data-run-id="2"] .rf-col-step');
                   return !!c && !c.textContent.trim().startsWith('0/'); }""",
        timeout=30_000,
    )
    row1 = panel.locator('tr[data-run-id="1"]')
    heights = panel.evaluate("el => [...el.querySelectorAll('tr.rf-run-row')].map(r => r.offsetHeight)")
    lab.run_cell(1)
    for rid in (2, 3, 4):
        page.wait_for_selector(
            f'[data-rf-panel] tr[data-run-id="{rid}"][data-status="STOPPED"]', timeout=30_000
        )
    for rid in (2, 3):
        row = panel.locator(f'tr[data-run-id="{rid}"]')
        assert row.get_attribute("data-pruned") is not None
        assert row.locator("[data-badge]").inner_text() == "✂ PRUNED"
        why = row.locator("[data-rf-mark-why]")
        assert why.inner_text().startswith("eval_loss 1.93") and REASON in (why.get_attribute("title") or "")
    assert panel.locator('tr[data-run-id="4"] [data-badge]').inner_text() == "STOPPED"
    assert panel.locator("tr[data-error-for]:visible").count() == 0  # no reason row pushed rows down
    counts = panel.locator("[data-rf-count]").all_inner_texts()
    assert "2 pruned" in counts and "1 stopped" in counts, counts
    after = panel.evaluate("el => [...el.querySelectorAll('tr.rf-run-row')].map(r => r.offsetHeight)")
    assert after == heights, (heights, after)  # every row kept its height
    assert row1.get_attribute("data-status") in ("NEW", "ONGOING", "COMPLETED")
    page.wait_for_function(
        """() => [...document.querySelectorAll('[data-rf-panel] .rf-plot')].some(d => (d.data || [])
            .some(t => t.meta && t.meta.pruned && t.meta.run === 2))""",
        timeout=10_000,
    )
    time.sleep(1.0)  # plotly draws on the next frames
    page.mouse.move(2, 2)
    shot = lab.screenshot("panel_pruned.png", panel.first)
    if os.environ.get("RF_UPDATE_SCREENSHOTS") == "1":
        shutil.copyfile(shot, REPO / "docs" / "screenshots" / "panel-pruned.png")

    # a stop queued for the training run (its chunk lasts ~20 s): STOPPING… until it applies; Resume cancels it
    lab.run_cell(2)
    page.wait_for_function("() => document.querySelectorAll('[data-rf-panel]').length === 2", timeout=30_000)
    slow = panel.nth(1)
    row = slow.locator('tr[data-run-id="1"][data-on-device="true"]')
    row.wait_for(timeout=30_000)
    row.locator('button[data-op="stop"]').click()
    row.locator('[data-badge="STOPPING"]').wait_for(timeout=10_000)
    resume = row.locator('button[data-op="resume"]')
    page.wait_for_function(
        """() => { const b = document.querySelectorAll('[data-rf-panel]')[1]
            .querySelector('tr[data-run-id="1"] button[data-op="resume"]');
            return !b.disabled && b.title.includes('cancel the pending stop'); }""",
        timeout=10_000,
    )
    resume.click()
    row.locator('[data-badge="ONGOING"]').wait_for(timeout=10_000)  # cancelled: it trains on
    assert row.get_attribute("data-status") == "ONGOING"
