"""MLflow: one MLflow experiment per rapidfire_nb experiment, one MLflow run per run id, through one
``MlflowClient`` and explicit run ids (never MLflow's process-global active run: several runs log at once).

Where: ``MLFLOW_TRACKING_URI`` when set, else a SQLite store inside the experiment folder
(``<experiment>/mlflow.db``, artifacts in ``<experiment>/mlflow-artifacts``), so nothing else has to run. View it
with ``mlflow ui --backend-store-uri <uri>`` (the line printed when training starts gives the exact command).

What goes there: params = the run's hyperparameters in rapidfire_nb's naming (``learning_rate``, ``lora.r``,
``model_kwargs.<key>``, secrets ``<redacted>``) plus ``rapidfire.num_chunks`` / ``rapidfire.seed``; the whole config
as the artifact ``rapidfire_config.json`` (own SQLite store only); metrics under TRL's names (``loss``,
``eval_loss``, ...) at the optimizer steps of the store; tags ``rapidfire.run_id``, ``rapidfire.trainer_type``,
``rapidfire.parent_run`` / ``rapidfire.parent_mlflow_run_id`` and ``rapidfire.warm_start`` for clones. The MLflow
run name is the run's name (``RFModelConfig(run_name=...)``), ``run-<id>`` for a run without one; its tags
(``RFModelConfig(tags=[...])``) are MLflow tags with an empty value (a tag MLflow would refuse as a key is left to
``rapidfire.tags``, which lists them all).

Lifecycle: a run is created in MLflow when it leaves NEW (it starts training, or is stopped before it did), as
RUNNING, MLflow's status of a new run (a NEW run would cost two requests more, SCHEDULED then RUNNING, for the
seconds before its first chunk; runs still NEW when the experiment ends are created as SCHEDULED then); ONGOING ->
RUNNING (again after a resume), COMPLETED -> FINISHED, FAILED -> FAILED (tag ``rapidfire.error``), STOPPED /
INTERRUPTED -> KILLED, DELETED -> ``delete_run`` (MLflow's soft delete: hidden, restorable, removed by ``mlflow
gc``; with every point it logged, and KILLED first if it was running); a run deleted before it trained is never
created. A run's start time is when it first trained (the scheduler's event, not when the recorder wrote it) and its
end time when it reached its final status. The MLflow run ids are kept in the experiment's store, so a restarted
kernel continues the same MLflow runs, and a run whose MLflow status is already right is left as it is. MLflow
cannot drop a logged point: a run continued from its checkpoint after a kernel died does not log again the steps
MLflow already holds (:class:`~.base.HeldSteps`; not duplicated, and the resume is exact, so they are the values it
would log), and gets the tag ``rapidfire.continued_from_step``.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rapidfire_nb.redact import hide_url_passwords
from rapidfire_nb.tracking.base import BackendTracker, HeldSteps, TrackedRun

__all__ = ["MlflowTracker", "default_tracking_uri", "shown_uri"]

_STATUS = {
    "NEW": "SCHEDULED",
    "ONGOING": "RUNNING",
    "COMPLETED": "FINISHED",
    "FAILED": "FAILED",
    "STOPPED": "KILLED",
    "INTERRUPTED": "KILLED",
}
_TERMINAL = frozenset({"FINISHED", "FAILED", "KILLED"})
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")
_PARAM_MAX = 6000  # MLflow's MAX_PARAM_VAL_LENGTH (characters)
_TAG_MAX = 5000
_BATCH_PARAMS = 100  # MLflow's MAX_PARAMS_TAGS_PER_BATCH
_BATCH_METRICS = 1000  # MLflow's MAX_METRICS_PER_BATCH


def default_tracking_uri(exp_dir: Path) -> str:
    """``sqlite:///<experiment>/mlflow.db`` (absolute path)."""
    return "sqlite:///" + str((Path(exp_dir) / "mlflow.db").resolve())


PROBE_TIMEOUT_S = 3.0
"""Seconds the tracking server of an ``http(s)`` URI has to accept a connection when MLflow tracking opens."""


def probe_server(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Check once that the server of an ``http(s)`` tracking URI accepts a TCP connection (other URIs: nothing).

    MLflow's own client retries a refused connection with growing waits for minutes before it raises, holding a
    blocking ``run_fit`` that long with nothing printed; this fails in at most ``timeout_s`` seconds instead.

    Raises:
        ConnectionError: nothing accepts connections at the URI's host and port (the URI shown without its password).
    """
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            return
    except OSError as exc:
        raise ConnectionError(
            f"no MLflow tracking server answers at {shown_uri(uri)} ({exc.strerror or exc}, "
            f"checked for {timeout_s:g} s); start it or fix MLFLOW_TRACKING_URI"
        ) from None


def shown_uri(uri: str) -> str:
    """``uri`` without a password (``https://user:secret@host`` -> ``https://user:<redacted>@host``)."""
    return hide_url_passwords(uri)


def _ms(unix_s: float | None) -> int | None:
    """Unix seconds as MLflow's milliseconds (None: MLflow takes the time of the request)."""
    return None if unix_s is None else int(unix_s * 1000)


def _key(name: str) -> str:
    return _BAD_KEY_CHARS.sub("_", str(name))[:250]


def _user_tags(tags: Sequence[str]) -> dict[str, str]:
    """A run's free tags as MLflow tags: each one a key with an empty value (those MLflow would refuse as a key, or
    that would shadow ``rapidfire.*`` / ``mlflow.*``, only in ``rapidfire.tags``), and ``rapidfire.tags`` listing all."""
    if not tags:
        return {}
    out = {
        t: "" for t in tags if not _BAD_KEY_CHARS.search(t) and not t.startswith(("rapidfire.", "mlflow."))
    }
    return {**out, "rapidfire.tags": _text(", ".join(tags), _TAG_MAX)}


def _text(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 12] + "…(truncated)"


class MlflowTracker(BackendTracker):
    """Writes every run of one experiment to MLflow.

    Args:
        experiment: the rapidfire_nb experiment name (the MLflow experiment's name).
        exp_dir: the experiment folder (where the default SQLite store lives).
        state: what an earlier kernel saved (``{"uri", "experiment_id", "runs": {run id: MLflow run id}}``).
        save: ``save(state)`` keeps the state in the experiment's store (called when it changes).
        tracking_uri: the MLflow tracking URI; default ``MLFLOW_TRACKING_URI``, else the SQLite store.

    Raises:
        ImportError: MLflow is not installed (``pip install 'rapidfire_nb[mlflow]'``).
        ConnectionError: an ``http(s)`` URI's server refuses connections (:func:`probe_server`, within seconds).
    """

    name = "mlflow"
    metric_style = "trl"

    def __init__(
        self,
        experiment: str,
        exp_dir: Path,
        state: Mapping[str, Any],
        save: Callable[[dict[str, Any]], None],
        tracking_uri: str | None = None,
    ) -> None:
        try:
            from mlflow.entities import Metric, Param, RunTag
            from mlflow.tracking import MlflowClient
        except ImportError as exc:
            raise ImportError("MLflow tracking needs MLflow: pip install 'rapidfire_nb[mlflow]'") from exc
        self._Metric, self._Param, self._RunTag = Metric, Param, RunTag
        env_uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
        self.uri = tracking_uri or env_uri or default_tracking_uri(exp_dir)
        self.own_store = not (tracking_uri or env_uri)
        probe_server(self.uri)  # a server that refuses connections fails now, not after minutes of retries
        self.experiment = experiment
        self._exp_dir = Path(exp_dir)
        self._client = MlflowClient(tracking_uri=self.uri)
        same_place = state.get("uri") == shown_uri(self.uri)  # a password in the URI is never stored
        self._runs: dict[int, str] = (
            {int(k): v for k, v in (state.get("runs") or {}).items()} if same_place else {}
        )
        self._save_state = save
        self.experiment_id = self._experiment(state.get("experiment_id") if same_place else None)
        self._save()
        self._pending: dict[int, list[Any]] = {}
        self._waiting: dict[int, TrackedRun] = {}  # NEW runs not created in MLflow yet
        self._held = HeldSteps()
        self._stamps: dict[tuple[int, str], int] = {}  # (run, key) -> its last point's timestamp (_stamp)
        self._deleted: set[int] = set()

    def _save(self) -> None:
        self._save_state(
            {
                "uri": shown_uri(self.uri),
                "experiment_id": self.experiment_id,
                "runs": {str(k): v for k, v in sorted(self._runs.items())},
            }
        )

    def _experiment(self, stored_id: str | None) -> str:
        """The MLflow experiment's id: the stored one, else the one of this name, else a new one."""
        client = self._client
        found = None
        if stored_id:
            try:
                found = client.get_experiment(stored_id)
            except Exception:  # not there any more (another URI, a wiped store): look it up by name
                found = None
        if found is None:
            found = client.get_experiment_by_name(self.experiment)
        if found is not None:
            if found.lifecycle_stage == "deleted":
                client.restore_experiment(found.experiment_id)
            return str(found.experiment_id)
        location = (self._exp_dir / "mlflow-artifacts").resolve().as_uri() if self.own_store else None
        return str(
            client.create_experiment(
                self.experiment,
                artifact_location=location,
                tags={"rapidfire.experiment_path": str(self._exp_dir)},
            )
        )

    def describe(self) -> str:
        where = shown_uri(self.uri)
        if self.own_store:
            return (
                f"MLflow: experiment {self.experiment!r}, tracking URI {where}; open the UI with: "
                f"mlflow ui --backend-store-uri '{where}'  (then http://127.0.0.1:5000)"
            )
        if where.startswith(("http://", "https://")):  # a tracking server: its own UI
            return f"MLflow: experiment {self.experiment!r} at {where} (MLFLOW_TRACKING_URI); its UI is that address"
        return (
            f"MLflow: experiment {self.experiment!r} at {where} (MLFLOW_TRACKING_URI); open the UI with: "
            f"mlflow ui --backend-store-uri '{where}'  (then http://127.0.0.1:5000)"
        )

    def run_id_of(self, run_id: int) -> str | None:
        """The MLflow run id of run ``run_id`` (None before it is tracked)."""
        return self._runs.get(int(run_id))

    # ------------------------------------------------------------------ runs
    def start_run(self, run: TrackedRun, status: str) -> None:
        """Continue the stored MLflow run (renamed when the run's name changed) and set its status; else create the
        run, named as the run (``run-<id>`` without a name), with its params and tags, at once unless the run is NEW
        (then when it first changes status, see the module docstring)."""
        mid = self._runs.get(run.run_id)
        if mid is None:
            if status == "DELETED":
                return
            if status == "NEW":
                self._waiting[run.run_id] = run
                return
            mid = self._create(run)
            if status == "ONGOING":
                return  # created RUNNING
        else:
            info = self._client.get_run(mid).info
            if (
                run.run_name and info.run_name != run.run_name
            ):  # renamed by a later run_fit (a name is a label)
                self._client.update_run(mid, name=run.run_name)
            if _STATUS.get(status) in (None, info.status):
                return  # nothing to set, or an earlier kernel left it so (its end time stays)
        self._set(mid, status)

    def _create(self, run: TrackedRun, at: float | None = None) -> str:
        client = self._client
        tags = {
            "rapidfire.run_id": str(run.run_id),
            "rapidfire.experiment": self.experiment,
            "rapidfire.trainer_type": run.trainer_type,
            "rapidfire.warm_start": "true" if run.warm_start else "false",
        }
        if run.parent_id is not None:
            tags["rapidfire.parent_run"] = str(run.parent_id)
            parent = self._runs.get(run.parent_id)
            if parent is not None:
                tags["rapidfire.parent_mlflow_run_id"] = parent
        tags.update(_user_tags(run.tags))
        created = client.create_run(
            self.experiment_id, run_name=run.display_name, tags=tags, start_time=_ms(at)
        )
        mid = str(created.info.run_id)
        self._runs[run.run_id] = mid
        self._save()
        values = {**run.params, **{f"rapidfire.{k}": v for k, v in run.group.items()}}
        params = [self._Param(_key(k), _text(v, _PARAM_MAX)) for k, v in sorted(values.items())]
        for i in range(0, len(params), _BATCH_PARAMS):
            client.log_batch(mid, params=params[i : i + _BATCH_PARAMS])
        if self.own_store:
            client.log_dict(mid, dict(run.config), "rapidfire_config.json")
        return mid

    def _set(self, mid: str, status: str, at: float | None = None) -> None:
        target = _STATUS.get(status)
        if target is None:
            return
        if target in _TERMINAL:
            self._client.set_terminated(mid, status=target, end_time=_ms(at))
        else:
            self._client.update_run(mid, status=target)

    def set_status(self, run_id: int, status: str, error: str | None = None, at: float | None = None) -> None:
        """Run ``run_id`` is now ``status`` since ``at`` (unix s): created now if it waited (its start time), ended
        at ``at`` when the status is final."""
        if not self._create_if_waiting(run_id, status, at):
            return
        mid = self._runs.get(run_id)
        if mid is None or run_id in self._deleted:
            return
        self._write(run_id)  # the points before the status change
        if error:
            self._client.set_tag(mid, "rapidfire.error", _text(error, _TAG_MAX))
        self._set(mid, status, at)

    def _create_if_waiting(self, run_id: int, status: str, at: float | None = None) -> bool:
        """Create a waiting (NEW) run that now has ``status``; False when nothing more is to be done for it."""
        waiting = self._waiting.pop(run_id, None)
        if waiting is None:
            return True
        if status in ("NEW", "DELETED"):  # still waiting, or gone before it trained
            if status == "NEW":
                self._waiting[run_id] = waiting
            return False
        self._create(waiting, at)  # MLflow makes it RUNNING
        return status != "ONGOING"

    def mark_deleted(self, run_id: int) -> None:
        """MLflow's soft delete of the run (hidden in the UI, restorable until ``mlflow gc``): its points are
        written and a run deleted while it trained is KILLED first, so a restored run holds what the store holds
        and does not look as if it were still running."""
        mid = self._runs.get(run_id)
        self._waiting.pop(run_id, None)  # never created: nothing to delete
        if mid is None or run_id in self._deleted:
            self._pending.pop(run_id, None)
            return
        self._write(run_id)
        if self._client.get_run(mid).info.status not in _TERMINAL:
            self._client.set_terminated(mid, status="KILLED")
        self._deleted.add(run_id)
        self._client.delete_run(mid)

    def continue_from(self, run_id: int, step: int) -> None:
        """Skip the points MLflow holds above ``step`` when the run logs those steps again."""
        mid = self._runs.get(run_id)
        if mid is None or run_id in self._deleted:
            return
        self._write(run_id)  # what it buffered before the rewind is in MLflow, so it is held like the rest
        self._held.hold_points(run_id, step, self._held_steps(mid))
        self._client.set_tag(mid, "rapidfire.continued_from_step", str(step))

    def _held_steps(self, mid: str) -> dict[str, list[int]]:
        """``{metric key: the step of each point}`` of what MLflow holds of the run ``mid`` (a step repeats when
        several log calls of one step carry the key: TRL's ``epoch`` is in the training log, the evaluation log
        and the final summary of a step)."""
        return {
            key: [int(m.step) for m in self._client.get_metric_history(mid, key)]
            for key in self._client.get_run(mid).data.metrics
        }

    def restore_points(
        self, run_id: int, step: int, points: Sequence[tuple[int, Mapping[str, Any], float | None]]
    ) -> None:
        """Log the stored points up to ``step`` that MLflow lacks (a continued run's checkpoint, or the last step
        of a run that ended in a dead kernel).

        A kernel killed within a write window (:data:`~.fanout.WRITE_EVERY_S`) never wrote the points it buffered,
        some of them before its checkpoint; the continued run logs only what comes after it. ``points``:
        ``(step, {TRL name: value}, wall_time)`` per log call, from the store, oldest first.
        """
        if run_id not in self._runs or run_id in self._deleted:
            return
        if not self._held.knows(run_id):  # a run that ended in the dead kernel: not continued
            self._write(run_id)
            self._held.hold_points(run_id, step, self._held_steps(self._runs[run_id]))
        pending = self._pending.setdefault(run_id, [])
        for at, scalars, wall_time in points:
            if at > step:
                continue
            keyed = {_key(k): v for k, v in scalars.items()}  # as MLflow holds them (continue_from)
            for key, value in self._held.lacking(run_id, at, keyed).items():
                pending.append(self._Metric(key, float(value), self._stamp(run_id, key, wall_time), int(at)))

    # ------------------------------------------------------------------ metrics
    def log_scalars(
        self, run_id: int, step: int, scalars: Mapping[str, Any], wall_time: float | None = None
    ) -> None:
        """Buffer the points; :meth:`end_batch` writes them (one request per run and write window, the
        :class:`~.fanout.TrackerSet`'s), a status change of the run or :meth:`flush` at once."""
        self._create_if_waiting(run_id, "ONGOING")  # a run that logs trains
        if run_id not in self._runs or run_id in self._deleted:
            return
        points = self._pending.setdefault(run_id, [])
        keyed = {_key(k): v for k, v in scalars.items()}  # as MLflow holds them (continue_from)
        for key, value in self._held.new_only(run_id, step, keyed).items():
            points.append(self._Metric(key, float(value), self._stamp(run_id, key, wall_time), int(step)))

    def _stamp(self, run_id: int, key: str, wall_time: float | None) -> int:
        """The point's MLflow timestamp (ms): its wall time, else now; later than the key's previous point.

        MLflow's SQL store keeps one row of equal (key, timestamp, step, value): TRL's evaluation log and final
        summary of a run's last step both carry ``epoch`` and often come within one millisecond, so the second
        would be lost at random (one ``epoch`` point more or less than a run logged the same way: after a
        restart, "one extra identical point"). Each key's timestamps increase by at least 1 ms instead.
        """
        stamp = int((time.time() if wall_time is None else wall_time) * 1000)
        last = self._stamps.get((run_id, key))
        if last is not None and stamp <= last:
            stamp = last + 1
        self._stamps[(run_id, key)] = stamp
        return stamp

    def end_batch(self) -> None:
        """Write every run's buffered points: one ``log_batch`` per run (its cost is mostly fixed, ~10 ms of CPU
        in the SQLite store, so fewer, larger requests cost less)."""
        for run_id in list(self._pending):
            self._write(run_id)

    def _write(self, run_id: int) -> None:
        points = self._pending.pop(run_id, None)
        if not points:
            return
        mid = self._runs[run_id]
        for i in range(0, len(points), _BATCH_METRICS):
            self._client.log_batch(mid, metrics=points[i : i + _BATCH_METRICS])

    def flush(self) -> None:
        self.end_batch()

    def close(self) -> None:
        """Write the buffered points; runs still NEW are created now, as SCHEDULED (they are listed in MLflow)."""
        self.end_batch()
        waiting, self._waiting = list(self._waiting.values()), {}
        for run in waiting:
            self._set(self._create(run), "NEW")
