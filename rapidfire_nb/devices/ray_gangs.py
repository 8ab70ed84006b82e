"""Placement groups of ``backend="ray"``: the single devices' group (made on first use) and one per gang (no torch).

* The single-device actors share one group with a bundle per device (:class:`DeviceGroup`), made when the first
  of them starts: a ``run_fit`` whose runs all train over several devices reserves nothing for single devices.
* A gang (a run with ``num_gpus=k``, :class:`~rapidfire_nb.devices.gang.GangExecutor`) gets a group of its own,
  ``k`` bundles, strategy ``STRICT_PACK`` (every bundle on one node, so the ranks meet at ``MASTER_ADDR=127.0.0.1``):
  :func:`start_gang`. The group is removed once every rank closed (the gang's ``close``, or its ``revive``, which
  closes the dead ranks and starts ``k`` fresh actors on a fresh group).

Each rank's actor starts with its gang environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``...:
:func:`~rapidfire_nb.devices.gang.rank_env`) set before torch is imported there. On GPUs Ray shows each actor only
its bundle's GPU, so a GPU rank trains on ``cuda:0`` (``LOCAL_RANK=0``) and NCCL reaches its peers across the
process boundary. Not covered: ``MASTER_PORT`` is picked free on the kernel's machine, so a gang that Ray places on
another node may (rarely) find it taken there; the gang then fails to start and the run is interrupted.

A gang's bundles come on top of the single devices' (each a ``{"CPU": threads}`` or ``{"GPU": 1, "CPU": threads}``
reservation): a ``run_fit`` mixing one-device runs and gangs on Ray needs a cluster with room for both.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

from ..spec.bundles import TrainingCallbacks
from ._remote import RemoteDevice
from .ray_backend import RayWorkerExecutor, check_room, placement_group_for, remove_placement_group
from .settings import WorkerSettings

__all__ = ["DeviceGroup", "GangGroup", "start_gang"]


class DeviceGroup:
    """The single devices' placement group, made on first :meth:`get` (one bundle per device of the plan).

    Args:
        gpus: per device, True for a GPU device. threads: CPUs per bundle.

    Raises:
        ConfigError: (construction) the cluster has fewer CPUs or GPUs than the devices need at all.
    """

    def __init__(self, gpus: Sequence[bool], threads: int) -> None:
        self.gpus = tuple(gpus)
        self.threads = threads
        check_room(self.gpus, threads)
        self._group: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        """The group, made and reserved on the first call (ConfigError when the cluster cannot reserve it)."""
        with self._lock:
            if self._group is None:
                self._group = placement_group_for(list(self.gpus), self.threads)
            return self._group

    def remove(self) -> None:
        """Remove the group if it was made (never raises); :meth:`get` makes a new one afterwards."""
        with self._lock:
            group, self._group = self._group, None
        if group is not None:
            remove_placement_group(group)


class GangGroup:
    """One gang's placement group, removed when the last of its ``ranks`` actors closed (or by :meth:`remove`).

    Attributes:
        group: the Ray placement group (``group.bundle_specs``: one bundle per rank).
    """

    def __init__(self, group: Any, ranks: int) -> None:
        self.group = group
        self._left = ranks
        self._lock = threading.Lock()

    def rank_closed(self) -> None:
        """One rank's actor was closed (killed); the last one removes the group."""
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self.remove()

    def remove(self) -> None:
        """Remove the group now (its actors die with it); a second call does nothing. Never raises."""
        with self._lock:
            group, self.group, self._left = self.group, None, 0
        if group is not None:
            remove_placement_group(group)


def start_gang(
    ranks: Sequence[tuple[WorkerSettings, TrainingCallbacks]], gpus: Sequence[bool], threads: int
) -> list[RemoteDevice]:
    """Start a gang's ``k`` rank actors on a fresh ``STRICT_PACK`` group of ``k`` bundles (rank r on bundle r).

    Args:
        ranks: per rank (rank 0 first), its settings (``env`` holding :func:`~.gang.rank_env`'s variables) and
            the callbacks its events reach.
        gpus: per rank, True for a GPU rank. threads: CPUs per bundle (the ranks' torch threads).

    Returns:
        The ranks' :class:`~.ray_backend.RayWorkerExecutor` (each with ``kill()``), rank 0 first; the group is
        removed once all of them closed.

    Raises:
        ConfigError: the cluster cannot reserve ``k`` bundles on one node, or ``create_model_fn`` cannot be sent
            (the actors started are closed and the group removed first).
    """
    group = GangGroup(placement_group_for(list(gpus), threads, strategy="STRICT_PACK"), len(ranks))
    started: list[RemoteDevice] = []
    try:
        for bundle, (settings, callbacks) in enumerate(ranks):
            env = dict(settings.env)
            if gpus[bundle]:  # Ray shows the actor its bundle's GPU only: it is cuda:0 there
                env.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
            rank = dataclasses.replace(settings, env=env)
            started.append(
                RayWorkerExecutor(rank, group.group, bundle, callbacks, on_closed=group.rank_closed)
            )
    except BaseException:
        for actor in started:
            actor.close()
        group.remove()
        raise
    return started
