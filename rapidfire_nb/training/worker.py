"""One run's TRL trainer, whose own ``train()`` runs in a worker thread and parks at chunk boundaries.

The LR schedule, data order, gradient accumulation, logging/eval cadence and GRPO generation buffers stay
TRL's own: nothing is re-created per chunk. At a boundary the worker saves the process-wide RNG state,
hands a snapshot to the executor (checkpoint), resolves the segment's Future and waits; when the scheduler
hands the device back it restores its RNG, re-activates its adapter and continues inside the same
``train()`` call.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from transformers import TrainerCallback

from kernel_scheduler import ChunkPlan, SegmentResult

from .divergence import Diverged, check_logs, watch_training_loss
from .rng import capture_rng, restore_rng

__all__ = ["RunWorker"]


class _Abort(BaseException):
    """Unwinds a parked ``train()`` when its run is released (BaseException: TRL catches Exception)."""


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
            check_logs(state.global_step, logs)  # ... and a NaN/inf loss, grad_norm or eval_loss ends the run


class RunWorker:
    """Drives one trainer through its segments.

    Args:
        run_id: the run's id.
        trainer: a constructed TRL trainer (built while the run's adapter was active).
        plan: the run's chunk plan (its ``total_steps`` is the trainer's ``max_steps``).
        activate: called (in the worker thread) before the run trains again, e.g. ``set_adapter``.
        on_boundary: ``on_boundary(step, rng_state)`` called at each chunk boundary, before the Future
            resolves (the executor snapshots the checkpoint there).
        on_log: ``on_log(step, logs)`` for every TRL log call.
        initial_rng: the RNG state right after the trainer was built (restored before the first step).
        eval_at_boundaries: also evaluate at each chunk end (needs an eval dataset).
        resume_from_checkpoint: passed to ``train()`` (crash recovery and warm starts).
    """

    def __init__(
        self,
        run_id: int,
        trainer: Any,
        plan: ChunkPlan,
        activate: Callable[[], None],
        on_boundary: Callable[[int, dict[str, Any]], None],
        on_log: Callable[[int, dict[str, float]], None],
        initial_rng: dict[str, Any],
        eval_at_boundaries: bool,
        resume_from_checkpoint: str | None = None,
    ) -> None:
        self.run_id = run_id
        self.trainer = trainer
        self.plan = plan
        self._activate = activate
        self._on_boundary = on_boundary
        self.on_log = on_log
        self._rng = initial_rng
        self.eval_at_boundaries = eval_at_boundaries
        self._resume = resume_from_checkpoint
        self.stop_step: int | None = None
        self.last_eval_step = -1
        self._parked_step = -1
        self._go = threading.Event()
        self._abort = False
        self._future: Future[SegmentResult] | None = None
        self._thread: threading.Thread | None = None
        self.done = False
        trainer.add_callback(_ChunkCallback(self))
        watch_training_loss(trainer)
        original = trainer._maybe_log_save_evaluate

        def _after_log_save_evaluate(*args: Any, **kwargs: Any) -> None:
            original(*args, **kwargs)
            self._maybe_park()

        trainer._maybe_log_save_evaluate = _after_log_save_evaluate
        _release_eval_dataloaders(trainer)

    # -------------------------------------------------------------- scheduler side
    def run_until(self, stop_step: int) -> Future[SegmentResult]:
        """Let the run train until global step ``stop_step``; the Future resolves at that boundary."""
        if self.done:
            raise RuntimeError(f"run {self.run_id} has finished")
        fut: Future[SegmentResult] = Future()
        self._future = fut
        self.stop_step = stop_step
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._main, name=f"rapidfire-run-{self.run_id}", daemon=True
            )
            self._thread.start()
        else:
            self._go.set()
        return fut

    def release(self, timeout: float = 30.0) -> None:
        """Unwind a parked ``train()`` so its memory can be freed."""
        if self._thread is None or self.done:
            return
        self._abort = True
        self._go.set()
        self._thread.join(timeout)

    @property
    def step(self) -> int:
        return int(self.trainer.state.global_step)

    # -------------------------------------------------------------- worker thread
    def _enter(self) -> None:
        restore_rng(self._rng)
        self._activate()

    def _main(self) -> None:
        try:
            self._enter()
            self.trainer.train(resume_from_checkpoint=self._resume)
            self.done = True
            self._resolve(SegmentResult(self.step, self.plan.samples_seen(self.step), finished=True))
        except _Abort:
            self.done = True
        except BaseException as exc:  # a failing run never takes the others down
            self.done = True
            text = (
                str(exc)
                if isinstance(exc, Diverged)
                else "".join(traceback.format_exception_only(type(exc), exc)).strip()
            )
            self._error_trace = traceback.format_exc()
            self._resolve(SegmentResult(self.step, self.plan.samples_seen(self.step), error=text))

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
        if step >= self.plan.total_steps:
            return  # the last step: let train() finish, the Future resolves after it
        self._parked_step = step
        self._rng = capture_rng()
        self._on_boundary(step, self._rng)
        self._resolve(SegmentResult(step, self.plan.samples_seen(step)))
        self._go.wait()
        self._go.clear()
        if self._abort:
            raise _Abort()
        self._enter()

    def _resolve(self, result: SegmentResult) -> None:
        fut, self._future = self._future, None
        if fut is not None and not fut.done():
            fut.set_result(result)


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
