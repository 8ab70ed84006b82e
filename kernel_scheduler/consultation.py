"""The early-stopping consultation: what the scheduler asks its early-stopping policy, and when.

At every chunk boundary the scheduler tells the policy about the run's finished chunk (:meth:`Consultation.chunk`,
with every run's state: chunks counted over all epochs), then lets it review the runs that changed. The policy's
stops are ops like the user's (source ``early_stopping``): they are applied before another chunk starts. The
policy's :meth:`~kernel_scheduler.early_stopping.EarlyStoppingPolicy.progress` is asked on the scheduler thread
only, and kept for other threads (:meth:`Consultation.progress`). A run with an open op from the user is exempt
from the policy until that op is answered.

Called on the scheduler thread (and once by ``Scheduler.start`` before the thread runs). Standard library only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .core import SchedulerCore
from .early_stopping import (
    EARLY_STOPPING,
    ChunkResult,
    EarlyStoppingPolicy,
    NewRun,
    PolicyDriver,
    RunState,
)
from .executor import SegmentResult
from .ops import Op, OpAck
from .runs import Run
from .status import RunStatus

__all__ = ["Consultation"]

log = logging.getLogger(__name__)


class Consultation:
    """Asks one early-stopping policy at chunk boundaries (see the module).

    Args:
        core: the scheduler's shared state.
        policy: the experiment's early-stopping policy.
        submit: the scheduler's ``submit`` (a stop becomes an op like any other).
        add: ``add(new_run) -> run_id``: register a new run mid-experiment (a search's trial).
        apply_ops: applies the ops queued so far (the policy's stops) and runs the boundary actions they queued.
    """

    def __init__(
        self,
        core: SchedulerCore,
        policy: EarlyStoppingPolicy,
        submit: Callable[[Op], OpAck],
        add: Callable[[NewRun], int],
        apply_ops: Callable[[], None],
    ) -> None:
        self._core = core
        self._driver = PolicyDriver(policy, submit, add, core.note)
        self._apply_ops = apply_ops
        self._progress: dict[str, Any] = {}  # its latest progress(), asked on the scheduler thread
        self._reported = False

    def progress(self) -> dict[str, Any]:
        """The policy's latest ``progress()`` (a copy; {} once a broken policy was switched off). Any thread."""
        return dict(self._progress)

    def waits_at(self, chunks: int) -> bool:
        """True when runs wait for each other after ``chunks`` chunks (a rung of the policy)."""
        return self._driver.waits_at(chunks)

    def report_progress(self) -> None:
        """Ask the policy for its progress; tell the listener when it changed (always the first time)."""
        progress = self._driver.progress()
        if progress == self._progress and self._reported:
            return
        self._progress, self._reported = progress, True
        try:
            self._core.listener.on_early_stopping(dict(progress))
        except Exception:
            log.exception("listener.on_early_stopping failed")

    def consult(self, run: Run | None = None, res: SegmentResult | None = None, before: int = 0) -> None:
        """Ask the policy: ``run``'s finished chunk (``res``; ``before``: its segments done before the segment),
        then the runs that changed; its stop ops are applied here, before another chunk starts."""
        if self._core.halted is not None:
            return
        if run is not None and res is not None and res.error is None and run.plan is not None:
            if run.segments_done > before:
                chunk = run.chunks(
                    run.segments_done
                )  # whole chunks: a run compared at a rung trained on its rows
                final = run.status is RunStatus.COMPLETED
                if final:
                    self._note_cut_short(run, chunk)
                self._driver.chunk(ChunkResult(run.run_id, chunk, res.metrics, final), self.run_states())
        self._driver.review(self.run_states())
        self._apply_ops()
        self.report_progress()

    def _note_cut_short(self, run: Run, whole: int) -> None:
        """Say so when ``run`` ended inside a chunk that is a rung: it is no candidate there (it never trained
        on all of that chunk's rows), so its value does not compete with the runs that did."""
        assert run.plan is not None
        cut = run.plan.chunks_at(run.segments_done)
        rung = next((c for c in range(whole + 1, cut + 1) if self._driver.waits_at(c)), None)
        if rung is not None:
            self._core.note(
                f"early stopping: run {run.run_id} ended at step {run.step}, inside chunk {cut} (its max_steps): it "
                f"is not compared at the rung after chunk {rung}, whose rows it did not all train on"
            )

    def run_states(self) -> list[RunState]:
        """Every run as the early-stopping policy sees it (chunks counted over all epochs)."""
        core = self._core
        # chunks done: whole chunks (what a run may be compared at); its total: every chunk it trains in, as shown
        with core.lock:
            return [
                RunState(
                    r.run_id,
                    r.status,
                    r.chunks(r.segments_done),
                    r.plan.chunks_at(r.plan.num_segments) if r.plan is not None else 0,
                    exempt=core.book.exempt(r.run_id, EARLY_STOPPING),
                    exempt_through=r.exempt_through,
                )
                for r in sorted(core.runs.values(), key=lambda r: r.run_id)
            ]
