"""Which devices ``run_fit`` trains on: ``devices=`` and ``backend=`` resolved against the machine (pure).

* ``devices=None`` (default): every visible CUDA GPU, one worker process each; one GPU or none: one device in
  the kernel process, as before (no worker to start).
* ``devices=N``: the first N GPUs; on a machine without a GPU, N CPU workers, each with ``cores // N`` torch
  threads (``devices=1``: the kernel process).
* ``devices=["cuda:0", "cuda:3"]`` (or ``[0, 3]``): those GPUs; ``["cpu", "cpu"]``: two CPU workers.
* ``backend="local"`` (default): spawned worker processes on this machine; ``backend="ray"``: Ray actors (one per
  device, placed with a placement group), on any node of the cluster ``ray.init`` joined. ``backend="ray"``
  always uses workers, even for one device. The backend is chosen here, once, as a
  :class:`~rapidfire_nb.devices.backends.Transport` (``DevicePlan.transport``); nothing else tests its name.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..spec.gangs import gang_tiles
from .backends import BACKENDS, Transport, get_transport

__all__ = ["BACKENDS", "DevicePlan", "resolve_devices"]

_KERNEL = "kernel"  # DevicePlan.backend of one device in the kernel process (no worker, no transport)


@dataclass(frozen=True)
class DevicePlan:
    """Where the runs of one ``run_fit`` train.

    Attributes:
        backend: ``"kernel"`` (one device in the kernel process, no worker), ``"local"`` or ``"ray"``.
        names: device names, one per worker (``"cuda:0"``, ``"cpu:1"``); ``("device",)`` for ``"kernel"``.
        gpus: for each worker, the GPU index it sees as its only one (``CUDA_VISIBLE_DEVICES``), or None (CPU).
        threads: torch threads per worker (CPU workers: ``cores // workers``; GPU workers: ``cores // workers``).
        widths: the widths (``num_gpus`` above 1) of the runs over several devices, ascending; () when none.
        singles: False when every run trains over several devices (no single-device worker is started).
    """

    backend: str
    names: tuple[str, ...]
    gpus: tuple[int | None, ...] = field(default_factory=tuple)
    threads: int = 1
    widths: tuple[int, ...] = ()
    singles: bool = True

    @property
    def gangs(self) -> list[tuple[str, tuple[int, ...]]]:
        """The composite devices of the runs over several devices: ``[(name, indices into names)]``
        (:func:`~rapidfire_nb.spec.gangs.gang_tiles` of :attr:`widths`); [] when no run is wider than one device."""
        return gang_tiles(self.names, self.widths)

    @property
    def workers(self) -> bool:
        """True when the runs train in worker processes (or actors), not in the kernel."""
        return self.backend != _KERNEL

    @property
    def transport(self) -> Transport:
        """How the kernel reaches the workers (``backend``'s :class:`~rapidfire_nb.devices.backends.Transport`).

        Raises:
            ValueError: a ``"kernel"`` plan (no worker to reach; ask :attr:`workers` first).
        """
        if not self.workers:
            raise ValueError("a DevicePlan of the kernel process has no workers and no transport")
        return get_transport(self.backend)

    def env(self, index: int) -> dict[str, str]:
        """The environment worker ``index`` starts with (its one GPU, its thread count)."""
        gpu = self.gpus[index] if index < len(self.gpus) else None
        out = {"OMP_NUM_THREADS": str(self.threads)}
        out["CUDA_VISIBLE_DEVICES"] = "" if gpu is None else str(gpu)
        return out


def _int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def resolve_devices(devices: Any, backend: Any, cuda_count: int, cores: int) -> DevicePlan:
    """Resolve ``run_fit(devices=..., backend=...)`` for a machine with ``cuda_count`` GPUs and ``cores`` CPUs.

    Args:
        devices: None, a positive int, or a list of device names (``"cuda:<i>"``, ``"cpu"``) or GPU indices.
        backend: ``"local"`` or ``"ray"`` (None: ``"local"``).
        cuda_count: visible CUDA GPUs (``torch.cuda.device_count()``).
        cores: CPU cores this process may use (``len(os.sched_getaffinity(0))``).

    Raises:
        ConfigError: a bad value, naming the argument and the fix (e.g. more GPUs than are visible).
    """
    transport = get_transport(backend)
    name, cores = transport.name, max(1, int(cores))
    kernel = DevicePlan(_KERNEL, ("device",), (None,), cores)
    if devices is None:
        if cuda_count > 1 or (transport.always_workers and cuda_count == 1):
            return _gpus(tuple(range(cuda_count)), name, cores)
        return _cpus(1, name, cores) if transport.always_workers else kernel
    if _int(devices):
        n = int(devices)
        if n < 1:
            raise ConfigError(f"devices must be >= 1 (workers to train on), got {n}")
        if n > cuda_count > 0:
            raise ConfigError(
                f"devices={n} but {cuda_count} CUDA GPU(s) are visible; pass devices={cuda_count} or fewer "
                "(or set CUDA_VISIBLE_DEVICES before starting the kernel)"
            )
        if n == 1 and not transport.always_workers:
            return kernel
        return _gpus(tuple(range(n)), name, cores) if cuda_count else _cpus(n, name, cores)
    gpus, cpus = _listed(devices, cuda_count)
    return _gpus(gpus, name, cores) if gpus else _cpus(cpus, name, cores)


def _listed(devices: Any, cuda_count: int) -> tuple[tuple[int, ...], int]:
    """``devices=[...]`` read as ``(GPU indices, number of CPU workers)``, one of them empty.

    Raises:
        ConfigError: not a non-empty list, a name that is neither a GPU nor ``"cpu"``, GPUs and CPUs mixed, a GPU
            that is not visible or listed twice.
    """
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence) or not devices:
        raise ConfigError(
            'devices must be None, a number of workers, or a list such as ["cuda:0", "cuda:3"] or '
            f'["cpu", "cpu"], got {devices!r}'
        )
    gpus: list[int] = []
    cpus = 0
    for item in devices:
        if _int(item):
            gpus.append(int(item))
        elif isinstance(item, str) and item.strip().lower().startswith("cuda"):
            tail = item.strip().lower()[4:].lstrip(":")
            if not tail.isdigit():
                raise ConfigError(f'devices: {item!r} is not a GPU name; write "cuda:<index>", e.g. "cuda:0"')
            gpus.append(int(tail))
        elif isinstance(item, str) and item.strip().lower().split(":")[0] == "cpu":
            cpus += 1
        else:
            raise ConfigError(f'devices: {item!r} is neither "cuda:<index>" nor "cpu"')
    if gpus and cpus:
        raise ConfigError("devices: mix of GPUs and CPU workers; list GPUs only or CPU workers only")
    bad = [g for g in gpus if not 0 <= g < cuda_count]
    if bad:
        raise ConfigError(
            f"devices: GPU {bad[0]} is not visible ({cuda_count} CUDA GPU(s): indices 0..{cuda_count - 1})"
            if cuda_count
            else f"devices: GPU {bad[0]} asked for, but no CUDA GPU is visible; use devices=N for N CPU workers"
        )
    if len(set(gpus)) != len(gpus):
        raise ConfigError(f"devices: GPU listed twice in {devices!r}; one worker per GPU")
    return tuple(gpus), cpus


def _gpus(indices: tuple[int, ...], backend: str, cores: int) -> DevicePlan:
    return DevicePlan(backend, tuple(f"cuda:{i}" for i in indices), indices, max(1, cores // len(indices)))


def _cpus(n: int, backend: str, cores: int) -> DevicePlan:
    if n > cores:
        raise ConfigError(
            f"devices={n} CPU workers on a machine where this process may use {cores} core(s): each worker needs a "
            f"core of its own (more only makes every step slower and multiplies memory); use devices={cores} or fewer"
        )
    return DevicePlan(backend, tuple(f"cpu:{i}" for i in range(n)), (None,) * n, max(1, cores // n))
