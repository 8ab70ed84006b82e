"""Fixtures of the tracking tests: Trackio in a temporary folder, one migrated MLflow SQLite store copied per test.

Trackio reads ``TRACKIO_DIR`` once, when it is imported: it is set here, at collection, before any test imports it
(nothing else in the suite imports trackio). A fresh MLflow SQLite store runs MLflow's migrations (5-20 s on this
machine); they run once, into a template that each test copies (milliseconds).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tests.rapidfire_nb.tracking._tracking_helpers import need

if "trackio" not in sys.modules:
    os.environ["TRACKIO_DIR"] = tempfile.mkdtemp(prefix="rf-trackio-")
    atexit.register(shutil.rmtree, os.environ["TRACKIO_DIR"], ignore_errors=True)
TRACKIO_DIR = Path(os.environ.get("TRACKIO_DIR", ""))


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow SQLite store with MLflow's tables made (copy it with :func:`mlflow_store_at`)."""
    need("mlflow")
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path
