"""TorchExecutor: trains runs with TRL, one shared base model per (model, model_kwargs, shared settings).

Implements :class:`kernel_scheduler.Executor`. Every call comes from the scheduler thread (or, before the
scheduler starts, from ``run_fit``'s thread) and does its torch work on the executor's one device thread
(:class:`~rapidfire_nb.training.device.DeviceThread`): building models and trainers, every run's training
(a greenlet each, see :mod:`~rapidfire_nb.training.worker`), saving and loading weights. Exactly one run
trains at any moment.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kernel_scheduler import ChunkPlan, Executor, RunStart, SegmentResult, check_device
from rapidfire_nb.errors import ConfigError, StorageError, storage_error
from rapidfire_nb.spec import LeafConfig, build_lora_config, build_training_args
from rapidfire_nb.spec.bundles import GroupSettings, TrainingCallbacks

from .adapters import activate_adapter
from .checkpoint import WARM_START_PREFIX, BoundarySnapshot, CheckpointWriter, Snapshotter, restore_counters
from .data import note_dropped_rows, prepare_dataset
from .device import DeviceThread
from .gang import run_model, run_snapshotter, save_run_final, setup_trainer, training_spec
from .gang_checkpoint import GangSnapshotter
from .garbage import TrainStartCollections
from .generation_batch import GenerationBatcher
from .generation_eval import maybe_attach_generation_eval
from .generation_spec import check_generation_eval
from .kinds import TrainerKind, get_kind
from .models import BaseModels, SharedBase, load_final_weights
from .offload import Parked, park, unpark
from .own_params import OwnParameters
from .pack_runs import PackRuns, packs_for
from .prepared_rows import RowPreparer, sft_rows
from .quiet import quiet_libraries
from .rng import capture_rng
from .warm_start import (
    checkpoint_step,
    keep_own_hyperparameters,
    saved_state,
    start_at,
    warm_snapshot,
    warm_start_from_disk,
)
from .worker import HandoffClock, RunHooks, RunWorker

__all__ = ["TorchExecutor"]

log = logging.getLogger(__name__)

_DEVICE_IDS = itertools.count(1)  # names of device threads (one per executor)


@dataclass
class _Run:
    run_id: int
    spec: LeafConfig
    kind: TrainerKind
    base: SharedBase | None
    adapter: str | None
    worker: RunWorker
    plan: ChunkPlan
    run_dir: Path
    snapshotter: Snapshotter | GangSnapshotter | None = None
    last: BoundarySnapshot | None = None
    final_dir: Path | None = None
    released: bool = False
    parked: Parked | None = (
        None  # full fine-tuning on an accelerator: weights + optimizer state in host memory
    )
    own: OwnParameters | None = None  # a LoRA run's clip and zero_grad over its own parameters


class TorchExecutor(Executor):
    """Trains the runs of one experiment on one device thread.

    Args:
        group: the config group's settings (trainer type, ``create_model_fn``, chunks per epoch, seed,
            checkpoint cadence in chunks, generation-eval sample in rows).
        train_dataset / eval_dataset: ``datasets.Dataset`` (rows before ``formatting_func``); eval may be None.
        exp_dir: the experiment folder (``runs/<id>/`` holds checkpoints and final weights).
        callbacks: where metrics, notes, final folders, storage failures and generation metric names go, and how
            a boundary checkpoint waits for the metrics before it (threads: see ``TrainingCallbacks``).

    Raises:
        ConfigError: ``group.trainer_type`` is unknown.
        ValueError: ``group.create_model_fn`` is None.
    """

    def __init__(
        self,
        group: GroupSettings,
        train_dataset: Any,
        eval_dataset: Any,
        exp_dir: Path,
        callbacks: TrainingCallbacks,
    ) -> None:
        self.group = group
        self.kind = get_kind(group.trainer_type)
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        self.exp_dir = Path(exp_dir)
        self.callbacks = callbacks
        if group.create_model_fn is None:
            raise ValueError(
                "TorchExecutor needs group.create_model_fn (None only in a copy sent to a worker)"
            )
        self.models = BaseModels(group.create_model_fn, self._note)  # create_model_fn calls, shared bases
        self._runs: dict[int, _Run] = {}
        self._writer = CheckpointWriter(on_error=self._write_failed)
        self.device = DeviceThread(f"rapidfire-device-{next(_DEVICE_IDS)}")
        self.handoffs = HandoffClock()  # our own time between two segments (benchmark)
        # TRL's full gc.collect() at train() starts, only where it can find garbage (training/garbage.py)
        self.collections = TrainStartCollections()
        self.switch_seconds = 0.0  # time spent in activations + snapshots (benchmark)
        self._noted: set[str] = set()
        self._eval_metric_names: set[str] = set()
        # a clone's rows tokenized off the device thread while the others train (training/prepared_rows.py)
        self.prepared = RowPreparer(self._prepare_inputs, sft_rows if self.kind.name == "SFT" else None)
        # chunk-end generation eval of the runs on one base, batched (training/generation_batch.py); device thread
        self.generation = (
            GenerationBatcher(self.callbacks.metric_sink, self._note) if group.batch_generation else None
        )
        self.packs: PackRuns | None = packs_for(self, group, self._note)  # packed steps (training/packing.py)

    # ------------------------------------------------------------------ Executor API
    def add_run(
        self,
        run_id: int,
        spec: LeafConfig,
        warm_from: int | None = None,
        resume_from: Path | None = None,
        *,
        device: str | None = None,
    ) -> RunStart:
        """Build the run's trainer (validation happens here) and return its plan and start position.

        Args:
            run_id: the run's id.
            spec: its ``LeafConfig``.
            warm_from: parent run id for a warm-start clone (its latest chunk boundary).
            resume_from: a complete ``checkpoint-<step>`` folder of this run (crash recovery / restart): the
                run continues exactly where that checkpoint left it. A warm clone's
                ``warm-start-from-run-<parent>-step-<s>`` folder works too (a clone restarted before its first
                chunk ended): it starts from the parent's state with its own hyperparameters, as when created.
            device: this executor's one device (:attr:`devices`) or ``None``: it builds every run there.

        Raises:
            ConfigError: bad input (before any training).
            ValueError: ``device`` names another device.
        """
        check_device(self, device)

        def build() -> RunStart:
            with quiet_libraries():
                return self._add_run(run_id, spec, warm_from, resume_from)

        return self.device.run(build)

    def prepare_run(self, run_id: int, spec: LeafConfig, *, device: str | None = None) -> Future[None] | None:
        """Tokenize a clone's rows on the builder thread before ``add_run`` builds it (SFT; None for the other
        kinds: ``add_run`` does all). See :mod:`~rapidfire_nb.training.prepared_rows`."""
        check_device(self, device)
        return self.prepared.start(run_id, spec)

    def run_segment(self, run_id: int, stop_step: int) -> Future[SegmentResult]:
        if self.packs is not None:
            return self.device.call(lambda: self.packs.segment(run_id, stop_step))  # type: ignore[union-attr]
        return self._runs[run_id].worker.run_until(stop_step)

    @property
    def runs(self) -> Mapping[int, _Run]:
        """The runs this executor built, by run id (read-only; their trainers, adapters, plans; for tests)."""
        return MappingProxyType(self._runs)

    def has_run(self, run_id: int) -> bool:
        """True when this executor built run ``run_id`` (in this process)."""
        return run_id in self._runs

    def has_boundary(self, run_id: int) -> bool:
        run = self._runs.get(run_id)
        if run is None:  # finished before this process: its final state on disk (continued after a restart)
            return saved_state(self.run_dir(run_id)) is not None
        return run.last is not None

    def on_status(self, run_id: int, status: str) -> None:
        if status == "DELETED":
            self.prepared.discard(run_id)  # a clone deleted while its rows were tokenized is never built
        if self.packs is not None:
            self.packs.on_status(
                run_id, status
            )  # trained ahead in a pack: put back where the scheduler sees it
        run = self._runs.get(run_id)
        if run is None:
            return
        if self.generation is not None:  # a batch no longer waits for a finished run (before its final save)
            batcher, finished = self.generation, status in ("COMPLETED", "STOPPED", "FAILED")
            self.device.call(lambda: batcher.settle(run_id, finished))
        if status in ("COMPLETED", "STOPPED", "FAILED") and run.snapshotter is not None:
            run.snapshotter.drop_spares()  # no next snapshot soon: its spare buffers are freed
        if status in ("COMPLETED", "STOPPED"):
            try:
                self.save_final(run_id)
            except Exception as exc:
                if storage_error(exc, str(run.run_dir / "final")) is None:
                    raise
                self._write_failed(exc, run.run_dir / "final")
            if run.last is not None:  # its final state stays on disk: continued after a restart
                snap, folder = run.last, run.run_dir
                self.callbacks.in_record_order(lambda: self._writer.submit(snap, folder))
        if status == "DELETED":  # never trains again: its trainer, optimizer and adapter leave the device
            self.drop_run(run_id)

    def drop_run(self, run_id: int) -> None:
        """Forget run ``run_id`` (it moved to another device, or it was deleted): unwind its paused ``train()`` and
        delete its adapter from the shared base, on the device thread after what is queued there (a segment in
        progress); returns at once. Its run folder stays (a deleted run's last checkpoint included). Unknown runs
        are ignored."""
        run = self._runs.pop(run_id, None)
        if run is None:
            return
        self._writer.written.pop(run_id, None)
        if self.packs is not None:
            self.packs.drop(run_id)

        def release() -> None:
            if self.generation is not None:
                self.generation.forget(run_id)  # its deferred generation first: its adapter is about to go
            run.worker.release()  # on the device thread: runs inline
            base, adapter = run.base, run.adapter
            if base is not None and adapter is not None and adapter in base.adapters:
                try:
                    base.model.delete_adapter(adapter)
                    base.adapters.remove(adapter)
                except Exception as exc:  # memory only: the adapter stays, unused
                    log.warning("rapidfire_nb: could not delete adapter %s: %s", adapter, exc)

        self.device.call(release)

    def close(self) -> None:
        self.prepared.close()
        if self.generation is not None:
            try:
                self.device.run(self.generation.flush_all)
            except Exception as exc:  # the runs are over; their last generation metrics are what is lost
                log.warning("rapidfire_nb: batched generation at close failed: %s", exc)
        for run in self._runs.values():
            run.worker.release(timeout=10)
        self._writer.flush()
        self._writer.close()
        self.device.close()

    # ------------------------------------------------------------------ extras used by Experiment
    def flush(self) -> None:
        """Wait until every queued checkpoint is on disk."""
        self._writer.flush()

    def run_dir(self, run_id: int) -> Path:
        return self.exp_dir / "runs" / str(run_id)

    def final_dir(self, run_id: int) -> Path | None:
        run = self._runs.get(run_id)
        return run.final_dir if run else None

    def checkpoint_dir(self, run_id: int) -> Path | None:
        return self._writer.written.get(run_id)

    def save_final(self, run_id: int) -> Path:
        """Save the run's current weights + tokenizer with ``save_pretrained`` into ``runs/<id>/final``."""
        return self.device.run(lambda: self._save_final(run_id))

    def _save_final(self, run_id: int) -> Path:
        run = self._runs[run_id]
        target = run.run_dir / "final"
        trainer = run.worker.trainer
        save_run_final(trainer, run.adapter, target)  # a gang's weights gathered first (training/gang.py)
        run.final_dir = target
        self.callbacks.on_final(run_id, target)
        return target

    def load_model(
        self, run_id: int, spec: LeafConfig | None = None, final_dir: Path | None = None
    ) -> tuple[Any, Any]:
        """A fresh ``(model, tokenizer)`` with the run's trained weights (from its final folder).

        A run this executor did not build (it ended in an earlier process) needs its ``spec`` and ``final_dir``.

        Raises:
            ConfigError: the run is unknown here and no ``final_dir`` with saved weights was given.
        """
        return self.device.run(lambda: self._load_model(run_id, spec, final_dir))

    def _load_model(self, run_id: int, spec: LeafConfig | None, final_dir: Path | None) -> tuple[Any, Any]:
        run = self._runs.get(run_id)
        if run is not None:
            if run.final_dir is None:
                self._save_final(run_id)
            assert run.final_dir is not None
            spec, final_dir = run.spec, run.final_dir
        elif spec is None or final_dir is None or not Path(final_dir).is_dir():
            raise ConfigError(f"run {run_id} has no saved final weights to load")
        return load_final_weights(self.models, spec, Path(final_dir))

    # ------------------------------------------------------------------ internals
    def _write_failed(self, exc: BaseException, folder: Path) -> None:
        """A checkpoint or final-weights write failed (writer or device thread): report it as a StorageError."""
        failure = storage_error(exc, str(folder)) or StorageError(str(folder), f"{type(exc).__name__}: {exc}")
        self.callbacks.on_storage_error(failure)

    def _note(self, text: str) -> None:
        if text not in self._noted:
            self._noted.add(text)
            self.callbacks.notes(text)

    def _add_run(
        self, run_id: int, spec: LeafConfig, warm_from: int | None, resume_from: Path | None
    ) -> RunStart:
        run_dir = self.run_dir(run_id)
        args, train_ds, eval_ds, lora = self._inputs(spec, run_dir)
        base, model, adapter = run_model(self.models, spec, args, lora, run_id)  # a gang's: own base, sharded
        rows = self.prepared.rows(run_id, spec, train_ds, eval_ds, args)  # tokenized off the device thread?
        trainer = self.kind.build_trainer(spec, model, adapter, base.tokenizer, args, rows, self.models)
        own = setup_trainer(trainer, adapter)  # a LoRA run's extras on the shared base; a gang's resume
        note_dropped_rows(trainer, train_ds, eval_ds, args, lambda text: self._note(f"run {run_id}: {text}"))
        if eval_ds is not None:
            self._eval_metrics_seen(self.kind.eval_metric_names(trainer))  # e.g. GRPO's eval rewards
            maybe_attach_generation_eval(
                trainer,
                base.tokenizer,
                eval_ds,
                spec,
                self.group,
                self._eval_metrics_seen,
                lambda text: self._note(f"run {run_id}: {text}"),
            )
        initial_rng = capture_rng()
        plan = self.kind.plan_run(trainer, self.group.num_chunks, run_id)
        resume, start = self._start_position(run_id, trainer, adapter, plan, run_dir, warm_from, resume_from)
        if resume is not None:
            restore_counters(trainer, resume)  # e.g. TRL's num_tokens goes on counting from the checkpoint
        hooks = RunHooks(
            activate=lambda: self._activate(run_id),
            on_boundary=lambda step, rng: self._on_boundary(run_id, step, rng),
            on_log=lambda step, logs: self._on_log(run_id, step, logs),
            on_final=lambda step, rng: self._on_final(run_id, rng),
        )
        worker = RunWorker(
            run_id,
            trainer,
            plan,
            self.device,
            hooks if self.packs is None else self.packs.wrap(run_id, spec, hooks),
            initial_rng=initial_rng,
            eval_at_boundaries=eval_ds is not None,
            resume_from_checkpoint=resume,
            clock=self.handoffs,
            collections=self.collections,
        )
        if self.generation is not None:
            self.generation.add_run(run_id, self.kind.name, base, adapter, worker)
        snapshotter = run_snapshotter(run_id, trainer, adapter)
        self._runs[run_id] = _Run(
            run_id, spec, self.kind, base, adapter, worker, plan, run_dir, snapshotter, own=own
        )
        return start

    def _inputs(self, spec: LeafConfig, run_dir: Path) -> tuple[Any, Any, Any, Any]:
        """The run's checked inputs: ``(TRL config, train rows, eval rows or None, LoraConfig or None)``."""
        self.kind.precheck(spec, self.train_dataset, self.eval_dataset)  # e.g. GRPO: batch + reward checks
        args, notes = build_training_args(
            training_spec(spec), output_dir=str(run_dir / "trainer"), default_seed=self.group.seed
        )
        for n in notes:
            self._note(n)
        train_ds = prepare_dataset(self.train_dataset, spec.formatting_func, self.kind, "train_dataset", spec)
        eval_ds = (
            prepare_dataset(self.eval_dataset, spec.formatting_func, self.kind, "eval_dataset", spec)
            if self.eval_dataset is not None
            else None
        )
        for n in check_generation_eval(spec, eval_ds):  # compute_metrics + generation_config
            self._note(n)
        return args, train_ds, eval_ds, build_lora_config(spec)

    def _prepare_inputs(self, run_id: int, spec: LeafConfig) -> tuple[Any, Any, Any, Any]:
        """The builder thread's inputs of run ``run_id``: ``_inputs``' first three and its base's tokenizer (None
        while its base is not created)."""
        args, train_ds, eval_ds, _ = self._inputs(spec, self.run_dir(run_id))
        base = self.models.existing(spec, args, run_id)
        return args, train_ds, eval_ds, None if base is None else base.tokenizer

    def _start_position(
        self,
        run_id: int,
        trainer: Any,
        adapter: str | None,
        plan: ChunkPlan,
        run_dir: Path,
        warm_from: int | None,
        resume_from: Path | None,
    ) -> tuple[str | None, RunStart]:
        """Where the run starts: ``(checkpoint folder to resume from or None, RunStart)``."""
        if resume_from is not None:
            if Path(resume_from).name.startswith(
                WARM_START_PREFIX
            ):  # a warm clone restarted before its 1st chunk
                keep_own_hyperparameters(trainer)
            return str(resume_from), start_at(plan, checkpoint_step(resume_from))
        if warm_from is not None:
            return self._warm_start(run_id, warm_from, trainer, adapter, plan, run_dir)
        return None, RunStart(plan=plan)

    def _warm_start(
        self, run_id: int, parent_id: int, trainer: Any, adapter: str | None, plan: ChunkPlan, run_dir: Path
    ) -> tuple[str, RunStart]:
        """Prepare a warm clone: a resumable checkpoint holding the parent's state at its latest boundary.

        The clone's trainer resumes from it (TRL/transformers' own resume: data position, global step, RNG,
        adapter weights, AdamW moments) and keeps its OWN hyperparameters: learning rate schedule, weight decay,
        betas (see :func:`~rapidfire_nb.training.warm_start.keep_own_hyperparameters`).
        """
        from .checkpoint import write_snapshot

        if parent_id not in self._runs:  # finished before this process: from its final state on disk
            parent_dir = self.run_dir(parent_id)
            folder, step = warm_start_from_disk(parent_id, parent_dir, trainer, adapter, plan, run_dir)
            keep_own_hyperparameters(trainer)
            return str(folder), start_at(plan, step)
        snap = warm_snapshot(self._runs.get(parent_id), parent_id, trainer, adapter, plan)
        target = run_dir / f"{WARM_START_PREFIX}{parent_id}-step-{snap.step}"
        run_dir.mkdir(parents=True, exist_ok=True)
        write_snapshot(snap, target)
        keep_own_hyperparameters(trainer)
        return str(target), start_at(plan, snap.step)

    def _eval_metrics_seen(self, names: list[str]) -> None:
        from .generation_spec import GENERATION_SECONDS

        new = [n for n in names if n not in self._eval_metric_names and not n.endswith(GENERATION_SECONDS)]
        if new:
            self._eval_metric_names.update(new)
            self.callbacks.on_eval_metrics(new)

    def _activate(self, run_id: int) -> None:
        if self.generation is not None:
            self.generation.before_training(run_id)  # its deferred generation, before its adapter changes
        t0 = time.perf_counter()
        run = self._runs[run_id]
        if run.parked is not None:  # full fine-tuning parked off the accelerator: back before it trains
            unpark(run.worker.trainer.model, run.worker.trainer.optimizer, run.parked)
            run.parked = None
        if run.adapter is not None and run.base is not None:
            activate_adapter(run.base.model, run.adapter)  # set_adapter without its walk of every module
            active = run.base.model.active_adapter
            if active != run.adapter:  # a wrong active adapter raises nothing: it trains the wrong weights
                raise RuntimeError(f"active adapter is {active!r}, expected {run.adapter!r}")
            if run.own is not None:
                run.own.activate()
        run.kind.on_activate(run.worker.trainer)  # e.g. the run's own patched forward on the shared base
        self.switch_seconds += time.perf_counter() - t0

    def _on_boundary(self, run_id: int, step: int, rng: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        run = self._runs[run_id]
        assert run.snapshotter is not None
        run.last = run.snapshotter.take(rng)
        if run.plan.segments_done_at(step) % self.group.checkpoint_every == 0:
            snap, folder = run.last, run.run_dir
            self.callbacks.in_record_order(lambda: self._writer.submit(snap, folder))
        if run.adapter is None and sum(1 for r in self._runs.values() if not r.worker.done) > 1:
            # another run trains next on this device: a full fine-tuning run's weights and AdamW state leave it
            run.parked = park(run.worker.trainer.model, run.worker.trainer.optimizer)
        self.switch_seconds += time.perf_counter() - t0

    def _on_final(self, run_id: int, rng: dict[str, Any]) -> None:
        """The run's last step: its final state becomes its ``last`` snapshot (in memory only, like a boundary's
        until written), so a warm clone of the finished (COMPLETED) run continues from its end."""
        run = self._runs[run_id]
        assert run.snapshotter is not None
        run.last = None  # full fine-tuning: never two copies of the model at once
        run.last = run.snapshotter.take(rng)

    def _on_log(self, run_id: int, step: int, logs: dict[str, float]) -> None:
        run = self._runs[run_id]
        self.callbacks.metric_sink(run_id, step, run.plan.samples_seen(step), logs)
