"""Factories the Experiment uses, so that ``rapidfire_nb.experiment`` never imports torch at module level."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rapidfire_nb.spec.bundles import GroupSettings, TrainingCallbacks

from .executor import TorchExecutor
from .quiet import silence_globally

__all__ = ["load_final_model", "make_executor", "silence_globally"]


def make_executor(
    group: GroupSettings, train_dataset: Any, eval_dataset: Any, exp_dir: Path, callbacks: TrainingCallbacks
) -> TorchExecutor:
    """The executor of a ``run_fit`` that trains in this process (see :class:`TorchExecutor` for the arguments).

    Raises:
        ConfigError: ``group.trainer_type`` is unknown.
    """
    return TorchExecutor(group, train_dataset, eval_dataset, exp_dir, callbacks)


def load_final_model(create_model_fn: Callable[[dict], Any], spec: Any, final_dir: Path) -> tuple[Any, Any]:
    """A fresh ``(model, tokenizer)`` with a run's saved final weights, built in this process.

    Used for runs that trained in a worker process (``run_fit(devices=...)``): their ``final/`` folder is on
    the shared disk; the model is built here with ``create_model_fn``, then the run's adapter (LoRA) or its full
    weights are loaded on it.
    """
    from .models import BaseModels, load_final_weights

    return load_final_weights(BaseModels(create_model_fn, lambda text: None), spec, Path(final_dir))
