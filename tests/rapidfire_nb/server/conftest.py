"""Fixtures for the server extension tests: jupyter_server's pytest plugin, scoped to this folder, and stores.

``pytest_plugins`` may only be set in the top-level conftest, so the plugin's fixtures and hooks are imported
here instead: they apply to the tests in this folder only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pytest_jupyter.jupyter_server import *
from traitlets.config import Config

from tests.rapidfire_nb.server._stores import make_experiment


@pytest.fixture
def rf_root(tmp_path: Path) -> Path:
    root = tmp_path / "experiments"
    root.mkdir()
    return root


@pytest.fixture
def writers(rf_root: Path) -> Any:
    """Two experiments: ``live`` (a kernel beating) and ``dead`` (no kernel; run 1 was ONGOING)."""
    stores = {"live": make_experiment(rf_root, "live"), "dead": make_experiment(rf_root, "dead", alive=False)}
    yield stores
    for s in stores.values():
        s.close()


@pytest.fixture
def jp_server_config(rf_root: Path) -> Config:
    return Config(
        {
            "ServerApp": {"jpserver_extensions": {"rapidfire_nb.server": True}},
            "RapidfireApp": {"experiments_root": str(rf_root)},
        }
    )
