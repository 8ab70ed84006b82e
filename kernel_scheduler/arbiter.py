"""The device arbiter: one training segment at a time per device, whatever experiment it belongs to.

Each :class:`~kernel_scheduler.loop.Scheduler` lets one segment of *its* experiment train at a time. Two
experiments training in one process would still train at once, on the same device, with the same
process-wide RNG (python, numpy, torch), and change each other's results. The arbiter is the one lock all
of them share: a scheduler holds a :class:`Lease` on the device while a segment trains and while it calls
the executor at a boundary (clones, final saves, releases), and gives it back between segments, so the
experiments of a process take turns chunk by chunk (first come, first served). Building trainers in
``run_fit`` and ``load_model`` (on the caller's thread) hold a lease too: they reseed or draw from the same
RNG.

Two ways to ask, one for each kind of thread:

* :meth:`DeviceArbiter.request` never blocks: it returns a lease that is granted now or later; ``on_grant``
  is called (from the releasing thread) when it is, so the scheduler thread keeps draining commands and
  polling its inbox while it waits on its own wake-up event.
* :meth:`DeviceArbiter.acquire` blocks the calling thread (a notebook cell) until the lease is granted.

Devices are named; each has a number of slots (1 by default: one segment at a time). A composite device (a gang
of devices training one run, ``"cpu:0+cpu:1"``: :mod:`~kernel_scheduler.gangs`) takes a slot of each of its parts,
all at once or not at all: a lease is granted when every part has a free slot and no earlier request sharing a part
still waits (first come, first served among the requests that share a part). Nobody ever holds part of a gang
while it waits for the rest, so two schedulers cannot wait for each other, and a gang is not starved by the
single-device segments around it. A later multi-device
change (one executor per device, each in its own process so that each has its own RNG) gives each device
its name and a scheduler holds one lease per device it trains on. Today every in-process executor uses
:data:`DEFAULT_DEVICE`: the process-wide RNG is shared by all of them, whichever chip they compute on.

Thread-safety: every method may be called from any thread; the arbiter's state is guarded by one lock, and
``on_grant`` callbacks and waiters are woken after that lock is released. Standard library only.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping

from .gangs import device_parts

__all__ = ["DEFAULT_DEVICE", "DeviceArbiter", "Lease", "device_arbiter"]

log = logging.getLogger(__name__)

DEFAULT_DEVICE = "device"
"""The device every in-process executor trains on (they share the process-wide RNG)."""


class Lease:
    """One request for a slot of a device: pending until granted, then held until :meth:`release`.

    Attributes:
        owner: who asked (an experiment name), shown to whoever waits.
        device: the device name.
    """

    def __init__(
        self, arbiter: DeviceArbiter, owner: str, device: str, on_grant: Callable[[], None] | None
    ) -> None:
        self.owner = owner
        self.device = device
        self._arbiter = arbiter
        self._on_grant = on_grant
        self.parts = device_parts(device)
        self._granted = threading.Event()
        self.released = False

    @property
    def granted(self) -> bool:
        """True once the slot is this lease's (and until it is released)."""
        return self._granted.is_set() and not self.released

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the lease is granted (True) or ``timeout`` seconds pass (False)."""
        return self._granted.wait(timeout)

    def release(self) -> None:
        """Give the slot back, or withdraw the request if not granted yet. Idempotent."""
        self._arbiter._release(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _grant(self) -> None:
        """Called by the arbiter, outside its lock."""
        self._granted.set()
        if self._on_grant is not None:
            try:
                self._on_grant()
            except Exception:  # a waker that fails must not wedge the arbiter
                log.exception("device arbiter: on_grant callback failed")

    def __repr__(self) -> str:
        state = "released" if self.released else "held" if self._granted.is_set() else "waiting"
        return f"Lease({self.owner!r} on {self.device!r}: {state})"


class DeviceArbiter:
    """Grants device slots first come, first served.

    Args:
        slots: slots per single device name (devices not named have 1); a composite takes one of each part's.
    """

    def __init__(self, slots: Mapping[str, int] | None = None) -> None:
        self._slots = dict(slots or {})
        self._lock = threading.Lock()
        self._held: dict[str, list[Lease]] = {}  # single device -> the leases holding one of its slots
        self._queue: deque[Lease] = deque()  # every request not granted yet, first come first

    def _fits(self, lease: Lease, ahead: set[str]) -> bool:
        """True when every part of ``lease`` has a free slot and no earlier waiting request takes one of its
        parts (``ahead``: the parts of the requests before it). Lock held."""
        return all(p not in ahead and len(self._held.get(p, ())) < self._slots.get(p, 1) for p in lease.parts)

    def _take(self, lease: Lease) -> None:
        for p in lease.parts:
            self._held.setdefault(p, []).append(lease)

    def request(
        self, owner: str, on_grant: Callable[[], None] | None = None, device: str = DEFAULT_DEVICE
    ) -> Lease:
        """Ask for a slot of ``device`` without blocking.

        Args:
            owner: who asks (shown to others that wait).
            on_grant: called once when the lease is granted later (not when granted at once); it runs on
                the thread that released the slot, so it must only wake its owner (e.g. ``Event.set``).
            device: the device name; a composite (``"cpu:0+cpu:1"``) is granted all its parts at once.

        Returns:
            The lease; ``lease.granted`` says whether it was granted at once.

        Raises:
            ValueError: ``device`` names a part twice or an empty part.
        """
        lease = Lease(self, owner, device, on_grant)
        with self._lock:
            ahead = {p for waiting in self._queue for p in waiting.parts}
            if self._fits(lease, ahead):
                self._take(lease)
                lease._granted.set()  # granted at once: no callback, the caller sees lease.granted
            else:
                self._queue.append(lease)
        return lease

    def acquire(
        self,
        owner: str,
        device: str = DEFAULT_DEVICE,
        on_wait: Callable[[list[str]], None] | None = None,
        timeout: float | None = None,
    ) -> Lease:
        """Block until a slot of ``device`` is this caller's; use the lease as a context manager.

        Args:
            owner: who asks.
            device: the device name.
            on_wait: called once, before blocking, with the owners holding the device (e.g. to say why the
                cell waits).
            timeout: seconds; ``None`` waits as long as needed.

        Returns:
            The granted lease.

        Raises:
            TimeoutError: not granted within ``timeout`` seconds (the request is withdrawn).
            KeyboardInterrupt: while waiting (the request is withdrawn).
        """
        lease = self.request(owner, device=device)
        if lease.granted:
            return lease
        try:
            if on_wait is not None:
                on_wait(self.holders(device))
            if not lease.wait(timeout):
                raise TimeoutError(f"the device {device!r} was not free within {timeout} s")
        except BaseException:
            lease.release()
            raise
        return lease

    def holders(self, device: str = DEFAULT_DEVICE) -> list[str]:
        """The owners holding a slot of ``device`` now (of any of its parts, for a composite), each lease once."""
        with self._lock:
            leases: dict[int, Lease] = {}
            for p in device_parts(device):
                for lease in self._held.get(p, []):
                    leases.setdefault(id(lease), lease)
            return [lease.owner for lease in leases.values()]

    def waiting(self, device: str = DEFAULT_DEVICE) -> list[str]:
        """The owners waiting for ``device`` (for a device sharing a part with it), first come first."""
        parts = set(device_parts(device))
        with self._lock:
            return [lease.owner for lease in self._queue if not parts.isdisjoint(lease.parts)]

    def _release(self, lease: Lease) -> None:
        granted: list[Lease] = []
        with self._lock:
            if lease.released:
                return
            lease.released = True
            if lease in self._queue:
                self._queue.remove(lease)
            else:
                for p in lease.parts:
                    held = self._held.get(p, [])
                    if lease in held:
                        held.remove(lease)
            ahead: set[str] = set()  # first come first: a request waits for the earlier ones sharing a part
            for waiting in list(self._queue):
                if self._fits(waiting, ahead):
                    self._queue.remove(waiting)
                    self._take(waiting)
                    granted.append(waiting)
                else:
                    ahead.update(waiting.parts)
        for nxt in granted:
            nxt._grant()


_PROCESS_ARBITER = DeviceArbiter()


def device_arbiter() -> DeviceArbiter:
    """The arbiter every scheduler of this process shares (unless given its own)."""
    return _PROCESS_ARBITER
