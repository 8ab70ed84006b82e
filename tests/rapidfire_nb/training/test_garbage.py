"""TRL's full gc.collect() at train() starts: once per device until a run's train() ended (training/garbage.py)."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from rapidfire_nb.training.garbage import TrainStartCollections


class _Cycle:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


class FakeAccelerator:
    """Records what ``free_memory`` saw: the freeze count and how many objects its ``gc.collect()`` freed."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, tuple[Any, ...]]] = []

    def free_memory(self, *objects: Any) -> list[None]:
        frozen = gc.get_freeze_count()
        self.calls.append((frozen, gc.collect(), objects))
        return [None] * len(objects)


@pytest.fixture(autouse=True)
def _unfrozen() -> Any:
    # no automatic collection between making the cycles and the call that should find them (a generation-0 pass
    # triggered by the allocations would free some first); the collector stays enabled
    thresholds = gc.get_threshold()
    gc.set_threshold(1_000_000)
    gc.collect()
    assert gc.get_freeze_count() == 0
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def _garbage() -> None:
    for _ in range(50):
        _Cycle()  # 50 unreachable cycles


def test_only_the_first_start_and_the_first_after_a_run_left_collect() -> None:
    record = TrainStartCollections()
    accels = [FakeAccelerator() for _ in range(4)]
    for a in accels:
        record.wrap(a)
    for a in accels[:3]:  # three runs start train() one after the other
        _garbage()
        assert a.free_memory("x") == [None], "TRL's return value passes through"
    assert accels[0].calls[0][0] == 0 and accels[0].calls[0][1] >= 50, "first start: a full collection"
    for a in accels[1:3]:
        frozen, freed, objects = a.calls[0]
        assert frozen > 1000 and freed == 0, "later starts: every object frozen, nothing traversed"
        assert objects == ("x",)
    assert gc.get_freeze_count() == 0, "unfrozen after the call"
    assert (record.full, record.skipped) == (1, 2)
    record.run_left()  # a run's train() ended: its trainer may be garbage now
    _garbage()
    accels[3].free_memory()
    assert accels[3].calls[0][0] == 0 and accels[3].calls[0][1] >= 50
    assert (record.full, record.skipped) == (2, 2)
    gc.collect()
    assert gc.collect() == 0, "the cycles created before the skipped starts are collected later as usual"


def test_a_users_freeze_or_disabled_collector_gets_trls_call_unchanged() -> None:
    record = TrainStartCollections()
    first, second, third = FakeAccelerator(), FakeAccelerator(), FakeAccelerator()
    for a in (first, second, third):
        record.wrap(a)
    first.free_memory()
    gc.freeze()  # the user froze their objects (e.g. before forking)
    try:
        second.free_memory()
        assert second.calls[0][0] > 1000, "TRL's call ran with their objects frozen, as they left them"
        assert gc.get_freeze_count() > 1000, "their freeze is not undone"  # (a frozen object freed drops out)
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        third.free_memory()
    finally:
        gc.enable()
    assert (record.full, record.skipped) == (3, 0)


def test_an_exception_in_free_memory_still_unfreezes() -> None:
    record = TrainStartCollections()

    class Broken:
        def free_memory(self) -> None:
            raise RuntimeError("device cache")

    warm, broken = FakeAccelerator(), Broken()
    record.wrap(warm)
    record.wrap(broken)
    warm.free_memory()
    with pytest.raises(RuntimeError, match="device cache"):
        broken.free_memory()
    assert gc.get_freeze_count() == 0
