"""Composite devices: one run trained by a gang of k devices at once (FSDP), named by joining its parts with ``+``.

The executor lists, besides single devices (``"cpu:0"``, ``"cuda:1"``), composite devices such as
``"cuda:0+cuda:1"``: a gang of k workers in one process group. A run lives on one device of its width for its life
(a gang run on a composite of k parts, a single run on a single device). Two devices *overlap* when they share a
part: they never train at once (:class:`~kernel_scheduler.slots.DeviceSlots`,
:class:`~kernel_scheduler.placement.FairPlacement`). Pure functions of the names; standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["SEPARATOR", "device_parts", "device_width", "overlaps", "single_devices"]

SEPARATOR = "+"
"""What joins a composite device's parts in its name."""


def device_parts(name: str) -> tuple[str, ...]:
    """The single devices a device is made of, in the order its name lists them.

    ``"cpu:0+cpu:1"`` -> ``("cpu:0", "cpu:1")``; ``"cpu:0"`` -> ``("cpu:0",)``.

    Raises:
        ValueError: a part is empty (``"cpu:0+"``) or listed twice (``"cpu:0+cpu:0"``).
    """
    parts = tuple(name.split(SEPARATOR))
    if any(not p for p in parts):
        raise ValueError(
            f"device name {name!r} has an empty part; join single devices with '+', e.g. 'cpu:0+cpu:1'"
        )
    if len(set(parts)) != len(parts):
        raise ValueError(
            f"device name {name!r} lists a part twice; each part of a gang is a different device"
        )
    return parts


def device_width(name: str) -> int:
    """How many single devices ``name`` is made of (1 for a single device)."""
    return len(device_parts(name))


def overlaps(a: str, b: str) -> bool:
    """True when devices ``a`` and ``b`` share a part (a device overlaps itself): they never train at once."""
    return not set(device_parts(a)).isdisjoint(device_parts(b))


def single_devices(names: Iterable[str]) -> tuple[str, ...]:
    """Every single device among ``names`` and their parts, each once, in order of first mention."""
    seen: dict[str, None] = {}
    for name in names:
        for part in device_parts(name):
            seen.setdefault(part, None)
    return tuple(seen)
