"""DeviceSlots: the scheduler thread's per-device bookkeeping (segments in flight, leases, boundary actions).

One segment at most is in flight per device. Executor calls other than ``run_segment`` (status changes, final
saves, clones, moves) touch a device's shared base model and its process-wide RNG, so they wait in that device's
queue until no segment runs there. A lease of the process-wide :class:`~kernel_scheduler.arbiter.DeviceArbiter`
is held per device while a segment trains on it and while its queued actions run, so two experiments of one
process take turns on a device chunk by chunk. Owned by the scheduler thread (nothing here is locked), except
:meth:`running_ids`, which other threads may read (a copy of a dict).

Composite devices (a gang of k devices training one run, named ``"cpu:0+cpu:1"``: :mod:`~kernel_scheduler.gangs`)
share their parts: a device is busy while it, or any device sharing a part with it, has a segment in flight, and its
queued actions wait for that. A composite's lease is one lease of the arbiter that holds every part at once (granted
all together or not at all, first come first served among the requests sharing a part), so two schedulers never
hold parts of one gang each and wait for each other. :meth:`DeviceSlots.hold` gives back the leases a scheduler does
not use before it waits for others.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from .arbiter import DeviceArbiter, Lease
from .executor import SegmentResult
from .gangs import device_parts, overlaps

__all__ = ["DeviceSlots"]

log = logging.getLogger(__name__)


class DeviceSlots:
    """Segments in flight, leases and queued boundary actions, per device name.

    Args:
        devices: the executor's device names, in order.
        arbiter: the process-wide device arbiter.
        owner: the name leases are held under (the experiment's name).
        on_grant: called when a requested lease is granted (wakes the loop).
    """

    def __init__(
        self, devices: Sequence[str], arbiter: DeviceArbiter, owner: str, on_grant: Callable[[], None]
    ) -> None:
        self.devices = tuple(devices)
        self._arbiter = arbiter
        self._owner = owner
        self._on_grant = on_grant
        self._leases: dict[str, Lease] = {}
        self.inflight: dict[str, tuple[int, Future[SegmentResult]]] = {}
        self._started: dict[str, tuple[float, int]] = {}  # device -> (monotonic start, step) of its segment
        self._actions: list[tuple[str, Callable[[], None]]] = []
        self.error: str | None = None  # traceback of the latest boundary action that raised

    # ------------------------------------------------------------------ segments
    def start(self, device: str, run_id: int, fut: Future[SegmentResult], step: int = 0) -> None:
        """Run ``run_id``'s segment ``fut`` is in flight on ``device``, from optimizer step ``step``."""
        self.inflight[device] = (run_id, fut)
        self._started[device] = (time.monotonic(), step)

    def end(self, device: str, step: int = 0) -> float | None:
        """``device``'s segment ended at optimizer step ``step``: its seconds per step (None when it made none)."""
        self.inflight.pop(device, None)
        started = self._started.pop(device, None)
        if started is None or step <= started[1]:
            return None
        return (time.monotonic() - started[0]) / (step - started[1])

    def finished(self) -> list[tuple[str, int, Future[SegmentResult]]]:
        """The segments whose Future is resolved, in device order."""
        return [(d, rid, fut) for d, (rid, fut) in list(self.inflight.items()) if fut.done()]

    def running(self, run_id: int) -> bool:
        return any(rid == run_id for rid, _ in self.inflight.values())

    def running_ids(self) -> dict[str, int]:
        """Device -> run id training there now (any thread: a copy). A gang's run is listed under its composite
        device and under each of its parts (``{"cpu:0+cpu:1": 3, "cpu:0": 3, "cpu:1": 3}``)."""
        out: dict[str, int] = {}
        for d, (rid, _) in list(self.inflight.items()):
            out[d] = rid
            for part in device_parts(d):
                out.setdefault(part, rid)
        return out

    def busy(self, device: str) -> bool:
        """True while a segment is in flight on ``device`` or on a device sharing a part with it."""
        return device in self.inflight or any(overlaps(device, d) for d in list(self.inflight))

    def any_running(self) -> bool:
        return bool(self.inflight)

    # ------------------------------------------------------------------ leases
    def held(self, device: str) -> bool:
        """True when this scheduler holds ``device``; otherwise asks for it (the grant calls ``on_grant``). A
        composite's lease holds all of its parts at once (:class:`~kernel_scheduler.arbiter.DeviceArbiter`)."""
        lease = self._leases.get(device)
        if lease is None:
            lease = self._leases[device] = self._arbiter.request(
                self._owner, on_grant=self._on_grant, device=device
            )
        return lease.granted

    def hold(self, wanted: Sequence[str]) -> list[str]:
        """Ask for the ``wanted`` devices and give back every other lease not in use (no segment in flight on
        its device): the wanted devices held now, in order. A lease kept idle while its scheduler waits for
        another device could otherwise wait, through the arbiter's queue, for a lease that waits for it."""
        keep = set(wanted) | set(self.inflight)
        for device in [d for d in self._leases if d not in keep]:
            self.release(device)
        return [d for d in wanted if self.held(d)]

    def release(self, device: str) -> None:
        lease = self._leases.pop(device, None)
        if lease is not None:
            lease.release()

    def release_all(self) -> None:
        for device in list(self._leases):
            self.release(device)

    # ------------------------------------------------------------------ boundary actions
    def queue(self, device: str, fn: Callable[[], None]) -> None:
        """Run ``fn`` once no segment trains on ``device`` nor on a device sharing a part with it (and this
        scheduler holds it); in order per device."""
        self._actions.append((device, fn))

    def pending(self, device: str | None = None) -> bool:
        """True when actions wait (for ``device``, or for any device)."""
        return any(device is None or d == device for d, _ in self._actions)

    def reroute(self, dead: set[str], to: str) -> None:
        """Hand the actions waiting for the ``dead`` devices to device ``to`` (their worker died; the executor
        ignores what no longer applies there, e.g. a lost run's status change)."""
        self._actions = [(to if d in dead else d, fn) for d, fn in self._actions]

    def flush(self, device: str | None = None) -> None:
        """Run the waiting actions of every free device (or only ``device``'s) that this scheduler holds.

        An action that raises is logged (``error`` keeps its traceback) and the next one runs.
        """
        while True:
            index = next(
                (
                    i
                    for i, (d, _) in enumerate(self._actions)
                    if (device is None or d == device) and not self.busy(d) and self.held(d)
                ),
                None,
            )
            if index is None:
                return
            _, fn = self._actions.pop(index)
            try:
                fn()
            except Exception:
                self.error = traceback.format_exc()
                log.exception("rapidfire scheduler: boundary action failed")
