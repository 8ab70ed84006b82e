"""Starting a ``run_fit`` session: from checked inputs and the restore plan to a :class:`~.session.FitSession`.

:func:`check_group` decides whether the stored runs belong to this config group; :func:`open_session` makes the
executor (the training layer), registers every run with the scheduler (new, finished, continued from its
checkpoint, or failed), records the group in the store and hands the runs to the trackers (opened on the recorder
thread). Runs on the caller's thread, before the scheduler thread starts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableSet, Sequence
from pathlib import Path
from typing import Any

from kernel_scheduler import RunStatus, Scheduler, device_arbiter

from .. import meta_keys
from .._atomic import is_complete_dir
from ..errors import ExperimentError
from ..run_folder import run_dir
from ..spec.bundles import GroupSettings, TrainingCallbacks
from ..view.stops import StopInfo, answered_ops, stop_history
from ..view.text import run_labels
from .binding import SessionBinding
from .clones import rebuild_clone_spec
from .inputs import FitInputs, check_same_inputs
from .record_writes import forget_packs, record_pack, store_new_run
from .recorder import Recorder
from .reporter import Reporter
from .restore import (
    FINAL_DIR,
    RestoreAction,
    RunRestore,
    apply_restore,
    keep_rung_book,
    other_policy_note,
    plan_restore,
    recover_rung_values,
)
from .session import FitSession
from .tracking import make_trackers, tracked_run

__all__ = ["check_group", "open_session", "start_message"]


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: value}


def _group_difference(existing: dict[int, dict[str, Any]], specs: Any, most: int = 3) -> str:
    """``"; run 1: training_args.max_steps is 48 there, 40 here"``: where the stored group and the given one
    differ (runs matched by position), at most ``most`` fields; ``""`` when nothing can be compared."""
    if len(existing) != len(specs):
        return f"; {len(specs)} given here"
    found: list[str] = []
    for run_id, spec in zip(sorted(existing), specs):
        stored = existing[run_id].get("config")
        if not isinstance(stored, dict):
            continue
        old, new = _flat(stored), _flat(spec.to_json())
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key) and len(found) < most:
                found.append(f"run {run_id}: {key} is {old.get(key)!r} there, {new.get(key)!r} here")
    return "; " + "; ".join(found) if found else ""


def _same_group(recorded: Any, inputs: FitInputs) -> bool:
    """Whether the group fingerprint ``recorded`` in the store is this group's: its ``fingerprint``, or the one
    recorded before runs had names (TRL's ``training_args.run_name`` was a training argument then:
    ``LeafConfig.legacy_fingerprint``)."""
    if recorded == inputs.fingerprint:
        return True
    legacy = [getattr(spec, "legacy_fingerprint", None) for spec in inputs.specs]
    return all(legacy) and recorded == json.dumps([fingerprint() for fingerprint in legacy])


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
    if not _same_group(store.get_meta(meta_keys.FINGERPRINT), inputs):
        raise ExperimentError(
            f"experiment {name!r} already holds a different config group ({len(existing)} runs"
            f"{_group_difference(existing, inputs.specs)}). Use a new experiment name, or "
            "Experiment(name, overwrite=True) to start it afresh"
        )
    if trained_here:
        return None
    unfinished = [rid for rid, r in existing.items() if not RunStatus(r["status"]).is_finished()]
    if unfinished:
        check_same_inputs(name, store.meta(), inputs.meta(), unfinished)
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
    tracking: Sequence[str] = ("tensorboard",),
    trackers_off: MutableSet[str] | None = None,
) -> FitSession:
    """Build the executor, register every run and record the group; the scheduler is not started yet.

    Args:
        store: the experiment's store (this process holds its writer lock).
        reporter: where notes and messages go.
        exp_dir: the experiment folder.
        inputs: the checked ``run_fit`` arguments.
        existing: the stored runs of this group (``source`` fit), by run id (empty for a new experiment).
        tracking: the tracking backends (checked by ``Experiment``).
        trackers_off: backends that failed earlier in this experiment object (left out; new failures added).

    Raises:
        ConfigError: bad input found while building a run's trainer (nothing trains; the executor is closed).
    """
    from ..training import runtime  # torch is imported here, not at `import rapidfire_nb`

    runtime.silence_globally()
    late = SessionBinding()  # the recorder needs the executor and the session: bound once they exist
    off: MutableSet[str] = trackers_off if trackers_off is not None else set()
    tracker = make_trackers(store, exp_dir, exp_dir.name, tracking, reporter, off)
    recorder = Recorder(
        store,
        reporter,
        tracker,
        inputs.num_chunks,
        inputs.columns,
        checkpoint_dir=late.checkpoint_dir,
        inbox=late.inbox_ops,
    )
    try:
        executor = _make_executor(inputs, exp_dir, _callbacks(store, reporter, recorder, late), reporter)
    except BaseException:
        recorder.close()
        tracker.close()
        raise
    late.bind_executor(executor)
    session = _new_session(executor, recorder, tracker, inputs, store, exp_dir)
    late.bind_session(session)
    if note := other_policy_note(inputs.early_stopping, store):
        reporter.say(note)
    keep_rung_book(inputs.early_stopping, store, recorder.in_order)  # rungs decided before a restart stay so
    recorder.on_storage_error = session.storage_failed
    try:
        _register_all(session, existing, exp_dir, reporter)
    except BaseException:
        executor.close()
        recorder.close()
        tracker.close()
        raise
    _record_group(session, store, existing)
    _track(session)
    return session


def _callbacks(store: Any, reporter: Reporter, recorder: Recorder, late: SessionBinding) -> TrainingCallbacks:
    """The executor's callbacks: metrics, final folders and the record order through the recorder, notes to the
    reporter, storage failures to the session (bound later), generation metric names and packs into the store's
    meta."""
    return TrainingCallbacks(
        metric_sink=recorder.on_metrics,
        notes=reporter.say,
        on_final=recorder.on_final,
        on_storage_error=late.storage_failed,
        in_record_order=recorder.in_order,
        on_eval_metrics=lambda names: recorder.in_order(lambda: _note_eval_metrics(store, names)),
        on_pack=lambda run_id, pack: recorder.in_order(lambda: record_pack(store, run_id, pack)),
    )


def _new_session(
    executor: Any, recorder: Recorder, tracker: Any, inputs: FitInputs, store: Any, exp_dir: Path
) -> FitSession:
    """The session around a new scheduler over ``executor`` (not started), with the stored stop history."""
    scheduler = Scheduler(
        executor,
        listener=recorder,
        arbiter=device_arbiter(),
        owner=f"experiment {exp_dir.name!r}",
        early_stopping=inputs.early_stopping,
    )
    session = FitSession(scheduler, executor, recorder, tracker, inputs, store)
    ops = store.ops()
    session.stops = stop_history(ops)
    scheduler.remember(answered_ops(ops))  # an op id answered by an earlier kernel is not applied again
    return session


def _register_all(
    session: FitSession, existing: Mapping[int, Mapping[str, Any]], exp_dir: Path, reporter: Reporter
) -> None:
    """Register the group's runs, then the runs a previous kernel added, and say which continue from a
    checkpoint. Building trainers reseeds and draws from the process-wide RNG: it holds the device."""
    resumed: list[str] = []
    with session.hold_device("build its runs", reporter):
        for run_id, spec in enumerate(session.inputs.specs, start=1):
            plan = plan_restore(run_id, existing.get(run_id), run_dir(exp_dir, run_id))
            _register(session, run_id, spec, plan, resumed, reporter)
        _register_later_runs(session, session.store, exp_dir, resumed, reporter)
    if resumed:
        reporter.say("continuing from the last chunk checkpoints: " + ", ".join(resumed))


def _group_settings(inputs: FitInputs) -> GroupSettings:
    """The settings every run of the group shares, from the checked ``run_fit`` inputs."""
    return GroupSettings(
        trainer_type=inputs.trainer_type,
        create_model_fn=inputs.create_model_fn,
        num_chunks=inputs.num_chunks,
        seed=inputs.seed,
        checkpoint_every=inputs.checkpoint_every,
        eval_generation_samples=inputs.eval_generation_samples,
        batch_generation=inputs.batch_generation,
        packing=inputs.packing,
    )


def _make_executor(inputs: FitInputs, exp_dir: Path, callbacks: TrainingCallbacks, reporter: Reporter) -> Any:
    """This process' ``TorchExecutor``, or a pool of one worker process (or Ray actor) per device.

    Raises:
        ConfigError: a worker cannot be given ``create_model_fn`` or the datasets, or the devices do not fit.
    """
    from ..training import runtime

    group = _group_settings(inputs)
    plan = inputs.devices
    if plan is not None and plan.workers:
        from ..devices.build import make_pool

        datasets = (inputs.train_dataset, inputs.eval_dataset)
        return make_pool(plan, group, datasets, exp_dir, callbacks, runtime.load_final_model, reporter.say)
    return runtime.make_executor(group, inputs.train_dataset, inputs.eval_dataset, exp_dir, callbacks)


def _track(session: FitSession) -> None:
    """Hand every run to the trackers (on the recorder thread): new backend runs, or the stored ones continued
    (what a dead process logged after a checkpoint is not shown twice); clones get theirs when recorded."""
    group = {"num_chunks": session.inputs.num_chunks, "seed": session.inputs.seed}
    kind = session.inputs.trainer_type

    def describe(run_id: int, spec: Any, parent_id: int | None, warm_start: bool) -> Any:
        return tracked_run(run_id, spec, kind, group, parent_id, warm_start)

    session.recorder.tracked_run = describe
    runs = [
        (describe(s.run_id, s.spec, s.parent_id, s.warm_start), s.status)
        for s in session.scheduler.snapshot()
    ]
    session.recorder.track_runs(runs, session.continued)


def _register_later_runs(
    session: FitSession, store: Any, exp_dir: Path, resumed: list[str], reporter: Reporter
) -> None:
    """Rebuild the runs a previous kernel added after its start and register them, in run id order (a clone of
    a trial's run finds its parent registered): clones from their recipes (meta ``clones``), the runs the
    early-stopping policy added (a search's trials, meta ``added_runs``) by that policy
    (``EarlyStoppingPolicy.restore_added``: an Optuna trial from its parameters in the study)."""
    recipes = store.get_meta(meta_keys.CLONES, {}) or {}
    added = {int(k): v for k, v in (store.get_meta(meta_keys.ADDED_RUNS, {}) or {}).items()}
    policy = session.inputs.early_stopping
    rebuilt = policy.restore_added(added) if policy is not None else {}
    for row in store.runs():
        if row["run_id"] in added and row.get("source") != "clone":
            _register_added(session, row, rebuilt.get(row["run_id"]), exp_dir, resumed, reporter)
            continue
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


def _register_added(
    session: FitSession,
    row: Mapping[str, Any],
    spec: Any,
    exp_dir: Path,
    resumed: list[str],
    reporter: Reporter,
) -> None:
    """A run the early-stopping policy added in an earlier kernel: continued (or shown as it ended) with the
    spec the policy rebuilt; without one (the policy cannot rebuild it: another policy, its trial gone from the
    study) an unfinished run becomes FAILED with the reason, a finished one stays as stored."""
    run_id = row["run_id"]
    if spec is None:
        if not RunStatus(row["status"]).is_finished():
            error = "cannot be continued after the restart: the early-stopping policy of this run_fit cannot rebuild it"
            session.store.upsert_run(run_id, status=RunStatus.FAILED.value, error=error)
            reporter.say(f"run {run_id} {error}")
        return
    plan = plan_restore(run_id, row, run_dir(exp_dir, run_id))
    _register(session, run_id, spec, plan, resumed, reporter)


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
        apply_restore(plan)  # a checkpoint write the dead kernel left half done (the run had ended meanwhile)
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
        session.finished_before[run_id] = int(prior.get("completed_steps") or 0)  # its final state: on disk?
        final = run_dir(session.store.experiment_dir, run_id) / FINAL_DIR
        if plan.status is RunStatus.COMPLETED and not prior.get("checkpoint_dir") and is_complete_dir(final):
            # saved, but the kernel died before the store recorded where: load_model() finds it again
            session.store.upsert_run(run_id, checkpoint_dir=str(final))
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
    stops = session.stops.get(run_id, StopInfo())  # a pruned run stays pruned; a user's resume stays exempt
    sched.add_run(
        run_id,
        spec,
        start=start,
        status=plan.status,
        parent_id=prior.get("parent_id") if prior else None,
        warm_start=bool(prior.get("warm_start")) if prior else False,
        stops=stops,
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
    recover_rung_values(session.inputs.early_stopping, session.store, run_id, start)
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


def _note_eval_metrics(store: Any, names: list[str]) -> None:
    """Add generation metric names to meta ``eval_metric_names`` (the result tables' columns); recorder thread."""
    known = list(store.get_meta(meta_keys.EVAL_METRIC_NAMES, []) or [])
    added = [n for n in names if n not in known]
    if added:
        store.set_meta(meta_keys.EVAL_METRIC_NAMES, known + added)


def _record_group(session: FitSession, store: Any, existing: Mapping[int, Mapping[str, Any]]) -> None:
    """Write the group's meta, editable fields and the rows of runs the store does not know yet; the runs that train
    again leave their earlier kernel's packs (this session's executor says theirs)."""
    inputs = session.inputs
    meta: dict[str, Any] = {
        meta_keys.FINGERPRINT: inputs.fingerprint,
        meta_keys.TRAINER_TYPE: inputs.trainer_type,
        meta_keys.HPARAM_COLUMNS: session.columns,
        meta_keys.PANEL_METRICS: inputs.panel_meta(),  # run_fit's panel_metrics / best_by (view.metrics_view)
    }
    if not existing or any(not RunStatus(r["status"]).is_finished() for r in existing.values()):
        meta.update(inputs.meta())  # a finished experiment keeps the inputs it was trained with
    store.update_meta(meta)
    session.recorder.record_editable(session.specs())
    known = {r["run_id"]: r for r in store.runs()}
    for snap in session.scheduler.snapshot():
        if snap.run_id in known:
            _relabel(store, known[snap.run_id], snap.spec)
            continue
        store_new_run(store, snap, "fit", total_steps=snap.total_steps, num_segments=snap.num_segments)
    forget_packs(store, [s.run_id for s in session.scheduler.snapshot() if not s.status.is_finished()])


def _relabel(store: Any, row: Mapping[str, Any], spec: Any) -> None:
    """A stored run whose name or tags this ``run_fit``'s group gives otherwise (the fingerprint leaves them out:
    the same run) takes the new ones: its stored config is the spec's (what the panel, the page and
    ``get_runs_info()`` read)."""
    config = spec.to_json() if hasattr(spec, "to_json") else None
    if isinstance(config, dict) and run_labels(config) != run_labels(row.get("config")):
        store.upsert_run(int(row["run_id"]), config=config)
