"""One run's TRL trainer, whose own ``train()`` runs as a greenlet on the device thread and parks at chunk boundaries.

The LR schedule, data order, gradient accumulation, logging/eval cadence and GRPO generation buffers stay
TRL's own: nothing is re-created per chunk. At a boundary the run saves the process-wide RNG state, hands a
snapshot to the executor (checkpoint) and switches back to the device thread's loop with the segment's result;
when the scheduler gives it the device again, the loop switches into it, it restores its RNG and grad mode,
re-activates its adapter and continues inside the same ``train()`` call.

Every run's ``train()`` is a greenlet (a paused call stack) on the one device thread
(:class:`~rapidfire_nb.training.device.DeviceThread`), so all runs train on one OS thread, as a plain
``trainer.train()`` does; why that matters for speed is in that module's docstring. A switch happens only inside
``Trainer._maybe_log_save_evaluate`` after an optimizer step (never inside a forward/backward pass).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch
from greenlet import greenlet
from transformers import TrainerCallback

from kernel_scheduler import ChunkPlan, SegmentResult

from .device import DeviceThread
from .divergence import Diverged, check_logs, watch_training_loss
from .garbage import TrainStartCollections
from .rng import capture_rng, restore_rng

__all__ = ["HandoffClock", "RunHooks", "RunWorker"]


class _Abort(BaseException):
    """Unwinds a parked ``train()`` when its run is released (BaseException: TRL catches Exception)."""


class HandoffClock:
    """Our own time between two segments on one device: from one run parking to the next one training.

    ``seconds`` sums, over ``count`` hand-offs, the wall time from a run's park (its result handed back) to the
    next run's first instruction after its own set-up (RNG restore, adapter activation): the scheduler's work,
    two thread wake-ups and the set-up. The benchmark prints it; nothing depends on it.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.count = 0
        self._parked_at: float | None = None

    def parked(self) -> None:
        self._parked_at = time.perf_counter()

    def resumed(self) -> None:
        if self._parked_at is not None:
            self.seconds += time.perf_counter() - self._parked_at
            self.count += 1
            self._parked_at = None


class _ChunkCallback(TrainerCallback):
    def __init__(self, worker: RunWorker) -> None:
        self.worker = worker

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.worker.last_eval_step = state.global_step

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any
    ) -> None:
        if logs:
            self.worker.on_log(state.global_step, dict(logs))  # recorded as logged (a NaN is stored as NaN)
            self.worker.segment_metrics.update(
                {
                    k: float(v)
                    for k, v in logs.items()
                    if isinstance(v, (int, float)) and not isinstance(v, bool)
                }
            )  # the latest value per name in this segment: what early stopping compares
            check_logs(state.global_step, logs)  # ... and a NaN/inf loss, grad_norm or eval_loss ends the run


@dataclass(frozen=True)
class RunHooks:
    """The executor's hooks into one run's ``train()``, all called on the device thread.

    Attributes:
        activate: called before the run trains again (after its RNG state is restored), e.g. ``set_adapter``.
        on_boundary: ``on_boundary(step, rng_state)`` at each chunk boundary (global optimizer step ``step``),
            before the segment's Future resolves (the executor snapshots the checkpoint there).
        on_log: ``on_log(step, logs)`` for every TRL log call (``logs``: name -> value).
        on_final: ``on_final(step, rng_state)`` once, at the run's last step, at the same point of the loop as
            ``on_boundary`` (the executor keeps the final state there: a warm clone continues from it).
    """

    activate: Callable[[], None]
    on_boundary: Callable[[int, dict[str, Any]], None]
    on_log: Callable[[int, dict[str, float]], None]
    on_final: Callable[[int, dict[str, Any]], None] | None = None


class RunWorker:
    """Drives one trainer through its segments.

    Args:
        run_id: the run's id.
        trainer: a constructed TRL trainer (built while the run's adapter was active).
        plan: the run's chunk plan (its ``total_steps`` is the trainer's ``max_steps``).
        device: the device thread every segment runs on.
        hooks: the executor's ``activate``, ``on_boundary`` and ``on_log`` (:class:`RunHooks`).
        initial_rng: the RNG state right after the trainer was built (restored before the first step).
        eval_at_boundaries: also evaluate at each chunk end (needs an eval dataset).
        resume_from_checkpoint: passed to ``train()`` (crash recovery and warm starts).
        clock: where hand-off time is counted (shared by the runs of one device).
        collections: the device's record of TRL's full ``gc.collect()`` at ``train()`` starts (shared by the runs of
            one device; see :mod:`~rapidfire_nb.training.garbage`). ``None``: TRL's collection at every start.
    """

    def __init__(
        self,
        run_id: int,
        trainer: Any,
        plan: ChunkPlan,
        device: DeviceThread,
        hooks: RunHooks,
        initial_rng: dict[str, Any],
        eval_at_boundaries: bool,
        resume_from_checkpoint: str | None = None,
        clock: HandoffClock | None = None,
        collections: TrainStartCollections | None = None,
    ) -> None:
        self.run_id = run_id
        self.trainer = trainer
        self.plan = plan
        self._device = device
        self._activate = hooks.activate
        self._on_boundary = hooks.on_boundary
        self._on_final = hooks.on_final
        self.on_log = hooks.on_log
        self._rng = initial_rng
        self._grad_enabled = True
        self.eval_at_boundaries = eval_at_boundaries
        self._resume = resume_from_checkpoint
        self._clock = clock or HandoffClock()
        self._collections = collections
        if collections is not None:
            collections.wrap(trainer.accelerator)
        self.stop_step: int | None = None
        self.last_eval_step = -1
        self._parked_step = -1
        self._glet: greenlet | None = None
        self.done = False
        self.segment_metrics: dict[str, float] = {}  # device thread: logged since the segment began
        trainer.add_callback(_ChunkCallback(self))
        watch_training_loss(trainer)
        original = trainer._maybe_log_save_evaluate

        def _after_log_save_evaluate(*args: Any, **kwargs: Any) -> None:
            original(*args, **kwargs)
            self._maybe_park()

        trainer._maybe_log_save_evaluate = _after_log_save_evaluate
        _release_eval_dataloaders(trainer)

    # -------------------------------------------------------------- scheduler side (any thread)
    def run_until(self, stop_step: int) -> Future[SegmentResult]:
        """Let the run train until global step ``stop_step``; the Future resolves at that boundary.

        Raises:
            RuntimeError: the run has finished.
        """
        if self.done:
            raise RuntimeError(f"run {self.run_id} has finished")
        return self._device.call(lambda: self._segment(stop_step))

    def release(self, timeout: float = 30.0) -> None:
        """Unwind a parked ``train()`` (on the device thread) so its memory can be freed."""
        if self._glet is None or self.done:
            return
        self._device.call(self._abort).result(timeout)

    @property
    def resume_from(self) -> str | None:
        """The checkpoint folder its ``train()`` resumes from (a restart, a warm clone), or None."""
        return self._resume

    @property
    def step(self) -> int:
        return int(self.trainer.state.global_step)

    # -------------------------------------------------------------- device thread
    def _segment(self, stop_step: int) -> SegmentResult:
        """Train from where the run is parked until ``stop_step`` (or its end); its result."""
        self.stop_step = stop_step
        if self._glet is None:
            self._glet = greenlet(self._main)
        result = self._glet.switch()
        assert isinstance(result, SegmentResult), result
        return result

    def glet_or_new(self) -> greenlet:
        """The run's ``train()`` greenlet (made, not started, before its first segment); device thread."""
        if self._glet is None:
            self._glet = greenlet(self._main)
        return self._glet

    def start_packed(self, stop_step: int) -> Any:
        """A packed segment (:mod:`~rapidfire_nb.training.packing`) begins: train until the run's first rendezvous
        (returned), its boundary at ``stop_step``, its end or its error (a ``SegmentResult``); device thread."""
        self.stop_step = stop_step
        return self.glet_or_new().switch()

    def resume_packed(self, answer: Any) -> Any:
        """Hand the driver's ``answer`` to the run parked at a rendezvous; what it returns next, as ``start_packed``."""
        assert self._glet is not None
        return self._glet.switch(answer)

    def _abort(self) -> None:
        if self._glet is not None and not self._glet.dead:
            self._glet.throw(_Abort())
        self.done = True

    def _enter(self) -> None:
        restore_rng(self._rng)
        torch.set_grad_enabled(self._grad_enabled)
        self._activate()
        self._clock.resumed()

    def _main(self) -> SegmentResult | None:
        try:
            self._enter()
            self.trainer.train(resume_from_checkpoint=self._resume)
            self.done = True
            return SegmentResult(
                self.step, self.plan.samples_seen(self.step), finished=True, metrics=self._take_metrics()
            )
        except _Abort:
            self.done = True
            return None
        except BaseException as exc:  # a failing run never takes the others down
            self.done = True
            text = (
                str(exc)
                if isinstance(exc, Diverged)
                else "".join(traceback.format_exception_only(type(exc), exc)).strip()
            )
            self._error_trace = traceback.format_exc()
            return SegmentResult(
                self.step, self.plan.samples_seen(self.step), error=text, metrics=self._take_metrics()
            )
        finally:
            self._clock.parked()
            if self._collections is not None:
                self._collections.run_left()  # its trainer may be garbage now: the next start collects

    def _take_metrics(self) -> dict[str, float]:
        metrics, self.segment_metrics = self.segment_metrics, {}
        return metrics

    def _maybe_park(self) -> None:
        step = self.step
        if self.stop_step is None or step < self.stop_step or step == self._parked_step:
            return
        if self.eval_at_boundaries and self.last_eval_step != step:
            # the comparison point: evaluate at the end of every chunk, on top of the config's own cadence,
            # without touching the run's RNG stream (exactness against a plain run holds)
            rng = capture_rng()
            self.trainer.evaluate()
            restore_rng(rng)
        if step >= self.plan.total_steps:  # the last step: let train() finish, the segment ends after it
            self._parked_step = step  # once (transformers calls this again at the epoch's end)
            if self._on_final is not None:
                self._on_final(step, capture_rng())
            return
        self._parked_step = step
        self._rng = capture_rng()
        self._grad_enabled = torch.is_grad_enabled()
        self._on_boundary(step, self._rng)
        result = SegmentResult(step, self.plan.samples_seen(step), metrics=self._take_metrics())
        self._clock.parked()
        assert self._glet is not None and self._glet.parent is not None
        self._glet.parent.switch(result)  # back to the device loop; returns when the run trains again
        self._enter()


def _release_eval_dataloaders(trainer: Any) -> None:
    """Let every evaluation drop the eval dataloader it registered with the trainer's accelerator.

    ``Trainer.evaluate`` builds a new eval dataloader each time (unless ``dataloader_persistent_workers``) and
    ``Accelerator.prepare`` keeps a reference to every dataloader it prepared, for the life of the trainer: with
    an evaluation at every chunk end, each chunk left one ``DataLoaderShard`` (and the eval ``Dataset`` view it
    holds) behind, ~0.1 MB per chunk switch, for every run. Nothing reads them after the evaluation.
    """
    original = trainer.evaluate

    def evaluate(*args: Any, **kwargs: Any) -> Any:
        registered = getattr(getattr(trainer, "accelerator", None), "_dataloaders", None)
        before = len(registered) if isinstance(registered, list) else None
        try:
            return original(*args, **kwargs)
        finally:
            if (
                before is not None
                and isinstance(registered, list)
                and not trainer.args.dataloader_persistent_workers
            ):
                del registered[before:]

    trainer.evaluate = evaluate
