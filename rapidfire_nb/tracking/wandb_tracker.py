"""Weights & Biases: one W&B project per rapidfire_nb experiment, one W&B run per run id (named as the run:
``RFModelConfig(run_name=...)``, ``run-<id>`` without one; found again by its saved W&B id, never by name), offline
unless ``WANDB_MODE`` says otherwise (offline runs are written under ``<experiment>/wandb``; ``wandb sync`` uploads
them).

Each run is its own ``wandb.init(..., reinit="create_new")`` handle (never the process-global ``wandb.run``: several
runs log at once). Its config holds the hyperparameters in rapidfire_nb's naming (secrets ``<redacted>``) and the
``rapidfire.*`` settings; tags: the trainer type, ``clone`` / ``warm-start`` for clones, then the run's own
(``RFModelConfig(tags=[...])``). Metrics as transformers' W&B
callback names them (``train/loss``, ``eval/loss``), at the store's steps.

Lifecycle: W&B states come from how a run is finished: COMPLETED -> ``finish(exit_code=0)`` (finished), FAILED ->
``finish(exit_code=1)`` (failed); the SDK cannot mark a run killed, so STOPPED / INTERRUPTED set the summary value
``rapidfire.status`` to ``killed`` (and back to ``running`` when resumed); DELETED cannot be done from an offline run:
the run gets the tag ``deleted`` and is finished. The W&B run ids are kept in the experiment's store, so a restarted
kernel resumes the same runs (``resume="allow"``); online, W&B ignores steps below a resumed run's last step, so
nothing is duplicated; offline runs cannot resume, so the continued part is a second offline folder of the same id,
marked by the config value ``rapidfire.continued_from_step``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rapidfire_nb.tracking.base import BackendTracker, TrackedRun

__all__ = ["WandbTracker"]


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError as exc:
        raise ImportError("W&B tracking needs wandb: pip install 'rapidfire_nb[wandb]'") from exc
    return wandb


class WandbTracker(BackendTracker):
    """Writes every run of one experiment to W&B (offline by default).

    Args:
        experiment: the rapidfire_nb experiment name (the W&B project).
        exp_dir: the experiment folder (W&B's ``dir``: offline runs go to ``<exp_dir>/wandb``).
        state: what an earlier kernel saved (``{"runs": {run id: W&B run id}}``).
        save: ``save(state)`` keeps the state in the experiment's store (called when it changes).

    Raises:
        ImportError: wandb is not installed (``pip install 'rapidfire_nb[wandb]'``).
    """

    name = "wandb"
    metric_style = "split"

    def __init__(
        self, experiment: str, exp_dir: Path, state: Mapping[str, Any], save: Callable[[dict[str, Any]], None]
    ) -> None:
        self._wandb = _import_wandb()
        self.project = experiment
        self.folder = Path(exp_dir)
        self.mode = os.environ.get("WANDB_MODE", "").strip() or "offline"
        self._ids: dict[int, str] = {int(k): v for k, v in (state.get("runs") or {}).items()}
        self._runs: dict[int, TrackedRun] = {}
        self._handles: dict[int, Any] = {}
        self._ended: set[int] = set()
        self._continued: dict[int, int] = {}
        self._save_state = save

    def _save(self) -> None:
        self._save_state({"runs": {str(k): v for k, v in sorted(self._ids.items())}})

    def describe(self) -> str:
        if self.mode == "offline":
            return (
                f"W&B: project {self.project!r}, offline runs in {self.folder / 'wandb'}; upload them with: "
                f"wandb sync '{self.folder / 'wandb'}'/offline-run-*"
            )
        return f"W&B: project {self.project!r} (WANDB_MODE={self.mode})"

    def run_id_of(self, run_id: int) -> str | None:
        """The W&B run id of run ``run_id`` (None before it is tracked)."""
        return self._ids.get(int(run_id))

    def _handle(self, run_id: int) -> Any | None:
        """The run's W&B handle, made on first use (``reinit="create_new"``: one handle per run)."""
        if run_id in self._ended or run_id not in self._runs:
            return None
        handle = self._handles.get(run_id)
        if handle is None:
            run = self._runs[run_id]
            tags = [run.trainer_type] + (["clone"] if run.parent_id is not None else [])
            tags += ["warm-start"] if run.warm_start else []
            tags += [t for t in run.tags if t not in tags]  # the user's own (RFModelConfig(tags=[...]))
            config: dict[str, Any] = {
                **run.params,
                **{f"rapidfire.{k}": v for k, v in run.group.items()},
                "rapidfire.run_id": run_id,
                "rapidfire.parent_run": run.parent_id,
                "rapidfire.warm_start": run.warm_start,
            }
            if run_id in self._continued:
                config["rapidfire.continued_from_step"] = self._continued[run_id]
            handle = self._wandb.init(
                project=self.project,
                name=run.display_name,  # the run's name, run-<id> without one
                id=self._ids[run_id],
                resume="allow",
                reinit="create_new",
                mode=self.mode,
                dir=str(self.folder),
                config=config,
                tags=tags,
            )
            self._handles[run_id] = handle
        return handle

    def start_run(self, run: TrackedRun, status: str) -> None:
        self._runs[run.run_id] = run
        if run.run_id not in self._ids:
            if status == "DELETED":
                return
            self._ids[run.run_id] = uuid.uuid4().hex[:8]
            self._save()
        if status in ("COMPLETED", "FAILED", "DELETED"):
            self._ended.add(run.run_id)  # ended in an earlier kernel: not opened again

    def set_status(self, run_id: int, status: str, error: str | None = None, at: float | None = None) -> None:
        if status == "NEW":
            return
        handle = self._handle(run_id)
        if handle is None:
            return
        if status in ("COMPLETED", "FAILED"):
            handle.summary["rapidfire.status"] = "finished" if status == "COMPLETED" else "failed"
            if error:
                handle.summary["rapidfire.error"] = error[:2000]
            self._finish(run_id, 0 if status == "COMPLETED" else 1)
        else:
            handle.summary["rapidfire.status"] = "running" if status == "ONGOING" else "killed"

    def mark_deleted(self, run_id: int) -> None:
        """Tag the run ``deleted`` and finish it (an offline run cannot be deleted from the SDK)."""
        handle = self._handle(run_id)
        if handle is None:
            return
        handle.tags = (*tuple(handle.tags or ()), "deleted")
        handle.summary["rapidfire.status"] = "deleted"
        self._finish(run_id, 0)

    def continue_from(self, run_id: int, step: int) -> None:
        """Mark the run (config ``rapidfire.continued_from_step``); W&B online ignores steps it has already."""
        self._continued[run_id] = int(step)
        handle = self._handles.get(run_id)
        if handle is not None:
            handle.config.update({"rapidfire.continued_from_step": int(step)}, allow_val_change=True)

    def log_scalars(
        self, run_id: int, step: int, scalars: Mapping[str, Any], wall_time: float | None = None
    ) -> None:
        handle = self._handle(run_id)
        if handle is not None and scalars:
            handle.log({k: float(v) for k, v in scalars.items()}, step=int(step))

    def _finish(self, run_id: int, exit_code: int) -> None:
        self._ended.add(run_id)
        handle = self._handles.pop(run_id, None)
        if handle is not None:
            handle.finish(exit_code=exit_code)

    def close(self) -> None:
        """Finish every open run (a run still STOPPED keeps its summary ``rapidfire.status = killed``)."""
        for run_id in list(self._handles):
            self._finish(run_id, 0)
