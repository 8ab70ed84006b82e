"""One ``run_fit`` session: what it wires together, built on the caller's thread, then driven by the scheduler.

:func:`open_session` turns checked inputs and the restore plan into a running :class:`FitSession`: it makes the
executor (the training layer), registers every run with the scheduler (new, finished, continued from its
checkpoint, or failed), records the group in the store and starts the tracker. :class:`FitSession` is what the
facade delegates to afterwards: IC Ops, snapshots, the ops inbox, closing.

Threads: the caller's thread builds the session and, until ``scheduler.start()``, is its only user. Afterwards
the scheduler thread owns all run state (each run's status, progress and spec live in the scheduler); other
threads call :meth:`FitSession.submit` (which only checks and enqueues) and read frozen snapshots. The session's
own fields are set once, at construction.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_scheduler import Op, OpAck, OpKind, RunSnapshot, RunStatus, Scheduler
from kernel_scheduler.ops import new_op_id

from ..errors import ExperimentError, OpError
from ..run_folder import run_dir
from .clones import prepare_clone, rebuild_clone_spec
from .inputs import FitInputs, check_same_inputs, column_names
from .recorder import Recorder
from .reporter import Reporter
from .restore import RestoreAction, RunRestore, apply_restore, plan_restore

__all__ = ["FitSession", "check_group", "open_session", "start_message"]


@dataclass
class FitSession:
    """What one ``run_fit`` wires: scheduler, executor, recorder, tracker and the group's settings.

    Attributes:
        scheduler: owns every run's state (thread ``rapidfire-scheduler``).
        executor: the training layer (``rapidfire_nb.training``'s TorchExecutor).
        recorder: the scheduler listener writing the store and the tracker.
        tracker: TensorBoard (or a null tracker).
        inputs: the checked ``run_fit`` arguments.
        started_at: unix seconds when training started.
        continued: run id -> the step it continues from (runs restored from a checkpoint).
    """

    scheduler: Scheduler
    executor: Any
    recorder: Recorder
    tracker: Any
    inputs: FitInputs
    store: Any
    started_at: float = field(default_factory=time.time)
    continued: dict[int, int] = field(default_factory=dict)

    @property
    def num_chunks(self) -> int:
        return self.inputs.num_chunks

    @property
    def columns(self) -> list[str]:
        """The hyperparameter columns shown in tables (differing in the group, plus those clones changed)."""
        return self.recorder.columns

    # ------------------------------------------------------------------ reading (any thread)
    def snapshots(self) -> dict[int, RunSnapshot]:
        """Frozen views of every run, by run id."""
        return {s.run_id: s for s in self.scheduler.snapshot()}

    def spec(self, run_id: int) -> Any:
        """Run ``run_id``'s spec (None when there is no such run)."""
        snap = self.scheduler.run_snapshot(int(run_id))
        return snap.spec if snap is not None else None

    def specs(self) -> dict[int, Any]:
        return {s.run_id: s.spec for s in self.scheduler.snapshot()}

    # ------------------------------------------------------------------ IC Ops (any thread)
    def submit(
        self,
        kind: str,
        run_id: int,
        op_id: str | None = None,
        changes: Mapping[str, Any] | None = None,
        warm_start: bool = False,
        source: str = "api",
    ) -> OpAck:
        """Check an op and hand it to the scheduler; returns its acknowledgement at once.

        Raises:
            OpError: unknown op kind, unknown parent run, or a change a warm start cannot take.
            ConfigError: a clone whose changes are invalid (the op is not queued).
        """
        try:
            kind_e = OpKind(kind)
        except ValueError:
            raise OpError(f"unknown op {kind!r}; use stop, resume, delete or clone") from None
        if kind_e is not OpKind.CLONE:
            return self.scheduler.submit(Op(kind_e, int(run_id), op_id=op_id or new_op_id(), source=source))
        request = prepare_clone(self.spec(int(run_id)), int(run_id), changes, warm_start, source)
        op = Op(kind_e, int(run_id), op_id=op_id or new_op_id(), payload=request.payload(), source=source)
        ack = self.scheduler.submit(op)
        if ack.new_run_id is not None and ack.state != "rejected":
            self.recorder.record_clone(ack.new_run_id, int(run_id), request)
            self.recorder.record_editable(self.specs())
        return ack

    def inbox_ops(self) -> list[Op]:
        """The ops posted through the server since the last call (clones are submitted here at once)."""
        ops = []
        for row in self.store.take_inbox_ops():
            payload = row.get("payload") or {}
            kind = row.get("kind")
            try:
                if kind == "clone":
                    self.submit(
                        "clone",
                        int(row["run_id"]),
                        op_id=row["op_id"],
                        changes=payload.get("changes"),
                        warm_start=bool(payload.get("warm_start")),
                        source="inbox",
                    )
                else:
                    ops.append(Op(OpKind(kind), int(row["run_id"]), op_id=row["op_id"], source="inbox"))
            except Exception as exc:
                self.store.add_op(
                    row["op_id"],
                    str(kind),
                    row.get("run_id"),
                    payload,
                    source="inbox",
                    state="rejected",
                    message=str(exc),
                )
        return ops

    def load_model(self, run_id: int) -> tuple[Any, Any]:
        """``(model, tokenizer)`` with run ``run_id``'s trained weights (see ``Experiment.load_model``).

        Raises:
            ExperimentError: no such run, it is training right now, or it has no saved final weights.
        """
        spec = self.spec(run_id)
        if spec is None:
            raise ExperimentError(f"run {run_id} does not exist (runs: {sorted(self.specs())})")
        if self.scheduler.on_device() == run_id:
            raise ExperimentError(f"run {run_id} is training right now; stop it or wait for its chunk to end")
        if self.executor.has_run(run_id):
            return self.executor.load_model(run_id)  # type: ignore[no-any-return]
        row = self.store.get_run(run_id) or {}  # ended in an earlier process: its final weights are on disk
        final = row.get("checkpoint_dir")
        if not final or not Path(final).is_dir():
            raise ExperimentError(
                f"run {run_id} ({row.get('status', 'unknown')}) has no saved final weights; only "
                "runs that completed or were stopped have them"
            )
        return self.executor.load_model(run_id, spec=spec, final_dir=Path(final))  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop the scheduler thread, release every run and close the tracker (after ``wait()``)."""
        self.scheduler.close()
        self.executor.close()
        self.tracker.close()


# ---------------------------------------------------------------------------------------------- building
def check_group(
    name: str, store: Any, inputs: FitInputs, trained_here: bool
) -> dict[int, dict[str, Any]] | None:
    """The stored runs of this config group, by run id (empty for a new experiment); None when this process
    trained the group already (``trained_here``) and so nothing is left to do.

    Raises:
        ExperimentError: the experiment holds another group, or its unfinished runs were started with other
            inputs (:func:`~.inputs.check_same_inputs`).
    """
    existing = {r["run_id"]: r for r in store.runs() if r.get("source") in (None, "fit")}
    if not existing:
        return existing
    if store.get_meta("fingerprint") != inputs.fingerprint:
        raise ExperimentError(
            f"experiment {name!r} already holds a different config group ({len(existing)} runs). Use a new "
            "experiment name, or Experiment(name, overwrite=True) to start it afresh"
        )
    if trained_here:
        return None
    unfinished = [rid for rid, r in existing.items() if not RunStatus(r["status"]).is_finished()]
    if unfinished:
        check_same_inputs(
            name,
            store.meta(),
            inputs.num_chunks,
            inputs.seed,
            inputs.train_dataset,
            inputs.eval_dataset,
            unfinished,
        )
    return existing


def start_message(name: str, session: FitSession, continued: bool, background: bool) -> str:
    """What ``run_fit`` says as training starts: the runs and chunks, or that no run is left to train."""
    snaps = session.scheduler.snapshot()  # the runs as registered; the scheduler thread has not started yet
    if continued and not any(s.status.in_rotation() for s in snaps):
        counts: dict[str, int] = {}
        for snap in snaps:
            counts[snap.status.value] = counts.get(snap.status.value, 0) + 1
        return (
            f"experiment {name!r}: no run left to train ("
            + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
            + "); see experiment.get_runs_info(); resume or clone_modify trains more"
        )
    n_runs = sum(1 for s in snaps if s.status is not RunStatus.DELETED)
    return (
        f"experiment {name!r}: {n_runs} run{'s' if n_runs != 1 else ''} × {session.num_chunks} chunks "
        f"({session.inputs.trainer_type})"
        + ("; training in the background (experiment.wait() blocks)" if background else "")
    )


def open_session(
    store: Any,
    reporter: Reporter,
    exp_dir: Path,
    inputs: FitInputs,
    existing: Mapping[int, Mapping[str, Any]],
) -> FitSession:
    """Build the executor, register every run and record the group; the scheduler is not started yet.

    Args:
        store: the experiment's store (this process holds its writer lock).
        reporter: where notes and messages go.
        exp_dir: the experiment folder.
        inputs: the checked ``run_fit`` arguments.
        existing: the stored runs of this group (``source`` fit), by run id (empty for a new experiment).

    Raises:
        ConfigError: bad input found while building a run's trainer (nothing trains; the executor is closed).
    """
    from ..training import runtime  # torch is imported here, not at `import rapidfire_nb`

    runtime.silence_globally()
    late: dict[str, Any] = {}  # the recorder needs the executor and the executor the recorder: bound below
    tracker = runtime.make_tracker(exp_dir / "tensorboard")
    recorder = Recorder(
        store,
        reporter,
        tracker,
        inputs.num_chunks,
        column_names(inputs.specs),
        checkpoint_dir=lambda rid: late["executor"].checkpoint_dir(rid),
        inbox=lambda: late["session"].inbox_ops(),
    )
    executor = runtime.make_executor(
        inputs.trainer_type,
        inputs.create_model_fn,
        inputs.train_dataset,
        inputs.eval_dataset,
        inputs.num_chunks,
        inputs.seed,
        exp_dir,
        recorder.on_metrics,
        reporter.say,
        lambda rid, path: store.upsert_run(rid, checkpoint_dir=str(path)),
    )
    late["executor"] = executor
    session = FitSession(Scheduler(executor, listener=recorder), executor, recorder, tracker, inputs, store)
    late["session"] = session
    resumed: list[str] = []
    try:
        for run_id, spec in enumerate(inputs.specs, start=1):
            _register(
                session,
                run_id,
                spec,
                plan_restore(run_id, existing.get(run_id), run_dir(exp_dir, run_id)),
                resumed,
                reporter,
            )
        _register_clones(session, store, exp_dir, resumed, reporter)
    except BaseException:
        executor.close()
        tracker.close()
        raise
    if resumed:
        reporter.say("continuing from the last chunk checkpoints: " + ", ".join(resumed))
    _record_group(session, store, existing)
    for rid, step in session.continued.items():
        tracker.continue_from(rid, step)  # TensorBoard drops what a dead process logged after it
    for snap in session.scheduler.snapshot():
        if snap.status is not RunStatus.DELETED:  # a deleted run's folder was renamed; do not bring it back
            tracker.log_hparams(snap.run_id, snap.spec.hparams())
    return session


def _register_clones(
    session: FitSession, store: Any, exp_dir: Path, resumed: list[str], reporter: Reporter
) -> None:
    """Rebuild the clones a previous kernel made (their recipes are in meta ``clones``) and register them."""
    recipes = store.get_meta("clones", {}) or {}
    for row in store.runs():
        recipe = recipes.get(str(row["run_id"]))
        if row.get("source") != "clone" or recipe is None:
            continue
        parent = session.spec(int(recipe["parent"]))
        if parent is None:
            continue
        try:
            spec = rebuild_clone_spec(parent, recipe)
        except Exception as exc:  # e.g. a changed function that no longer exists: this clone only
            _register_broken_clone(session, row, parent, recipe, exc, resumed, reporter)
            continue
        plan = plan_restore(row["run_id"], row, run_dir(exp_dir, row["run_id"]))
        _register(session, row["run_id"], spec, plan, resumed, reporter)


def _register_broken_clone(
    session: FitSession,
    row: Mapping[str, Any],
    parent: Any,
    recipe: Mapping[str, Any],
    exc: Exception,
    resumed: list[str],
    reporter: Reporter,
) -> None:
    error = f"cannot be rebuilt after the restart: {exc}; clone run {recipe['parent']} again"
    if RunStatus(row["status"]).is_finished():  # shown as it ended; its spec is the parent's
        _register(
            session,
            row["run_id"],
            parent,
            RunRestore(row["run_id"], RestoreAction.FINISHED, RunStatus(row["status"]), row),
            resumed,
            reporter,
        )
        return
    session.scheduler.add_run(
        row["run_id"], parent, status=RunStatus.FAILED, error=error, parent_id=row.get("parent_id")
    )
    session.store.upsert_run(row["run_id"], status=RunStatus.FAILED.value, error=error)
    reporter.say(f"run {row['run_id']} {error}")


def _register(
    session: FitSession, run_id: int, spec: Any, plan: RunRestore, resumed: list[str], reporter: Reporter
) -> None:
    """Register one run with the scheduler as the plan says (building its trainer unless it is finished)."""
    prior, sched = plan.prior, session.scheduler
    if plan.action is RestoreAction.FINISHED:
        assert prior is not None
        sched.add_run(
            run_id,
            spec,
            status=plan.status,
            error=prior.get("error"),
            parent_id=prior.get("parent_id"),
            progress=(
                int(prior.get("completed_steps") or 0),
                int(prior.get("total_steps") or 0),
                int(prior.get("chunks_done") or 0),
                int(prior.get("samples_seen") or 0),
            ),
        )
        session.recorder.known(run_id, int(prior.get("chunks_done") or 0), finished=True)
        return
    message = apply_restore(plan)
    if message:
        reporter.say(message)
    if plan.action is RestoreAction.FAILED:
        assert prior is not None
        sched.add_run(
            run_id, spec, status=RunStatus.FAILED, parent_id=prior.get("parent_id"), error=plan.error
        )
        session.store.upsert_run(run_id, status=RunStatus.FAILED.value, error=plan.error)
        return
    start = session.executor.add_run(run_id, spec, resume_from=plan.checkpoint)
    sched.add_run(
        run_id,
        spec,
        start=start,
        status=plan.status,
        parent_id=prior.get("parent_id") if prior else None,
        warm_start=bool(prior.get("warm_start")) if prior else False,
    )
    if prior is not None:
        _continue_from(session, plan, start, resumed, reporter)


def _continue_from(
    session: FitSession, plan: RunRestore, start: Any, resumed: list[str], reporter: Reporter
) -> None:
    """A stored run registered again: drop what was logged after its start, record where it continues."""
    run_id, prior = plan.run_id, plan.prior
    assert prior is not None
    session.store.delete_metrics_after(run_id, start.step)
    session.continued[run_id] = start.step
    session.store.upsert_run(
        run_id,
        status=plan.status.value,
        completed_steps=start.step,
        chunks_done=start.segments_done,
        samples_seen=start.samples_seen,
        total_steps=start.plan.total_steps,
        num_segments=start.plan.num_segments,
    )
    session.recorder.known(run_id, start.segments_done, finished=False)
    if plan.status is RunStatus.STOPPED:
        reporter.say(
            f"run {run_id} stays STOPPED at step {start.step} (experiment.resume({run_id}) continues it)"
        )
    elif plan.checkpoint is not None:
        resumed.append(
            f"run {run_id} at step {start.step}" + (" (from its warm start)" if plan.from_warm_start else "")
        )
    elif int(prior.get("completed_steps") or 0) > 0:
        resumed.append(f"run {run_id} from step 0 ({plan.restart_reason})")


def _record_group(session: FitSession, store: Any, existing: Mapping[int, Mapping[str, Any]]) -> None:
    """Write the group's meta, editable fields and the rows of runs the store does not know yet."""
    inputs = session.inputs
    meta: dict[str, Any] = {
        "fingerprint": inputs.fingerprint,
        "trainer_type": inputs.trainer_type,
        "hparam_columns": session.columns,
    }
    if not existing or any(not RunStatus(r["status"]).is_finished() for r in existing.values()):
        meta.update(inputs.meta())  # a finished experiment keeps the inputs it was trained with
    store.update_meta(meta)
    session.recorder.record_editable(session.specs())
    known = {r["run_id"] for r in store.runs()}
    for snap in session.scheduler.snapshot():
        if snap.run_id in known:
            continue
        spec = snap.spec
        store.upsert_run(
            snap.run_id,
            status=snap.status.value,
            config=spec.to_json(),
            hparams=spec.hparams(),
            fingerprint=spec.fingerprint(),
            source="fit",
            total_steps=snap.total_steps,
            num_segments=snap.num_segments,
            completed_steps=0,
            chunks_done=0,
            epoch=0.0,
            samples_seen=0,
        )
