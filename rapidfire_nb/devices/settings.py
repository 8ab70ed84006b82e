"""What a worker process needs to host one device's executor (a plain, picklable record; no torch)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["WorkerSettings"]


@dataclass(frozen=True)
class WorkerSettings:
    """One device's worker: the experiment's inputs as a worker process receives them.

    Attributes:
        device: the device's name, e.g. ``"cuda:0"`` or ``"cpu:1"`` (used in messages and ``devices``).
        trainer_type: ``"SFT"``, ``"DPO"`` or ``"GRPO"``.
        create_model_fn: ``create_model_fn(model_config: dict) -> (model, tokenizer)``; a callable in the kernel
            and, once unpickled, in the worker (shipped with cloudpickle: see :mod:`rapidfire_nb.devices.shipping`).
        train_path: folder of the training rows written by :func:`rapidfire_nb.devices.datasets.share_datasets`
            (the worker memory-maps it with ``datasets.load_from_disk``).
        eval_path: the same for the eval rows, or None.
        num_chunks: chunks per epoch.
        seed: the experiment seed.
        exp_dir: the experiment folder (runs' checkpoints and final weights go to ``runs/<id>/``).
        checkpoint_every: write a boundary checkpoint every this many chunks.
        eval_generation_samples: eval rows generated for by generation eval (None: all).
        torch_threads: ``torch.set_num_threads`` in the worker (None: torch's default), e.g. ``cores // N`` for
            N CPU workers on one machine.
        env: environment variables set in the worker before torch is imported (e.g. ``CUDA_VISIBLE_DEVICES``).
    """

    device: str
    trainer_type: str
    create_model_fn: Callable[[dict[str, Any]], Any] | None
    train_path: str
    eval_path: str | None
    num_chunks: int
    seed: int
    exp_dir: str
    checkpoint_every: int = 1
    eval_generation_samples: int | None = None
    torch_threads: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
