"""The device roster: which run each free device trains next, where new runs go, lost devices and moves.

One path for one device and for several: :class:`~kernel_scheduler.placement.FairPlacement` decides, and on one
device it orders runs exactly as :class:`~kernel_scheduler.policy.FurthestBehindFirst` does (lowest ``(epoch,
chunk)`` first, ties by run id; a test over random schedules holds it to that). The roster also holds runs back at
an early-stopping rung that another active run has not reached yet (several devices), finds devices whose worker
died, hands their runs to live devices and moves runs between devices through their latest boundary checkpoint.

Called on the scheduler thread (and by ``Scheduler.add_run`` before the thread starts). It changes run records
under the core's lock and never calls the listener with the lock held. Standard library only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial

from .core import SchedulerCore
from .gangs import device_parts, device_width, single_devices
from .placement import Assignment, DeviceView, FairPlacement, PlacedRun
from .runs import Run
from .status import RunStatus

__all__ = ["DeviceRoster"]

log = logging.getLogger(__name__)


class DeviceRoster:
    """Placement, held-at-rung runs, lost devices, relocation and moves (see the module).

    Args:
        core: the scheduler's shared state.
        halt: stops training for good with a reason (``Scheduler.halt``): called when every device's worker died.
        placement: the placement rules (default :class:`~kernel_scheduler.placement.FairPlacement`).
    """

    def __init__(
        self, core: SchedulerCore, halt: Callable[[str], None], placement: FairPlacement | None = None
    ) -> None:
        self._core = core
        self._halt = halt
        self._placement = placement or FairPlacement()
        self._noted_dead: set[str] = set()  # devices whose death the user was told about
        self._stranded: set[int] = set()  # lost runs with no live device of their width (the user was told)
        # asked whether runs wait at an early-stopping rung after this many chunks (None: no policy)
        self.waits_at: Callable[[int], bool] | None = None

    @property
    def devices(self) -> tuple[str, ...]:
        """The executor's devices, in order."""
        return self._core.slots.devices

    def states(self) -> dict[str, str]:
        """Single device -> ``"training run N"``, ``"idle"`` or ``"lost"`` (its worker died). Any thread.

        Composite devices are not listed: each of their parts is, ``"training run N"`` while the gang trains run
        N. A part the executor does not list alone is lost once every composite it belongs to is."""
        running = self._core.slots.running_ids()
        return {
            d: f"training run {running[d]}" if d in running else self._idle_or_lost(d) for d in self.singles
        }

    @property
    def singles(self) -> tuple[str, ...]:
        """The single devices: those the executor lists and the parts of its composites, each once, in order."""
        return single_devices(self.devices)

    def _idle_or_lost(self, part: str) -> str:
        if part in self.devices:
            return "idle" if self._core.alive(part) else "lost"
        homes = [d for d in self.devices if part in device_parts(d)]
        return "idle" if any(self._core.alive(d) for d in homes) else "lost"

    # ------------------------------------------------------------------ placement
    def device_views(self) -> list[DeviceView]:
        slots = self._core.slots
        return [DeviceView(d, alive=self._core.alive(d), busy=slots.busy(d)) for d in slots.devices]

    def placed(self) -> list[PlacedRun]:
        """Every run as the placement sees it, by run id (a run held at a rung is not ready)."""
        core = self._core
        held = self.held_at_rungs()
        return [
            PlacedRun(
                run_id=r.run_id,
                status=r.status,
                segments_done=r.segments_done,
                device=r.device,
                ready=core.ready(r) and r.run_id not in held,
                in_flight=core.slots.running(r.run_id),
                remaining_steps=max(0, r.plan.total_steps - r.step) if r.plan is not None else 0,
                seconds_per_step=r.seconds_per_step,
                position=r.position(),
            )
            for r in sorted(core.runs.values(), key=lambda r: r.run_id)
        ]

    def held_at_rungs(self) -> set[int]:
        """Runs that reached an early-stopping rung another active run has not reached yet: they wait there, so
        that no run trains a chunk past a rung that prunes it. Several devices only: one device trains the run
        furthest behind anyway, and holding there could only reorder runs whose chunks span several segments."""
        waits_at = self.waits_at
        if waits_at is None or len(self.devices) < 2:
            return set()
        core = self._core
        active = [r for r in core.runs.values() if r.status.in_rotation() and core.ready(r)]
        done = {r.run_id: r.chunks(r.segments_done) for r in active}
        lowest = min(done.values(), default=0)
        return {rid for rid, c in done.items() if c > lowest and waits_at(c)}

    def assign(self, free: Sequence[str]) -> list[Assignment]:
        """What each of the ``free`` devices trains next (none once training halted). Call with the lock held."""
        if self._core.halted is not None:
            return []
        wanted = set(free)
        picks = self._placement.assign_free(self.device_views(), self.placed())
        return [a for a in picks if a.device in wanted]

    def needs(self, device: str, clone_waits: Callable[[], bool]) -> bool:
        """True when the loop has executor work on ``device``: boundary actions, a clone waiting (``clone_waits``),
        or a run to train."""
        with self._core.lock:
            if self._core.slots.pending(device) or clone_waits():
                return True
            return any(a.device == device for a in self.assign([device]))

    def choose(self) -> int | None:
        """The run the first free device trains next, or None (lock held)."""
        picks = self.assign(list(self.devices))
        return picks[0].run_id if picks else None

    def place_new(self, width: int = 1) -> str:
        """The device a new run (a cold clone, a search's trial) training on ``width`` devices at once is built on:
        the live device of ``width`` parts where the least work remains.

        Raises:
            ValueError: no live device has ``width`` parts (while some device is alive; with none alive the first
                device of that width is named and the build fails with the executor's own error).
        """
        try:
            return self._placement.place_new(self.device_views(), self.placed(), width=width)
        except ValueError:
            if any(self._core.alive(d) for d in self.devices):
                raise
            return next((d for d in self.devices if device_width(d) == width), self.devices[0])

    def width_of(self, spec: object) -> int:
        """How many devices a run of config ``spec`` trains on at once (``Executor.width_of``).

        Raises:
            ValueError: the executor says less than 1; whatever the executor raises for bad input.
        """
        width = self._core.executor.width_of(spec)
        if not isinstance(width, int) or width < 1:
            raise ValueError(f"Executor.width_of must return an int of 1 or more, got {width!r}")
        return width

    # ------------------------------------------------------------------ lost devices and moves
    def find_lost(self) -> None:
        """Runs on a device whose worker died: ONGOING ones become INTERRUPTED; all move before training again.

        With no device left alive, training halts (``run_fit`` again continues every run on new workers).
        """
        core = self._core
        dead = {d for d in self.devices if not core.slots.busy(d) and not core.alive(d)}
        if not dead:
            return
        changed: list[Run] = []
        with core.lock:
            for run in core.runs.values():
                if (
                    run.device in dead
                    and not run.moving
                    and not run.status.is_finished()
                    and run.run_id not in self._stranded
                ):
                    run.lost = True
                    if run.status is RunStatus.ONGOING:
                        core.set_status(run, RunStatus.INTERRUPTED)
                    changed.append(run)
            live = [d for d in self.devices if core.alive(d)]
            if live:  # what waited for a dead device (a clone, a status change) runs on a live one
                core.slots.reroute(dead, live[0])
        for run in changed:
            core.emit(run)
        revived = self._revive(dead, changed)
        live = [d for d in self.devices if core.alive(d)]
        for run in changed:
            if run.device in revived:  # back onto its restarted gang, from its latest checkpoint
                run.moving = True
                core.slots.queue(run.device, partial(self._relocate, run, run.device))
        if live and changed:
            self._relocate_all({r.run_id for r in changed if r.device not in revived})
        if revived:
            core.note(
                f"a worker of {', '.join(sorted(revived))} died: its gang was restarted on new workers, and "
                f"run(s) {', '.join(str(r.run_id) for r in changed if r.device in revived)} continue there from "
                "their latest checkpoint"
            )
            self._noted_dead |= revived
        if changed and not self._noted_dead >= dead:
            self._note_dead(dead - revived, [r for r in changed if r.device not in revived], bool(live))
        if not live and core.halted is None:
            self._halt(
                f"every device's worker died ({', '.join(sorted(dead))}); run_fit(...) again continues every run "
                "from its latest checkpoint on new workers"
            )

    def _revive(self, dead: set[str], changed: list[Run]) -> set[str]:
        """The dead composite devices (gangs) with lost runs that the executor restarted on new workers
        (:meth:`Executor.revive`): their runs then move back onto them from their latest checkpoints."""
        homes = {r.device for r in changed if r.device is not None}
        revived = set()
        for device in sorted(dead & homes):
            if device_width(device) > 1 and self._core.executor.revive(device):
                revived.add(device)
        return revived

    def _relocate_all(self, moving: set[int]) -> None:
        """Each lost run to the live device of its width with the least work left, once that device is free (a
        gang run with no live device of its width stays INTERRUPTED: the user is told)."""
        core = self._core
        moved: set[int] = set()
        for move in self._placement.relocate(self.device_views(), self.placed()):
            if move.run_id in moving:
                run = core.runs[move.run_id]
                run.moving = True
                moved.add(move.run_id)
                core.slots.queue(move.device, partial(self._relocate, run, move.device))
        for rid in sorted(moving - moved - self._stranded):
            self._stranded.add(rid)
            home = core.runs[rid].device
            width = device_width(home) if home else 1
            what = (
                f"{width} devices at once and no live device of {width} parts is left"
                if width > 1
                else "one device and no live single device is left"
            )
            core.note(
                f"run {rid} trains on {what}: it stays INTERRUPTED (run_fit(...) again continues it from its "
                "latest checkpoint on new workers)"
            )

    def _note_dead(self, dead: set[str], changed: list[Run], alive: bool) -> None:
        names = ", ".join(sorted(dead - self._noted_dead))
        self._noted_dead |= dead
        runs = ", ".join(str(r.run_id) for r in changed)
        if not alive:
            text = f"the worker of {names} died and no device is left: training stops"
        elif len(changed) == 1:
            text = f"the worker of {names} died; run {runs} continues from its latest checkpoint on another device"
        else:
            text = f"the worker of {names} died; runs {runs} continue from their latest checkpoints on the other devices"
        self._core.note(text)

    def _relocate(self, run: Run, device: str) -> None:
        """A queued move of a run whose device died (on ``device``, now free)."""
        if not run.lost or run.status is RunStatus.DELETED:
            run.moving = False
            return
        if not self._core.alive(device):  # that one died too: the next turn places it again
            run.moving = False
            return
        self.move(run, device)

    def move(self, run: Run, device: str) -> bool:
        """Move ``run`` to ``device`` through its latest boundary checkpoint (the crash-resume path); False when
        the move failed (the run is then FAILED, or INTERRUPTED when its device died meanwhile)."""
        core = self._core
        source = run.device
        try:
            start = core.executor.move_run(run.run_id, run.spec, device)
        except Exception as exc:
            with core.lock:
                run.moving = False
                if not core.alive(device) or (source is not None and not core.alive(source)):
                    return (
                        False  # a worker died meanwhile: not the run's fault; the next turn places it again
                    )
                run.error = f"moving it from {source} to {device} failed: {type(exc).__name__}: {exc}"
                if run.status.in_rotation() or run.status is RunStatus.INTERRUPTED:
                    core.set_status(run, RunStatus.FAILED)
            core.emit(run)
            return False
        rewound = run.lost  # what it logged after its checkpoint (a chunk cut short) is void
        with core.lock:
            run.place(start)
            run.device, run.lost, run.moving = device, False, False
            if run.status is RunStatus.INTERRUPTED:
                core.set_status(run, RunStatus.ONGOING)
            snap = core.snap(run)
        if rewound:
            try:
                core.listener.on_rewound(snap, start.step)
            except Exception:
                log.exception("listener.on_rewound failed")
        if source == device:  # its gang was revived: the same devices, new workers
            core.note(f"run {run.run_id} resumed on {device} (new workers) at step {start.step}")
        else:
            core.note(f"run {run.run_id} moved from {source} to {device} at step {start.step}")
        core.emit(run)
        return True
