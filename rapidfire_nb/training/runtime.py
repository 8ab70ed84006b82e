"""Factories the Experiment uses, so that ``rapidfire_nb.experiment`` never imports torch at module level."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .executor import TorchExecutor
from .quiet import silence_globally

__all__ = ["load_final_model", "make_executor", "silence_globally"]


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


def load_final_model(create_model_fn: Callable[[dict], Any], spec: Any, final_dir: Path) -> tuple[Any, Any]:
    """A fresh ``(model, tokenizer)`` with a run's saved final weights, built in this process.

    Used for runs that trained in a worker process (``run_fit(devices=...)``): their ``final/`` folder is on
    the shared disk; the model is built here with ``create_model_fn``, then the run's adapter (LoRA) or its full
    weights are loaded on it.
    """
    from .models import BaseModels, load_trained_weights

    model, tok = BaseModels(create_model_fn, lambda text: None).create(spec.model_config_dict())
    if spec.lora is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(final_dir))
    else:
        model = load_trained_weights(model, Path(final_dir))
    model.eval()
    return model, tok
