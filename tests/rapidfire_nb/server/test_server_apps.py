"""The extension is enabled by the install itself and loads in the Jupyter front ends' servers.

``jupyter server extension list`` shows ``rapidfire_nb.server`` enabled and valid; a Notebook 7 server started
with no extension flags (only the config the install put in ``<sys.prefix>/etc/jupyter``) serves the REST API and
the page. JupyterLab's server is covered the same way by the real-browser tests (``tests/browser``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
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

from tests.rapidfire_nb.server._stores import make_experiment

REPO = Path(__file__).resolve().parents[3]


def _env(tmp_path: Path, root: Path) -> dict[str, str]:
    """A throwaway user config/runtime dir: only the install's own config (sys.prefix) enables extensions."""
    return {
        **os.environ,
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "RF_HOME": str(root),
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
    }


def test_extension_list_shows_it_enabled_and_valid(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "jupyter", "server", "extension", "list"],
        env=_env(tmp_path, tmp_path / "exp"),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)  # drop colour codes
    assert re.search(r"rapidfire_nb\.server\s+enabled", text), text
    assert re.search(r"rapidfire_nb\.server\s+OK", text), text


@pytest.fixture
def notebook7(tmp_path: Path) -> Iterator[dict[str, Any]]:
    pytest.importorskip(
        "notebook", minversion="7", reason="Notebook 7 (the `notebook` package) is not installed"
    )
    root = tmp_path / "experiments"
    make_experiment(root, "nb7-exp", alive=False).close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    log_path = tmp_path / "notebook.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "notebook",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            "--port-retries=0",
            "--allow-root",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={tmp_path}",
        ],
        env=_env(tmp_path, root),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{url}api/status?token={token}", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail("Notebook 7 did not start:\n" + log_path.read_text())
                time.sleep(0.3)
        yield {"url": url, "token": token, "log": log_path}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        log.close()


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode(errors="replace")


def test_notebook7_loads_the_extension_from_the_install_config(notebook7: dict[str, Any]) -> None:
    url, token = notebook7["url"], notebook7["token"]
    status, ctype, body = _get(f"{url}rapidfire/api/experiments?token={token}")
    assert status == 200 and "json" in ctype, (status, body[:300])
    names = [e["name"] for e in json.loads(body)["experiments"]]
    assert names == ["nb7-exp"], body[:300]
    status, _, body = _get(f"{url}rapidfire/api/experiments/nb7-exp/runs?token={token}")
    assert status == 200 and sorted(r["run_id"] for r in json.loads(body)["runs"]) == [1, 2, 3]
    status, ctype, body = _get(f"{url}rapidfire/?token={token}")
    assert status == 200 and "html" in ctype and "rapidfire" in body.lower()
    assert _get(f"{url}rapidfire/api/experiments")[0] == 403  # no token
    assert _get(f"{url}tree?token={token}")[0] == 200  # Notebook 7's own page: it is Notebook 7 serving
    log = notebook7["log"].read_text()
    assert "rapidfire_nb.server | extension was successfully loaded" in log, log[-3000:]
    assert "notebook | extension was successfully loaded" in log, log[-3000:]  # Notebook 7's own extension
