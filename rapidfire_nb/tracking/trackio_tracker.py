"""Trackio: one Trackio project per rapidfire_nb experiment, one Trackio run per run id, local (the folder
``TRACKIO_DIR``, Trackio's default ``~/.cache/huggingface/trackio``). View with ``trackio show --project
<experiment>``. The Trackio run's name is the run's name (``RFModelConfig(run_name=...)``; ``run-<id>`` for a run
without one, and for a run tracked before runs had names), ``"<name> (run <id>)"`` when another run of the project
has that name already (Trackio tells runs apart by name); it is saved with the Trackio run id, so it never changes.
The run's tags are in its config (``rapidfire.tags``).

Each run is written with its own Trackio run id (never ``trackio.init``, which finishes the process's previous run:
several runs log at once; see "Writes" below). Its config holds the hyperparameters in rapidfire_nb's naming
(secrets ``<redacted>``), ``rapidfire.trainer_type``, ``rapidfire.parent_run`` and ``rapidfire.warm_start``; metrics
are logged as transformers' Trackio callback names them (``train/loss``, ``eval/loss``) at the store's steps.

Lifecycle: Trackio has no run status, so every change is a Trackio alert on the run (shown in its dashboard):
``finished`` (INFO), ``failed: <error>`` (ERROR), ``killed`` (WARN, STOPPED or INTERRUPTED), ``running`` again
(INFO); DELETED deletes the run from the project (``SQLiteStorage.delete_run``). The Trackio run ids are kept in the
experiment's store, so a restarted kernel logs into the same runs; Trackio cannot drop a logged point, so a run
continued from its checkpoint does not log again the steps Trackio holds (:class:`~.base.HeldSteps`: not
duplicated).

Writes: the points are buffered per run and written once per write window of the :class:`~.fanout.TrackerSet`
(``end_batch``), before each alert of that run, and at :meth:`TrackioTracker.flush` / ``close``, each point with
the time it was logged. In Trackio's default storage mode (``sqlite``) they are written on the trackers' thread with
the calls a local ``trackio.Run`` makes from its writer thread: ``SQLiteStorage.bulk_log`` (one SQLite transaction
per run and window, under Trackio's process lock) and ``SQLiteStorage.bulk_alert``, so Trackio starts no thread
(a ``Run`` polls every 0.5 s while it lives, and its ``log`` serializes each point again: together about a third
of Trackio's CPU in a SmolLM2 experiment). Where Trackio chose its ``jsonl`` mode (``TRACKIO_STORAGE_MODE``, or
``TRACKIO_DIR`` on a network filesystem, where SQLite writers are unsafe) each run gets its own ``trackio.Run``
instead, and Trackio writes its fragments.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from rapidfire_nb.tracking.base import BackendTracker, HeldSteps, TrackedRun

__all__ = ["TrackioTracker"]

_ALERTS = {
    "ONGOING": ("running", "INFO"),
    "COMPLETED": ("finished", "INFO"),
    "FAILED": ("failed", "ERROR"),
    "STOPPED": ("killed", "WARN"),
    "INTERRUPTED": ("killed", "WARN"),
}


def _import_trackio() -> Any:
    try:
        import trackio
    except ImportError as exc:
        raise ImportError("Trackio tracking needs Trackio: pip install 'rapidfire_nb[trackio]'") from exc
    return trackio


class TrackioTracker(BackendTracker):
    """Writes every run of one experiment to a local Trackio project.

    Args:
        experiment: the rapidfire_nb experiment name (the Trackio project).
        state: what an earlier kernel saved (``{"dir", "runs": {run id: Trackio run id}, "names": {run id: Trackio
            run name}}``).
        save: ``save(state)`` keeps the state in the experiment's store (called when it changes).

    Raises:
        ImportError: Trackio is not installed (``pip install 'rapidfire_nb[trackio]'``).
        ValueError: Trackio refuses the project name.
    """

    name = "trackio"
    metric_style = "split"

    def __init__(
        self, experiment: str, state: Mapping[str, Any], save: Callable[[dict[str, Any]], None]
    ) -> None:
        trackio = _import_trackio()
        from trackio.sqlite_storage import SQLiteStorage
        from trackio.utils import TRACKIO_DIR, get_storage_mode

        SQLiteStorage.validate_project_name(experiment)
        self._trackio, self._storage = trackio, SQLiteStorage
        self.direct = get_storage_mode() == "sqlite"  # else jsonl: one trackio.Run per run writes fragments
        self.project = experiment
        self.folder = str(TRACKIO_DIR)
        same_place = state.get("dir") == self.folder
        self._ids: dict[int, str] = (
            {int(k): v for k, v in (state.get("runs") or {}).items()} if same_place else {}
        )
        known = state.get("names") or {} if same_place else {}
        self._names: dict[int, str] = {int(k): str(v) for k, v in known.items()}
        self._config: dict[int, dict[str, Any]] = {}
        self._handles: dict[int, Any] = {}  # jsonl mode only
        self._config_written: set[int] = set()  # sqlite mode: the runs whose config this kernel wrote
        self._last_step: dict[int, int] = {}
        # run id -> [(step, values, unix s)]
        self._pending: dict[int, list[tuple[int, dict[str, float], float]]] = {}
        self._save_state = save
        self._held = HeldSteps()
        self._deleted: set[int] = set()
        self._save()

    def _save(self) -> None:
        self._save_state(
            {
                "dir": self.folder,
                "runs": {str(k): v for k, v in sorted(self._ids.items())},
                "names": {str(k): v for k, v in sorted(self._names.items())},
            }
        )

    def _name(self, run_id: int) -> str:
        """The Trackio run name of run ``run_id`` (``run-<id>`` for one tracked before runs had names)."""
        return self._names.get(run_id, f"run-{run_id}")

    def _new_name(self, run: TrackedRun) -> str:
        """A new Trackio run's name: the run's name, with its id appended when another run of the project has it."""
        name = run.display_name
        return f"{name} (run {run.run_id})" if name in self._names.values() else name

    def describe(self) -> str:
        return (
            f"Trackio: project {self.project!r} in {self.folder}; open the dashboard with: "
            f"trackio show --project '{self.project}'"
        )

    def run_id_of(self, run_id: int) -> str | None:
        """The Trackio run id of run ``run_id`` (None before it is tracked)."""
        return self._ids.get(int(run_id))

    def _handle(self, run_id: int) -> Any | None:
        """jsonl mode: the run's ``trackio.Run`` (made on first use: it starts Trackio's writer thread for the run)."""
        if run_id in self._deleted or run_id not in self._ids or self.direct:
            return None
        handle = self._handles.get(run_id)
        if handle is None:
            handle = self._trackio.Run(
                url=None,
                project=self.project,
                client=None,
                name=self._name(run_id),
                run_id=self._ids[run_id],
                config=self._config.get(run_id),
                auto_log_gpu=False,
                auto_log_cpu=False,
            )
            self._handles[run_id] = handle
        return handle

    def start_run(self, run: TrackedRun, status: str) -> None:
        """Note the run (its Trackio run is written with its first point); a new run gets a new Trackio id."""
        config = {
            **run.params,
            **{f"rapidfire.{k}": v for k, v in run.group.items()},
            "rapidfire.trainer_type": run.trainer_type,
            "rapidfire.warm_start": run.warm_start,
        }
        if run.parent_id is not None:
            config["rapidfire.parent_run"] = run.parent_id
        if run.tags:
            config["rapidfire.tags"] = list(run.tags)
        self._config[run.run_id] = config
        if run.run_id not in self._ids and status != "DELETED":
            self._ids[run.run_id] = uuid.uuid4().hex
            self._names[run.run_id] = self._new_name(run)
            self._save()

    def set_status(self, run_id: int, status: str, error: str | None = None, at: float | None = None) -> None:
        alert = _ALERTS.get(status)
        if alert is None or run_id in self._deleted or run_id not in self._ids:
            return
        title, level = alert
        text = (error or "")[:2000] or None
        handle = self._hand_over(run_id)  # its points come before the alert
        if self.direct:
            self._storage.bulk_alert(
                project=self.project,
                run=self._name(run_id),
                run_id=self._ids[run_id],
                titles=[f"run-{run_id} {title}"],
                texts=[text],
                levels=[getattr(self._trackio.AlertLevel, level).value],
                steps=[self._last_step.get(run_id, 0)],
                timestamps=[_iso(time.time() if at is None else at)],
                alert_ids=[uuid.uuid4().hex],
            )
            return
        if handle is None:
            return
        handle.alert(title=f"run-{run_id} {title}", text=text, level=getattr(self._trackio.AlertLevel, level))
        if status in ("COMPLETED", "FAILED"):  # it never trains again: write what it holds, stop its thread
            self._handles.pop(run_id, None)
            handle.finish()

    def mark_deleted(self, run_id: int) -> None:
        """Delete the run from the Trackio project (its metrics, config and alerts)."""
        self._pending.pop(run_id, None)
        if run_id in self._deleted or run_id not in self._ids:
            return
        handle = self._handles.pop(run_id, None)
        if handle is not None:
            handle.finish()  # writes what it holds, so the delete below removes everything
        self._deleted.add(run_id)
        self._storage.delete_run(self.project, self._name(run_id), run_id=self._ids[run_id])

    def continue_from(self, run_id: int, step: int) -> None:
        """Skip the points Trackio holds above ``step`` when the run logs those steps again."""
        tid = self._ids.get(run_id)
        if tid is None or run_id in self._deleted:
            return
        # what it buffered before the rewind is written, then held like the rest
        self._held.hold(run_id, step, self._held_steps(run_id, tid))

    def _held_steps(self, run_id: int, tid: Any) -> dict[str, int]:
        """``{name: highest step}`` of what Trackio holds of the run, once what it buffered is written."""
        handle = self._hand_over(run_id)
        if handle is not None:
            _write_now(handle)
        held: dict[str, int] = {}
        for row in self._storage.get_logs(self.project, self._name(run_id), run_id=tid):
            for key in row:
                if key not in ("step", "timestamp"):
                    held[key] = max(held.get(key, -1), int(row["step"]))
        return held

    def restore_points(
        self, run_id: int, step: int, points: Sequence[tuple[int, Mapping[str, Any], float | None]]
    ) -> None:
        """Log the stored points up to ``step`` that Trackio lacks (a continued run's checkpoint, or the last step of
        a run that ended in a dead kernel): a kernel killed before its trackers wrote never handed over the points
        it buffered. ``points``: ``(step, {name: value}, wall_time)`` per log call, from the store, oldest first."""
        if run_id in self._deleted or run_id not in self._ids:
            return
        if not self._held.knows(run_id):  # a run that ended in the dead kernel: not continued
            self._held.hold(run_id, step, self._held_steps(run_id, self._ids[run_id]))
        for at, scalars, wall_time in points:
            values = self._held.lacking(run_id, at, scalars) if at <= step else {}
            if values:
                stamp = time.time() if wall_time is None else float(wall_time)
                self._pending.setdefault(run_id, []).append(
                    (int(at), {k: float(v) for k, v in values.items()}, stamp)
                )
                self._last_step[run_id] = max(self._last_step.get(run_id, 0), int(at))

    def log_scalars(
        self, run_id: int, step: int, scalars: Mapping[str, Any], wall_time: float | None = None
    ) -> None:
        """Buffer the points (handed to Trackio by :meth:`end_batch`, an alert of the run, or :meth:`flush`)."""
        if run_id in self._deleted or run_id not in self._ids:
            return
        values = self._held.new_only(run_id, step, scalars)
        if values:
            at = time.time() if wall_time is None else float(wall_time)
            self._pending.setdefault(run_id, []).append(
                (int(step), {k: float(v) for k, v in values.items()}, at)
            )
            self._last_step[run_id] = max(self._last_step.get(run_id, 0), int(step))

    def _hand_over(self, run_id: int) -> Any | None:
        """Write run ``run_id``'s buffered points (sqlite mode: now, one transaction; jsonl mode: its
        ``trackio.Run`` takes them and its thread writes them); the run's ``trackio.Run`` in jsonl mode, else None."""
        points = self._pending.pop(run_id, None)
        if self.direct:
            if points and run_id in self._ids and run_id not in self._deleted:
                first = run_id not in self._config_written
                self._storage.bulk_log(
                    project=self.project,
                    run=self._name(run_id),
                    run_id=self._ids[run_id],
                    metrics_list=[values for _, values, _ in points],
                    steps=[step for step, _, _ in points],
                    timestamps=[_iso(at) for _, _, at in points],
                    config=self._stored_config(run_id) if first else None,
                    log_ids=[uuid.uuid4().hex for _ in points],
                )
                self._config_written.add(run_id)
            return None
        handle = self._handle(run_id)
        if handle is not None:
            for step, values, _ in points or ():
                handle.log(values, step=step)
        return handle

    def _stored_config(self, run_id: int) -> dict[str, Any]:
        """The run's config as a ``trackio.Run`` stores it (its reserved ``_Created``, ``_Group``, ``_Username``)."""
        from trackio.utils import to_json_safe

        config = dict(to_json_safe(self._config.get(run_id) or {}))
        config.update(_Username=None, _Created=_iso(time.time()), _Group=None)
        return config

    def end_batch(self) -> None:
        """The write window is over: hand every run's points to Trackio (one SQLite write per run follows)."""
        for run_id in list(self._pending):
            self._hand_over(run_id)

    def flush(self) -> None:
        """Write every buffered point now, on this thread."""
        self.end_batch()
        for handle in list(self._handles.values()):
            _write_now(handle)

    def close(self) -> None:
        """Write every buffered point; jsonl mode: finish every open ``trackio.Run`` (it writes what it holds and
        stops its thread)."""
        self.end_batch()
        handles, self._handles = list(self._handles.values()), {}
        for handle in handles:
            handle.finish()


def _iso(unix_s: float) -> str:
    """A unix time as Trackio stamps its rows (ISO 8601, UTC)."""
    return datetime.fromtimestamp(unix_s, timezone.utc).isoformat()


def _write_now(handle: Any) -> None:
    """Write what ``handle`` (a ``trackio.Run``) holds, as its writer thread does (under its lock, so not twice).

    Trackio has no public flush short of ``finish()``; when this Trackio has no inline flush, its thread writes
    within its interval (0.5 s) and ``finish()`` writes the rest.
    """
    flush = getattr(handle, "_flush_queues_inline", None)
    lock = getattr(handle, "_client_lock", None)
    if flush is None or lock is None:
        return
    with lock:
        flush()
