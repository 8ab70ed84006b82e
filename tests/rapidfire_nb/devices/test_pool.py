"""DevicePool.close: every member closed, then ``on_closed`` once (the Ray backend removes its placement group)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb.devices.pool import DevicePool


class _Member:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def alive(self, device: str) -> bool:
        return True

    def close(self) -> None:
        self.log.append(f"close {self.name}")


def _pool(log: list[str], hook: Any) -> DevicePool:
    members = {"cpu:0": _Member(log, "cpu:0"), "cpu:1": _Member(log, "cpu:1")}
    return DevicePool(members, Path("."), lambda spec, folder: (None, None), on_closed=hook)


def test_on_closed_runs_once_after_every_member_closed() -> None:
    log: list[str] = []
    pool = _pool(log, lambda: log.append("removed"))
    pool.close()
    assert sorted(log[:2]) == ["close cpu:0", "close cpu:1"]
    assert log[2:] == ["removed"]
    pool.close()  # the members' close is theirs to make idempotent; the hook runs no more
    assert log.count("removed") == 1


def test_a_failing_on_closed_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    def hook() -> None:
        raise RuntimeError("no cluster")

    with caplog.at_level(logging.ERROR):
        _pool([], hook).close()
    assert "no cluster" in caplog.text
