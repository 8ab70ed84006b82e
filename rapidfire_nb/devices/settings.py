"""What a worker process needs to host one device's executor (a plain, picklable record; no torch)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rapidfire_nb.spec.bundles import GroupSettings

__all__ = ["WorkerSettings"]


@dataclass(frozen=True)
class WorkerSettings:
    """One device's worker: the experiment's inputs as a worker process receives them.

    Attributes:
        device: the device's name, e.g. ``"cuda:0"`` or ``"cpu:1"`` (used in messages and ``devices``).
        group: the config group's settings (trainer type, ``create_model_fn``, chunks, seed, checkpoint cadence,
            generation-eval sample). ``create_model_fn`` is a callable in the kernel and, once unpickled, in the
            worker; it travels apart, shipped with cloudpickle (:meth:`shipped`, :mod:`.shipping`).
        train_path: folder of the training rows written by :func:`rapidfire_nb.devices.datasets.share_datasets`
            (the worker memory-maps it with ``datasets.load_from_disk``).
        eval_path: the same for the eval rows, or None.
        exp_dir: the experiment folder (runs' checkpoints and final weights go to ``runs/<id>/``).
        torch_threads: ``torch.set_num_threads`` in the worker (None: torch's default), e.g. ``cores // N`` for
            N CPU workers on one machine.
        env: environment variables set in the worker before torch is imported (e.g. ``CUDA_VISIBLE_DEVICES``).
    """

    device: str
    group: GroupSettings
    train_path: str
    eval_path: str | None
    exp_dir: str
    torch_threads: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def create_model_fn(self) -> Callable[[dict[str, Any]], Any] | None:
        """The group's ``create_model_fn`` (None in the copy a worker receives before it loads the function)."""
        return self.group.create_model_fn

    def with_model_fn(self, create_model_fn: Callable[[dict[str, Any]], Any] | None) -> WorkerSettings:
        """A copy whose group holds ``create_model_fn`` (None: the copy to send, the function shipped apart)."""
        return dataclasses.replace(
            self, group=dataclasses.replace(self.group, create_model_fn=create_model_fn)
        )
