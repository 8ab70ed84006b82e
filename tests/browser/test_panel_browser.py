"""The panel in a real JupyterLab + Chromium, fed by the fake source: curves grow, Stop on run 2 stops it.

Screenshots go to ``artifacts/browser/``; with ``RF_UPDATE_SCREENSHOTS=1`` the light one is also copied to
``docs/screenshots/panel.png``.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.browser

CELL = """\
from rapidfire_nb._fake_source import FakeSource
from rapidfire_nb.panel import RunPanel
source = FakeSource(4, total_steps=300, num_chunks=4, steps_per_tick=2, tick_s=0.05, eval_every=20,
                    fail_run=4, fail_at_step=40, experiment="sft-lora-sweep")
panel = RunPanel(source)
panel
"""


def _points(panel: Any) -> int:
    return int(panel.locator("[data-rf-plots]").get_attribute("data-points") or 0)


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_panel_streams_and_stops_run_2(lab: Any) -> None:
    page = lab.page
    lab.open_notebook("panel_demo.ipynb", [CELL])
    lab.run_cell(0)
    panel = page.locator("[data-rf-panel]")
    panel.wait_for(timeout=30_000)

    # curves arrive and keep growing
    _wait(lambda: _points(panel) > 0, 20, "first plotted points")
    first = _points(panel)
    _wait(lambda: _points(panel) > first + 20, 10, "more plotted points")
    assert (
        panel.locator(
            'tr[data-run-id="1"][data-on-device="true"], tr[data-run-id="2"][data-on-device="true"],'
            ' tr[data-run-id="3"][data-on-device="true"]'
        ).count()
        == 1
    )

    # Stop on run 2: acknowledged at once, then STOPPED in the table and applied in the ops log
    row2 = panel.locator('tr[data-run-id="2"]')
    assert row2.get_attribute("data-status") in ("NEW", "ONGOING")
    stop = row2.locator('button[data-op="stop"]')
    assert stop.is_enabled()
    assert row2.locator('button[data-op="resume"]').is_disabled()
    stop.click()
    # the click's notice is there at once; the op may already be applied (then it says so)
    notice = panel.locator(".rf-notice").first
    assert re.search(r"stop requested for run 2|run 2 stopped", notice.inner_text(timeout=1_000))
    page.wait_for_selector('[data-rf-panel] tr[data-run-id="2"][data-status="STOPPED"]', timeout=15_000)
    panel.locator('.rf-op-item[data-state="applied"]', has_text="stop run 2").wait_for(timeout=5_000)
    assert row2.locator('button[data-op="resume"]').is_enabled()
    assert row2.locator('button[data-op="stop"]').is_disabled()

    # the failing run shows its error in red
    page.wait_for_selector('[data-rf-panel] tr[data-run-id="4"][data-status="FAILED"]', timeout=20_000)
    assert "out of memory" in panel.locator('tr[data-error-for="4"]').inner_text()

    # clone form: lists the run's hyperparameters, warm start, submit -> a new run 5
    panel.locator('tr[data-run-id="1"] button[data-op="clone"]').click()
    form = panel.locator('form[data-clone-form="1"]')
    form.wait_for(timeout=2_000)
    form.locator('input[name="learning_rate"]').fill("5e-4")
    form.locator('input[name="__extra"]').fill("lora.lora_dropout=0.1")
    form.locator('input[name="warm_start"]').check()
    lab.screenshot("panel_clone_form.png", panel)
    form.locator('button[data-op="clone-submit"]').click()
    page.wait_for_selector('[data-rf-panel] tr[data-run-id="5"]', timeout=10_000)

    # let curves accumulate a little, then the screenshots (light and dark)
    _wait(lambda: _points(panel) > first + 400, 15, "curves to fill in")
    page.mouse.move(2, 2)  # no hover highlight in the screenshots
    lab.screenshot("panel_page.png")
    width = panel.evaluate("el => el.getBoundingClientRect().width")
    assert 700 < width < 1000, f"panel width {width}px; the screenshot is meant to show ~900 px"
    overflow = panel.evaluate(
        "el => { const w = el.querySelector('.rf-table-wrap'); return w.scrollWidth - w.clientWidth; }"
    )
    assert overflow <= 0, f"the run table overflows its {width}px panel by {overflow}px"
    light = lab.screenshot("panel_light.png", panel)
    panel.locator(".rf-plot").first.evaluate(
        "el => window.Plotly.Fx.hover(el, [{curveNumber: 1, pointNumber: 40}])"
    )
    hover = panel.locator(".rf-plot").first.locator(".hoverlayer").text_content() or ""
    assert "run 2" in hover and "step 41" in hover and "loss" in hover, hover
    lab.screenshot("panel_hover.png", panel.locator(".rf-plots"))
    lab.set_theme(dark=True)
    time.sleep(0.8)
    lab.screenshot("panel_dark.png", panel)
    lab.set_theme(dark=False)
    if os.environ.get("RF_UPDATE_SCREENSHOTS") == "1":
        dest = REPO / "docs" / "screenshots" / "panel.png"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(light, dest)

    # x axis: samples seen
    panel.locator('button[data-x="samples"]').click()
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-rf-panel] .rf-plot .xtitle')]"
        ".every(t => t.textContent === 'samples seen')"
    )
    assert _points(panel) > 0

    # delete run 5: hidden by default, back (greyed) with "show deleted"
    panel.locator('tr[data-run-id="5"] button[data-op="delete"]').click()
    page.wait_for_selector('[data-rf-panel] tr[data-run-id="5"]', state="detached", timeout=10_000)
    assert panel.locator('.rf-legend-item[data-run-id="5"]').count() == 0
    panel.locator("input[data-rf-show-deleted]").check()
    page.wait_for_selector(
        '[data-rf-panel] tr[data-run-id="5"][data-status="DELETED"].rf-deleted', timeout=2_000
    )
    assert panel.locator('.rf-legend-item.rf-legend-deleted[data-run-id="5"]').count() == 1

    # the notebook saved with its widget state stays small (metric history is never in synced traits)
    saved = lab.save()
    text = saved.read_text()
    assert "application/vnd.jupyter.widget-state+json" in text
    assert len(text.encode()) < 200_000, len(text.encode())

    # a narrow output area still lays out (table scrolls, plots stack)
    page.set_viewport_size({"width": 760, "height": 1400})
    time.sleep(0.5)
    lab.screenshot("panel_narrow.png", panel)

    errors = [m for m in lab.console if m.startswith("pageerror") or "rapidfire" in m.lower()]
    assert not errors, errors
