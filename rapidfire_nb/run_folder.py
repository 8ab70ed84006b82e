"""The on-disk layout of one run's folder, ``<experiment>/runs/<run_id>/`` (standard library only).

::

    checkpoint-<step>/                         the latest complete chunk-boundary checkpoint
                                               (the layout ``Trainer.train(resume_from_checkpoint=...)`` reads)
    warm-start-from-run-<parent>-step-<step>/  a warm clone's start: its parent's state at that boundary
    damaged-<name>/                            a checkpoint set aside because it could not be read
    final/                                     the weights of a run that ended (``save_pretrained``)

Every folder is written with :func:`rapidfire_nb._atomic.atomic_dir` and counts only once its ``COMPLETE``
marker is there. The training layer writes these folders; the restore planner and the server only read them.
"""

from __future__ import annotations

import json
from pathlib import Path

from ._atomic import is_complete_dir

__all__ = [
    "CHECKPOINT_PREFIX",
    "DAMAGED_PREFIX",
    "WARM_START_PREFIX",
    "checkpoint_step",
    "latest_checkpoint",
    "readable_checkpoint",
    "run_dir",
]

CHECKPOINT_PREFIX = "checkpoint-"
"""Name prefix of a run's chunk-boundary checkpoint: ``checkpoint-<global step>``."""
WARM_START_PREFIX = "warm-start-from-run-"
"""Name prefix of the checkpoint a warm clone starts from: ``warm-start-from-run-<parent>-step-<step>``."""
DAMAGED_PREFIX = "damaged-"
"""Name prefix of a checkpoint set aside as unreadable (kept for a look, never resumed from)."""


def run_dir(experiment_dir: Path, run_id: int) -> Path:
    """``<experiment>/runs/<run_id>``: the folder holding one run's checkpoints and final weights."""
    return Path(experiment_dir) / "runs" / str(run_id)


def latest_checkpoint(folder: Path, prefix: str = CHECKPOINT_PREFIX) -> Path | None:
    """The complete ``<prefix>...-<step>`` folder with the highest step (half-written ones are skipped).

    Args:
        folder: a run's folder (:func:`run_dir`).
        prefix: :data:`CHECKPOINT_PREFIX` for boundary checkpoints, :data:`WARM_START_PREFIX` for a warm start.

    Returns:
        The folder, or None when there is none (or ``folder`` does not exist).
    """
    best: tuple[int, Path] | None = None
    if not Path(folder).is_dir():
        return None
    for p in Path(folder).glob(f"{prefix}*"):
        try:
            step = int(p.name.rsplit("-", 1)[1])
        except ValueError:
            continue
        if is_complete_dir(p) and (best is None or step > best[0]):
            best = (step, p)
    return best[1] if best else None


def checkpoint_step(folder: Path) -> int:
    """The global optimizer step a checkpoint folder holds (its ``trainer_state.json``'s ``global_step``).

    Raises:
        OSError, ValueError, KeyError: the file is missing or unreadable.
    """
    state = json.loads((Path(folder) / "trainer_state.json").read_text())
    return int(state["global_step"])


def readable_checkpoint(folder: Path) -> bool:
    """True when ``folder/trainer_state.json`` parses and names its ``global_step`` and the files resuming loads
    (weights, optimizer, scheduler) are there and not empty. Deeper damage shows when the run resumes (it fails)."""
    try:
        state = json.loads((Path(folder) / "trainer_state.json").read_text())
        if not isinstance(state.get("global_step"), int):
            return False
        weights = [Path(folder) / "adapter_model.safetensors", Path(folder) / "model.safetensors"]
        needed = [
            next((w for w in weights if w.is_file()), weights[0]),
            Path(folder) / "optimizer.pt",
            Path(folder) / "scheduler.pt",
        ]
        return all(p.is_file() and p.stat().st_size > 0 for p in needed)
    except (OSError, ValueError, AttributeError):
        return False
