"""Clone building: the clone op's child run, warm clones waiting for their parent, a search's new trials.

A clone op gets its child run id when it is submitted (the child exists from then on, NEW and ``pending``); the
:class:`CloneBuilder` builds the child through ``Executor.add_run`` once the op is applied: a cold clone on the
device with the least work left, a warm clone on its parent's device from the parent's latest chunk boundary (a
finished parent's final state: a COMPLETED run is continued from its last step, a STOPPED one from where it
stopped; the executor keeps that state, in memory and as the run's last checkpoint on disk, so a run finished
before a restart is continued too; the clone's ``max_steps`` sets the new total). A
warm clone of a parent with no boundary to start from waits for the parent's next one while the parent trains on (in
rotation, or moving to another device because its worker died). A new run added by the early-stopping policy (a
search's trial) is built the same way as a cold clone. A build that fails makes the child
FAILED with the reason and rejects the op; it never takes the loop down.

A build does not hold the loop: when the op is applied the executor is first asked to prepare the run off the
scheduler thread (``Executor.prepare_run``: e.g. tokenizing a 20,000-row dataset); meanwhile the other runs train
and ops apply, and the child stays NEW and pending. Once its preparation is done (:meth:`CloneBuilder.collect`,
every turn) the child is built through ``Executor.add_run`` on its device between segments (the part that touches
the shared base model and the process-wide RNG), and joins the rotation. A preparation that fails makes the child
FAILED with the error, the other runs untouched; a child deleted meanwhile is never built (its preparation is
cancelled by the executor's DELETED status call); a child stopped meanwhile is built and stays STOPPED (a resume
trains it).

Called on the scheduler thread, while no segment trains on the device built on (boundary actions); only the
preparation runs elsewhere (the executor's own thread). Standard library only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial

from .core import SchedulerCore
from .early_stopping import NewRun
from .gangs import device_width
from .ops import Op, OpKind
from .roster import DeviceRoster
from .runs import Run
from .status import RunStatus

__all__ = ["CloneBuilder"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Preparing:
    """A run whose preparation runs off the loop: what to do once it is done (``build``) or failed (``fail``)."""

    future: Future[None]
    build: Callable[[], None]
    fail: Callable[[str], None]


class CloneBuilder:
    """Builds clone children and new trials (see the module).

    Args:
        core: the scheduler's shared state.
        roster: where new runs go (:meth:`DeviceRoster.place_new`).
        wake: wakes the loop (a preparation finished); default: nothing (the loop polls each turn anyway).
    """

    def __init__(
        self, core: SchedulerCore, roster: DeviceRoster, wake: Callable[[], None] | None = None
    ) -> None:
        self._core = core
        self._roster = roster
        self._wake = wake or (lambda: None)
        self._preparing: dict[int, _Preparing] = {}  # child run id -> its preparation (lock held)

    def device_for(self, op: Op) -> str:
        """Where a clone is built: a warm clone on its parent's device (the parent's boundary snapshot is there;
        a device that would idle may take it over later), a cold one where the least work remains, on a device
        of as many parts as the child trains on at once (``Executor.width_of``; a warm clone of another width
        than its parent's device is placed as a cold one).

        Raises:
            ValueError: no live device has the child's width; whatever ``Executor.width_of`` raises.
        """
        core = self._core
        with core.lock:
            parent = core.runs.get(op.run_id)
            child = core.runs.get(int(op.payload.get("child_id", -1)))
            width = self._roster.width_of(child.spec if child is not None else op.payload.get("spec"))
            if op.payload.get("warm_start") and parent is not None and parent.device is not None:
                if device_width(parent.device) == width:
                    return parent.device
            return self._roster.place_new(width)

    def _device_for_new(self, run: Run) -> str:
        """Where a new run (a search's trial) is built: the live device of its width with the least work left."""
        return self._roster.place_new(self._roster.width_of(run.spec))

    def request(self, op: Op) -> None:
        """Clone ``op`` is applied: prepare its child off the loop (``Executor.prepare_run``), then build it on
        its device (:meth:`apply`) once no segment trains there; never raises."""
        core = self._core
        with core.lock:
            child = core.runs[int(op.payload["child_id"])]
        build = partial(self._build_on_device, op)
        if child.status is RunStatus.DELETED:  # deleted before it was created: apply says so
            build()
            return
        self._prepare(child, build, partial(self._fail_child, child, op), op)

    def collect(self) -> None:
        """Build the runs whose preparation finished (or fail those whose preparation failed); each turn."""
        core = self._core
        with core.lock:
            done = [(rid, p) for rid, p in self._preparing.items() if p.future.done()]
            for rid, _ in done:
                del self._preparing[rid]
                core.unapplied -= 1
        for rid, prep in done:
            self._prepared(core.runs[rid], prep)

    def preparing(self, run_id: int) -> bool:
        """True while run ``run_id``'s preparation runs off the loop (lock held)."""
        return run_id in self._preparing

    def apply(self, op: Op) -> None:
        """Build the child of clone ``op`` (or make it wait for its parent); never raises."""
        try:
            self._apply(op)
        except Exception as exc:  # never leave the op queued and the child pending
            log.exception("rapidfire scheduler: clone failed")
            self.reject_op(op, f"{type(exc).__name__}: {exc}")

    def reject_op(self, op: Op, reason: str) -> None:
        """Reject ``op``; a clone's child (created NEW by submit) fails with the same reason."""
        core = self._core
        child = core.runs.get(int(op.payload.get("child_id", -1))) if op.kind is OpKind.CLONE else None
        if child is not None and child.pending:
            self._fail_child(child, op, reason)
        else:
            core.reject(op, reason)

    def resolve_waiting(self) -> None:
        """Build the warm clones whose parent now has a boundary (or answer those whose parent or child left)."""
        core = self._core
        with core.lock:
            waiting = [r.waiting_clone for r in core.runs.values() if r.waiting_clone is not None]
        for op in waiting:
            assert op is not None
            with core.lock:
                parent, child = core.runs[op.run_id], core.runs[int(op.payload["child_id"])]
                gone = child.status is RunStatus.DELETED or not _trains_on(parent)
            if gone or core.executor.has_boundary(op.run_id):
                child.waiting_clone = None
                self.apply(op)

    def any_building(self) -> bool:
        """True while a child or new run is still to be built: pending (being prepared, its build queued for or
        running on its device, e.g. ``add_run`` after an off-loop preparation, or waiting for its parent's
        boundary) and not DELETED or FAILED; False once training halted (lock held). ``wait()`` waits for it: the
        child has not trained yet, though nothing else may be left to train."""
        if self._core.halted is not None:
            return False
        gone = (RunStatus.DELETED, RunStatus.FAILED)
        return any(r.pending and r.status not in gone for r in self._core.runs.values())

    def any_waiting(self) -> bool:
        """True while a warm clone waits for its parent's first boundary (lock held)."""
        return any(r.waiting_clone is not None for r in self._core.runs.values())

    def add_new(self, new: NewRun) -> int:
        """Register ``new`` mid-experiment (a search's new trial): NEW at once, built once no segment runs, then
        it joins the rotation like a cold clone (a build that fails makes it FAILED with the reason)."""
        core = self._core
        with core.lock:
            run = core.new_run(new.spec)
            core.busy = True
            snap = core.snap(run)
        try:
            core.listener.on_added(snap, dict(new.info))
        except Exception:
            log.exception("listener.on_added failed")
        self._prepare(run, partial(self._build_new_on_device, run), partial(self._fail_new, run), None)
        return run.run_id

    # ------------------------------------------------------------------ internals
    def _prepare(
        self, run: Run, build: Callable[[], None], fail: Callable[[str], None], op: Op | None
    ) -> None:
        """Ask the executor to prepare ``run`` off the loop; ``build`` at once when it has nothing to prepare."""
        core = self._core
        try:
            device = self.device_for(op) if op is not None else self._device_for_new(run)
            future = core.executor.prepare_run(run.run_id, run.spec, device=device)
        except Exception as exc:
            fail(f"{type(exc).__name__}: {exc}")
            return
        if future is None:
            build()
            return
        prep = _Preparing(future, build, fail)
        if future.done():
            self._prepared(run, prep)
            return
        with core.lock:
            self._preparing[run.run_id] = prep
            core.unapplied += 1  # wait() waits for the child to be built, as for an op not applied yet
            core.busy = True
            if op is not None:
                ack = core.book.with_message(
                    op, f"run {run.run_id} is being prepared (e.g. its dataset tokenized)"
                )
        if op is not None:
            core.tell(op, ack)
        future.add_done_callback(lambda _f: self._wake())

    def _prepared(self, run: Run, prep: _Preparing) -> None:
        """``run``'s preparation ended: build it on its device, or fail it with the preparation's error."""
        future = prep.future
        error = None if future.cancelled() else future.exception()
        if run.status is RunStatus.DELETED or future.cancelled():
            prep.build()  # the build itself answers a run deleted meanwhile (never built)
        elif error is not None:
            prep.fail(f"{type(error).__name__}: {error}")
        else:
            prep.build()

    def _build_on_device(self, op: Op) -> None:
        """Queue clone ``op``'s build (:meth:`apply`) for its device, once no segment trains there."""
        try:
            device = self.device_for(op)
        except Exception as exc:  # e.g. the last device of the child's width died meanwhile
            self.reject_op(op, f"{type(exc).__name__}: {exc}")
            return
        self._core.when_free(partial(self.apply, op), device)

    def _build_new_on_device(self, run: Run) -> None:
        try:
            device = self._device_for_new(run)
        except Exception as exc:
            self._fail_new(run, f"{type(exc).__name__}: {exc}")
            return
        self._core.when_free(partial(self._build_new, run, device), device)

    def _fail_new(self, run: Run, reason: str) -> None:
        core = self._core
        with core.lock:
            run.pending = False
            if run.status is not RunStatus.DELETED:
                run.error = reason
                core.set_status(run, RunStatus.FAILED)
        core.emit(run)

    def _apply(self, op: Op) -> None:
        core = self._core
        child_id = int(op.payload["child_id"])
        with core.lock:
            child = core.runs[child_id]
        if child.status is RunStatus.DELETED:  # deleted before it was created: never build it
            self._fail_child(child, op, f"run {child_id} was deleted before it was created")
            return
        warm = bool(op.payload.get("warm_start"))
        gone = (
            core.runs[op.run_id].status is RunStatus.DELETED
        )  # its checkpoint may stay: not a parent any more
        if warm and (gone or not core.executor.has_boundary(op.run_id)):
            self._wait_or_fail(op, child)
            return
        try:
            device = self.device_for(op)
            start = core.executor.add_run(
                child_id, child.spec, warm_from=op.run_id if warm else None, device=device
            )
        except Exception as exc:
            self._fail_child(child, op, f"{type(exc).__name__}: {exc}")
            return
        with core.lock:
            child.place(start)
            child.device = core.device_of(child_id)
            child.waiting_clone = None
            child.pending = False
        how = _how_started(core.runs[op.run_id], start.step) if warm else "from scratch"
        core.resolved(op, f"run {child_id} created ({how})")
        core.emit(child)

    def _wait_or_fail(self, op: Op, child: Run) -> None:
        """A warm clone of a parent with no boundary to start from: it waits while the parent trains on (also
        when the parent's worker died: it continues on another device and ends a chunk there), else fails."""
        core = self._core
        with core.lock:
            parent = core.runs[op.run_id]
            waits = _trains_on(parent)
            if waits:
                child.waiting_clone = op  # waits for the parent's first boundary
                ack = core.book.with_message(
                    op, f"run {child.run_id} waits for run {op.run_id} to finish its first chunk (warm start)"
                )
                core.tell(op, ack)
        if waits:
            return
        reason = f"run {op.run_id} has no completed chunk to warm-start from and is {parent.status.value}"
        if parent.status in (RunStatus.COMPLETED, RunStatus.STOPPED) and parent.step > 0:
            reason = (
                f"run {op.run_id} is {parent.status.value} at step {parent.step}, but its final state is neither in "
                "this kernel nor on disk (its checkpoint was removed, or its worker died before writing it), so it "
                "cannot be continued"
            )
        self._fail_child(child, op, f"{reason}; use a cold clone (warm_start=False)")

    def _fail_child(self, child: Run, op: Op, reason: str) -> None:
        core = self._core
        with core.lock:
            child.waiting_clone = None
            child.pending = False
            if child.status is not RunStatus.DELETED:  # a child deleted before it existed stays DELETED
                child.error = reason
                core.set_status(child, RunStatus.FAILED)
        core.reject(op, reason)
        core.emit(child)

    def _build_new(self, run: Run, device: str) -> None:
        core = self._core
        if run.status is RunStatus.DELETED:  # deleted before it was built
            run.pending = False
            return
        try:
            start = core.executor.add_run(run.run_id, run.spec, device=device)
        except Exception as exc:
            self._fail_new(run, f"{type(exc).__name__}: {exc}")
            return
        with core.lock:
            run.place(start)
            run.device = core.device_of(run.run_id)
            run.pending = False
        core.emit(run)


def _how_started(parent: Run, step: int) -> str:
    """How a warm clone started: from a finished parent's final state (a continuation: COMPLETED, or STOPPED at
    a boundary), else from the parent's latest chunk boundary, which may lie behind the parent's step."""
    if parent.status in (RunStatus.COMPLETED, RunStatus.STOPPED) and parent.step == step:
        return f"warm from run {parent.run_id}'s final state, step {step}: it continues run {parent.run_id}"
    how = f"warm from run {parent.run_id}'s latest chunk boundary, step {step}"
    return how + (f"; run {parent.run_id} is at step {parent.step}" if parent.step > step else "")


def _trains_on(parent: Run) -> bool:
    """True while ``parent`` will end another chunk: in rotation, or INTERRUPTED because its device's worker
    died (it moves to a live device and continues from its checkpoint; a warm clone then starts from the next
    boundary it ends there)."""
    return parent.status.in_rotation() or (parent.status is RunStatus.INTERRUPTED and parent.lost)
