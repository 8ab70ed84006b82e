"""The real engine in a real JupyterLab + Chromium: 3 tiny runs train, the panel's curves grow, Stop on run 2.

A notebook cell runs ``experiment.run_fit`` on 3 tiny SFT runs (96 rows, batch 2, 2 epochs, 4 chunks per
epoch: 96 steps and 8 chunks per run, about 15-40 s of training here). The test watches the number of plotted
points grow, clicks Stop on run 2 while it is still NEW/ONGOING, and checks run 2 ends STOPPED in the panel
(``data-status``), in ``get_runs_info()`` (a second cell) and in the store file (read from this process), then
lets runs 1 and 3 complete. Screenshots: ``artifacts/browser/engine-*.png``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts" / "browser"

EXPERIMENT = "browser-engine"

FIT_CELL = f"""\
from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset
group = RFGridSearch(List([
    RFModelConfig(model_name="tiny",
                  peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
                  training_args=RFSFTConfig(learning_rate=lr, per_device_train_batch_size=2, num_train_epochs=2,
                                            max_length=48, logging_steps=1))
    for lr in (1e-3, 2e-3, 3e-3)]), "SFT")
exp = Experiment("{EXPERIMENT}")
exp.run_fit(group, tiny_create_model, tiny_sft_dataset(96), tiny_sft_dataset(4, seed=1), num_chunks=4, seed=7)
"""

INFO_CELL = """\
import json
print("STATUS", json.dumps({int(r.run_id): r.status for r in exp.get_runs_info().itertuples()}))
"""


def _browser_conftest() -> Any:
    """tests/browser/conftest.py as pytest loaded it (conftest modules are not importable by a stable name)."""
    import importlib.util
    import sys

    path = Path(__file__).with_name("conftest.py").resolve()
    for mod in list(sys.modules.values()):
        if getattr(mod, "__file__", None) and Path(mod.__file__).resolve() == path:
            return mod
    spec = importlib.util.spec_from_file_location("_rf_browser_conftest", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def rf_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine_rf_home")


@pytest.fixture(scope="module")
def jupyter_lab(tmp_path_factory: pytest.TempPathFactory, chromium_path: str, rf_home: Path) -> Iterator[Any]:
    """The conftest's server, with this module's RF_HOME (the server and its kernels start before any
    per-test fixture could set it)."""
    import shutil

    server = _browser_conftest().JupyterLab(
        tmp_path_factory.mktemp("jupyterlab-engine"), extra_env={"RF_HOME": str(rf_home)}
    )
    try:
        yield server
    finally:
        server.stop()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(server.log_path, ARTIFACTS / "jupyterlab-engine.log")


def _points(panel: Any) -> int:
    return int(panel.locator("[data-rf-plots]").get_attribute("data-points") or 0)


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _cell_output(page: Any, index: int) -> str:
    """Text of every output of cell ``index`` (stream text and text/plain), from the notebook model."""
    outputs = page.evaluate(
        """(i) => JSON.stringify(window.jupyterapp.shell.currentWidget.content.widgets[i].model.outputs.toJSON())""",
        index,
    )
    parts = []
    for out in json.loads(outputs):
        text = out.get("text") or (out.get("data") or {}).get("text/plain") or ""
        if out.get("output_type") == "error":
            text = "\n".join(out.get("traceback") or [])
        parts.append("".join(text) if isinstance(text, list) else str(text))
    return "".join(parts)


def _store_statuses(rf_home: Path) -> dict[int, str]:
    from rapidfire_nb.paths import experiment_dir
    from rapidfire_nb.store import Store

    with Store(experiment_dir(rf_home, EXPERIMENT), read_only=True) as store:
        return {int(r["run_id"]): r["status"] for r in store.runs()}


def _store_points(rf_home: Path, names: tuple[str, ...]) -> int:
    from rapidfire_nb.paths import experiment_dir
    from rapidfire_nb.store import Store

    with Store(experiment_dir(rf_home, EXPERIMENT), read_only=True) as store:
        points, _ = store.metrics_since(0)
    return sum(1 for p in points if p["name"] in names)


def test_engine_panel_streams_and_stop_applies(lab: Any, rf_home: Path) -> None:
    page = lab.page
    t0 = time.monotonic()
    timings: list[str] = []

    def phase(name: str) -> None:
        timings.append(f"{time.monotonic() - t0:6.1f}s  {name}")

    try:
        lab.open_notebook("engine_demo.ipynb", [FIT_CELL, INFO_CELL], timeout=90)
        phase("notebook open, kernel idle")
        lab.run_cell(0)
        panel = page.locator("[data-rf-panel]")
        panel.wait_for(timeout=120_000)  # torch import + 3 trainers on a busy machine
        phase("panel rendered")

        # the curves fill in and keep growing while the runs train
        _wait(lambda: _points(panel) > 0, 90, "the first plotted points")
        first = _points(panel)
        _wait(lambda: _points(panel) > first + 5, 60, "more plotted points")
        grown = _points(panel)
        assert grown > first
        phase(f"points {first} -> {grown}")
        header = panel.inner_text()
        assert EXPERIMENT in header, header[:300]

        row2 = panel.locator('tr[data-run-id="2"]')
        assert row2.get_attribute("data-status") in ("NEW", "ONGOING"), "run 2 finished before the click"
        page.mouse.move(2, 2)
        lab.screenshot("engine-streaming.png", panel)

        # Stop on run 2: acknowledged at once, STOPPED at the end of its current chunk (or at once while NEW)
        stop = row2.locator('[data-op="stop"]')
        assert stop.is_enabled()
        stop.click()
        notice = panel.locator(".rf-notice").first
        assert re.search(r"stop requested for run 2|run 2 stopped", notice.inner_text(timeout=5_000))
        page.wait_for_selector('[data-rf-panel] tr[data-run-id="2"][data-status="STOPPED"]', timeout=120_000)
        phase("run 2 STOPPED in the panel")
        assert row2.locator('[data-op="resume"]').is_enabled()
        assert row2.locator('[data-op="stop"]').is_disabled()
        panel.locator('.rf-op-item[data-state="applied"]', has_text="stop run 2").wait_for(timeout=10_000)

        # get_runs_info() in a second cell (the kernel is free while training goes on) and the store file
        lab.run_cell(1)
        _wait(lambda: "STATUS" in _cell_output(page, 1), 60, "the get_runs_info() cell's output")
        out = _cell_output(page, 1)
        m = re.search(r"STATUS (\{.*\})", out)
        assert m, out
        info = {int(k): v for k, v in json.loads(m.group(1)).items()}
        assert info[2] == "STOPPED", info
        assert set(info) == {1, 2, 3}
        assert _store_statuses(rf_home)[2] == "STOPPED"
        phase("run 2 STOPPED in get_runs_info() and the store")
        page.mouse.move(2, 2)
        lab.screenshot("engine-stopped.png", panel)

        # runs 1 and 3 train on and complete
        for rid in (1, 3):
            page.wait_for_selector(
                f'[data-rf-panel] tr[data-run-id="{rid}"][data-status="COMPLETED"]', timeout=180_000
            )
        # every logged loss / eval_loss point of the store ends up plotted (the default two plots), and the
        # Step column of a finished run is complete
        expected = _store_points(rf_home, ("loss", "eval_loss"))
        _wait(
            lambda: _points(panel) == expected, 15, f"{expected} plotted points (the store's loss/eval_loss)"
        )
        assert _store_statuses(rf_home) == {1: "COMPLETED", 2: "STOPPED", 3: "COMPLETED"}
        assert panel.locator('tr[data-run-id="2"]').get_attribute("data-status") == "STOPPED"
        for rid in (1, 3):
            assert "96/96" in panel.locator(f'tr[data-run-id="{rid}"] td.rf-col-step').inner_text()
        phase("runs 1 and 3 COMPLETED")
        time.sleep(1.0)  # the last update (idle header, final curves) reaches the page
        page.mouse.move(2, 2)
        lab.screenshot("engine-done.png", panel)
        lab.screenshot("engine-page.png")

        width = panel.evaluate("el => el.getBoundingClientRect().width")
        overflow = panel.evaluate(
            "el => { const w = el.querySelector('.rf-table-wrap'); return w.scrollWidth - w.clientWidth; }"
        )
        assert overflow <= 0, f"the run table overflows its {width}px panel by {overflow}px"
        errors = [m for m in lab.console if m.startswith("pageerror") or "rapidfire" in m.lower()]
        assert not errors, errors

        # the Chunks column of a finished 2-epoch run reads done/total, never more done than total ("8/4")
        chunks = panel.evaluate(
            """el => { const heads = [...el.querySelectorAll('thead th')].map((t) => t.textContent.trim());
                       const i = heads.indexOf('Chunks');
                       return i < 0 ? null : el.querySelector(`tr[data-run-id="1"]`).children[i].textContent; }"""
        )
        assert chunks is not None
        done_, total_ = (int(x) for x in chunks.split("/"))
        assert done_ <= total_, f"run 1 (completed, 2 epochs x 4 chunks) shows Chunks {chunks!r}"
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "engine-timings.txt").write_text("\n".join(timings) + "\n")
