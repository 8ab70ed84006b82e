"""Multi-device placement: which run each free device trains next, and where a new run goes (pure, no torch).

With several devices (one worker per GPU or CPU worker) the scheduler thread asks :class:`FairPlacement` what a
free device trains next. The rules:

* **One segment per device in flight**; a device whose segment is in flight (``busy``) gets nothing.
* **Runs stick to their device** (their base model is cached there): a free device trains its own runs first.
* **Fairness across devices**: no active run is more than one chunk ahead of another. A run may *start* its next
  segment only if ``segments_done <= floor + 1``, where ``floor`` is the lowest ``segments_done`` over the
  *active* runs (in rotation and ready), those with a segment in flight included (counted with their
  ``segments_done`` before that segment ends). A late joiner (a cold clone at 0 while the others are at 5) is
  therefore the only run that may train until it has caught up; the other devices idle.
* **Furthest behind first**: among the runs that may start, a device takes the one whose next chunk comes first
  (lowest ``(epoch, chunk)``: :attr:`PlacedRun.position`), ties by run id; the active run furthest behind may always
  start (when a segment covers several chunks, as GRPO's may, it can lie more than one segment behind). On one
  device this is exactly :class:`~kernel_scheduler.policy.FurthestBehindFirst`'s order.
* **Takeover**: a free device with nothing of its own takes a run from another device whose home device is busy
  or dead, never one whose home device is free and alive (that device trains it itself; moving costs a checkpoint
  write and load).
* **New runs and clones** go to the live device with the least estimated work left (:meth:`FairPlacement.place_new`).
* **Gangs** (composite devices, ``"cpu:0+cpu:1"``: :mod:`~kernel_scheduler.gangs`): a run lives on a device of
  its width for its life. Two devices that share a part never train at once: a device is busy while one sharing a
  part with it is, and once a device is given a segment, every device sharing a part with it is busy for the rest
  of the turn. The free devices choose in furthest-behind order of the runs they would train (so a gang run
  furthest behind goes before the single runs on its parts; with no shared parts the choice is the same in any
  order). Only single devices take over, and only single runs; a gang run moves only when its device died, to a
  live device of its width. The one-chunk-ahead rule keeps single runs from starving a gang: once they are a chunk
  ahead they wait, its parts fall idle and the gang trains.

Everything here is a function of the views passed in: the same views give the same answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .gangs import device_parts, device_width
from .status import RunStatus

__all__ = ["DeviceView", "PlacedRun", "Assignment", "FairPlacement"]

#: seconds per step assumed when no run anywhere has measured one yet
DEFAULT_SECONDS_PER_STEP = 1.0


@dataclass(frozen=True)
class DeviceView:
    """What the placement may look at for one device.

    Attributes:
        name: the device's name, as :attr:`Executor.devices` spells it (e.g. ``"cuda:0"``); unique.
        alive: False once the device's worker died (its runs must move elsewhere).
        busy: True while a segment is in flight on it (then it gets nothing new). A device sharing a part with a
            busy one counts as busy too, whatever its own flag says.
    """

    name: str
    alive: bool = True
    busy: bool = False

    @property
    def parts(self) -> tuple[str, ...]:
        """The single devices it is made of (``("cpu:0", "cpu:1")`` for ``"cpu:0+cpu:1"``): :func:`device_parts`."""
        return device_parts(self.name)


@dataclass(frozen=True)
class PlacedRun:
    """What the placement may look at for one run.

    Attributes:
        run_id: the run's id (unique).
        status: its :class:`RunStatus`; only runs in rotation (NEW, ONGOING) train.
        segments_done: chunks completed over all epochs, i.e. the 0-based index of the chunk it trains next.
        device: its home device (its trainer and base model live there); ``None`` when not placed yet.
        ready: False while the run cannot train yet (e.g. a warm clone waiting for its parent).
        in_flight: True while one of its segments is training.
        remaining_steps: optimizer steps it has left to train (steps).
        seconds_per_step: its measured time per optimizer step (seconds); ``None`` until measured.
        position: ``(epoch, chunk)`` of the chunk its next segment ends in (1-based; ``Run.position``); ``None``:
            ordered by ``segments_done`` instead. Give it for every run or for none.
    """

    run_id: int
    status: RunStatus
    segments_done: int
    device: str | None
    ready: bool = True
    in_flight: bool = False
    remaining_steps: int = 0
    seconds_per_step: float | None = None
    position: tuple[int, int] | None = None

    @property
    def order(self) -> tuple[int, int]:
        """Its place in the furthest-behind order (compared first, then the run id)."""
        return self.position if self.position is not None else (0, self.segments_done)


@dataclass(frozen=True)
class Assignment:
    """One decision: train run ``run_id``'s next segment on ``device``.

    Attributes:
        run_id: the run to train.
        device: the device that trains it.
        move_from: the run's home device when it is taken over from another device (the caller moves it first,
            through its latest boundary checkpoint: ``Executor.move_run``); ``None`` when it trains at home or
            had no home yet.
    """

    run_id: int
    device: str
    move_from: str | None = None


def _eligible_key(run: PlacedRun) -> tuple[tuple[int, int], int]:
    return (run.order, run.run_id)


class _State:
    """The views indexed once: devices by name, the fairness floor and the runs that may start, by home."""

    def __init__(self, devices: Sequence[DeviceView], runs: Sequence[PlacedRun]) -> None:
        self.order: list[str] = []
        self.alive: dict[str, bool] = {}
        self.busy: dict[str, bool] = {}
        self.parts: dict[str, frozenset[str]] = {}
        for d in devices:
            if d.name in self.alive:
                raise ValueError(f"device {d.name!r} is listed twice")
            self.order.append(d.name)
            self.alive[d.name] = d.alive
            self.parts[d.name] = frozenset(d.parts)
        in_use = {p for d in devices if d.busy for p in self.parts[d.name]}
        for d in devices:
            self.busy[d.name] = d.busy or not in_use.isdisjoint(self.parts[d.name])
        seen: set[int] = set()
        floor: int | None = None
        first: PlacedRun | None = None  # the active run furthest behind
        for r in runs:
            if r.run_id in seen:
                raise ValueError(f"run {r.run_id} is listed twice")
            seen.add(r.run_id)
            if r.ready and r.status.in_rotation():
                if floor is None or r.segments_done < floor:
                    floor = r.segments_done
                if first is None or _eligible_key(r) < _eligible_key(first):
                    first = r
        self.floor = floor
        # runs that may start now (in rotation, ready, not in flight, allowed by the invariant), by home device
        self.waiting: dict[str | None, list[PlacedRun]] = {}
        if floor is not None:
            limit = floor + 1
            for r in runs:
                if (
                    r.ready
                    and not r.in_flight
                    and r.status.in_rotation()
                    and (r.segments_done <= limit or r is first)
                ):
                    self.waiting.setdefault(r.device, []).append(r)

    def check(self, device: str) -> None:
        if device not in self.alive:
            raise ValueError(f"unknown device {device!r} (devices: {', '.join(self.order)})")

    def free(self, device: str) -> bool:
        return self.alive[device] and not self.busy[device]

    def best_own(self, device: str) -> PlacedRun | None:
        """The furthest-behind run that may start among ``device``'s own (not taken); ``None`` when it has none."""
        mine = self.waiting.get(device)
        return min(mine, key=_eligible_key) if mine else None

    def own(self, device: str) -> Assignment | None:
        """The furthest-behind run that may start among ``device``'s own; ``None`` when it has none."""
        run = self.best_own(device)
        if run is None:
            return None
        self._take(run, device)
        return Assignment(run.run_id, device)

    def takeover(self, device: str) -> Assignment | None:
        """The run ``device`` takes from a busy, dead or unknown home (or from no home); ``None`` when none. Only
        a single device takes over, and only a single run (or one with no home)."""
        if len(self.parts[device]) != 1:
            return None
        best: PlacedRun | None = None
        best_key: tuple[tuple[int, int], int, int] | None = None
        for home, waiting in self.waiting.items():
            if not waiting or home == device or (home is not None and device_width(home) != 1):
                continue
            if home is not None and home in self.alive and self.free(home):
                continue  # its home device is free and alive: it trains it itself
            for r in waiting:
                key = (r.order, -len(waiting), r.run_id)
                if best_key is None or key < best_key:
                    best, best_key = r, key
        if best is None:
            return None
        self._take(best, device)
        return Assignment(best.run_id, device, move_from=best.device)

    def _take(self, run: PlacedRun, device: str) -> None:
        self.waiting[run.device].remove(run)
        taken = self.parts[device]
        for name, parts in self.parts.items():
            if not taken.isdisjoint(parts):
                self.busy[name] = True


class FairPlacement:
    """Sticky, fair placement of runs' segments on several devices (see the module's docstring for the rules).

    Stateless: every method is a pure function of the device and run views it is given.
    """

    def next_for(
        self, device: str, devices: Sequence[DeviceView], runs: Sequence[PlacedRun]
    ) -> Assignment | None:
        """What the free device ``device`` trains next.

        Among the runs that may start (in rotation, ready, not in flight, allowed by the fairness invariant) it
        picks its own furthest behind (lowest :attr:`PlacedRun.order`, then run id). With none of its own it takes over
        a run whose home device is busy or dead (or that has no home yet), furthest behind first, ties from the
        home device with the most runs waiting, then run id; such an assignment has ``move_from`` set.

        Args:
            device: the name of the device asking.
            devices: every device of the executor, in its order.
            runs: every run (any status; those not in rotation are ignored).

        Returns:
            The assignment, or ``None`` when ``device`` is dead or busy, or nothing may start on it.

        Raises:
            ValueError: ``device`` is not in ``devices``, or a device name or run id is listed twice.
        """
        state = _State(devices, runs)
        state.check(device)
        if not state.free(device):
            return None
        return state.own(device) or state.takeover(device)

    def assign_free(self, devices: Sequence[DeviceView], runs: Sequence[PlacedRun]) -> list[Assignment]:
        """One assignment for every free live device that has something to train; no run twice.

        Every free device first takes one of its own runs (as :meth:`next_for`); then, in device order, those
        left without take over runs, the devices given a run counting as busy (so a free device's second waiting
        run may go to a device that has nothing). A device given a run makes every device sharing a part with it
        busy: in the first pass the devices choose in the order of the runs they would train (furthest behind
        first, then device order), so a gang run furthest behind goes before the single runs on its parts.

        Args:
            devices: every device of the executor, in its order.
            runs: every run (any status).

        Returns:
            The assignments, in device order of the first pass and then the second; empty when nothing may start.

        Raises:
            ValueError: a device name or run id is listed twice.
        """
        state = _State(devices, runs)
        free = [d for d in state.order if state.free(d)]
        offers: list[tuple[tuple[tuple[int, int], int], int, str]] = []
        left: list[str] = []
        for index, d in enumerate(free):
            best = state.best_own(d)
            if best is None:
                left.append(d)
            else:
                offers.append((_eligible_key(best), index, d))
        first: list[tuple[int, Assignment]] = []
        for _, index, d in sorted(offers):
            if state.free(d):  # not taken by a device sharing a part with it
                a = state.own(d)
                assert a is not None
                first.append((index, a))
        out = [a for _, a in sorted(first, key=lambda ia: ia[0])]
        for d in left:
            a = state.takeover(d) if state.free(d) else None
            if a is not None:
                out.append(a)
        return out

    def place_new(self, devices: Sequence[DeviceView], runs: Sequence[PlacedRun], *, width: int = 1) -> str:
        """The live device of ``width`` parts a new run (or a clone) goes to: the one with the least estimated work
        left.

        A device's own work left is the sum over its runs in rotation of ``remaining_steps`` x seconds per step
        (seconds), the run's own ``seconds_per_step`` when measured, else the mean of the measured ones on that
        device, else the mean of all measured ones, else :data:`DEFAULT_SECONDS_PER_STEP`; a device's work left
        adds the own work of every live device sharing a part with it (they take turns). Ties go to the first
        device in ``devices``. (A warm clone may instead be put on its parent's device: the caller's choice.)

        Args:
            devices: every device of the executor, in its order.
            runs: every run placed so far (any status; those not in rotation count for nothing but their
                measured step times).
            width: how many devices the new run trains on at once (1: a single device; k: a composite device of
                k parts, ``"cpu:0+cpu:1"``).

        Returns:
            The device's name.

        Raises:
            ValueError: no device is alive, a device name is listed twice, ``width`` is below 1, or no live
                device has ``width`` parts.
        """
        if width < 1:
            raise ValueError(f"width must be 1 or more (devices a run trains on at once), got {width}")
        loads = _loads(self._work_left(devices, runs))
        fits = [(name, load) for name, load in loads.items() if device_width(name) == width]
        if not fits:
            raise ValueError(
                f"no live device of {width} parts for a run that trains on {width} devices at once "
                f"(live devices: {', '.join(loads)})"
            )
        return min(fits, key=lambda kv: kv[1])[0]

    def relocate(self, devices: Sequence[DeviceView], runs: Sequence[PlacedRun]) -> list[Assignment]:
        """Where the runs of dead devices go: each to the live device of its width with the least work left.

        Covers every run not finished and not in flight whose home device is dead or not in ``devices``, in
        run-id order, each one's work added to its new device before the next is placed. A run keeps its width (a
        gang run on ``"cpu:0+cpu:1"`` goes to a live composite of 2 parts, a single run to a live single device);
        one with no live device of its width gets no move (it stays where it is, lost). The assignments have
        ``move_from`` set; they say where each run lives from now on, not that it may start a segment now
        (:meth:`next_for` decides that, and may equally take a single run over on its own).

        Args:
            devices: every device of the executor, in its order.
            runs: every run (any status).

        Returns:
            The moves, in run-id order; empty when no run is on a dead device.

        Raises:
            ValueError: runs must move but no device is alive, or a device name is listed twice.
        """
        alive = {d.name: d.alive for d in devices}
        stranded: list[tuple[PlacedRun, str]] = []
        for r in runs:
            home = r.device
            if (
                home is not None
                and not alive.get(home, False)
                and not r.in_flight
                and not r.status.is_finished()
            ):
                stranded.append((r, home))
        if not stranded:
            return []
        stranded.sort(key=lambda rh: rh[0].run_id)
        work = self._work_left(devices, runs)
        overall = _mean([r.seconds_per_step for r in runs if r.seconds_per_step is not None])
        out: list[Assignment] = []
        for r, home in stranded:
            width = device_width(home)
            fits = [(name, load) for name, load in _loads(work).items() if device_width(name) == width]
            if not fits:
                continue  # no live device of its width: it stays lost
            target = min(fits, key=lambda kv: kv[1])[0]
            out.append(Assignment(r.run_id, target, move_from=home))
            if r.status.in_rotation():
                sps = r.seconds_per_step
                if sps is None:
                    sps = overall if overall is not None else DEFAULT_SECONDS_PER_STEP
                work[target] += r.remaining_steps * sps
        return out

    @staticmethod
    def _work_left(devices: Sequence[DeviceView], runs: Sequence[PlacedRun]) -> dict[str, float]:
        """Estimated seconds of work left on each live device, in device order."""
        names: set[str] = set()
        work: dict[str, float] = {}
        for d in devices:
            if d.name in names:
                raise ValueError(f"device {d.name!r} is listed twice")
            names.add(d.name)
            if d.alive:
                work[d.name] = 0.0
        if not work:
            raise ValueError("no device is alive")
        measured: dict[str, list[float]] = {}
        everywhere: list[float] = []
        for r in runs:
            if r.seconds_per_step is not None:
                everywhere.append(r.seconds_per_step)
                if r.device is not None:
                    measured.setdefault(r.device, []).append(r.seconds_per_step)
        overall = _mean(everywhere)
        fallback = overall if overall is not None else DEFAULT_SECONDS_PER_STEP
        per_device = {name: _mean(measured.get(name, [])) for name in work}
        for r in runs:
            if r.device in work and r.status.in_rotation():
                sps = r.seconds_per_step
                if sps is None:
                    own = per_device[r.device]
                    sps = own if own is not None else fallback
                work[r.device] += r.remaining_steps * sps
        return work


def _loads(work: dict[str, float]) -> dict[str, float]:
    """Each device's own work plus that of every device sharing a part with it (seconds), in the same order."""
    parts = {name: frozenset(device_parts(name)) for name in work}
    if all(len(p) == 1 for p in parts.values()):
        return dict(work)
    return {n: sum(w for e, w in work.items() if not parts[n].isdisjoint(parts[e])) for n in work}


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
