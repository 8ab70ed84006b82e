"""Divergence: a run whose loss, gradient norm or eval loss becomes NaN or infinite fails, saying where.

transformers hides a NaN training loss: with ``logging_nan_inf_filter=True`` (the default) it adds the average
of the previous losses instead and logs a finite number (0.0 once every step is NaN), while the weights are
already NaN. rapidfire_nb checks the raw per-step loss right where TRL computes it (``training_step``; the
filter syncs on that value anyway, so the check adds no device round trip), and every logged ``loss``,
``grad_norm`` and ``eval_loss``. The run then fails with ``"diverged at step N: loss is NaN"``; the other runs
are not touched, and the NaN step's metrics are never recorded as numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["WATCHED", "Diverged", "check_logs", "watch_training_loss"]

WATCHED: tuple[str, ...] = ("loss", "grad_norm", "eval_loss")
"""The logged values that end a run when they are not finite."""


class Diverged(Exception):
    """A run's loss, gradient norm or eval loss is NaN or infinite; the message is the run's failure reason."""


def _word(value: float) -> str:
    return "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def check_logs(step: int, logs: Mapping[str, Any]) -> None:
    """Raise :class:`Diverged` when a watched value of one TRL log line is not finite.

    Args:
        step: the global optimizer step of the line.
        logs: the line (``{"loss": ..., "grad_norm": ..., "eval_loss": ...}``; other keys are ignored).

    Raises:
        Diverged: ``"diverged at step N: grad_norm is inf"`` for the first watched key that is not finite.
    """
    for key in WATCHED:
        value = logs.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isfinite(value):
            raise Diverged(f"diverged at step {step}: {key} is {_word(float(value))}")


def watch_training_loss(trainer: Any) -> None:
    """Wrap ``trainer.training_step`` so that a NaN/inf loss of any micro-batch raises :class:`Diverged`.

    Only while ``logging_nan_inf_filter`` is on (transformers then syncs on the loss of every micro-batch
    itself); with the filter off the NaN reaches the logged ``loss``, which :func:`check_logs` sees.

    Args:
        trainer: a built TRL trainer (its ``state.global_step`` names the step being trained, + 1).
    """
    original = trainer.training_step

    def checked(*args: Any, **kwargs: Any) -> Any:
        loss = original(*args, **kwargs)
        if trainer.args.logging_nan_inf_filter:
            value = float(loss.detach().float().mean()) if hasattr(loss, "detach") else float(loss)
            if not math.isfinite(value):
                raise Diverged(f"diverged at step {trainer.state.global_step + 1}: loss is {_word(value)}")
        return loss

    trainer.training_step = checked
