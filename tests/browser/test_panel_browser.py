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
from rapidfire_nb.testing.fake_source import FakeSource
from rapidfire_nb.panel import RunPanel
source = FakeSource(4, total_steps=300, num_chunks=4, steps_per_tick=2, tick_s=0.05, eval_every=20,
                    fail_run=4, fail_at_step=24, experiment="sft-lora-sweep")
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


class _Phases:
    """Seconds spent per phase, written to artifacts/browser/timings.txt (to see what a slow CI run spent)."""

    def __init__(self) -> None:
        self.t0 = self.last = time.monotonic()
        self.rows: list[str] = []

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        self.rows.append(f"{now - self.t0:6.1f}s  (+{now - self.last:4.1f}s)  {name}")
        self.last = now

    def write(self) -> None:
        path = REPO / "artifacts" / "browser" / "timings.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(self.rows) + "\n")


def test_panel_streams_and_stops_run_2(lab: Any) -> None:
    phase = _Phases()
    try:
        _scenario(lab, phase)
    finally:
        phase.write()


def _scenario(lab: Any, phase: _Phases) -> None:
    page = lab.page
    lab.open_notebook("panel_demo.ipynb", [CELL])
    phase("notebook open, kernel idle")
    lab.run_cell(0)
    panel = page.locator("[data-rf-panel]")
    panel.wait_for(timeout=30_000)

    # curves arrive and keep growing
    _wait(lambda: _points(panel) > 0, 20, "first plotted points")
    first = _points(panel)
    _wait(lambda: _points(panel) > first + 20, 10, "more plotted points")
    # exactly one run is on the device (the table and the header agree)
    page.wait_for_function(
        """() => {
            const rows = document.querySelectorAll('[data-rf-panel] tr[data-on-device="true"]');
            const chip = document.querySelector('[data-rf-panel] .rf-device').textContent;
            return rows.length === 1 && chip === `run ${rows[0].dataset.runId} on device`;
        }""",
        timeout=5_000,
    )

    phase("points streaming")
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

    phase("run 2 stopped")
    # the failing run shows its error in red
    page.wait_for_selector('[data-rf-panel] tr[data-run-id="4"][data-status="FAILED"]', timeout=20_000)
    assert "out of memory" in panel.locator('tr[data-error-for="4"]').inner_text()

    phase("run 4 failed")
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

    phase("clone applied")

    # let curves accumulate a little, then the screenshots (light and dark)
    def run5_steps() -> int:
        return int(panel.locator('tr[data-run-id="5"] td.rf-col-step').inner_text().split("/")[0])

    _wait(lambda: run5_steps() >= 60, 20, "the clone's curve to fill in")
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
    panel.locator(".rf-plot").first.evaluate("el => window.Plotly.Fx.unhover(el)")
    lab.set_theme(dark=True)
    time.sleep(0.4)  # the plots re-render on the next animation frame
    lab.screenshot("panel_dark.png", panel)
    lab.set_theme(dark=False)
    if os.environ.get("RF_UPDATE_SCREENSHOTS") == "1":
        dest = REPO / "docs" / "screenshots" / "panel.png"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(light, dest)

    phase("screenshots")
    # x axis: samples seen
    panel.locator('button[data-x="samples"]').click()
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-rf-panel] .rf-plot .xtitle')]"
        ".every(t => t.textContent === 'samples seen')"
    )
    assert _points(panel) > 0

    phase("x axis")
    # delete run 5: hidden by default, back (greyed) with "show deleted"
    panel.locator('tr[data-run-id="5"] button[data-op="delete"]').click()
    page.wait_for_selector('[data-rf-panel] tr[data-run-id="5"]', state="detached", timeout=10_000)
    assert panel.locator('.rf-legend-item[data-run-id="5"]').count() == 0
    panel.locator("input[data-rf-show-deleted]").check()
    page.wait_for_selector(
        '[data-rf-panel] tr[data-run-id="5"][data-status="DELETED"].rf-deleted', timeout=2_000
    )
    assert panel.locator('.rf-legend-item.rf-legend-deleted[data-run-id="5"]').count() == 1

    phase("delete + show deleted")
    # the notebook saved with its widget state stays small (metric history is never in synced traits)
    saved = lab.save()
    text = saved.read_text()
    assert "application/vnd.jupyter.widget-state+json" in text
    assert len(text.encode()) < 200_000, len(text.encode())

    # a narrow output area still lays out (table scrolls, plots stack)
    page.set_viewport_size({"width": 760, "height": 1400})
    time.sleep(0.3)
    lab.screenshot("panel_narrow.png", panel)
    phase("saved, narrow screenshot")

    errors = [m for m in lab.console if m.startswith("pageerror") or "rapidfire" in m.lower()]
    assert not errors, errors
