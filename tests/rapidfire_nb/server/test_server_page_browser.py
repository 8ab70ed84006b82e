"""The experiments page in a real Chromium: panel.js fed by the REST API, ops through cookie auth + XSRF.

A ``jupyter server`` subprocess serves two experiments written directly into stores; a thread of this test
plays the kernel of one of them (heartbeat, takes inbox ops, applies stop/resume). No torch, no kernel.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb.store import Store
from tests.rapidfire_nb.server._stores import make_experiment

pytestmark = pytest.mark.browser

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]


def _chromium() -> str:
    path = os.environ.get("RF_CHROMIUM", "/usr/bin/chromium")
    missing = None if Path(path).is_file() else f"no Chromium at {path}"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing = "Playwright is not installed"
    if missing:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"browser test cannot run under CI=true: {missing}")
        pytest.skip(missing)
    return path


class FakeKernel(threading.Thread):
    """Beats for the experiment and applies stop/resume ops from its inbox, like a kernel's scheduler."""

    def __init__(self, store: Store) -> None:
        super().__init__(daemon=True)
        self.store = store
        self.halt = threading.Event()

    def run(self) -> None:
        step = 10
        while not self.halt.is_set():
            self.store.beat()
            for op in self.store.take_inbox_ops():
                status = {"stop": "STOPPED", "resume": "ONGOING"}.get(op["kind"])
                if status:
                    self.store.upsert_run(op["run_id"], status=status)
                self.store.add_op(
                    op["op_id"],
                    op["kind"],
                    op["run_id"],
                    op["payload"],
                    source="inbox",
                    state="applied" if status else "rejected",
                    message=f"{op['kind']} done",
                )
            self.store.add_metrics([{"run_id": 1, "step": step, "name": "loss", "value": 1.0 / step}])
            step += 1
            self.halt.wait(0.3)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[dict[str, Any]]:
    root = tmp_path / "experiments"
    make_experiment(root, "dead-exp", alive=False).close()
    kernel = FakeKernel(make_experiment(root, "live-exp", epochs=3))  # 3 epochs x 4 chunks per run
    kernel.start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    env = {
        **os.environ,
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parents[3]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_server",
            "--ip=127.0.0.1",
            f"--port={port}",
            "--no-browser",
            "--allow-root",
            f"--IdentityProvider.token={token}",
            "--ServerApp.base_url=/base/",
            "--ServerApp.jpserver_extensions=rapidfire_nb.server=True",
            f"--RapidfireApp.experiments_root={root}",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/base/"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}api/status?token={token}", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail("jupyter server did not start:\n" + (tmp_path / "server.log").read_text())
                time.sleep(0.3)
        yield {"url": url, "token": token, "kernel": kernel}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
        kernel.halt.set()
        kernel.join(5)
        kernel.store.close()


def _chunks_column(page: Any, view: str) -> dict[str, str]:
    """Run id -> the text of its Chunks cell in the panel under ``view``."""
    return page.eval_on_selector(  # type: ignore[no-any-return]
        view,
        """el => { const heads = [...el.querySelectorAll('thead th')].map((t) => t.textContent.trim());
                   const i = heads.indexOf('Chunks');
                   return Object.fromEntries([...el.querySelectorAll('tr[data-run-id]')].map(
                     (tr) => [tr.dataset.runId, tr.children[i].textContent])); }""",
    )


def test_page_shows_experiments_and_sends_ops(server: dict[str, Any], tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    chromium = _chromium()
    errors: list[str] = []
    profile = tmp_path / "profile"
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(profile),
            executable_path=chromium,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1300, "height": 1000},
        )
        try:
            page = ctx.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            # the token logs in (cookie); later loads are cookie-authenticated, so POSTs need the XSRF token
            page.goto(f"{server['url']}rapidfire/?token={server['token']}")
            page.wait_for_selector('tr[data-rf-experiment="live-exp"][data-rf-selected="true"]')
            page.goto(f"{server['url']}rapidfire/#exp=live-exp")
            view = '[data-rf-experiment-view="live-exp"]'
            page.wait_for_selector(f'{view}[data-rf-view="panel"] tr[data-run-id="1"][data-status="ONGOING"]')
            assert page.get_attribute('tr[data-rf-experiment="live-exp"]', "data-rf-live") == "true"
            # the Chunks column reads done/total over all epochs, as in the kernel's panel (not "9/4")
            assert _chunks_column(page, view) == {"1": "9/12", "2": "12/12", "3": "0/12"}
            # the device chip says what the store can tell (no false "device idle" while a kernel trains)
            assert page.inner_text(f"{view} .rf-device") == "training (kernel alive)"
            page.wait_for_function(
                "() => [...document.querySelectorAll('[data-points]')].some(e => Number(e.dataset.points) > 10)"
            )
            page.locator(f'{view} tr[data-run-id="1"] button[data-op="stop"]').click()
            page.wait_for_selector(f'{view} tr[data-run-id="1"][data-status="STOPPED"]', timeout=15000)
            # the list above follows its panel at once (it polls every 5 s by itself)
            page.wait_for_function(
                """() => (document.querySelector('tr[data-rf-experiment="live-exp"]').dataset.rfCounts || '')
                          .includes('STOPPED:1')""",
                timeout=1500,
            )
            page.locator(f'{view} tr[data-run-id="1"] button[data-op="resume"]').click()
            page.wait_for_selector(f'{view} tr[data-run-id="1"][data-status="ONGOING"]', timeout=15000)

            page.locator('tr[data-rf-experiment="dead-exp"] a').click()
            dead = '[data-rf-experiment-view="dead-exp"]'
            page.wait_for_selector(f'{dead} tr[data-run-id="1"][data-status="INTERRUPTED"]')
            assert page.locator(f"{dead} button[data-op]:enabled").count() == 0  # no kernel: read-only
            assert page.inner_text(f"{dead} .rf-device") == "no kernel running"
            tip = page.get_attribute(f'{dead} tr[data-run-id="1"] button[data-op="stop"]', "title") or ""
            assert "no kernel is running this experiment" in tip, tip  # a disabled button says why
            # a dark colour scheme: the panel goes dark with the page
            page.emulate_media(color_scheme="dark")
            page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'")
            bg = page.eval_on_selector(f"{dead} .rf-panel", "el => getComputedStyle(el).backgroundColor")
            assert sum(int(c) for c in bg[bg.index("(") + 1 : bg.index(")")].split(",")[:3]) < 120, bg
            shots = Path(__file__).resolve().parents[3] / "artifacts" / "browser"
            if shots.parent.is_dir():
                shots.mkdir(exist_ok=True)
                page.screenshot(path=str(shots / "server_page.png"), full_page=True)
        finally:
            ctx.close()
            shutil.rmtree(profile, ignore_errors=True)
    assert errors == []
