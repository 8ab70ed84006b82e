"""Devices as every window shows them: the server page's device chip, the device of each run, the header's list.

Standard library + :mod:`kernel_scheduler` only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kernel_scheduler import DEFAULT_DEVICE, RunSnapshot, RunStatus

from .. import meta_keys
from .ops_view import parse_status

__all__ = [
    "DEVICE_STATES",
    "device_list",
    "device_status",
    "run_device",
    "placed_as",
    "run_sharding",
    "stored_devices",
    "stored_packs",
]

#: A device's state in a snapshot's ``devices``: a run trains there, nothing does, its worker died, or (the server
#: page: the store does not record it) unknown.
DEVICE_STATES = ("training", "idle", "lost", "—")


def device_status(statuses: Iterable[RunStatus | str], writer_alive: bool, ended: bool = False) -> str:
    """The server page's device chip: what the store can tell about the device (not the run on it).

    Args:
        statuses: the runs' (reported) statuses.
        writer_alive: whether a kernel holds the experiment.
        ended: whether its kernel ended it (``experiment.end()``; meta ``ended_at``).

    Returns:
        ``"experiment ended"``, ``"no kernel running"``, ``"training (kernel alive)"`` (a live writer with
        NEW/ONGOING runs trains one of them) or ``"device idle (kernel alive)"``.
    """
    if ended:
        return "experiment ended"
    if not writer_alive:
        return "no kernel running"
    if any((st := parse_status(s)) is not None and st.in_rotation() for s in statuses):
        return "training (kernel alive)"
    return "device idle (kernel alive)"


def _natural(name: str) -> tuple[str, int, str]:
    """Sort key of a device name: ``cpu:2`` before ``cpu:10``."""
    head, _, tail = name.rpartition(":")
    return (head, int(tail), "") if tail.isdigit() else (name, -1, "")


def stored_devices(meta: Mapping[str, Any]) -> dict[int, str]:
    """Run id -> device, from meta ``devices`` (empty when the experiment trained on one device)."""
    stored = meta.get(meta_keys.DEVICES)
    if not isinstance(stored, Mapping):
        return {}
    out = {}
    for rid, dev in stored.items():
        if isinstance(dev, str) and dev and dev != DEFAULT_DEVICE and str(rid).isdigit():
            out[int(rid)] = dev
    return out


def stored_packs(meta: Mapping[str, Any]) -> dict[int, int]:
    """Run id -> the id of the pack it trains in (the pack's smallest run id), from meta ``packs``; a run not packed
    is absent (empty when no run trains packed: ``run_fit(packing=...)``)."""
    stored = meta.get(meta_keys.PACKS)
    if not isinstance(stored, Mapping):
        return {}
    return {
        int(rid): pack
        for rid, pack in stored.items()
        if isinstance(pack, int) and not isinstance(pack, bool) and str(rid).isdigit()
    }


def run_sharding(config: Any) -> str | None:
    """How a run spans several devices, from its stored config (``LeafConfig.to_json()``): ``"fsdp"`` (``num_gpus``
    above 1 and ``fsdp`` in its training args: PyTorch FSDP2), ``"ddp"`` (``num_gpus`` above 1 without it) or None
    (one device; also for a config stored before ``num_gpus`` existed). The same rule as
    :func:`rapidfire_nb.spec.gangs.sharding_of`, read from JSON."""
    if not isinstance(config, Mapping):
        return None
    width = config.get("num_gpus")
    if not isinstance(width, int) or isinstance(width, bool) or width < 2:
        return None
    training = config.get("training")
    fsdp = training.get("fsdp") if isinstance(training, Mapping) else None
    return "fsdp" if fsdp not in (None, "", [], False) else "ddp"


def placed_as(meta: Mapping[str, Any], run_id: int, config: Any) -> dict[str, Any]:
    """A run's ``pack`` (its pack's id, the smallest run id; None: alone) and ``sharding`` (:func:`run_sharding`),
    as the panel's and the page's run rows carry them."""
    return {"pack": stored_packs(meta).get(run_id), "sharding": run_sharding(config)}


def run_device(snap: RunSnapshot | None, stored: Mapping[int, str], run_id: int) -> str | None:
    """The device a run trains on: the scheduler's (unless the single in-kernel :data:`DEFAULT_DEVICE`), else
    the one stored in meta ``devices``; None when unknown or the experiment uses one device."""
    if snap is not None and snap.device and snap.device != DEFAULT_DEVICE:
        return snap.device
    return stored.get(run_id)


def device_list(
    states: Mapping[str, str], running: Mapping[str, int], stored: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """The header's devices: one ``{"name", "state", "run_id"}`` per device, state one of :data:`DEVICE_STATES`.

    Args:
        states: the kernel's device -> ``"training"`` / ``"idle"`` / ``"lost"`` (in its device order); empty on
            the server page or with one device.
        running: device -> id of the run training there (a device in it is ``"training"``).
        stored: device names the store knows (meta ``devices``): added, in natural order, with state ``"—"``; a
            gang's (``"cpu:0+cpu:1"``) as its parts.

    Returns:
        A list (empty with one device: the header shows its single "run N on device" chip then).
    """
    out = []
    for name, state in states.items():
        rid = running.get(name)
        st = "training" if rid is not None else state if state in ("idle", "lost") else "idle"
        out.append({"name": name, "state": st, "run_id": rid})
    parts = {part for name in stored for part in name.split("+")}  # a gang's devices, each once
    for name in sorted(parts - set(states), key=_natural):
        out.append({"name": name, "state": "—", "run_id": None})
    return out
