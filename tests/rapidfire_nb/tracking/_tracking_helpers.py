"""Helpers of the tracking tests (the fixtures are in this folder's conftest.py)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

import pytest


def need(module: str) -> None:
    """Skip when ``module`` is not installed, except on CI (``CI=true``, the test extra installs it): fail there."""
    if importlib.util.find_spec(module) is not None:
        return
    message = f"{module} is not installed (pip install -e '.[test]')"
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def mlflow_store_at(template: Path, path: Path) -> str:
    """Copy the migrated template store to ``path``; returns its SQLite URI."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, path)
    return f"sqlite:///{path.resolve()}"


def mlflow_history(client: Any, mlflow_run_id: str, key: str) -> list[tuple[int, float]]:
    """``[(step, value)]`` of one MLflow metric, every point (duplicates visible), by step."""
    return sorted((int(m.step), float(m.value)) for m in client.get_metric_history(mlflow_run_id, key))


def trackio_history(project: str, run_name: str, trackio_run_id: str, key: str) -> list[tuple[int, float]]:
    """``[(step, value)]`` of one Trackio metric, every point (duplicates visible), by step."""
    from trackio.sqlite_storage import SQLiteStorage

    rows = SQLiteStorage.get_logs(project, run_name, run_id=trackio_run_id)
    return sorted((int(r["step"]), float(r[key])) for r in rows if key in r)
