"""The two bundles every executor takes: a config group's settings and the kernel's training callbacks.

:class:`GroupSettings` is what all runs of one ``run_fit`` share (trainer type, ``create_model_fn``, chunking,
seed, checkpoint cadence, generation-eval sample): a plain record that a worker process receives pickled
(``create_model_fn`` shipped separately with cloudpickle: :mod:`rapidfire_nb.devices.shipping`).

:class:`TrainingCallbacks` is how an executor reports to the kernel (metrics, notes, final weights, storage
failures, record order, generation metric names). Callbacks cannot cross a process boundary: a worker process
builds its own bundle whose callbacks send events back (``rapidfire_nb.training.host.WorkerHost``), and the
kernel side of a worker (``rapidfire_nb.devices``) hands each event to the kernel's bundle.

Standard library only (no torch): the training, devices and experiment layers all import it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rapidfire_nb.errors import StorageError

__all__ = ["GroupSettings", "MetricSink", "TrainingCallbacks"]

log = logging.getLogger(__name__)

MetricSink = Callable[[int, int, int, dict[str, float]], None]
"""``sink(run_id, step, samples_seen, logs)``: one TRL log call of a run."""


def _ignore(*args: Any) -> None:
    """The default of a callback nobody listens to."""


def _log_storage_error(failure: StorageError) -> None:
    log.error("rapidfire_nb: %s", failure)


def _at_once(fn: Callable[[], None]) -> None:
    fn()


@dataclass(frozen=True)
class GroupSettings:
    """What every run of one config group (one ``run_fit``) shares, as the executors take it.

    Attributes:
        trainer_type: ``"SFT"``, ``"DPO"`` or ``"GRPO"``.
        create_model_fn: ``create_model_fn(model_config: dict) -> (model, tokenizer)``; called once per distinct
            base (``model_name`` + ``model_kwargs`` + settings that act on the shared model). ``None`` only in
            the copy sent to a worker process, where the function travels apart (shipped bytes).
        num_chunks: chunks per epoch (a count, >= 1).
        seed: the experiment seed (a run's own ``training_args.seed`` wins).
        checkpoint_every: write a run's boundary checkpoint to disk every this many chunks (1: at every chunk
            boundary). The in-memory snapshot a warm clone starts from is taken at every boundary regardless; a
            larger value only means a crashed kernel continues a run from up to ``checkpoint_every - 1`` chunks
            further back (exactly, as ever).
        eval_generation_samples: runs that evaluate by generating (``compute_metrics`` and ``generation_config``
            both set) generate for this many eval rows (a count), a fixed sample drawn with ``seed`` (the same
            rows for every run); ``None``: every eval row.
        batch_generation: the LoRA runs of one shared base generate their chunk-end eval answers in one batched
            ``generate`` (:mod:`rapidfire_nb.training.generation_batch`); False: each run alone.
        packing: ``"auto"`` (pack the LoRA runs of equal :func:`~rapidfire_nb.spec.packs.pack_key` on CUDA), True
            (on any device) or False (every run time-sliced): ``run_fit``'s ``packing``, checked.
    """

    trainer_type: str
    create_model_fn: Callable[[dict[str, Any]], Any] | None
    num_chunks: int
    seed: int
    checkpoint_every: int = 1
    eval_generation_samples: int | None = None
    batch_generation: bool = True
    packing: bool | str = "auto"


@dataclass(frozen=True)
class TrainingCallbacks:
    """How an executor reports to the kernel. Every callback must be cheap and thread-safe (the recorder's queue).

    Threads: in one process (``TorchExecutor``) every callback runs on the executor's device thread, except
    ``on_storage_error``, which a failed checkpoint write calls on the checkpoint writer's thread and a failed
    final save on the thread that reported the run's end (the scheduler's). For a device in a worker process or
    Ray actor (``rapidfire_nb.devices``) the kernel's callbacks run on that device's reader thread
    (``rapidfire-worker-<device>``) or drain thread (``rapidfire-ray-<device>``), and ``on_final`` also on the
    scheduler's thread (a finished run's folder is handed on before ``on_status`` returns).

    Attributes:
        metric_sink: ``metric_sink(run_id, step, samples_seen, logs)`` for every TRL log call of a run: ``step`` the
            global optimizer step, ``samples_seen`` the training rows consumed up to it, ``logs`` name -> float
            (a NaN is passed as NaN).
        notes: ``notes(text)`` with one user-facing note (e.g. a CPU adaptation, rows TRL dropped); the
            executor says each distinct text once.
        on_final: ``on_final(run_id, folder)`` after a run's final weights and tokenizer were saved into
            ``folder`` (``runs/<id>/final``).
        on_storage_error: ``on_storage_error(failure)`` once per failed write of a checkpoint or of final weights
            (a full disk, an I/O error): not the run's fault, so the run does not fail; the session stops
            training instead. Default: logged as an error.
        in_record_order: ``in_record_order(fn)`` runs ``fn`` once everything reported before it (the metrics of
            the steps up to a boundary) is recorded; boundary checkpoints are handed to the writer through it, so
            a checkpoint on disk is never ahead of the metrics in the store (a resume then loses no step).
            ``fn`` may run on another thread (the recorder's). Default: at once.
        on_eval_metrics: ``on_eval_metrics(names)`` with the names of generation metrics (``eval_<name>`` from
            ``compute_metrics``, GRPO's eval rewards) as runs first log them, each name once.
        on_pack: ``on_pack(run_id, pack_id)``: the run joined pack ``pack_id`` (the pack's id is its smallest run
            id) or left packing (None); device thread. Not sent from a worker process (ignored there).
    """

    metric_sink: MetricSink = _ignore
    notes: Callable[[str], None] = _ignore
    on_final: Callable[[int, Path], None] = _ignore
    on_storage_error: Callable[[StorageError], None] = _log_storage_error
    in_record_order: Callable[[Callable[[], None]], None] = _at_once
    on_eval_metrics: Callable[[list[str]], None] = _ignore
    on_pack: Callable[[int, int | None], None] = _ignore
