"""Chunk-boundary checkpoints: an in-memory snapshot, written in the background, atomically.

Layout (what ``Trainer.train(resume_from_checkpoint=...)`` reads)::

    <run_dir>/checkpoint-<step>/
        adapter_model.safetensors, adapter_config.json     (LoRA runs)  | model.safetensors + config.json (full)
        optimizer.pt, scheduler.pt, rng_state.pth, trainer_state.json, training_args.bin
        rapidfire_state.json     trainer counters transformers does not save (TRL's ``_total_train_tokens``)
        COMPLETE                                            (written last; a folder without it is skipped)

Only the latest boundary checkpoint of each run is kept; the final weights go to ``<run_dir>/final``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import queue
import shutil
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from rapidfire_nb._atomic import atomic_dir
from rapidfire_nb._priority import lower_thread_priority
from rapidfire_nb.redact import REDACTED, is_secret_key
from rapidfire_nb.run_folder import WARM_START_PREFIX, latest_checkpoint

from .rng import rng_for_checkpoint

__all__ = [
    "Snapshotter",
    "WARM_START_PREFIX",
    "BoundarySnapshot",
    "CheckpointWriter",
    "frozen_state",
    "latest_checkpoint",
    "restore_counters",
]

log = logging.getLogger(__name__)


@dataclass
class BoundarySnapshot:
    """A run's resumable state at one chunk boundary (tensors are private copies)."""

    run_id: int
    step: int
    weights: dict[str, torch.Tensor]  # adapter weights (PEFT key names) or the full model state dict
    adapter_config: Any | None  # peft config object for LoRA runs, None for full fine-tuning
    model_config: Any | None
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    rng: dict[str, Any]
    trainer_state: Any  # a frozen copy of the trainer's TrainerState (see :func:`frozen_state`)
    training_args: Any
    counters: dict[str, Any] = dataclasses.field(default_factory=dict)  # see TRAINER_COUNTERS
    # Keeps the snapshot's tensors out of its snapshotter's pool while any copy of it is alive (copy.copy
    # shares it); see Snapshotter. None: the tensors are the snapshot's alone.
    lease: Any = dataclasses.field(default=None, repr=False, compare=False)
    # A gang rank's share: how it is written (training/gang_checkpoint.py's GangLayout); None: one process's run.
    layout: Any = dataclasses.field(default=None, repr=False, compare=False)

    def trainer_state_json(self) -> str:
        """``trainer_state.json`` as ``TrainerState.save_to_json`` writes it (built when written, off the device
        thread: its size grows with the log history, ~2 ms at 24 steps and linear in steps)."""
        return json.dumps(dataclasses.asdict(self.trainer_state), indent=2, sort_keys=True) + "\n"


def frozen_state(state: Any) -> Any:
    """A copy of a ``TrainerState`` that later steps do not change, in O(1) per logged step.

    The scalars are copied; ``log_history`` is a new list of the same entry dicts (transformers appends a new
    dict per log and never changes one it has appended); the small mutable fields (``stateful_callbacks``,
    ``trial_params``) are deep-copied.
    """
    frozen = copy.copy(state)
    frozen.log_history = list(state.log_history)
    frozen.stateful_callbacks = copy.deepcopy(state.stateful_callbacks)
    frozen.trial_params = copy.deepcopy(state.trial_params)
    return frozen


#: trainer attributes that are part of what a run logs but not of transformers' checkpoint: TRL's SFT/DPO
#: ``num_tokens`` metric counts from ``_total_train_tokens`` (in memory only; a plain TRL resume restarts it at 0)
TRAINER_COUNTERS = ("_total_train_tokens",)
COUNTERS_FILE = "rapidfire_state.json"


def restore_counters(trainer: Any, folder: str | Path) -> None:
    """Set the trainer's :data:`TRAINER_COUNTERS` from ``folder/rapidfire_state.json`` (if it is there)."""
    try:
        counters = json.loads((Path(folder) / COUNTERS_FILE).read_text()).get("counters", {})
    except (OSError, ValueError, AttributeError):
        return
    for name, value in counters.items():
        if name in TRAINER_COUNTERS and hasattr(trainer, name) and isinstance(value, (int, float)):
            setattr(trainer, name, value)


_IMMUTABLE = (int, float, bool, str, type(None))


def _clone(obj: Any) -> Any:
    if isinstance(obj, _IMMUTABLE):
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_clone(v) for v in obj)
    return copy.deepcopy(obj)


def _same_layout(buf: Any, t: torch.Tensor) -> bool:
    # Shape and dtype only (each check costs ~0.5 us, a snapshot has hundreds of tensors): a spare set was cloned
    # from this run's own live tensors, whose devices and strides do not change (offloading, which moves them, is
    # for full fine-tuning, which never reuses), and copy_ copies values right whatever the strides.
    return isinstance(buf, torch.Tensor) and buf.shape == t.shape and buf.dtype is t.dtype


def _clone_into(obj: Any, old: Any) -> Any:
    """:func:`_clone`, copying each tensor into the tensor at the same place of ``old`` (an earlier clone of the
    same structure) when it has the same shape and dtype; a new clone elsewhere."""
    if isinstance(obj, torch.Tensor):
        if _same_layout(old, obj):
            return old.copy_(obj.detach())
        return obj.detach().clone()
    if isinstance(obj, dict):
        olds = old if isinstance(old, dict) else {}
        return {k: _clone_into(v, olds.get(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        olds = old if isinstance(old, (list, tuple)) and len(old) == len(obj) else [None] * len(obj)
        items = [_clone_into(v, o) for v, o in zip(obj, olds)]
        return items if isinstance(obj, list) else tuple(items)
    return _clone(obj)


_Tensors = tuple[dict[str, torch.Tensor], dict[str, Any]]  # a snapshot's (weights, optimizer state)


class _Lease:
    """Held by a snapshot (and its shallow copies); when the last of them goes, its tensors go back to the pool."""

    __slots__ = ("__weakref__",)


class _SparePool:
    """A run's spare snapshot tensors (at most ``cap`` sets). It holds tensors only, never the trainer, so a
    snapshot outliving its run keeps nothing else alive."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._sets: list[_Tensors] = []
        self._lock = threading.Lock()  # sets come back on whichever thread lets a snapshot go

    def get(self) -> _Tensors | None:
        with self._lock:
            return self._sets.pop() if self._sets else None

    def put(self, tensors: _Tensors) -> None:
        with self._lock:
            if len(self._sets) < self.cap:
                self._sets.append(tensors)

    def clear(self) -> int:
        with self._lock:
            dropped, self._sets = len(self._sets), []
            return dropped

    def __len__(self) -> int:
        with self._lock:
            return len(self._sets)


class Snapshotter:
    """Takes one run's boundary snapshots: a private copy of exactly what a resume needs.

    For a LoRA run that is the adapter's tensors and the optimizer/scheduler state (not the base model); for full
    fine-tuning, the model's state dict. What does not change while a run trains is found once, when the
    snapshotter is made (with the run's trainer, before it trains), so that no chunk switch pays for it: which
    tensors make up the adapter (PEFT's ``get_peft_model_state_dict``, 8 ms on the fast-steps model of
    ``benchmarks/overhead.py``; its tensors share storage with the live parameters, which training, resuming
    (``load_adapter`` loads in place) and the optimizer all update in place), the run's ``TrainingArguments``
    and its LoRA / model config (deep copies, ~2 ms). A snapshot then costs the tensor copies plus O(1) per
    logged step (:func:`frozen_state`): 1.6 ms at step 24 on that model, against 3.0 ms when the trainer state
    was serialised here (its JSON is built by the checkpoint writer instead).

    For a LoRA run on the CPU the copies go into the buffers of an earlier snapshot of the run that nothing holds
    any more (``copy_`` into kept tensors instead of ``clone``: no allocation, no page faults for fresh memory).
    Measured with ``benchmarks/snapshot_reuse.py`` (SmolLM2, one thread, 5 runs): a reused snapshot of an r=32
    q/k/v/o adapter (14.7 MB, 29.5 MB of AdamW state) takes 14.5-16.4 ms every time, a cloned one 14.0-16.1 ms or,
    when the allocator had given the freed memory back to the system (2 runs of 5), 32.8-33.2 ms; r=8 q/v
    4.5-5.5 ms reused, 4.4-7.7 ms cloned. On an accelerator snapshots clone: PyTorch's caching allocator reuses
    freed blocks itself, and a spare set would hold device memory (not measured here). A snapshot's buffers
    return to the pool when the last reference to it (or to a shallow copy of it) goes: the run's ``last``
    snapshot was replaced and the checkpoint writer is done with it. The pool keeps at most ``SPARE_BUFFERS``
    spare sets, so a run holds its latest snapshot, the ones still being written and at most that many more; a
    run that ends or stops drops its spare (:meth:`drop_spares`). Full fine-tuning clones every time (a spare set
    there would be a whole extra copy of the model and its optimizer state).

    Args:
        run_id: the run.
        trainer: its TRL trainer.
        adapter_name: its adapter on the shared base (None: full fine-tuning).
    """

    SPARE_BUFFERS = 1
    """How many spare buffer sets a LoRA run's snapshotter keeps for its next snapshots."""

    def __init__(self, run_id: int, trainer: Any, adapter_name: str | None) -> None:
        self.run_id = run_id
        self.trainer = trainer
        self.adapter_name = adapter_name
        self._pool = _SparePool(self.SPARE_BUFFERS)
        self.reused = 0  # snapshots copied into spare buffers (benchmark, tests)
        model = trainer.model
        self._tensors: dict[str, torch.Tensor] | None = None
        if adapter_name is not None:
            from peft import get_peft_model_state_dict

            self._tensors = dict(get_peft_model_state_dict(model, adapter_name=adapter_name))
        tensors = list((self._tensors or {}).values())
        # LoRA on the CPU only: on an accelerator the caching allocator already reuses freed blocks, and a spare
        # set would hold device memory; full fine-tuning never (a spare would be a second copy of the model)
        self.reuses = bool(tensors) and all(t.device.type == "cpu" for t in tensors)
        adapter_config = copy.deepcopy(model.peft_config[adapter_name]) if adapter_name is not None else None
        model_config = copy.deepcopy(model.config) if adapter_name is None else None
        # (adapter config, model config, training args)
        self._fixed = (adapter_config, model_config, _without_secrets(copy.deepcopy(trainer.args)))

    def drop_spares(self) -> int:
        """Free the spare buffer sets (the run ended or stopped: its next snapshot, if any, clones again); returns
        how many were dropped. Snapshots still held keep their tensors."""
        return self._pool.clear()

    @property
    def spares(self) -> int:
        """How many spare buffer sets the run keeps now (0 or 1)."""
        return len(self._pool)

    def _live_tensors(self) -> dict[str, torch.Tensor]:
        if self._tensors is None:
            # full fine-tuning: offloading swaps the parameters' storage, so ask each time
            return dict(self.trainer.model.state_dict())
        return self._tensors

    def take(self, rng: dict[str, Any]) -> BoundarySnapshot:
        """The run's resumable state now; ``rng`` is a fresh capture (it is kept, not copied again)."""
        trainer = self.trainer
        adapter_config, model_config, training_args = self._fixed
        live = self._live_tensors()
        lease = None
        if not self.reuses:
            weights = {k: v.detach().clone() for k, v in live.items()}
            optimizer = _clone(trainer.optimizer.state_dict())
        else:
            spare = self._pool.get()
            if spare is not None:
                self.reused += 1
            old_weights, old_optimizer = spare if spare is not None else ({}, None)
            weights = {k: _clone_into(v, old_weights.get(k)) for k, v in live.items()}
            optimizer = _clone_into(trainer.optimizer.state_dict(), old_optimizer)
            lease = _Lease()
            weakref.finalize(lease, self._pool.put, (weights, optimizer)).atexit = False
        return BoundarySnapshot(
            run_id=self.run_id,
            step=int(trainer.state.global_step),
            weights=weights,
            adapter_config=adapter_config,
            model_config=model_config,
            optimizer=optimizer,
            scheduler=_clone(trainer.lr_scheduler.state_dict()),
            rng=rng,
            trainer_state=frozen_state(trainer.state),
            training_args=training_args,
            counters={n: _plain_number(getattr(trainer, n)) for n in TRAINER_COUNTERS if hasattr(trainer, n)},
            lease=lease,
        )


def _without_secrets(args: Any) -> Any:
    """A copy of the trainer's arguments for ``training_args.bin`` (informational: transformers does not read it
    on resume) with ``hub_token`` and any other secret-like field as ``<redacted>``; the trainer keeps the real one."""
    for field in dataclasses.fields(args):
        value = getattr(args, field.name, None)
        if is_secret_key(field.name) and isinstance(value, str) and value:
            setattr(args, field.name, REDACTED)
    return args


def _plain_number(value: Any) -> Any:
    return value.item() if isinstance(value, torch.Tensor) else value


def write_snapshot(snap: BoundarySnapshot, target: Path) -> None:
    """Write ``snap`` into ``target`` atomically (temp dir + rename, COMPLETE marker last)."""
    if snap.layout is not None:  # a gang rank writes its own share (training/gang_checkpoint.py)
        snap.layout.write(snap, target)
        return
    with atomic_dir(target) as tmp:
        tmp = Path(tmp)
        if snap.adapter_config is not None:
            save_file(
                {k: v.contiguous() for k, v in snap.weights.items()}, str(tmp / "adapter_model.safetensors")
            )
            snap.adapter_config.save_pretrained(str(tmp))
        else:
            # tied weights share storage: drop duplicates the way transformers does on save
            seen: dict[int, str] = {}
            tensors = {}
            for k, v in snap.weights.items():
                ptr = v.data_ptr()
                if ptr in seen:
                    continue
                seen[ptr] = k
                tensors[k] = v.contiguous()
            save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            snap.model_config.save_pretrained(str(tmp))
        torch.save(snap.optimizer, tmp / "optimizer.pt")
        torch.save(snap.scheduler, tmp / "scheduler.pt")
        torch.save(rng_for_checkpoint(snap.rng), tmp / "rng_state.pth")
        (tmp / "trainer_state.json").write_text(snap.trainer_state_json())
        (tmp / COUNTERS_FILE).write_text(json.dumps({"counters": snap.counters}) + "\n")
        torch.save(snap.training_args, tmp / "training_args.bin")


class CheckpointWriter:
    """Writes boundary snapshots in a background thread (training does not wait for the disk).

    ``submit(snap, run_dir)`` returns at once; ``flush()`` waits for everything queued; ``close()`` joins.
    After a successful write of ``checkpoint-<step>``, older checkpoints of that run are removed. A run has at
    most one snapshot waiting: a newer one replaces the one not yet written (which would be removed right after
    being written), so memory stays bounded when chunk switches outpace the disk (measured on the tiny model:
    8 runs switching every ~30 ms queued snapshots faster than they were written, +9 MB in use over 64 rounds).
    The writer thread runs at nice +10 (:func:`~rapidfire_nb._priority.lower_thread_priority`), not lower: a thread
    that gets almost no CPU while it holds the interpreter lock stalls training (``_priority``'s docstring).
    """

    def __init__(self, on_error: Callable[[BaseException, Path], None] | None = None) -> None:
        self.on_error = on_error  # ``on_error(exc, folder)`` on the writer thread when a write fails
        self._queue: queue.Queue[int | None] = queue.Queue()  # run ids with a snapshot waiting (once each)
        self._lock = threading.Lock()
        self._waiting: dict[int, tuple[BoundarySnapshot, Path]] = {}
        # how the writer thread yields the CPU once it started: "nice", or "" where it could not (see _priority)
        self.priority = ""
        self._thread = threading.Thread(target=self._main, name="rapidfire-checkpoints", daemon=True)
        self._thread.start()
        self.last_error: str | None = None
        self.written: dict[int, Path] = {}
        self.replaced = 0  # snapshots replaced by a newer one of their run before being written

    def submit(self, snap: BoundarySnapshot, run_dir: Path) -> Path:
        """Queue ``snap`` to be written as ``run_dir/checkpoint-<step>``; returns that folder. A snapshot of the step
        already written for its run (a finished run's final state that was also its last boundary's) is not
        written twice."""
        target = run_dir / f"checkpoint-{snap.step}"
        if not self._thread.is_alive():
            return target
        with self._lock:
            if self.written.get(snap.run_id) == target and snap.run_id not in self._waiting:
                return target
            queued = snap.run_id in self._waiting
            self._waiting[snap.run_id] = (snap, run_dir)
            if queued:
                self.replaced += 1
        if not queued:
            self._queue.put(snap.run_id)
        return target

    def flush(self) -> None:
        self._queue.join()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _main(self) -> None:
        self.priority = "nice" if lower_thread_priority() else ""  # the disk waits; training does not
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                with self._lock:
                    snap, run_dir = self._waiting.pop(item)
                self._write(snap, run_dir)
                del snap  # not held while waiting for the next one: a LoRA snapshot's tensors are reused
            finally:
                self._queue.task_done()

    def _write(self, snap: BoundarySnapshot, run_dir: Path) -> None:
        target = run_dir / f"checkpoint-{snap.step}"
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            if snap.layout is not None:  # a gang rank: its own share and its own clean-up
                if snap.layout.save(snap, run_dir, target):
                    self.written[snap.run_id] = target
                return
            write_snapshot(snap, target)
            self.written[snap.run_id] = target
            for old in run_dir.glob("checkpoint-*"):
                if old != target and not old.name.startswith("."):
                    shutil.rmtree(old, ignore_errors=True)
        except Exception as exc:  # a disk error: the previous checkpoint stays (atomic writes)
            self.last_error = f"checkpoint of run {snap.run_id} at step {snap.step} failed: {exc}"
            if self.on_error is not None:
                self.on_error(exc, target)
            else:
                log.error(self.last_error)
