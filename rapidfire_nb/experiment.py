"""The Experiment facade: ``run_fit``, ``wait``, IC Ops, results — the surface ``rapidfireai`` users know.

Threads: ``run_fit`` validates on the calling thread, then one scheduler thread owns run state (see
``kernel_scheduler.loop``). Every method here may be called from any notebook cell while training runs.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from kernel_scheduler import Op, OpAck, OpKind, RunSnapshot, RunStatus, Scheduler, SchedulerListener
from kernel_scheduler.ops import new_op_id

from ._writer_lock import LOCK_FILENAME, WriterLock
from .errors import ConfigError, ExperimentError, OpError
from .paths import experiment_dir, experiments_root, validate_experiment_name
from .store import Store
from .view import KernelState, StoreRows, chunk_line, kernel_snapshot
from .wire import json_type_name

__all__ = ["Experiment", "current_experiment", "live_experiment"]

_LIVE: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
_CURRENT: list[Any] = [None]
#: the Experiment object of each experiment folder in this process (``Experiment(name)`` again returns it)
_BY_PATH: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()  # str: no Path at shutdown


def current_experiment() -> Experiment | None:
    """The experiment most recently created or trained in this process (what ``%rapidfire`` addresses)."""
    ref = _CURRENT[0]
    return ref() if ref is not None else None


def live_experiment(name: str) -> Experiment | None:
    """The live Experiment object of that name in this process, if any."""
    return _LIVE.get(name)

#: trainer fields that change how data is batched or sampled, or the adapter's shape: no warm start.
WARM_FORBIDDEN = ("per_device_train_batch_size", "gradient_accumulation_steps", "seed", "num_generations",
                  "max_length", "max_prompt_length", "max_completion_length", "packing", "lora.r",
                  "lora.target_modules", "model_name", "steps_per_generation", "dataloader_drop_last",
                  "group_by_length", "data_seed", "num_train_epochs", "generation_batch_size", "num_iterations")


#: hyperparameter columns that the panel, the magic and the server cannot change (functions: API only).
NOT_EDITABLE = ("formatting_func", "compute_metrics", "reward_funcs", "model_type")


def _in_kernel() -> bool:
    """True inside a Jupyter kernel (not a plain script or terminal IPython)."""
    ip = _ipython()
    return ip is not None and type(ip).__name__ in ("ZMQInteractiveShell", "Shell")  # Shell: Colab


def _ipython() -> Any:
    if "IPython" not in sys.modules:
        return None
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return None
    return get_ipython()


class _Listener(SchedulerListener):
    """Writes scheduler events to the store and prints one compact line per finished chunk."""

    def __init__(self, exp: Experiment) -> None:
        self.exp = exp
        self._last_beat = 0.0
        self._seen_segments: dict[int, int] = {}  # chunks already reported per run (a restart starts there)
        self._reported_end: set[int] = set()  # runs whose COMPLETED/FAILED line was printed (or predates us)

    def on_run(self, snap: RunSnapshot) -> None:
        exp = self.exp
        ckpt = exp._executor.checkpoint_dir(snap.run_id) if exp._executor is not None else None
        exp.store.upsert_run(
            snap.run_id, status=snap.status.value, total_steps=snap.total_steps, completed_steps=snap.step,
            chunks_done=snap.segments_done, num_segments=snap.num_segments, epoch=snap.epoch,
            samples_seen=snap.samples_seen, error=snap.error,
            last_checkpoint=str(ckpt) if ckpt else None,
        )
        if snap.status is RunStatus.DELETED and exp._tracker is not None:
            exp._tracker.mark_deleted(snap.run_id)  # TensorBoard no longer lists it under its id
        if snap.run_id not in self._seen_segments and snap.status is RunStatus.NEW:
            self._seen_segments[snap.run_id] = snap.segments_done  # a warm clone starts at its parent's chunk
        prev = self._seen_segments.get(snap.run_id, 0)
        ended = snap.status in (RunStatus.COMPLETED, RunStatus.FAILED) and snap.run_id not in self._reported_end
        if snap.segments_done > prev or ended:
            self._seen_segments[snap.run_id] = max(prev, snap.segments_done)
            if ended:
                self._reported_end.add(snap.run_id)
            exp._print_chunk_line(snap)

    def known(self, run_id: int, segments_done: int, finished: bool) -> None:
        """A run restored from the store: its chunks so far (and its end) were reported by an earlier process."""
        self._seen_segments[run_id] = segments_done
        if finished:
            self._reported_end.add(run_id)

    def on_op(self, op: Op, ack: OpAck) -> None:
        store = self.exp.store
        payload = {k: v for k, v in op.payload.items() if k != "spec"}
        if not store.add_op(op.op_id, op.kind.value, op.run_id, payload, source=op.source, state=ack.state,
                            message=ack.message, requested_at=op.requested_at):
            store.update_op(op.op_id, ack.state, ack.message,
                            applied_at=time.time() if ack.state != "queued" else None)
        if ack.state != "queued" and op.source != "api":
            self.exp._say(f"op {op.kind.value} run {op.run_id}: {ack.state} — {ack.message}")

    def poll_ops(self) -> Sequence[Op]:
        return self.exp._inbox_ops()

    def on_heartbeat(self) -> None:
        now = time.monotonic()
        if now - self._last_beat > 2.0:
            self._last_beat = now
            self.exp.store.beat()


def encode_changes(changes: dict[str, Any]) -> dict[str, Any]:
    """A clone's changes as JSON: a function (or a list of functions, e.g. ``reward_funcs``) is stored by reference,
    ``{"__function__": "module:qualname"}``, so a restarted kernel can find it again (nothing is pickled)."""
    def one(value: Any) -> Any:
        if callable(value):
            return {"__function__": f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', '?')}"}
        if isinstance(value, (list, tuple)):
            return [one(v) for v in value]
        return value

    return {k: one(v) for k, v in changes.items()}


def decode_changes(changes: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`encode_changes`: function references are looked up in their (already imported)
    module — ``__main__`` is the notebook's namespace, so its cells must have been run again.

    Raises:
        ConfigError: a referenced function is not there (a lambda, a nested function, or a cell not re-run).
    """
    def one(value: Any) -> Any:
        if isinstance(value, dict) and set(value) == {"__function__"}:
            module_name, _, qualname = str(value["__function__"]).partition(":")
            target: Any = sys.modules.get(module_name)
            for part in qualname.split("."):
                target = getattr(target, part, None) if target is not None else None
            if not callable(target):
                raise ConfigError(f"the function {qualname!r} of module {module_name!r} that this clone was given "
                                  "is not defined in this process (define it again, e.g. re-run its cell)")
            return target
        if isinstance(value, list):
            return [one(v) for v in value]
        return value

    return {k: one(v) for k, v in changes.items()}


def _warm_start_checkpoint(run_dir: Path) -> Path | None:
    """The complete, readable ``warm-start-from-run-<parent>-step-<s>`` folder a warm clone was created from."""
    from .training.checkpoint import WARM_START_PREFIX, latest_checkpoint

    ckpt = latest_checkpoint(run_dir, WARM_START_PREFIX)
    return ckpt if ckpt is not None and _readable_checkpoint(ckpt) else None


def _readable_checkpoint(folder: Path) -> bool:
    """True when ``folder/trainer_state.json`` parses and names its ``global_step`` and the files resuming loads
    (weights, optimizer, scheduler) are there and not empty. Deeper damage shows when the run resumes (it fails)."""
    try:
        state = json.loads((folder / "trainer_state.json").read_text())
        if not isinstance(state.get("global_step"), int):
            return False
        weights = [folder / "adapter_model.safetensors", folder / "model.safetensors"]
        needed = [next((w for w in weights if w.is_file()), weights[0]), folder / "optimizer.pt",
                  folder / "scheduler.pt"]
        return all(p.is_file() and p.stat().st_size > 0 for p in needed)
    except (OSError, ValueError, AttributeError):
        return False


def dataset_fingerprint(dataset: Any, samples: int = 32) -> dict[str, Any] | None:
    """A cheap identity of a dataset: ``{"rows": len, "sha256": hash of up to ``samples`` evenly spaced rows}``.

    Rows are hashed as JSON (keys sorted; values JSON cannot hold hashed by ``str``), so two datasets with the same
    rows in the same order match whatever object holds them. Differences outside the sampled rows go unnoticed.
    Returns None for None.
    """
    if dataset is None:
        return None
    import hashlib

    n = len(dataset)
    idx = sorted({round(i * (n - 1) / max(1, samples - 1)) for i in range(min(samples, n))}) if n else []
    digest = hashlib.sha256()
    for i in idx:
        try:
            row = dataset.iloc[int(i)].to_dict() if hasattr(dataset, "iloc") else dataset[int(i)]  # pandas / HF
        except Exception:  # rows not addressable by position: the row count alone
            return {"rows": n, "sha256": None}
        digest.update(json.dumps(row, sort_keys=True, default=str).encode())
    return {"rows": n, "sha256": digest.hexdigest()[:16]}


class Experiment:
    """One named experiment: a folder under the experiments root with its store, checkpoints and logs.

    Args:
        experiment_name: letters, digits, ``-``, ``_``, ``.``; opens the experiment of that name if it exists
            (its history is visible), creates it otherwise.
        mode: only ``"fit"`` is supported.
        experiment_path: the experiments root; default ``$RF_HOME``, else the user data dir
            (``platformdirs.user_data_dir("rapidfire_nb")``).
        overwrite: start the experiment afresh (deletes its folder).

    In one process there is one object per experiment: ``Experiment(name)`` again (a notebook cell run twice)
    returns the object that exists already, with its training, panel and history, unless that one was ended.
    Only one process trains an experiment at a time (an OS lock on ``<experiment>/writer.lock``, dropped by the
    system when that process dies); another process sees its state read-only.

    Raises:
        ConfigError: bad name or mode.
        ExperimentError: ``overwrite=True`` while the experiment is training (here or in another process).
    """

    def __new__(cls, experiment_name: str, mode: str = "fit", experiment_path: str | os.PathLike[str] | None = None,
                overwrite: bool = False) -> Experiment:
        try:
            path = experiment_dir(experiments_root(experiment_path), validate_experiment_name(experiment_name))
        except Exception:  # __init__ raises the error with its message
            return super().__new__(cls)
        live = _BY_PATH.get(str(path))
        if live is None or live._ended:
            return super().__new__(cls)
        if not overwrite:
            return live  # type: ignore[no-any-return]
        if live._scheduler is not None and not live._scheduler.is_idle():
            raise ExperimentError(
                f"experiment {live.experiment_name!r} is training in this kernel; it cannot be overwritten while it "
                "trains. Stop or wait for it (experiment.wait()), then end it (experiment.end()), or pick a new name")
        live.end()
        return super().__new__(cls)

    def __init__(self, experiment_name: str, mode: str = "fit", experiment_path: str | os.PathLike[str] | None = None,
                 overwrite: bool = False) -> None:
        if getattr(self, "_initialised", False):  # the live object of this folder, returned by __new__
            return
        if mode != "fit":
            raise ConfigError(f"mode={mode!r} is not supported; use mode='fit'")
        self.experiment_name = validate_experiment_name(experiment_name)
        self.root = experiments_root(experiment_path)
        self.path = experiment_dir(self.root, self.experiment_name)
        self._writer_lock: WriterLock | None = None
        if overwrite and self.path.exists():
            guard = WriterLock(self.path)
            if not guard.acquire():
                raise ExperimentError(
                    f"experiment {self.experiment_name!r} is being trained by process {guard.holder_pid()}; it "
                    "cannot be overwritten while it trains. End it there first, or pick a new name")
            try:  # everything but the lock file, which stays locked meanwhile
                for child in self.path.iterdir():
                    if child.name == LOCK_FILENAME:
                        continue
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
            finally:
                guard.release()
        self.path.mkdir(parents=True, exist_ok=True)
        self._writer_lock = WriterLock(self.path)
        self.store = Store(self.path)
        if self.store.get_meta("name") is None:
            self.store.update_meta({"name": self.experiment_name, "created_at": time.time()})
        self._scheduler: Scheduler | None = None
        self._executor: Any = None
        self._tracker: Any = None
        self._leaves: dict[int, Any] = {}
        self._hparam_cols: list[str] = []
        self._started_at: float | None = None
        self._num_chunks = 0
        self._thread_parent: Any = None
        self._ended = False
        self._panels: list[Any] = []
        self._known_metrics: set[str] | None = None  # metric names in the store's meta (this process writes them)
        self._live_step: dict[int, int] = {}  # latest logged step per run (the run on the device moves within a chunk)
        self._printer: Callable[[str], None] = print
        self._quiet = False
        self._lock = threading.Lock()
        _LIVE[self.experiment_name] = self
        _BY_PATH[str(self.path)] = self
        _CURRENT[0] = weakref.ref(self)
        self._initialised = True
        self._reconcile()

    def _writer_elsewhere(self) -> int | None:
        """Pid of another live process training this experiment (its writer lock is held, or — for a writer on
        another host — its heartbeat is fresh); None when nobody else is."""
        assert self._writer_lock is not None
        if not self._writer_lock.held and not self._writer_lock.is_free():
            return self._writer_lock.holder_pid() or -1
        beat = self.store.heartbeat()
        if beat is not None and beat.get("host") != socket.gethostname() and self.store.writer_alive():
            return int(beat.get("pid") or -1)
        return None

    def _reconcile(self) -> None:
        """Runs left ONGOING by a process that is gone become INTERRUPTED (resumable).

        "Gone": nobody holds the experiment's writer lock (the OS drops it when a process dies) and no writer on
        another host beats. Ops posted to the inbox for the dead process are answered rejected, not applied later
        by surprise.
        """
        other = self._writer_elsewhere()
        if other is not None:
            self._say(f"experiment {self.experiment_name!r} is being trained by process {other}; its state is "
                      "shown read-only here")
            return
        if self.store.heartbeat() is None:
            return
        for op in self.store.take_inbox_ops():
            self.store.add_op(op["op_id"], str(op.get("kind")), op.get("run_id"), op.get("payload"), source="inbox",
                              state="rejected", message="the kernel that was to apply it stopped first; send it again")
        runs = {r["run_id"]: r for r in self.store.runs()}
        for op in self.store.ops():  # taken by the dead kernel, not applied before it died
            if op["state"] != "queued":
                continue
            child = (op.get("payload") or {}).get("child_id") if op["kind"] == "clone" else None
            if child is not None and child in runs and runs[child]["status"] != RunStatus.FAILED.value:
                self.store.update_op(op["op_id"], "applied", f"run {child} created; it continues after the restart",
                                     applied_at=time.time())
            else:
                self.store.update_op(op["op_id"], "rejected",
                                     "the kernel stopped before applying it; send it again", applied_at=time.time())
        for r in runs.values():
            if r["status"] == RunStatus.ONGOING.value:
                self.store.upsert_run(r["run_id"], status=RunStatus.INTERRUPTED.value)

    def __repr__(self) -> str:
        return f"Experiment({self.experiment_name!r}, path={str(self.path)!r})"

    # ================================================================== run_fit
    def run_fit(self, param_config: Any, create_model_fn: Callable[[dict], Any], train_dataset: Any,
                eval_dataset: Any = None, num_chunks: int = 4, seed: int = 42, *,
                background: bool | None = None) -> None:
        """Train every config of ``param_config`` concurrently, chunk by chunk.

        Args:
            param_config: ``RFGridSearch`` / ``RFRandomSearch`` (or anything with ``expand(seed)`` and
                ``trainer_type``).
            create_model_fn: ``create_model_fn(model_config: dict) -> (model, tokenizer)``; called once per
                distinct base model.
            train_dataset: a ``datasets.Dataset`` (rows before ``formatting_func``).
            eval_dataset: optional ``datasets.Dataset``; every run is evaluated on it at the end of each chunk
                and at its own ``eval_steps``.
            num_chunks: chunks per epoch (1 .. a run's optimizer steps per epoch).
            seed: the experiment seed (random search, and each run's seed unless its config sets one).
            background: train in the background and return once validated. Default: True in a Jupyter kernel,
                False in a plain script (which then blocks until training ends).

        In a Jupyter kernel this returns once everything is validated and the runs are prepared; training
        goes on in a background thread (``experiment.wait()`` blocks). In a plain script it blocks until
        training ends.

        Raises:
            ConfigError: bad input, before any training starts.
            ExperimentError: the experiment is training already, or holds a different config group.
        """
        if self._ended:
            raise ExperimentError("this Experiment was ended; create Experiment(name) again to continue")
        if self._scheduler is not None and not self._scheduler.is_idle():
            raise ExperimentError(
                f"experiment {self.experiment_name!r} is training; use its IC Ops (experiment.stop(run_id), "
                "resume, clone_modify, delete) or experiment.wait() before calling run_fit again")
        held_before = self._writer_lock is not None and self._writer_lock.held
        if self._writer_lock is not None and not self._writer_lock.acquire():
            other = self._writer_lock.holder_pid()
            who = "another Experiment object in this process" if other == os.getpid() else f"process {other}"
            raise ExperimentError(
                f"experiment {self.experiment_name!r} is being trained by {who}; continue it there, or end it "
                "(experiment.end(), or shut that kernel down) and run this again")
        try:
            if not held_before and self._scheduler is None:
                self._reconcile()  # the writer may have died since this object opened the experiment read-only
            self._run_fit_locked(param_config, create_model_fn, train_dataset, eval_dataset, num_chunks, seed,
                                 background)
        except BaseException:
            if not held_before and self._scheduler is None and self._writer_lock is not None:
                self._writer_lock.release()  # refused before training: another process may train it
            raise

    def _run_fit_locked(self, param_config: Any, create_model_fn: Callable[[dict], Any], train_dataset: Any,
                        eval_dataset: Any, num_chunks: int, seed: int, background: bool | None) -> None:
        """``run_fit`` once this object holds the experiment's writer lock."""
        if not isinstance(num_chunks, int) or isinstance(num_chunks, bool) or num_chunks < 1:
            raise ConfigError(f"num_chunks must be an integer >= 1, got {num_chunks!r}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ConfigError(f"seed must be an integer, got {seed!r}")
        if train_dataset is None or len(train_dataset) == 0:
            raise ConfigError("train_dataset is empty: pass a datasets.Dataset with at least one row")
        if not callable(create_model_fn):
            raise ConfigError("create_model_fn must be a function model_config -> (model, tokenizer)")
        if not hasattr(param_config, "expand") or not hasattr(param_config, "trainer_type"):
            raise ConfigError(
                f"param_config must be RFGridSearch(configs=..., trainer_type=...) or RFRandomSearch(...), got "
                f"{type(param_config).__name__}; wrap your RFModelConfig(s) in one")
        leaves = list(param_config.expand(seed))
        if not leaves:
            raise ConfigError("the config group expands to no run")
        trainer_type = str(param_config.trainer_type).upper()
        fingerprint = json.dumps([leaf.fingerprint() for leaf in leaves])
        existing = {r["run_id"]: r for r in self.store.runs() if r.get("source") in (None, "fit")}
        if existing:
            if self.store.get_meta("fingerprint") != fingerprint:
                raise ExperimentError(
                    f"experiment {self.experiment_name!r} already holds a different config group "
                    f"({len(existing)} runs). Use a new experiment name, or Experiment(name, overwrite=True) to "
                    "start it afresh")
            if self._scheduler is not None:
                self._say("the same config group is already in this experiment; every run has finished "
                          "(see experiment.get_runs_info())")
                return
            unfinished = [rid for rid, r in existing.items() if not RunStatus(r["status"]).is_finished()]
            if unfinished:
                self._check_same_inputs(num_chunks, seed, train_dataset, eval_dataset, unfinished)

        from .training import runtime  # torch import happens here, not at `import rapidfire_nb`

        runtime.silence_globally()
        executor = runtime.make_executor(trainer_type, create_model_fn, train_dataset, eval_dataset, num_chunks,
                                         seed, self.path, self._on_metrics, self._say,
                                         lambda rid, path: self.store.upsert_run(rid, checkpoint_dir=str(path)))
        listener = _Listener(self)
        self._listener = listener
        self._continued: dict[int, int] = {}  # run id -> step it continues from (a restart)
        scheduler = Scheduler(executor, listener=listener)
        self._executor = executor
        self._leaves = {}
        hp_values: dict[str, set[str]] = {}
        for leaf in leaves:
            for k, v in leaf.hparams().items():
                hp_values.setdefault(k, set()).add(json.dumps(v, sort_keys=True, default=str))
        self._hparam_cols = [k for k, vs in hp_values.items() if len(vs) > 1]
        resumed: list[str] = []
        try:
            for run_id, leaf in enumerate(leaves, start=1):
                self._leaves[run_id] = leaf
                self._add_run(scheduler, executor, run_id, leaf, existing.get(run_id), resumed)
            clones = self.store.get_meta("clones", {}) or {}
            for r in self.store.runs():
                info = clones.get(str(r["run_id"]))
                if r.get("source") != "clone" or info is None:
                    continue
                parent = self._leaves.get(int(info["parent"]))
                if parent is None:
                    continue
                try:
                    leaf = parent.with_changes(decode_changes(info.get("changes") or {}), allow_functions=True)
                except Exception as exc:  # e.g. a changed function that no longer exists: this clone only
                    error = f"cannot be rebuilt after the restart: {exc}; clone run {info['parent']} again"
                    self._leaves[r["run_id"]] = parent
                    if RunStatus(r["status"]).is_finished():
                        self._add_run(scheduler, executor, r["run_id"], parent, r, resumed)
                    else:
                        scheduler.add_run(r["run_id"], parent, status=RunStatus.FAILED, error=error,
                                          parent_id=r.get("parent_id"))
                        self.store.upsert_run(r["run_id"], status=RunStatus.FAILED.value, error=error)
                        self._say(f"run {r['run_id']} {error}")
                    continue
                self._leaves[r["run_id"]] = leaf
                self._add_run(scheduler, executor, r["run_id"], leaf, r, resumed)
        except BaseException:
            executor.close()
            self._executor = None
            raise
        if resumed:
            self._say("continuing from the last chunk checkpoints: " + ", ".join(resumed))
        meta: dict[str, Any] = {"fingerprint": fingerprint, "trainer_type": trainer_type,
                                "hparam_columns": self._hparam_cols}
        if not existing or any(not RunStatus(r["status"]).is_finished() for r in existing.values()):
            # the inputs the runs train with (a finished experiment keeps those it was trained with)
            meta.update({"num_chunks": num_chunks, "seed": seed, "train_data": dataset_fingerprint(train_dataset),
                         "eval_data": dataset_fingerprint(eval_dataset)})
        self.store.update_meta(meta)
        self._store_editable_fields()
        known = {r["run_id"] for r in self.store.runs()}
        for run_id, leaf in self._leaves.items():
            snap = scheduler.run_snapshot(run_id)
            assert snap is not None
            if run_id not in known:
                self.store.upsert_run(run_id, status=snap.status.value, config=leaf.to_json(),
                                      hparams=leaf.hparams(), fingerprint=leaf.fingerprint(), source="fit",
                                      total_steps=snap.total_steps, num_segments=snap.num_segments,
                                      completed_steps=0, chunks_done=0, epoch=0.0,
                                      samples_seen=0)
        self._scheduler = scheduler
        _CURRENT[0] = weakref.ref(self)
        self._num_chunks = num_chunks
        self._started_at = time.time()
        self._tracker = runtime.make_tracker(self.path / "tensorboard")
        snaps = scheduler.snapshot()  # the runs as registered; the scheduler thread has not started yet
        gone = {s.run_id for s in snaps if s.status is RunStatus.DELETED}
        for run_id, step in self._continued.items():
            self._tracker.continue_from(run_id, step)  # TensorBoard drops what a dead process logged after it
        for run_id, leaf in self._leaves.items():
            if run_id not in gone:  # a deleted run's folder was renamed deleted-run-<id>; do not bring it back
                self._tracker.log_hparams(run_id, leaf.hparams())
        ip = _ipython()
        if ip is not None and _in_kernel():
            parent = getattr(ip, "parent_header", None) or getattr(getattr(ip, "kernel", None), "get_parent",
                                                                   lambda: None)()
            if parent and hasattr(ip, "set_thread_parent"):
                scheduler.on_thread_start = lambda: ip.set_thread_parent(parent)
        if background is None:
            background = _in_kernel()
        n_runs = sum(1 for s in snaps if s.status is not RunStatus.DELETED)
        if existing and not any(s.status.in_rotation() for s in snaps):
            counts: dict[str, int] = {}
            for snap in snaps:
                counts[snap.status.value] = counts.get(snap.status.value, 0) + 1
            self._say(f"experiment {self.experiment_name!r}: no run left to train ("
                      + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
                      + "); see experiment.get_runs_info(); resume or clone_modify trains more")
        else:
            self._say(f"experiment {self.experiment_name!r}: {n_runs} run{'s' if n_runs != 1 else ''} × "
                      f"{num_chunks} chunks ({trainer_type})"
                      + ("; training in the background (experiment.wait() blocks)" if background else ""))
        scheduler.start()
        if background:
            if _in_kernel():
                self._show_panel()
            return
        self.wait()

    # ================================================================== waiting / ending
    def wait(self, timeout: float | None = None, chunks: int | None = None) -> bool:
        """Block until no run is left to train (or, with ``chunks=k``, until every active run has done k chunks).

        Args:
            timeout: seconds; ``None`` waits as long as needed.
            chunks: wait for this many completed chunks per active run instead (counted over all epochs).

        Returns:
            True when the condition holds, False on timeout.

        On Ctrl-C (kernel interrupt) every active run is stopped at the end of its current chunk (STOPPED,
        resumable) and ``wait`` returns once they are parked; a second Ctrl-C returns at once.
        """
        sched = self._scheduler
        if sched is None:
            return True
        try:
            return sched.wait(timeout=timeout, chunks=chunks)
        except KeyboardInterrupt:
            active = [s.run_id for s in sched.snapshot() if s.status.in_rotation()]
            self._say(f"interrupted: stopping runs {active} at the end of their current chunk "
                      "(press interrupt again to return now)")
            for rid in active:
                sched.submit(Op(OpKind.STOP, rid, source="api"))
            try:
                sched.wait()
            except KeyboardInterrupt:
                pass
            return False

    def end(self) -> None:
        """Wait for the runs still training, save their final weights, and close the experiment."""
        if self._ended:
            return
        if self._scheduler is not None:
            self.wait()
            self._scheduler.close()
        if self._executor is not None:
            self._executor.close()
        if self._tracker is not None:
            self._tracker.close()
        for panel in self._panels:
            try:
                panel.close()
            except Exception:
                pass
        self._panels.clear()
        self.store.update_meta({"ended_at": time.time()})
        self._ended = True
        if self._writer_lock is not None:
            self._writer_lock.release()
        if self._scheduler is not None:
            self._say(f"experiment {self.experiment_name!r} ended")

    # ================================================================== IC Ops
    def stop(self, run_id: int | Iterable[int]) -> OpAck | list[OpAck]:
        """Stop run(s) at the end of their current chunk (STOPPED, resumable). Returns an OpAck (list for a list)."""
        return self._ops(OpKind.STOP, run_id)

    def resume(self, run_id: int | Iterable[int]) -> OpAck | list[OpAck]:
        """Put STOPPED run(s) back into the rotation where they left off."""
        return self._ops(OpKind.RESUME, run_id)

    def delete(self, run_id: int | Iterable[int]) -> OpAck | list[OpAck]:
        """Stop run(s) and mark them DELETED (hidden from listings)."""
        return self._ops(OpKind.DELETE, run_id)

    def clone_modify(self, run_id: int, changes: dict[str, Any] | None = None, warm_start: bool = False,
                     source: str = "api") -> int:
        """Create a new run from ``run_id``'s config plus ``changes``; returns the new run's id at once.

        Args:
            run_id: the parent run.
            changes: hyperparameters to change, named ``learning_rate``, ``lora.r``, ``model_kwargs.<key>``;
                functions (``formatting_func``, ``reward_funcs``, ``compute_metrics``) may be replaced here.
            warm_start: start from the parent's adapter and optimizer state at its latest chunk boundary and
                continue from its position in the data; otherwise a fresh adapter from chunk 1.

        Raises:
            OpError: unknown run, or a change that cannot be warm-started (suggests a cold clone).
            ConfigError: unknown field (with the closest valid name) or invalid value.
        """
        ack = self.submit_op("clone", run_id, changes=changes, warm_start=warm_start, source=source)
        if ack.state == "rejected":
            raise OpError(ack.message)
        self._say(f"clone of run {run_id} → run {ack.new_run_id}: {ack.message}")
        assert ack.new_run_id is not None
        return ack.new_run_id

    def ops(self) -> Any:
        """Every op with its outcome, as a pandas DataFrame (op_id, run_id, kind, source, state, message, ...)."""
        import pandas as pd

        return pd.DataFrame(self.store.ops())

    def submit_op(self, kind: str, run_id: int, op_id: str | None = None, changes: dict[str, Any] | None = None,
                  warm_start: bool = False, source: str = "api") -> OpAck:
        """The one command path used by the API, the panel, the magic and the ops inbox.

        Raises:
            ConfigError/OpError: for a clone whose changes are invalid (the op is not queued).
        """
        sched = self._require_scheduler()
        try:
            kind_e = OpKind(kind)
        except ValueError:
            raise OpError(f"unknown op {kind!r}; use stop, resume, delete or clone") from None
        payload: dict[str, Any] = {}
        if kind_e is OpKind.CLONE:
            parent = self._leaves.get(int(run_id))
            if parent is None:
                raise OpError(f"run {run_id} does not exist")
            changes = dict(changes or {})
            if warm_start:
                bad = [k for k in changes if k in WARM_FORBIDDEN or k.startswith("model_kwargs.")]
                if bad:
                    raise OpError(f"{', '.join(bad)} cannot be changed in a warm start (it changes how data is "
                                  "batched or sampled, or the adapter's shape); use a cold clone "
                                  "(warm_start=False)")
            child = parent.with_changes(changes, allow_functions=(source == "api"))
            payload = {"changes": encode_changes(changes), "warm_start": warm_start, "spec": child}
        op = Op(kind_e, int(run_id), op_id=op_id or new_op_id(), payload=payload, source=source)
        ack = sched.submit(op)
        if kind_e is OpKind.CLONE and ack.new_run_id is not None and ack.state != "rejected":
            child = payload["spec"]
            self._leaves[ack.new_run_id] = child
            self.store.upsert_run(ack.new_run_id, status="NEW", config=child.to_json(), hparams=child.hparams(),
                                  fingerprint=child.fingerprint(), source="clone", parent_id=int(run_id),
                                  warm_start=bool(warm_start), total_steps=0, completed_steps=0, chunks_done=0,
                                  epoch=0.0, samples_seen=0)
            for k in changes or {}:
                if k not in self._hparam_cols and not callable((changes or {})[k]):
                    self._hparam_cols.append(k)
            self.store.set_meta("hparam_columns", self._hparam_cols)  # the page and a restarted kernel show them
            self._store_editable_fields()
            clones = self.store.get_meta("clones", {}) or {}
            clones[str(ack.new_run_id)] = {"parent": int(run_id), "changes": payload["changes"],
                                           "warm": bool(warm_start)}
            self.store.set_meta("clones", clones)
        return ack

    def _check_same_inputs(self, num_chunks: int, seed: int, train_dataset: Any, eval_dataset: Any,
                           unfinished: list[int]) -> None:
        """Continuing runs from their checkpoints needs the inputs they were started with.

        Raises:
            ExperimentError: ``num_chunks``, ``seed``, the train or the eval dataset differ from the stored ones
                (datasets compared by :func:`dataset_fingerprint`: row count plus a hash of sampled rows).
        """
        meta = self.store.meta()
        checks = [("num_chunks", "num_chunks", num_chunks), ("seed", "seed", seed),
                  ("train_dataset", "train_data", dataset_fingerprint(train_dataset)),
                  ("eval_dataset", "eval_data", dataset_fingerprint(eval_dataset))]
        for field, key, given in checks:
            if key not in meta:  # an experiment stored before this was recorded: not checked
                continue
            stored = meta[key]
            if stored == given:
                continue
            if field in ("num_chunks", "seed"):
                what = f"{field}={given!r}, but it was started with {field}={stored!r}"
            elif given is None or stored is None:
                what = (f"a different {field}: "
                        + (f"none, but it was started with {stored['rows']} rows" if given is None else
                           f"{given['rows']} rows, but it was started without one"))
            else:
                what = (f"a different {field} than the one it was started with ({given['rows']} rows vs "
                        f"{stored['rows']}, or other content)")
            raise ExperimentError(
                f"experiment {self.experiment_name!r} has unfinished runs {unfinished} to continue from their "
                f"checkpoints, and run_fit got {what}. Continuing needs the same num_chunks, seed and datasets; "
                "pass those, or use a new experiment name (or Experiment(name, overwrite=True)) to start afresh")

    def _add_run(self, scheduler: Scheduler, executor: Any, run_id: int, leaf: Any, prior: dict[str, Any] | None,
                 resumed: list[str]) -> None:
        """Register one run: new, finished (shown, not retrained) or continued from its last chunk checkpoint."""
        from .training.checkpoint import WARM_START_PREFIX, latest_checkpoint

        status = RunStatus(prior["status"]) if prior else RunStatus.NEW
        if status.is_finished():
            scheduler.add_run(run_id, leaf, status=status, error=prior.get("error") if prior else None,
                              parent_id=prior.get("parent_id") if prior else None,
                              progress=(int(prior.get("completed_steps") or 0), int(prior.get("total_steps") or 0),
                                        int(prior.get("chunks_done") or 0),
                                        int(prior.get("samples_seen") or 0)) if prior else None)
            if prior:
                self._listener.known(run_id, int(prior.get("chunks_done") or 0), finished=True)
            return
        run_dir = executor.run_dir(run_id)
        if prior and run_dir.is_dir():  # no writer is active here: drop half-written leftovers of a crash
            for leftover in [*run_dir.glob(".checkpoint-*.tmp-*"), *run_dir.glob(".checkpoint-*.old-*")]:
                shutil.rmtree(leftover, ignore_errors=True)
        ckpt = latest_checkpoint(run_dir) if prior else None
        damaged_ckpt = ckpt is not None and not _readable_checkpoint(ckpt)
        if ckpt is not None and damaged_ckpt:
            damaged = ckpt.with_name(f"damaged-{ckpt.name}")
            shutil.rmtree(damaged, ignore_errors=True)
            ckpt.rename(damaged)  # kept for a look; latest_checkpoint no longer sees it
            again = "from its warm start" if prior and prior.get("warm_start") else "from step 0"
            self._say(f"run {run_id}: checkpoint {ckpt.name} is damaged (a missing, empty or unreadable file; moved "
                      f"to {damaged.name}); the run starts again {again}")
            ckpt = None
        if prior and prior.get("warm_start") and ckpt is None:
            # stopped before its own first chunk: it starts again from the parent's state it was given
            ckpt = _warm_start_checkpoint(run_dir)
            if ckpt is None:
                scheduler.add_run(run_id, leaf, status=RunStatus.FAILED, parent_id=prior.get("parent_id"),
                                  error="interrupted before its warm start was written; clone it again")
                self.store.upsert_run(run_id, status=RunStatus.FAILED.value,
                                      error="interrupted before its warm start was written; clone it again")
                return
        start = executor.add_run(run_id, leaf, resume_from=ckpt)
        if status is RunStatus.STOPPED:
            new_status = RunStatus.STOPPED
        elif ckpt is not None:
            new_status = RunStatus.ONGOING
        else:
            new_status = RunStatus.NEW
        scheduler.add_run(run_id, leaf, start=start, status=new_status,
                          parent_id=prior.get("parent_id") if prior else None,
                          warm_start=bool(prior.get("warm_start")) if prior else False)
        if prior is not None:
            self.store.delete_metrics_after(run_id, start.step)
            self._continued[run_id] = start.step
            self.store.upsert_run(run_id, status=new_status.value, completed_steps=start.step,
                                  chunks_done=start.segments_done, samples_seen=start.samples_seen,
                                  total_steps=start.plan.total_steps, num_segments=start.plan.num_segments)
            self._listener.known(run_id, start.segments_done, finished=False)
            if ckpt is not None and new_status is not RunStatus.STOPPED:
                warm = " (from its warm start)" if ckpt.name.startswith(WARM_START_PREFIX) else ""
                resumed.append(f"run {run_id} at step {start.step}{warm}")
            elif new_status is not RunStatus.STOPPED and int(prior.get("completed_steps") or 0) > 0:
                why = "its checkpoint was damaged" if damaged_ckpt else "it had no complete chunk checkpoint"
                resumed.append(f"run {run_id} from step 0 ({why})")
            elif new_status is RunStatus.STOPPED:
                self._say(f"run {run_id} stays STOPPED at step {start.step} (experiment.resume({run_id}) continues it)")

    def _store_editable_fields(self) -> None:
        """Record, per run, the hyperparameters the panel/server may change in a clone (name -> JSON type)."""
        fields = {str(rid): {k: json_type_name(v) for k, v in leaf.hparams().items() if k not in NOT_EDITABLE}
                  for rid, leaf in self._leaves.items()}
        self.store.set_meta("editable_fields", fields)

    def _ops(self, kind: OpKind, run_id: int | Iterable[int]) -> OpAck | list[OpAck]:
        if isinstance(run_id, Iterable) and not isinstance(run_id, (str, bytes)):
            return [self.submit_op(kind.value, int(r)) for r in run_id]
        return self.submit_op(kind.value, int(run_id))  # type: ignore[arg-type]

    def _require_scheduler(self) -> Scheduler:
        if self._scheduler is None:
            other = self._writer_elsewhere() if not self._ended else None
            if other is not None:
                raise ExperimentError(
                    f"experiment {self.experiment_name!r} is being trained by process {other}; apply IC Ops there "
                    "(its panel, %rapidfire, or the /rapidfire/ page of its Jupyter server)")
            if self.store.runs():
                raise ExperimentError(
                    f"experiment {self.experiment_name!r} is not training in this kernel: call run_fit with the same "
                    "arguments first (it continues the interrupted runs), then use IC Ops")
            raise ExperimentError("no training in this experiment yet: call run_fit first")
        if self._ended:
            raise ExperimentError("this Experiment was ended; IC Ops are no longer accepted")
        return self._scheduler

    def _inbox_ops(self) -> list[Op]:
        ops = []
        for row in self.store.take_inbox_ops():
            payload = row.get("payload") or {}
            kind = row.get("kind")
            try:
                if kind == "clone":
                    self.submit_op("clone", int(row["run_id"]), op_id=row["op_id"], changes=payload.get("changes"),
                                   warm_start=bool(payload.get("warm_start")), source="inbox")
                else:
                    ops.append(Op(OpKind(kind), int(row["run_id"]), op_id=row["op_id"], source="inbox"))
            except Exception as exc:
                self.store.add_op(row["op_id"], str(kind), row.get("run_id"), payload, source="inbox",
                                  state="rejected", message=str(exc))
        return ops

    # ================================================================== results
    def get_runs_info(self, include_deleted: bool = False) -> Any:
        """One row per run: run_id, status, config, the differing hyperparameters, progress, latest metrics.

        Returns:
            pandas DataFrame with columns ``run_id, status, config, <hparams...>, completed_steps, total_steps,
            chunks_done, epoch, loss, eval_loss, checkpoint_dir, error``. DELETED runs are left out unless
            ``include_deleted``.
        """
        import pandas as pd

        runs = self.store.runs()
        live = {s.run_id: s for s in self._scheduler.snapshot()} if self._scheduler is not None else {}
        latest = self.store.latest_metrics(["loss", "eval_loss"])
        cols = list(self.store.get_meta("hparam_columns", []) or [])
        for c in self._hparam_cols:
            if c not in cols:
                cols.append(c)
        rows = []
        for r in runs:
            if r["status"] == RunStatus.DELETED.value and not include_deleted:
                continue
            hp = r.get("hparams") or {}
            snap = live.get(r["run_id"])
            if snap is not None:  # the scheduler's view is the freshest (e.g. a clone applied a moment ago)
                r = {**r, "status": snap.status.value, "completed_steps": snap.step, "total_steps": snap.total_steps,
                     "chunks_done": snap.segments_done,
                     "epoch": snap.epoch if snap.steps_per_epoch else r.get("epoch"), "error": snap.error}
                if r["status"] == RunStatus.DELETED.value and not include_deleted:
                    continue
            row = {"run_id": r["run_id"], "status": r["status"], "config": r.get("config")}
            for c in cols:
                row[c] = hp.get(c)
            m = latest.get(r["run_id"], {})
            row.update(completed_steps=r.get("completed_steps"), total_steps=r.get("total_steps"),
                       chunks_done=r.get("chunks_done"), epoch=r.get("epoch"), loss=m.get("loss"),
                       eval_loss=m.get("eval_loss"), checkpoint_dir=r.get("checkpoint_dir"), error=r.get("error"))
            rows.append(row)
        columns = ["run_id", "status", "config", *cols, "completed_steps", "total_steps", "chunks_done", "epoch",
                   "loss", "eval_loss", "checkpoint_dir", "error"]
        return pd.DataFrame(rows, columns=columns)

    def get_results(self, include_deleted: bool = False) -> Any:
        """Every logged metric: one row per (run_id, step) with ``samples_seen`` (rows) and one column per
        metric name (TRL's names: ``loss``, ``eval_loss``, ``learning_rate``, ``grad_norm``, ...).

        Args:
            include_deleted: keep the rows of DELETED runs (left out by default, as in ``get_runs_info``).

        Returns:
            pandas DataFrame sorted by ``run_id, step``; empty (columns ``run_id, step, samples_seen``) before the
            first logged step.
        """
        import pandas as pd

        points, _ = self.store.metrics_since(0)
        if not include_deleted:
            live = {s.run_id: s.status for s in self._scheduler.snapshot()} if self._scheduler is not None else {}
            deleted = {r["run_id"] for r in self.store.runs()
                       if live.get(r["run_id"], RunStatus(r["status"])) is RunStatus.DELETED}
            points = [p for p in points if p["run_id"] not in deleted]
        if not points:
            return pd.DataFrame(columns=["run_id", "step", "samples_seen"])
        df = pd.DataFrame(points)
        wide = df.pivot_table(index=["run_id", "step"], columns="name", values="value", aggfunc="last")
        samples = df.groupby(["run_id", "step"])["samples_seen"].max()
        wide.insert(0, "samples_seen", samples)
        wide = wide.reset_index()
        wide.columns.name = None
        return wide.sort_values(["run_id", "step"]).reset_index(drop=True)

    def load_model(self, run_id: int) -> tuple[Any, Any]:
        """``(model, tokenizer)`` with run ``run_id``'s trained weights, in eval mode, ready for ``generate``."""
        if self._executor is None:
            raise ExperimentError("no run trained in this kernel yet: call run_fit with the same arguments first (it "
                                  "gives this kernel the model function; finished runs are not trained again)")
        if run_id not in self._leaves:
            raise ExperimentError(f"run {run_id} does not exist (runs: {sorted(self._leaves)})")
        if self._scheduler is not None and self._scheduler.on_device() == run_id:
            raise ExperimentError(f"run {run_id} is training right now; stop it or wait for its chunk to end")
        if run_id in getattr(self._executor, "_runs", {}):
            return self._executor.load_model(run_id)
        row = self.store.get_run(run_id) or {}  # ended in an earlier process: its final weights are on disk
        final = row.get("checkpoint_dir")
        if not final or not Path(final).is_dir():
            raise ExperimentError(f"run {run_id} ({row.get('status', 'unknown')}) has no saved final weights; only "
                                  "runs that completed or were stopped have them")
        return self._executor.load_model(run_id, spec=self._leaves[run_id], final_dir=Path(final))

    # ================================================================== panel source
    def panel_snapshot(self) -> dict[str, Any]:
        """JSON-able state for the panel (docs/ARCHITECTURE.md), built by :func:`rapidfire_nb.view.kernel_snapshot`."""
        sched = self._scheduler
        kernel = KernelState(started_at=self._started_at, num_chunks=self._num_chunks,
                             hparam_columns=list(self._hparam_cols),
                             runs=sched.snapshot() if sched is not None else None,
                             on_device=sched.on_device() if sched is not None else None,
                             live_steps=dict(self._live_step))
        return kernel_snapshot(self.experiment_name, StoreRows.read(self.store), kernel)

    def metrics_since(self, cursor: int) -> tuple[list[dict[str, Any]], int]:
        """Metric points after ``cursor`` (the store's row id) and the new cursor."""
        points, new = self.store.metrics_since(cursor)
        return [{k: p[k] for k in ("run_id", "step", "samples_seen", "name", "value")} for p in points], new

    def panel(self) -> None:
        """Display the live panel again (full history; any number of views may be open)."""
        self._show_panel(force=True)

    # ================================================================== internals
    def _metric_names(self) -> list[str]:
        names = self.store.get_meta("metric_names", None)
        return list(names or [])

    def _on_metrics(self, run_id: int, step: int, samples_seen: int, logs: dict[str, float]) -> None:
        now = time.time()
        self._live_step[run_id] = step
        rows = [{"run_id": run_id, "step": step, "samples_seen": samples_seen, "name": k, "value": float(v),
                 "wall_time": now} for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if not rows:
            return
        self.store.add_metrics(rows)
        if self._known_metrics is None:  # read once; afterwards only new names touch the store's meta
            self._known_metrics = set(self._metric_names())
        new = {r["name"] for r in rows} - self._known_metrics
        if new:
            self._known_metrics |= new
            self.store.set_meta("metric_names", sorted(self._known_metrics))
        if self._tracker is not None:
            tb = {}
            for k, v in logs.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    tb[k.replace("eval_", "eval/", 1) if k.startswith("eval_") else f"train/{k}"] = v
            self._tracker.log_scalars(run_id, step, tb)

    def _say(self, text: str) -> None:
        if not self._quiet:
            self._printer(f"[rapidfire] {text}")

    def _print_chunk_line(self, snap: RunSnapshot) -> None:
        latest = self.store.latest_metrics(["loss", "eval_loss"]).get(snap.run_id, {})
        self._say(chunk_line(snap, latest, self._num_chunks))

    def _show_panel(self, force: bool = False) -> Any:
        try:
            from .panel import display_panel
        except Exception:  # panel unavailable (no anywidget): text lines only
            return None
        try:
            panel = display_panel(self)
        except Exception as exc:
            self._say(f"panel unavailable ({exc}); progress is printed as text")
            return None
        if panel is not None and hasattr(panel, "close"):
            self._panels.append(panel)
        return panel
