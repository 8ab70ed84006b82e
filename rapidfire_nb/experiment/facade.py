"""The Experiment facade: ``run_fit``, ``wait``, IC Ops, results — the surface ``rapidfireai`` users know.

Each public method is its documentation plus a short hand-off: run_fit to :mod:`.inputs` (checks),
:mod:`.restore` (what each stored run becomes) and :mod:`.session` (the wiring); results to :mod:`.tables`.
What the object holds (store, writer lock, reporter, session, panels, ended, read-only) lives in one
:class:`~.state.ExperimentState`, handed to :mod:`.lifecycle` and :mod:`.panel_source`.
Threads: ``run_fit`` checks and builds on the calling thread, then one scheduler thread owns run state (see
``kernel_scheduler.loop``). Every method may be called from any notebook cell while training runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernel_scheduler import OpAck, OpKind, RunSnapshot

from .._writer_lock import WriterLock
from ..errors import ConfigError, ExperimentError, OpError
from ..paths import experiment_dir, experiments_root, validate_experiment_name
from ..tracking.backends import resolve_tracking
from ..training.openmp import release_thread_team
from . import lifecycle, panel_source, registry, tables
from .arguments import check_flag, check_run_id, check_run_ids, check_wait_args
from .inputs import FitArgs
from .reporter import Reporter
from .session import FitSession, require_session
from .state import ExperimentState
from .store_files import open_experiment_store

if TYPE_CHECKING:
    from ..store import Store

__all__ = ["Experiment"]


class Experiment:
    """One named experiment: a folder under the experiments root with its store, checkpoints and logs.

    Args:
        experiment_name: letters, digits, ``-``, ``_``, ``.``; opens the experiment of that name if it exists
            (its history is visible), creates it otherwise.
        mode: only ``"fit"`` is supported.
        experiment_path: the experiments root; default ``$RF_HOME``, else the user data dir
            (``platformdirs.user_data_dir("rapidfire_nb")``).
        overwrite: start the experiment afresh (deletes its folder).
        quiet: print no ``[rapidfire]`` lines (also settable later: ``experiment.quiet = True``).
        tracking: where metrics and run lifecycles go besides the store: any of ``"tensorboard"``, ``"mlflow"``,
            ``"trackio"``, ``"wandb"`` (``[]``: none). Default ``["tensorboard"]``, changed by the environment
            variables ``RF_TENSORBOARD_ENABLED`` / ``RF_MLFLOW_ENABLED`` / ``RF_TRACKIO_ENABLED`` /
            ``RF_WANDB_ENABLED`` (``true``/``false``). MLflow writes to ``MLFLOW_TRACKING_URI``, else to
            ``<experiment>/mlflow.db`` (the URI and the ``mlflow ui`` command are printed when training starts);
            Trackio to its local folder (``TRACKIO_DIR``); W&B offline unless ``WANDB_MODE`` says otherwise. A
            backend that fails later is reported once and left out; training and the store go on.

    In one process there is one object per experiment: ``Experiment(name)`` again (a notebook cell run twice)
    returns the object that exists already, with its training, panel and history, unless that one was ended;
    either way the experiment created last is the one ``%rapidfire`` addresses.
    Only one process trains an experiment at a time (an OS lock on ``<experiment>/writer.lock``, dropped by the
    system when that process dies); another process sees its state read-only.

    Raises:
        ConfigError: bad name or mode; an unknown tracker, or one whose package is not installed (the message
            names the extra, e.g. ``pip install 'rapidfire_nb[mlflow]'``).
        ExperimentError: ``overwrite=True`` while the experiment is training (here or in another process); the
            folder cannot be created; its store is missing or empty (0 bytes) while it holds run folders.
        DamagedStoreError: its ``store.sqlite`` cannot be read (the message names the file and the ways on).

    A folder this process cannot write opens read-only: results can be read, ``run_fit`` and IC Ops say why not.

    Attributes:
        root: the experiments root this object was opened under.
    """

    def __new__(
        cls,
        experiment_name: str,
        mode: str = "fit",
        experiment_path: str | os.PathLike[str] | None = None,
        overwrite: bool = False,
        quiet: bool = False,
        tracking: list[str] | None = None,
    ) -> Experiment:
        # before anything: overwrite="no" would end and wipe the experiment
        check_flag(overwrite, "overwrite")
        check_flag(quiet, "quiet")
        live = registry.reuse(experiment_name, experiment_path, overwrite)
        return live if live is not None else super().__new__(cls)

    def __init__(
        self,
        experiment_name: str,
        mode: str = "fit",
        experiment_path: str | os.PathLike[str] | None = None,
        overwrite: bool = False,
        quiet: bool = False,
        tracking: list[str] | None = None,
    ) -> None:
        if getattr(self, "_state", None) is not None:  # the live object of this folder, returned by __new__
            registry.set_current(self)  # created again: it is the one %rapidfire addresses now
            return
        if mode != "fit":
            raise ConfigError(f"mode={mode!r} is not supported; use mode='fit'")
        chosen = resolve_tracking(tracking)
        name = validate_experiment_name(experiment_name)
        self.root = experiments_root(experiment_path)
        path = experiment_dir(self.root, name)
        if overwrite and path.exists():
            lifecycle.wipe_folder(path, name)
        reporter, lock = Reporter(quiet=quiet), WriterLock(path)
        store, read_only = open_experiment_store(path, name)
        self._state = ExperimentState(name, path, store, lock, reporter, chosen, read_only)
        registry.register(self)
        lifecycle.announce_owner(self._state)

    def __repr__(self) -> str:
        return f"Experiment({self.experiment_name!r}, path={str(self.path)!r})"

    # ================================================================== state
    @property
    def experiment_name(self) -> str:
        """The experiment's name (its folder's name)."""
        return self._state.name

    @property
    def path(self) -> Path:
        """The experiment's folder: ``<root>/<experiment_name>``."""
        return self._state.path

    @property
    def store(self) -> Store:
        """The experiment's store (``<path>/store.sqlite``), the source of truth of every table. Advanced."""
        return self._state.store

    @property
    def tracking(self) -> tuple[str, ...]:
        """The tracking backends of this object, checked (e.g. ``("tensorboard", "mlflow")``)."""
        return self._state.tracking

    @property
    def quiet(self) -> bool:
        """True when the experiment prints no ``[rapidfire]`` lines (errors still raise)."""
        return self._state.reporter.quiet

    @quiet.setter
    def quiet(self, value: bool) -> None:
        self._state.reporter.quiet = check_flag(value, "quiet")

    @property
    def progress_lines(self) -> bool | None:
        """Print a ``[rapidfire] run N · chunk k/K ...`` line per finished chunk (and each op's outcome)?

        None (default): yes in scripts and terminals, no while a live panel shows the progress (failures,
        notes and the final summary are printed either way); True: always; False: never.
        """
        return self._state.reporter.progress_lines

    @progress_lines.setter
    def progress_lines(self, value: bool | None) -> None:
        self._state.reporter.progress_lines = None if value is None else bool(value)

    def on_message(self, printer: Callable[[str], None] | None) -> None:
        """Send the ``[rapidfire]`` lines to ``printer(line)`` instead of ``print`` (None: back to ``print``)."""
        self._state.reporter.printer = printer or print

    @property
    def ended(self) -> bool:
        """True after :meth:`end` (the object accepts no more training or IC Ops)."""
        return self._state.ended

    @property
    def training(self) -> bool:
        """True while a run is left to train in this process (or an op is still to be applied)."""
        return lifecycle.training(self._state)

    @property
    def session(self) -> FitSession | None:
        """What the latest ``run_fit`` in this process wired (scheduler, executor, recorder), or None. Advanced."""
        return self._state.session

    def run_snapshots(self) -> list[RunSnapshot]:
        """Frozen views of every run this process trains (status, step, chunks, spec), by run id; [] otherwise."""
        release_thread_team()  # a polling loop's thread must not keep an OpenMP team (training/openmp.py)
        return self._state.session.scheduler.snapshot() if self._state.session is not None else []

    def run_snapshot(self, run_id: int) -> RunSnapshot | None:
        """The frozen view of run ``run_id`` (None when this process does not train it)."""
        return self._state.session.scheduler.run_snapshot(run_id) if self._state.session is not None else None

    # ================================================================== run_fit
    def run_fit(
        self,
        param_config: Any,
        create_model_fn: Callable[[dict], Any],
        train_dataset: Any,
        eval_dataset: Any = None,
        num_chunks: int = 4,
        seed: int = 42,
        num_gpus: int | None = None,
        monte_carlo_simulations: int | None = None,
        *,
        background: bool | None = None,
        checkpoint_every: int = 1,
        eval_generation_samples: int | None = None,
        early_stopping: Any = None,
        devices: Any = None,
        backend: str | None = None,
        num_shards: int | None = None,
        panel_metrics: Sequence[str] | None = None,
        best_by: str | None = None,
        batch_generation: bool = True,
        packing: bool | str = "auto",
    ) -> None:
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
            num_gpus: devices per run where ``RFModelConfig.num_gpus`` is None (int >= 1; k > 1: a gang of k
                devices, FSDP2 with ``fsdp`` set else DDP, global batch k x per-device; ``spec.gangs``).
            monte_carlo_simulations: accepted for ``rapidfireai`` code; no effect here (a note says so once).
            background: train in the background and return once validated. Default: True in a Jupyter kernel,
                False in a plain script (which then blocks until training ends).
            checkpoint_every: write each run's resumable checkpoint every this many chunks (default 1: at every
                chunk boundary). Larger values write less; a crashed kernel then continues a run from up to
                ``checkpoint_every - 1`` chunks further back (exactly, as ever). Warm clones are unaffected.
            eval_generation_samples: runs with both ``compute_metrics`` and ``generation_config`` generate, at
                every evaluation, for this many eval rows: a fixed sample drawn with ``seed``, the same rows for
                every run (default None: every eval row). Their metrics are logged as ``eval_<name>`` with
                ``eval_generation_seconds`` (seconds spent generating).
            early_stopping: stop the losers at chunk boundaries, e.g. ``SuccessiveHalving(metric="eval_loss",
                mode="min", reduction_factor=2, grace_chunks=1)`` or ``MedianStopping(...)`` from
                ``rapidfire_nb.automl``; its stops are IC Ops from source ``early_stopping`` with the reason
                (``get_runs_info()``'s ``stop_reason``), and a pruned run stays resumable. None: no early stopping.
            devices: where the runs train. None: every visible CUDA GPU, one worker process each (one GPU or
                none: the kernel process, as a single device). ``N``: the first N GPUs, or on a machine without
                a GPU N CPU workers with ``cores // N`` torch threads each. A list: ``["cuda:0", "cuda:3"]`` or
                ``["cpu", "cpu"]``. Runs stick to a device; a device that would idle takes a run over through its
                latest chunk checkpoint (exact, as a crash resume is), and a worker that dies hands its runs to
                the others (INTERRUPTED, then continued from their checkpoints).
            backend: ``"local"`` (default: spawned worker processes on this machine) or ``"ray"`` (Ray actors, one
                per device, placed with a placement group on the cluster ``ray.init`` joined; needs
                ``pip install rapidfire_nb[ray]``).
            num_shards: ``rapidfireai`` 0.16.2's name for ``num_chunks`` (it calls chunks "shards"): the same
                knob (a note says so once); give one of the two.
            panel_metrics: 1 or 2 metric names for the panel's default plots; None: the trainer kind's (SFT
                ``loss``/``eval_loss``, GRPO ``reward``/``eval_reward``, DPO ``loss`` and the reward accuracy:
                :class:`~rapidfire_nb.schema.trainer_kinds.KindMetrics`).
            best_by: the metric runs are ranked by (panel star, ``end()``, ``get_runs_info()``, static copy; a loss
                lowest first, a reward or accuracy highest); None: the kind's (GRPO ``eval_reward``, DPO
                ``eval_rewards/accuracies``, each else its training value). A name never logged: ConfigError.
            batch_generation: the LoRA runs on one base that evaluate by generating answer the eval prompts in one
                batched ``generate`` at the end of each round (each row through its own run's adapter; greedy
                decoding gives each run exactly its answers alone; default True). False: each run generates alone
                at its chunk end (for comparison and debugging). Off with a note when ``early_stopping``'s metric
                is a generated one.
            packing: ``"auto"`` (default): LoRA runs that see the same batches share one forward/backward per
                step where it pays (CUDA; :mod:`rapidfire_nb.spec.packs`); True: on any device; False: never.

        In a Jupyter kernel this returns once everything is validated and the runs are prepared; training goes on
        in a background thread (``experiment.wait()`` blocks). In a plain script it blocks until training ends.

        Raises:
            ConfigError: bad input, before any training starts.
            ExperimentError: the experiment is training already, or holds a different config group; blocking, once
                training stopped because a write to disk failed (the message says how to continue).
            KeyboardInterrupt: Ctrl-C while a blocking ``run_fit`` trains in a script, once the runs are parked.
        """
        given = {k: v for k, v in locals().items() if k != "self"}  # FitArgs' fields are run_fit's parameters
        lifecycle.run_fit(self._state, FitArgs(**given), self)

    # ================================================================== waiting / ending
    def wait(self, timeout: float | None = None, chunks: int | None = None) -> bool:
        """Block until no run is left to train (or, with ``chunks=k``, until every active run has done k chunks).

        Args:
            timeout: seconds; ``None`` waits as long as needed.
            chunks: wait for this many completed chunks per active run instead, counted from the run's start over
                all epochs, not from this call (``wait(chunks=2)`` after chunk 3 returns at once).

        Returns:
            True when the condition holds; False on timeout, or once training stopped for good (every device's
            worker died, a write to disk failed: the reason was said).

        On Ctrl-C (kernel interrupt) every active run is stopped at the end of its current chunk (STOPPED,
        resumable) and ``wait`` returns once they are parked; a second Ctrl-C returns at once. In a script (not a
        kernel) the ``KeyboardInterrupt`` is raised again once the runs are parked (exit status 130), after a line
        saying how to continue.

        Raises:
            KeyboardInterrupt: Ctrl-C in a script (a blocking ``run_fit`` raises it too).
        """
        check_wait_args(timeout, chunks)
        return lifecycle.wait(self._state, timeout, chunks)

    def end(self) -> None:
        """Wait for the runs still training, save their final weights, and close the experiment.

        The store records that it ended (meta ``ended_at``): from then on the server refuses ops for it (409, saying
        how to continue: re-run ``Experiment(...)`` and ``run_fit``), and the ops it had posted that this kernel
        had not taken yet are answered rejected. A later ``run_fit`` of the experiment opens it again.

        Each live panel gives way to a static copy of its final state (the runs table and the curves, drawn
        as HTML/SVG), which stays in the saved notebook and shows without a kernel (GitHub, nbviewer).
        """
        lifecycle.end_experiment(self._state)

    # ================================================================== IC Ops
    def stop(self, run_id: int | Iterable[int]) -> OpAck | list[OpAck]:
        """Stop run(s) at the end of their current chunk (STOPPED, resumable). Returns an OpAck (list for a list).

        A later ``resume`` or ``delete`` of the run sent before its chunk ends replaces this stop.

        Raises:
            TypeError: a run id that is not an int (e.g. ``1.7``, ``True``, ``"two"``).
        """
        return self._ops(OpKind.STOP, run_id)

    def resume(self, run_id: int | Iterable[int]) -> OpAck | list[OpAck]:
        """Put STOPPED run(s) back into the rotation where they left off (or cancel a stop not yet applied).

        Raises:
            TypeError: a run id that is not an int.
        """
        return self._ops(OpKind.RESUME, run_id)

    def delete(self, run_id: int | Iterable[int]) -> OpAck | list[OpAck]:
        """Stop run(s) and mark them DELETED (hidden from listings).

        Raises:
            TypeError: a run id that is not an int.
        """
        return self._ops(OpKind.DELETE, run_id)

    def clone_modify(
        self,
        run_id: int,
        changes: dict[str, Any] | None = None,
        warm_start: bool = False,
        source: str = "api",
    ) -> int:
        """Create a new run from ``run_id``'s config plus ``changes``; returns the new run's id at once.

        Args:
            run_id: the parent run.
            changes: hyperparameters to change, named ``learning_rate``, ``lora.r``, ``model_kwargs.<key>``;
                functions (``formatting_func``, ``reward_funcs``, ``compute_metrics``) may be replaced here.
                ``run_name`` (a name or a template filled with the clone's values) and ``tags`` label the clone;
                without them it is named ``"<parent's name> (clone)"`` and keeps the parent's tags.
            warm_start: start from the parent's adapter and optimizer state at its latest chunk boundary and
                continue from its position in the data; otherwise a fresh adapter from chunk 1.

        Raises:
            OpError: unknown run, or a change that cannot be warm-started (suggests a cold clone).
            ConfigError: unknown field (with the closest valid name) or invalid value.
            TypeError: a run id that is not an int.
        """
        ack = self.submit_op("clone", run_id, changes=changes, warm_start=warm_start, source=source)
        if ack.state == "rejected":
            raise OpError(ack.message)
        if source != "magic":  # %rapidfire prints its own one line
            self._state.say(ack.message)
        assert ack.new_run_id is not None
        note = panel_source.same_config_note(self._state.session, ack.new_run_id, warm_start)
        if note:
            self._state.say(note)
        return ack.new_run_id

    def ops(self) -> Any:
        """Every op with its outcome, as a pandas DataFrame (op_id, run_id, kind, source, state, message, ...)."""
        self._flush()
        return tables.ops_table(self.store)

    def submit_op(
        self,
        kind: str,
        run_id: int,
        op_id: str | None = None,
        changes: dict[str, Any] | None = None,
        warm_start: bool = False,
        source: str = "api",
        reason: str | None = None,
    ) -> OpAck:
        """The one command path used by the API, the panel, the magic and the ops inbox (a stop's own ``reason``:
        :meth:`Session.submit <rapidfire_nb.experiment.session.Session.submit>`).

        Raises:
            ExperimentError: nothing trains in this process (it says what to do), or the experiment was ended.
            ConfigError/OpError: for a clone whose changes are invalid (the op is not queued).
            TypeError: a run id that is not an int.
        """
        run_id = check_run_id(run_id)
        check_flag(warm_start, "warm_start")
        return self._require_session().submit(
            kind, run_id, op_id=op_id, changes=changes, warm_start=warm_start, source=source, reason=reason
        )

    def _ops(self, kind: OpKind, run_id: int | Iterable[int]) -> OpAck | list[OpAck]:
        ids = check_run_ids(run_id)  # every id checked before any op is sent
        if isinstance(ids, list):
            return [self.submit_op(kind.value, r) for r in ids]
        return self.submit_op(kind.value, ids)

    def _require_session(self) -> FitSession:
        state = self._state
        if state.read_only is not None and not state.ended:
            raise ExperimentError(state.read_only)
        return require_session(state.session, state.ended, state.name, state.lock, state.store)

    # ================================================================== results
    def get_runs_info(self, include_deleted: bool = False) -> Any:
        """One row per run: run_id, status, the differing hyperparameters, progress, latest metrics, config.

        Returns:
            pandas DataFrame with columns ``run_id, status, <hparams...>, completed_steps, total_steps, chunks_done,
            epoch, loss, eval_loss, <generation metrics...>, checkpoint_dir, error, stop_reason[, device][, pack],
            config`` (``config``: the run's whole config, last: the compared values come first; ``pack``: when
            some run trains packed); the generation metrics are the ``eval_<name>`` values of ``compute_metrics``
            with ``generation_config`` (``eval_rougeL``) and GRPO's ``eval_reward``/``eval_rewards/<f>/mean``, each
            run's latest. DELETED runs are left out unless ``include_deleted``.
        """
        session = self._flush()
        return tables.runs_table(
            self.store,
            session.snapshots() if session else {},
            session.columns if session else [],
            include_deleted,
        )

    def get_results(self, include_deleted: bool = False) -> Any:
        """Every logged metric: one row per (run_id, step) with ``samples_seen`` (rows) and one column per
        metric name (TRL's names: ``loss``, ``eval_loss``, ``learning_rate``, ``grad_norm``, ...).

        Args:
            include_deleted: keep the rows of DELETED runs (left out by default, as in ``get_runs_info``).

        Returns:
            pandas DataFrame sorted by ``run_id, step``; empty (columns ``run_id, step, samples_seen``) before the
            first logged step.
        """
        session = self._flush()
        return tables.results_table(self.store, session.snapshots() if session else {}, include_deleted)

    def load_model(self, run_id: int) -> tuple[Any, Any]:
        """``(model, tokenizer)`` with run ``run_id``'s trained weights, in eval mode, ready for ``generate``.

        Raises:
            ExperimentError: nothing was trained in this kernel (run_fit gives it the model function), no such
                run, the run is training right now, or it has no saved final weights.
            TypeError: a run id that is not an int.
        """
        return lifecycle.load_model(self._state, check_run_id(run_id))

    # ================================================================== panel source
    def panel_snapshot(self) -> dict[str, Any]:
        """JSON-able state for the panel (see docs/ARCHITECTURE.md, "Panel source")."""
        return panel_source.panel_snapshot(self._state)

    def metrics_since(self, cursor: int) -> tuple[list[dict[str, Any]], int]:
        """Metric points after ``cursor`` (the store's row id) and the new cursor."""
        return panel_source.metrics_since(self.store, cursor)

    def panel(self) -> None:
        """Display the live panel again (full history; any number of views may be open); after :meth:`end`,
        its static copy."""
        if self._state.ended:
            panel_source.show_static(self)
            return
        panel_source.show_panel(self._state, self)

    def _flush(self) -> FitSession | None:
        """Let the recorder write what was reported so far to the store (the tables then show it; the trackers are
        not waited for: they never feed a table). A table read in a polling loop also frees this thread's OpenMP
        team (``training/openmp.py``)."""
        release_thread_team()
        session = self._state.session
        if session is not None:
            session.recorder.flush(trackers=False)
        return session
