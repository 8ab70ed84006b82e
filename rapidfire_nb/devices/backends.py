"""How the kernel reaches a device's worker: one object per transport, chosen once from ``run_fit(backend=...)``.

* :class:`LocalTransport` (``backend="local"``, the default): a spawned worker process per device on this machine
  (:class:`~rapidfire_nb.devices.local.WorkerExecutor`); one device trains in the kernel process instead.
* :class:`RayTransport` (``backend="ray"``): a Ray actor per device on one placement group
  (:class:`~rapidfire_nb.devices.ray_backend.RayWorkerExecutor`), even for one device; a gang's ranks on a
  ``STRICT_PACK`` group of their own (:mod:`~rapidfire_nb.devices.ray_gangs`).

A transport answers what the rest of ``devices`` asks: whether one device still gets a worker
(:func:`~rapidfire_nb.devices.resolve.resolve_devices`), whether it can run here at all (``run_fit``'s input checks),
where its workers go and how many torch threads they get, and how one worker starts
(:func:`~rapidfire_nb.devices.build.make_pool`), and a gang's ranks (:meth:`Transport.start_gang`). Torch-free; Ray is imported only by :class:`RayTransport`'s
``place``/``start``.

Adding a transport (e.g. SSH workers): a :class:`Transport` subclass here and its instance in ``_TRANSPORTS``;
its worker's kernel side as a :class:`~rapidfire_nb.devices._remote.RemoteDevice` subclass in its own module
(as ``local.py``/``ray_backend.py``), its worker side beside ``_child.py``/``_ray_actor.py``.
"""

from __future__ import annotations

import abc
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import ConfigError
from ..spec.bundles import TrainingCallbacks
from ._remote import RemoteDevice
from .settings import WorkerSettings

__all__ = ["BACKENDS", "LocalTransport", "Placement", "RayTransport", "Transport", "get_transport"]


@dataclass(frozen=True)
class Placement:
    """Where a pool's workers go, as a transport reserved it.

    Attributes:
        threads: torch threads per worker (the plan's, or fewer where the transport has fewer CPUs to give).
        handle: what :meth:`Transport.start` needs to place a worker (Ray: the single devices' placement group,
            :class:`~rapidfire_nb.devices.ray_gangs.DeviceGroup`, made on first use); None if nothing.
        on_closed: called once after every worker closed (Ray: removes the placement group); None if nothing.
    """

    threads: int
    handle: Any = None
    on_closed: Callable[[], None] | None = None


class Transport(abc.ABC):
    """One way to reach device workers. Instances are stateless and shared (``get_transport``).

    Subclasses set ``name`` (the ``backend=`` value) and ``always_workers`` (class attributes) and implement
    :meth:`start`; :meth:`check_available` and :meth:`place` default to "nothing to check or reserve".
    """

    #: the ``run_fit(backend=...)`` value that picks this transport
    name: ClassVar[str]
    #: True when even one device trains in a worker (False: one device trains in the kernel process)
    always_workers: ClassVar[bool] = False

    def check_available(self) -> None:
        """Check, before anything is built, that this transport can run in this Python.

        Raises:
            ConfigError: it cannot (naming what to install).
        """
        return None  # nothing to check by default

    def place(self, gpus: tuple[int | None, ...], threads: int) -> Placement:
        """Reserve room for one worker per device.

        Args:
            gpus: per device, the GPU index it trains on, or None for a CPU device.
            threads: the torch threads each worker would get on this machine.

        Returns:
            The placement (``threads`` unchanged by default; no handle, nothing to undo).

        Raises:
            ConfigError: the devices do not fit where this transport puts them.
        """
        return Placement(threads)

    @abc.abstractmethod
    def start(
        self, index: int, settings: WorkerSettings, callbacks: TrainingCallbacks, placement: Placement
    ) -> RemoteDevice:
        """Start device ``index``'s worker (it loads torch and TRL in the background; the first call waits).

        Args:
            index: the device's position in the plan (its bundle in the placement).
            settings: what the worker needs (its device name and environment set).
            callbacks: the kernel's callbacks (events from the worker reach them).
            placement: what :meth:`place` reserved.

        Returns:
            The worker's kernel side, an ``Executor`` for one device.

        Raises:
            ConfigError: ``create_model_fn`` or the group's functions cannot be sent to the worker.
        """

    def start_gang(
        self,
        indices: Sequence[int],
        ranks: Sequence[tuple[WorkerSettings, TrainingCallbacks]],
        placement: Placement,
    ) -> list[RemoteDevice]:
        """Start a gang's rank workers, rank 0 first (called again for each revive).

        Args:
            indices: the devices of the gang (positions in the plan), rank order.
            ranks: per rank, its settings (its environment holds :func:`~rapidfire_nb.devices.gang.rank_env`'s
                variables) and the callbacks its events reach.
            placement: what :meth:`place` reserved.

        Returns:
            One worker per rank, each with a ``kill()`` method. By default :meth:`start` per rank; the workers
            started are closed again when one fails to start.

        Raises:
            ConfigError: as :meth:`start`, or the gang does not fit where this transport puts it.
        """
        started: list[RemoteDevice] = []
        try:
            for index, (settings, callbacks) in zip(indices, ranks, strict=True):
                started.append(self.start(index, settings, callbacks, placement))
        except BaseException:
            for worker in started:
                worker.close()
            raise
        return started


class LocalTransport(Transport):
    """Spawned worker processes on this machine (``backend="local"``)."""

    name = "local"
    always_workers = False

    def start(
        self, index: int, settings: WorkerSettings, callbacks: TrainingCallbacks, placement: Placement
    ) -> RemoteDevice:
        from .local import WorkerExecutor

        return WorkerExecutor(settings, callbacks)


class RayTransport(Transport):
    """Ray actors, one per device on one placement group (``backend="ray"``): see :mod:`.ray_backend`."""

    name = "ray"
    always_workers = True

    def check_available(self) -> None:
        if importlib.util.find_spec("ray") is None:
            raise ConfigError(
                'backend="ray" needs Ray: pip install "rapidfire_nb[ray]" (or leave backend out for worker '
                "processes on this machine)"
            )

    def place(self, gpus: tuple[int | None, ...], threads: int) -> Placement:
        """One bundle per device (as many CPUs as torch threads: at most the cluster's CPUs divided among the
        devices) in one group, reserved when the first single-device actor starts (never when every run is a
        gang's); the placement's ``on_closed`` removes it."""
        from .ray_backend import fit_threads
        from .ray_gangs import DeviceGroup

        threads = fit_threads(len(gpus), threads)
        group = DeviceGroup([gpu is not None for gpu in gpus], threads)
        return Placement(threads, group, group.remove)

    def start(
        self, index: int, settings: WorkerSettings, callbacks: TrainingCallbacks, placement: Placement
    ) -> RemoteDevice:
        from .ray_backend import RayWorkerExecutor

        return RayWorkerExecutor(settings, placement.handle.get(), index, callbacks)

    def start_gang(
        self,
        indices: Sequence[int],
        ranks: Sequence[tuple[WorkerSettings, TrainingCallbacks]],
        placement: Placement,
    ) -> list[RemoteDevice]:
        """The ranks as actors on a ``STRICT_PACK`` placement group of their own, ``k`` bundles (one node, so
        ``MASTER_ADDR=127.0.0.1`` holds), removed when the last rank closed: a revive gets a fresh group."""
        from .ray_gangs import start_gang

        gpus = [placement.handle.gpus[i] for i in indices]
        return start_gang(ranks, gpus, placement.threads)


_TRANSPORTS: Mapping[str, Transport] = {t.name: t for t in (LocalTransport(), RayTransport())}

BACKENDS: tuple[str, ...] = tuple(_TRANSPORTS)
"""The ``run_fit(backend=...)`` values: ``("local", "ray")``."""


def get_transport(backend: object) -> Transport:
    """The transport ``run_fit(backend=...)`` names.

    Args:
        backend: ``"local"``, ``"ray"``, or None (``"local"``).

    Returns:
        Its shared :class:`Transport`.

    Raises:
        ConfigError: any other value (the message lists the choices).
    """
    name = "local" if backend is None else backend
    if isinstance(name, str) and name in _TRANSPORTS:
        return _TRANSPORTS[name]
    raise ConfigError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
