"""Fixtures for real-browser tests: a throwaway JupyterLab server and Debian's Chromium driven by Playwright.

Reusable pieces (see ``test_panel_browser.py`` for an example):

* ``chromium_path`` — ``/usr/bin/chromium`` (or ``$RF_CHROMIUM``); skips the test with a message when
  missing, and fails instead under ``CI=true``. Never ``playwright install``: it would download a browser.
* ``jupyter_lab`` (module scope) — a :class:`JupyterLab` on 127.0.0.1, random port and token,
  ``--allow-root``, ``--LabApp.expose_app_in_browser=True`` (gives ``window.jupyterapp``), throwaway
  runtime/settings/workspace/config dirs, the repository on ``PYTHONPATH`` (kernels import ``rapidfire_nb``
  from the working tree); stopped by its process group.
* ``browser_context`` (module scope) — a persistent Chromium context on a fresh profile, headless.
* ``lab`` — a :class:`LabPage` on a new page: ``open_notebook(name, cells)``, ``run_cell(i)``, ``run_all()``,
  ``set_theme(dark)``, ``screenshot(name, locator)`` (into ``artifacts/browser/``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts" / "browser"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]
# Settings for a quiet, reproducible Lab: no news/update toasts; notebooks saved with their widget state (so a
# test can check what a user's saved notebook weighs).
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
    "@jupyter-widgets/jupyterlab-manager/plugin.jupyterlab-settings": {"saveState": True},
}


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"browser test cannot run under CI=true: {reason}")
    pytest.skip(f"{reason} (install it with `apt-get install -y chromium`; CI fails instead of skipping)")


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """Path of the system Chromium; skip (or fail under CI=true) when it or Playwright is missing."""
    path = os.environ.get("RF_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).exists():
        _unavailable("Debian's chromium is not installed")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _unavailable("the playwright Python package is not installed")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class JupyterLab:
    """A JupyterLab server in its own process group, with throwaway directories under ``base``."""

    def __init__(self, base: Path, *, extra_env: dict[str, str] | None = None) -> None:
        self.base = base
        self.root_dir = base / "root"
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = base / "jupyterlab.log"
        self._ready = False
        for d in ("root", "runtime", "settings", "workspaces", "config", "ipython"):
            (base / d).mkdir(parents=True, exist_ok=True)
        for rel, value in LAB_SETTINGS.items():
            path = base / "settings" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(value))
        env = dict(os.environ)
        env.update(
            {
                "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
                "JUPYTERLAB_SETTINGS_DIR": str(base / "settings"),
                "JUPYTERLAB_WORKSPACES_DIR": str(base / "workspaces"),
                "JUPYTER_CONFIG_DIR": str(base / "config"),
                "IPYTHONDIR": str(base / "ipython"),
                "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p),
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(extra_env or {})
        cmd = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            "--port-retries=0",
            f"--IdentityProvider.token={self.token}",
            "--allow-root",
            "--LabApp.expose_app_in_browser=True",
            f"--ServerApp.root_dir={self.root_dir}",
            "--ServerApp.open_browser=False",
        ]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            cmd,
            cwd=self.root_dir,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until ``/api/status`` answers (returns at once when it did before)."""
        if self._ready:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited ({self.proc.returncode}):\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/status?token={self.token}", timeout=2) as r:
                    if r.status == 200:
                        self._ready = True
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.25)
        raise TimeoutError(f"JupyterLab did not start in {timeout}s:\n{self.log()}")

    def lab_url(self, path: str = "") -> str:
        return f"{self.url}/lab/tree/{path}?token={self.token}"

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-6000:]

    def stop(self) -> None:
        """SIGTERM the server's process group (the server shuts its kernels down), SIGKILL after 10 s."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._log.close()


@pytest.fixture(scope="module")
def jupyter_lab(tmp_path_factory: pytest.TempPathFactory, chromium_path: str) -> Iterator[JupyterLab]:
    server = JupyterLab(tmp_path_factory.mktemp("jupyterlab"))
    try:
        yield server  # ``lab`` waits until it is ready (Chromium starts meanwhile)
    finally:
        server.stop()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(server.log_path, ARTIFACTS / "jupyterlab.log")


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory: pytest.TempPathFactory, chromium_path: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=chromium_path,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1060, "height": 1150},
            device_scale_factor=1,
        )
        try:
            yield context
        finally:
            context.close()


class LabPage:
    """Drives one JupyterLab page through ``window.jupyterapp`` (``--LabApp.expose_app_in_browser``)."""

    def __init__(self, page: Any, server: JupyterLab) -> None:
        self.page = page
        self.server = server
        self.console: list[str] = []
        page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))

    def write_notebook(self, name: str, cells: list[str]) -> Path:
        nb = {
            "cells": [
                {
                    "cell_type": "code",
                    "execution_count": None,
                    "id": f"cell-{i}",
                    "metadata": {},
                    "outputs": [],
                    "source": src,
                }
                for i, src in enumerate(cells)
            ],
            "metadata": {
                "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                "language_info": {"name": "python"},
            },
            "nbformat": 4,
            "nbformat_minor": 5,
        }
        path = self.server.root_dir / name
        path.write_text(json.dumps(nb, indent=1))
        return path

    def open_notebook(self, name: str, cells: list[str] | None = None, *, timeout: float = 40.0) -> None:
        """Write ``cells`` to ``name`` (if given), open it and wait until its kernel is idle."""
        if cells is not None:
            self.write_notebook(name, cells)
        self.page.goto(self.server.lab_url(name))
        self.page.wait_for_function("() => !!window.jupyterapp", timeout=timeout * 1000)
        self.page.wait_for_function(
            """(name) => {
                const w = window.jupyterapp.shell.currentWidget;
                if (!w || !w.sessionContext || !w.context || !w.context.path.endsWith(name)) return false;
                const k = w.sessionContext.session && w.sessionContext.session.kernel;
                return !!k && k.status === 'idle' && k.connectionStatus === 'connected';
            }""",
            arg=name,
            timeout=timeout * 1000,
        )
        self.collapse_sidebars()

    def collapse_sidebars(self) -> None:
        """Collapse Lab's left and right side areas (more room for outputs)."""
        self.page.evaluate(
            "() => { const s = window.jupyterapp.shell; s.collapseLeft(); s.collapseRight(); }"
        )
        self.page.wait_for_function("() => window.jupyterapp.shell.leftCollapsed")

    def run_cell(self, index: int = 0) -> None:
        """Select cell ``index`` and run it (without awaiting the command's promise)."""
        self.page.evaluate(
            """(i) => { const w = window.jupyterapp.shell.currentWidget; w.content.activeCellIndex = i;
                        void window.jupyterapp.commands.execute('notebook:run-cell'); }""",
            index,
        )

    def run_all(self) -> None:
        self.page.evaluate("() => { void window.jupyterapp.commands.execute('notebook:run-all-cells'); }")

    def save(self) -> Path:
        """Save the current notebook (``docmanager:save``) and return its path once written."""
        path = self.page.evaluate(
            "async () => { const w = window.jupyterapp.shell.currentWidget;"
            " await window.jupyterapp.commands.execute('docmanager:save'); return w.context.path; }"
        )
        self.page.wait_for_function(
            "() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=10_000
        )
        return self.server.root_dir / path

    def set_theme(self, dark: bool) -> None:
        theme = "JupyterLab Dark" if dark else "JupyterLab Light"
        self.page.evaluate(
            "(t) => window.jupyterapp.commands.execute('apputils:change-theme', {theme: t})", theme
        )
        self.page.wait_for_function("(d) => document.body.dataset.jpThemeLight === String(!d)", arg=dark)

    def screenshot(self, name: str, locator: Any | None = None) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / name
        (locator or self.page).screenshot(path=str(path))
        return path


@pytest.fixture()
def lab(request: pytest.FixtureRequest, jupyter_lab: JupyterLab, browser_context: Any) -> Iterator[LabPage]:
    jupyter_lab.wait_ready()
    page = browser_context.new_page()
    helper = LabPage(page, jupyter_lab)
    try:
        yield helper
    finally:
        if helper.console:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            (ARTIFACTS / f"{request.node.name}.console.log").write_text("\n".join(helper.console))
        page.close()
