"""The device transports (``rapidfire_nb.devices.backends``): chosen once from ``backend=``, each answering what
resolving, checking and building the pool ask (no worker is started here: fake transports stand in).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import datasets
import pytest

from rapidfire_nb.devices import backends
from rapidfire_nb.devices.backends import (
    BACKENDS,
    LocalTransport,
    Placement,
    RayTransport,
    Transport,
    get_transport,
)
from rapidfire_nb.devices.build import make_pool
from rapidfire_nb.devices.resolve import resolve_devices
from rapidfire_nb.devices.settings import WorkerSettings
from rapidfire_nb.errors import ConfigError
from rapidfire_nb.experiment.inputs import check_devices
from rapidfire_nb.spec.bundles import GroupSettings, TrainingCallbacks


def test_the_backend_names_one_shared_transport() -> None:
    assert BACKENDS == ("local", "ray")
    assert get_transport(None) is get_transport("local")
    assert isinstance(get_transport("local"), LocalTransport) and not get_transport("local").always_workers
    assert isinstance(get_transport("ray"), RayTransport) and get_transport("ray").always_workers
    for bad in ("rayy", "Local", 3, ["ray"]):
        with pytest.raises(
            ConfigError, match=re.escape(f"backend must be one of 'local', 'ray', got {bad!r}")
        ):
            get_transport(bad)


def test_a_plan_knows_its_transport_and_a_kernel_plan_has_none() -> None:
    assert isinstance(resolve_devices(2, "local", 0, 2).transport, LocalTransport)
    assert isinstance(resolve_devices(1, "ray", 0, 2).transport, RayTransport)
    kernel = resolve_devices(None, None, 0, 2)
    with pytest.raises(ValueError, match="no workers and no transport"):
        _ = kernel.transport


def test_ray_without_ray_installed_is_refused_before_anything_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        backends.importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name)
    )
    with pytest.raises(ConfigError, match=r'backend="ray" needs Ray: pip install "rapidfire_nb\[ray\]"'):
        check_devices(None, "ray")  # Ray: one CPU actor even for one device
    LocalTransport().check_available()  # nothing to install
    assert check_devices(1, "local").workers is False  # one device: the kernel process, nothing checked


def test_local_workers_keep_the_plans_threads_and_reserve_nothing() -> None:
    assert LocalTransport().place((None, None), 3) == Placement(3, None, None)


def test_ray_placement_fits_the_threads_and_removes_its_group_once_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rapidfire_nb.devices import ray_backend, ray_gangs

    calls: list[Any] = []
    monkeypatch.setattr(
        ray_backend, "fit_threads", lambda devices, threads: calls.append(("fit", devices, threads)) or 1
    )
    monkeypatch.setattr(ray_gangs, "check_room", lambda gpus, threads: calls.append(("room", gpus, threads)))
    monkeypatch.setattr(
        ray_gangs, "placement_group_for", lambda gpus, threads: calls.append(("pg", gpus, threads)) or "PG"
    )
    monkeypatch.setattr(ray_gangs, "remove_placement_group", lambda group: calls.append(("remove", group)))
    placement = RayTransport().place((0, None), 4)
    assert placement.threads == 1
    assert calls == [("fit", 2, 4), ("room", (True, False), 1)]  # checked now, reserved on first use
    assert placement.handle.get() == "PG" and placement.handle.get() == "PG"  # made once
    assert calls[2:] == [("pg", [True, False], 1)]
    assert placement.on_closed is not None
    placement.on_closed()
    assert calls[-1] == ("remove", "PG")


class _Worker:
    def __init__(self, log: list[str], settings: WorkerSettings) -> None:
        self.log, self.settings = log, settings

    def close(self) -> None:
        self.log.append(f"close {self.settings.device}")


class _FakeTransport(Transport):
    """Starts fake workers; halves the threads; fails on device ``fail_at`` when set."""

    name = "local"  # stands in for the local transport in the registry

    def __init__(self, log: list[str], fail_at: int | None = None) -> None:
        self.log, self.fail_at = log, fail_at

    def place(self, gpus: tuple[int | None, ...], threads: int) -> Placement:
        self.log.append(f"place {len(gpus)} x {threads}")
        return Placement(max(1, threads // 2), "handle", lambda: self.log.append("undone"))

    def start(
        self, index: int, settings: WorkerSettings, callbacks: TrainingCallbacks, placement: Placement
    ) -> Any:
        if index == self.fail_at:
            raise ConfigError(f"cannot ship to {settings.device}")
        self.log.append(f"start {settings.device} {placement.handle} threads={settings.torch_threads}")
        return _Worker(self.log, settings)


def _make(tmp_path: Path, transport: _FakeTransport, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setitem(backends._TRANSPORTS, "local", transport)
    plan = resolve_devices(2, "local", cuda_count=0, cores=4)
    group = GroupSettings("SFT", lambda config: None, num_chunks=2, seed=0)
    rows = datasets.Dataset.from_list([{"text": "a"}, {"text": "b"}])
    said: list[str] = []
    pool = make_pool(
        plan, group, (rows, None), tmp_path, TrainingCallbacks(), lambda *a: (None, None), said.append
    )
    return pool, said


def test_make_pool_places_then_starts_every_device_through_the_plans_transport(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[str] = []
    pool, said = _make(tmp_path, _FakeTransport(log), monkeypatch)
    assert log == ["place 2 x 2", "start cpu:0 handle threads=1", "start cpu:1 handle threads=1"]
    assert said == ["training on 2 devices (cpu:0, cpu:1; local workers, 1 torch thread(s) each)"]
    pool.close()
    assert sorted(log[3:5]) == ["close cpu:0", "close cpu:1"] and log[5:] == ["undone"]


def test_a_worker_that_cannot_start_closes_the_started_ones_and_undoes_the_placement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[str] = []
    with pytest.raises(ConfigError, match="cannot ship to cpu:1"):
        _make(tmp_path, _FakeTransport(log, fail_at=1), monkeypatch)
    assert log == ["place 2 x 2", "start cpu:0 handle threads=1", "close cpu:0", "undone"]
