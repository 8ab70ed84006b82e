"""Factories the Experiment uses, so that ``rapidfire_nb.experiment`` never imports torch at module level."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .executor import TorchExecutor
from .quiet import silence_globally

__all__ = ["make_executor", "silence_globally"]


def make_executor(
    trainer_type: str,
    create_model_fn: Callable[[dict], Any],
    train_dataset: Any,
    eval_dataset: Any,
    num_chunks: int,
    seed: int,
    exp_dir: Path,
    metric_sink: Any,
    notes: Callable[[str], None],
    on_final: Callable[[int, Path], None],
    checkpoint_every: int = 1,
    on_storage_error: Callable[[Any], None] | None = None,
    in_record_order: Callable[[Callable[[], None]], None] | None = None,
    eval_generation_samples: int | None = None,
    on_eval_metrics: Callable[[list[str]], None] | None = None,
) -> TorchExecutor:
    return TorchExecutor(
        trainer_type,
        create_model_fn,
        train_dataset,
        eval_dataset,
        num_chunks,
        seed,
        exp_dir,
        metric_sink,
        notes,
        on_final,
        checkpoint_every=checkpoint_every,
        on_storage_error=on_storage_error,
        in_record_order=in_record_order,
        eval_generation_samples=eval_generation_samples,
        on_eval_metrics=on_eval_metrics,
    )
