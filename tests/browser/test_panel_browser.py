"""The panel in a real JupyterLab + Chromium, fed by the fake source: curves grow, Stop on run 2 stops it (the
notice does not move the table), a warm clone's curve joins its parent, the table sorts, the best run is
highlighted, smoothing, CSV export, "stop all but the best k", the training clock stops once nothing trains, and
the static copy (``freeze``'s) is drawn with the panel's plot settings.

Screenshots go to ``artifacts/browser/``; with ``RF_UPDATE_SCREENSHOTS=1`` the light and dark ones are also copied
to ``docs/screenshots/panel.png`` and ``docs/screenshots/panel-dark.png``.
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
ARTIFACTS = REPO / "artifacts" / "browser"

pytestmark = pytest.mark.browser

CELL = """\
from rapidfire_nb.testing.fake_source import FakeSource
from rapidfire_nb.panel import RunPanel
source = FakeSource(4, total_steps=600, num_chunks=4, steps_per_tick=2, tick_s=0.05, eval_every=20,
                    fail=(4, 24), experiment="sft-lora-sweep")
panel = RunPanel(source)
panel
"""
#: The static copy ``RunPanel.freeze`` would write now (the widget stays: a closed widget's view goes away).
STATIC_CELL = 'from IPython.display import HTML\nHTML(panel.static_bundle()["text/html"])'


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
    lab.open_notebook("panel_demo.ipynb", [CELL, STATIC_CELL])
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
    resume = row2.locator('button[data-op="resume"]')
    assert resume.is_disabled() and "only STOPPED or INTERRUPTED runs can be resumed" in (
        resume.get_attribute("title") or ""
    )
    table_top = _top(panel, ".rf-table-wrap")
    stop.click()
    # the click's notice is there at once; the op may already be applied (then it says so)
    notice = panel.locator(".rf-notice").first
    assert re.search(r"stop requested for run 2|run 2 stopped", notice.inner_text(timeout=1_000))
    assert _top(panel, ".rf-table-wrap") == table_top, "the notice pushed the run table down"
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
    # a warm clone starts at its parent's chunk boundary and trains when its turn comes: wait for its curve
    try:
        page.wait_for_function(
            """() => { const el = document.querySelector('[data-rf-panel] .rf-plot');
                       const t = el && el.data && el.data.find(d => d.name === 'run 5');
                       return !!t && t.x.length >= 10; }""",
            timeout=60_000,
        )
    except Exception:
        lab.screenshot("panel_clone_timeout.png", panel)
        raise
    _check_warm_clone_joined(panel)
    phase("warm clone joined to its parent")
    _check_sorting_and_best_run(panel)
    phase("sorting, best run")
    _check_smoothing(page, panel)
    phase("smoothing")
    _check_csv_export(page, panel)
    phase("CSV export")
    panel.locator("details[data-rf-compare] > summary").click()  # parallel coordinates, drawn when opened
    page.wait_for_function(
        "() => Number(document.querySelector('[data-rf-panel] [data-rf-parcoords]').dataset.runs) >= 3",
        timeout=5_000,
    )
    assert panel.locator("[data-rf-parcoords] .parcoords").count() >= 1
    lab.screenshot("panel_compare.png", panel.locator("details[data-rf-compare]"))
    panel.locator("details[data-rf-compare] > summary").click()  # closed again for the screenshots below
    phase("parallel coordinates")
    page.mouse.move(2, 2)  # no hover highlight in the screenshots
    lab.screenshot("panel_page.png")
    width = panel.evaluate("el => el.getBoundingClientRect().width")
    assert 700 < width < 1000, f"panel width {width}px; the screenshot is meant to show ~900 px"
    overflow = panel.evaluate(
        "el => { const w = el.querySelector('.rf-table-wrap'); return w.scrollWidth - w.clientWidth; }"
    )
    if overflow > 0:
        widths = panel.evaluate(
            "el => [...el.querySelectorAll('thead th')].map(t => t.textContent + ':' + Math.round(t.getBoundingClientRect().width))"
        )
        raise AssertionError(f"the run table overflows its {width}px panel by {overflow}px: {widths}")
    light = lab.screenshot("panel_light.png", panel)
    panel.locator(".rf-plot").first.evaluate("el => window.Plotly.Fx.hover(el, {xval: 41}, 'xy')")
    hover = panel.locator(".rf-plot").first.locator(".hoverlayer").text_content() or ""
    assert "run 1" in hover and "run 3" in hover and "41" in hover, hover  # every run at the hovered step
    lab.screenshot("panel_hover.png", panel.locator(".rf-plots"))
    panel.locator(".rf-plot").first.evaluate("el => window.Plotly.Fx.unhover(el)")
    lab.set_theme(dark=True)
    time.sleep(0.4)  # the plots re-render on the next animation frame
    lab.screenshot("panel_dark.png", panel)
    lab.set_theme(dark=False)
    if os.environ.get("RF_UPDATE_SCREENSHOTS") == "1":
        dest = REPO / "docs" / "screenshots"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(light, dest / "panel.png")
        shutil.copyfile(ARTIFACTS / "panel_dark.png", dest / "panel-dark.png")

    phase("screenshots")
    # x axis: samples seen
    panel.locator('button[data-x="samples"]').click()
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-rf-panel] .rf-plot .xtitle')]"
        ".every(t => t.textContent === 'samples seen')"
    )
    assert _points(panel) > 0
    # both plots share one x range (issue 37: loss and eval_loss had different ones)
    ranges = panel.locator(".rf-plot").evaluate_all(
        "els => els.map(e => e._fullLayout.xaxis.range.map(Math.round))"
    )
    assert len(ranges) == 2 and ranges[0] == ranges[1], ranges
    # the user's log scale wins and has its cue on each plot; "auto" gives the choice back
    panel.locator('button[data-y="log"]').click()
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-rf-panel] .rf-card')].every(c => c.dataset.scale === 'log')"
    )
    assert panel.locator("[data-rf-scale-cue]").first.inner_text() == "log scale"
    panel.locator('button[data-y="auto"]').click()

    phase("x axis, shared x range, y scale")
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

    page.set_viewport_size({"width": 1060, "height": 1150})
    _check_stop_all_but_best_and_frozen_clock(page, panel)
    phase("stop all but best, clock frozen when idle")
    # the static copy (freeze's, at the end) is drawn with the live panel's plot settings (smoothing 0.6 above)
    lab.run_cell(1)
    line = page.locator("[data-rf-static] [data-rf-plot-settings]")
    line.wait_for(timeout=15_000)
    text = line.inner_text()
    assert "smoothing 0.6 (raw curves faint) · y scale auto" in text, text
    assert text.endswith("as the live panel had them"), text
    phase("the static copy with the panel's plot settings")

    errors = [m for m in lab.console if m.startswith("pageerror") or "rapidfire" in m.lower()]
    assert not errors, errors


def _top(panel: Any, selector: str) -> float:
    """The element's top relative to the panel's (the notebook may scroll meanwhile)."""
    return float(
        panel.evaluate(
            "(el, sel) => el.querySelector(sel).getBoundingClientRect().top - el.getBoundingClientRect().top",
            selector,
        )
    )


def _rows(panel: Any) -> list[tuple[int, str]]:
    """(run id, Eval loss cell text) of the table's run rows, in the order shown."""
    return [
        (int(i), t)
        for i, t in panel.evaluate(
            """el => [...el.querySelectorAll('tr.rf-run-row')].map(tr => [tr.dataset.runId,
                tr.children[tr.children.length - 3].textContent])"""
        )
    ]


def _check_warm_clone_joined(panel: Any) -> None:
    """Run 5 (warm from run 1) is drawn from run 1's point at the branch step, not as a lone dot."""
    got = panel.locator(".rf-plot").first.evaluate(
        """el => { const t = (id) => el.data.find(d => d.name === `run ${id}`);
                   const c = t(5), p = t(1);
                   if (!c || !p) return {names: el.data.map(d => d.name)};
                   const i = p.x.indexOf(c.x[0]);
                   return {names: el.data.map(d => d.name), x0: c.x[0], x1: c.x[1], y0: c.y[0],
                           py: i < 0 ? null : p.y[i]}; }"""
    )
    assert "x0" in got and got["x1"] == got["x0"] + 1, got
    assert got["py"] is not None and abs(got["y0"] - got["py"]) < 1e-9, got


def _check_sorting_and_best_run(panel: Any) -> None:
    def values(rows: list[tuple[int, str]]) -> list[float]:
        return [float(t) for _, t in rows if t not in ("–", "-")]

    panel.locator('th[data-sort-key="eval_loss"] button').click()
    asc = _rows(panel)
    assert values(asc) == sorted(values(asc)) and len(values(asc)) >= 3, asc
    assert panel.locator('th[data-sort-key="eval_loss"]').get_attribute("aria-sort") == "ascending"
    # the rows and the starred one read in one go: a snapshot may land between two reads
    shown = panel.evaluate(
        """el => [...el.querySelectorAll('tr.rf-run-row')].map(tr => [Number(tr.dataset.runId),
            tr.children[tr.children.length - 3].textContent, tr.dataset.best === 'true', tr.textContent.includes('★')])"""
    )
    starred = [(rid, text, star) for rid, text, best, star in shown if best]
    ranked = [(rid, text) for rid, text, _, _ in shown if text not in ("–", "-")]
    assert len(starred) == 1 and starred[0][2], shown
    assert starred[0][:2] == min(ranked, key=lambda r: float(r[1])), shown
    panel.locator('th[data-sort-key="eval_loss"] button').click()
    desc = _rows(panel)
    assert values(desc) == sorted(values(desc), reverse=True), desc
    for rows in (asc, desc):  # missing values stay last in both directions
        texts = [t for _, t in rows]
        n_missing = sum(t in ("–", "-") for t in texts)
        assert all(t in ("–", "-") for t in texts[len(texts) - n_missing :]), rows
    panel.locator('th[data-sort-key="run"] button').click()
    assert [i for i, _ in _rows(panel)] == sorted(i for i, _ in asc)


def _check_smoothing(page: Any, panel: Any) -> None:
    panel.locator("input[data-rf-smoothing]").evaluate(
        "el => { el.value = '0.6'; el.dispatchEvent(new Event('input', {bubbles: true})); }"
    )
    page.wait_for_selector('[data-rf-panel] .rf-card[data-smoothed="true"]', timeout=3_000)
    got = panel.locator(".rf-plot").first.evaluate(
        """el => { const raw = el.data.find(d => d.name === 'run 1 (raw)');
                   const sm = el.data.find(d => d.name === 'run 1');
                   return {n: raw ? raw.y.length : 0, same: raw && raw.y.every((v, i) => v === sm.y[i])}; }"""
    )
    assert got["n"] > 10 and got["same"] is False, got  # the faint raw curve stays under the smoothed one


def _check_csv_export(page: Any, panel: Any) -> None:
    for what, head in (
        ("runs", "run_id,status,parent_id"),
        ("metrics", "run_id,step,samples_seen,wall_time"),
    ):
        with page.expect_download(timeout=5_000) as info:
            panel.locator(f'button[data-rf-export="{what}"]').click()
        download = info.value
        assert download.suggested_filename == f"sft-lora-sweep-{what}.csv"
        text = Path(download.path()).read_text()
        lines = text.strip().splitlines()
        assert lines[0].startswith(head), lines[0]
        if what == "runs":
            assert [ln.split(",")[0] for ln in lines[1:]] == ["1", "2", "3", "4", "5"], lines
        else:
            assert len(lines) > 100 and "loss" in lines[0].split(","), lines[0]


def _check_stop_all_but_best_and_frozen_clock(page: Any, panel: Any) -> None:
    """Stop all but the best 1 (one op per run), stop that one too: nothing trains, the clock stops."""
    active = [
        i
        for i, _ in _rows(panel)
        if panel.locator(f'tr[data-run-id="{i}"]').get_attribute("data-status") in ("NEW", "ONGOING")
    ]
    panel.locator("input[data-rf-keep]").fill("1")
    panel.locator("button[data-rf-stop-all-but]").click()
    for rid in active:
        row = panel.locator(f'tr[data-run-id="{rid}"]')
        _wait(
            lambda r=row: (
                r.get_attribute("data-status") not in ("NEW", "ONGOING")
                or r.locator('button[data-op="stop"]').is_enabled()
            ),
            10,
            f"run {rid}'s stop",
        )
    stopped = [
        i for i in active if panel.locator(f'tr[data-run-id="{i}"]').get_attribute("data-status") == "STOPPED"
    ]
    if stopped:  # the bulk stop records its own reason, not "stopped by the user (panel)"
        panel.locator('.rf-op-item[data-state="applied"]', has_text="stop all but best 1 by").first.wait_for(
            timeout=5_000
        )
    left = [
        i
        for i in active
        if panel.locator(f'tr[data-run-id="{i}"]').get_attribute("data-status") in ("NEW", "ONGOING")
    ]
    for rid in left:
        panel.locator(f'tr[data-run-id="{rid}"] button[data-op="stop"]').click()
    page.wait_for_function(
        """() => [...document.querySelectorAll('[data-rf-panel] tr.rf-run-row')].every(
              tr => !['NEW', 'ONGOING'].includes(tr.dataset.status))""",
        timeout=20_000,
    )
    elapsed = panel.locator("[data-rf-elapsed]")
    page.wait_for_function(
        "() => document.querySelector('[data-rf-panel] [data-rf-elapsed]').dataset.training === 'false'",
        timeout=5_000,
    )
    first = elapsed.inner_text()
    time.sleep(2.2)
    assert elapsed.inner_text() == first, "the clock of an idle experiment kept running"
