"""The write window (issue 15's overhead): MLflow and Trackio hold each run's points and write them once per
``WRITE_EVERY_S`` seconds, at the run's status change, at ``flush()`` and at ``close()``; the values and steps
written are the logged ones. Run against the real backends, with a clock the test moves."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb.tracking import TrackedRun
from rapidfire_nb.tracking.backends import openers
from rapidfire_nb.tracking.fanout import WRITE_EVERY_S, TrackerSet
from tests.rapidfire_nb.tracking._tracking_helpers import mlflow_store_at, need
from tests.rapidfire_nb.tracking.test_backend_contract import _Reader


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Fake:
    name, metric_style = "fake", "trl"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, method: str) -> Any:
        return lambda *args: self.calls.append(method)


def test_end_batch_reaches_the_backends_once_per_window_flush_always() -> None:
    clock, fake = _Clock(), _Fake()
    fan = TrackerSet([("fake", lambda: fake)], lambda line: None, clock=clock)
    fan.open()
    fan.end_batch()  # the first batch starts the window
    clock.now += WRITE_EVERY_S - 0.01
    fan.end_batch()
    assert "end_batch" not in fake.calls
    clock.now += 0.01
    fan.end_batch()
    fan.end_batch()
    assert fake.calls.count("end_batch") == 1
    fan.flush()  # at once, and a new window starts
    clock.now += WRITE_EVERY_S / 2
    fan.end_batch()
    assert fake.calls.count("end_batch") == 1 and fake.calls.count("flush") == 1


@pytest.fixture(params=["mlflow", "trackio"])
def backend(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    need(request.param)
    if request.param == "mlflow":
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        mlflow_store_at(request.getfixturevalue("mlflow_template"), tmp_path / "mlflow.db")
    return str(request.param)


def _eventually(read: Any, expected: Any, within_s: float = 5.0) -> Any:
    """Trackio's writer thread writes what it was handed within its interval (0.5 s): wait for it."""
    deadline = time.monotonic() + within_s
    while (got := read()) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def test_points_are_written_by_window_at_flush_and_at_a_status_change_unchanged(
    backend: str, tmp_path: Path
) -> None:
    project = f"window-{backend}"
    state: dict[str, Any] = {}

    def save(name: str, value: dict[str, Any]) -> None:
        state[name] = value

    clock = _Clock()
    fan = TrackerSet(openers([backend], tmp_path, project, {}, save), lambda line: None, clock=clock)
    fan.open()
    for rid in (1, 2):
        fan.start_run(TrackedRun(rid, {"learning_rate": 1e-3}, {}, "SFT"), "NEW")
        fan.set_status(rid, "ONGOING")
    reader = _Reader(backend, tmp_path, project, state)
    loss = {s: 1.0 / s + 0.123456789 for s in range(1, 8)}

    def history(rid: int) -> list[tuple[int, float]]:
        return reader.history(rid, "loss")

    def logged(rid: int, steps: range) -> list[tuple[int, float]]:
        return [(s, loss[s] + rid) for s in steps]

    for step in (1, 2, 3):  # within the window: held
        for rid in (1, 2):
            fan.log_metrics(rid, step, {"loss": loss[step] + rid}, 1000.0 + step)
        fan.end_batch()
        clock.now += 1.0
    assert history(1) == [] and history(2) == []
    clock.now += WRITE_EVERY_S  # the window is over: the next batch writes every run's points
    fan.end_batch()
    assert _eventually(lambda: history(1), logged(1, range(1, 4))) == logged(1, range(1, 4))
    assert _eventually(lambda: history(2), logged(2, range(1, 4))) == logged(2, range(1, 4))

    for step in (4, 5):
        fan.log_metrics(1, step, {"loss": loss[step] + 1})
        fan.end_batch()
    assert history(1) == logged(1, range(1, 4))
    fan.flush()  # written before it returns
    assert history(1) == logged(1, range(1, 6))

    fan.log_metrics(1, 6, {"loss": loss[6] + 1})
    fan.log_metrics(2, 6, {"loss": loss[6] + 2})
    fan.end_batch()
    fan.set_status(1, "COMPLETED")  # run 1's points first, then its status; run 2's wait for the window
    assert history(1) == logged(1, [*range(1, 7)])
    assert history(2) == logged(2, range(1, 4))
    if backend == "mlflow":
        assert reader.lifecycle(1) == ("FINISHED", "active")
    else:
        assert reader.lifecycle(1) == ["run-1 running", "run-1 finished"]

    fan.log_metrics(2, 7, {"loss": loss[7] + 2})
    fan.close()  # everything
    assert history(2) == logged(2, [*range(1, 4), 6, 7])
