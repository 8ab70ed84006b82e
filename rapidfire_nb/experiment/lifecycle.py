"""An experiment's lifecycle behind the facade's documentation: opening its folder, ``run_fit``, ``end``.

``run_fit``: refuse what cannot train (ended, read-only, training already, another writer), check the inputs
(:mod:`.inputs`), decide what each stored run becomes (:mod:`.start`, :mod:`.restore`), wire one
:class:`~.session.FitSession` and start its scheduler thread. All of it runs on the calling thread; nothing
trains before every check has passed. ``end``: wait, save, record the end, freeze the panels, drop the lock.
``exp`` is the :class:`~.facade.Experiment` (typed ``Any``: the facade imports this module).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ExperimentError, storage_error
from ..frontend import after_each_cell, in_kernel, thread_parent_hook
from ..training.openmp import release_thread_team
from . import panel_source, registry, script_exit
from .arguments import check_flag
from .compat import check_drop_in_args, chunks_from_shards
from .inputs import FitArgs, check_fit_inputs
from .ownership import settle_orphan, wipe
from .start import check_group, open_session, start_message
from .store_files import read_only_reason

if TYPE_CHECKING:
    from .session import FitSession

__all__ = ["announce_owner", "end_experiment", "load_model", "run_fit", "wipe_folder"]


def wipe_folder(path: Path, name: str) -> None:
    """``overwrite=True``: empty the experiment folder, unless this process may not (read-only, another writer).

    Raises:
        ExperimentError: the folder is read-only here, or another process trains it.
    """
    refused = read_only_reason(path, name)
    if refused is not None:
        raise ExperimentError(f"{refused}; overwrite=True cannot delete it")
    wipe(path, name)


def announce_owner(exp: Any) -> None:
    """Say why an opened experiment is read-only here; else settle what a dead writer left behind."""
    if exp._read_only is not None:
        exp._say(exp._read_only)
        return
    other = settle_orphan(exp._lock, exp.store)
    if other is not None:
        exp._say(
            f"experiment {exp.experiment_name!r} is being trained by process {other}; its state is "
            "shown read-only here"
        )


def run_fit(exp: Any, args: FitArgs) -> None:
    """Check, wire and start one ``run_fit`` of ``exp``.

    Order: ``background``, ``num_gpus``, ``monte_carlo_simulations`` and ``num_shards`` are checked first; then ``exp`` must be
    free to train (not ended, not read-only, not training, its writer lock taken); then the rest of ``args``
    (:func:`~.inputs.check_fit_inputs`) and the stored group (:func:`~.start.check_group`). Only then is anything
    built. A refusal after the lock was taken gives it back.

    Args:
        exp: the experiment.
        args: ``Experiment.run_fit``'s arguments, as given.

    Raises:
        TypeError: ``background`` is not True, False or None.
        ConfigError: bad input, before any training starts.
        ExperimentError: ended, read-only, training already, trained by another process or object, a different
            config group, or unfinished runs started with other inputs.
        StorageError: the store cannot be written (disk full, read-only file system).
        ExperimentError: (blocking) training stopped because a write to disk failed (after saying so).
    """
    check_flag(args.background, "background", allow_none=True)
    note = check_drop_in_args(args.num_gpus, args.monte_carlo_simulations)
    if note:
        exp._say(note)
    num_chunks, note = chunks_from_shards(args.num_chunks, args.num_shards)
    if note:
        exp._say(note)
    args = replace(args, num_chunks=num_chunks, num_shards=None)
    _refuse_if_busy(exp)
    background = in_kernel() if args.background is None else args.background
    held_before = _acquire_writer(exp)
    try:
        if exp._session is not None and exp._session.halted is not None:
            exp._session.close()  # a write to disk failed: the runs continue through the restore path
            exp._session = None
        if not held_before and exp._session is None:
            settle_orphan(exp._lock, exp.store)  # its writer may have died since this opened it read-only
        inputs = check_fit_inputs(args, exp_dir=exp.path)
        existing = check_group(exp.experiment_name, exp.store, inputs, trained_here=exp._session is not None)
        if existing is None:
            exp._say(
                "the same config group is already in this experiment; every run has finished "
                "(see experiment.get_runs_info())"
            )
            return
        session = open_session(
            exp.store, exp._reporter, exp.path, inputs, existing, exp.tracking, exp._trackers_off
        )
        _start(exp, session, bool(existing), background)
    except BaseException as exc:
        if not held_before and exp._session is None:
            exp._lock.release()  # refused before training: another process may train it
        failure = storage_error(exc, str(exp.store.path)) if isinstance(exc, Exception) else None
        if failure is not None and failure is not exc:
            raise failure from exc
        raise
    if not background:
        exp.wait()
        halted = exp._session.halted if exp._session is not None else None
        if halted is not None:  # a script must not go on (and exit 0) as if its runs had trained
            raise ExperimentError(f"training stopped: {halted}")


def _refuse_if_busy(exp: Any) -> None:
    if exp._ended:
        raise ExperimentError(
            f"experiment {exp.experiment_name!r} was ended (experiment.end()); to continue it, run "
            f"Experiment({exp.experiment_name!r}) again, then run_fit(...)"
        )
    if exp._read_only is not None:
        raise ExperimentError(exp._read_only)
    if exp.training:
        raise ExperimentError(
            f"experiment {exp.experiment_name!r} is training; use its IC Ops (experiment.stop(run_id), "
            "resume, clone_modify, delete) or experiment.wait() before calling run_fit again"
        )


def _acquire_writer(exp: Any) -> bool:
    """Take the experiment's writer lock; returns whether this object held it already."""
    held_before = exp._lock.held
    if not exp._lock.acquire():
        other = exp._lock.holder_pid()
        who = "another Experiment object in this process" if other == os.getpid() else f"process {other}"
        raise ExperimentError(
            f"experiment {exp.experiment_name!r} is being trained by {who}; continue it there, or end it "
            "(experiment.end(), or shut that kernel down) and run this again"
        )
    return held_before


def _start(exp: Any, session: FitSession, continued: bool, background: bool) -> None:
    """Make ``session`` the experiment's, say what starts, start the scheduler thread, show the panel."""
    session.started_at = time.time()
    exp._session = session
    registry.set_current(exp)
    session.scheduler.on_thread_start = thread_parent_hook()
    session.recorder.start(thread_parent_hook())
    exp._say(start_message(exp.experiment_name, session, continued, background))
    exp.store.reopen()  # an experiment ended before is trained again: the server accepts ops again
    session.scheduler.start()
    release_thread_team()  # this thread's OpenMP team would slow the device thread's (training/openmp.py)
    after_each_cell(_release_after_cell)  # a kernel: the same after every cell that ran torch code meanwhile
    if background and in_kernel():
        exp._show_panel()
    elif background:
        script_exit.watch(session)  # a script that ends while it trains: park the runs before Python exits


def _release_after_cell() -> None:
    """After a cell, while an experiment trains: free the main thread's OpenMP team (``training/openmp.py``)."""
    if registry.any_training():
        release_thread_team()


def end_experiment(exp: Any) -> None:
    """Wait for the runs still training, save their final weights, record the end, freeze the panels."""
    if exp._ended:
        return
    if exp._session is not None:
        exp.wait()
        exp._session.end()  # meta ended_at: the server refuses ops from now on (409, saying how to continue)
    exp._ended = True
    panel_source.freeze_panels(exp._panels)
    exp._panels.clear()
    exp._reporter.panel_live = False
    exp._lock.release()
    if exp._session is not None:
        exp._say(panel_source.final_summary(exp))


def load_model(exp: Any, run_id: int) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of run ``run_id`` (see ``Experiment.load_model``).

    Raises:
        ExperimentError: nothing was trained in this kernel, no such run, it trains now, no final weights.
    """
    if exp._session is None:
        raise ExperimentError(
            "no run trained in this kernel yet: call run_fit with the same arguments first (it "
            "gives this kernel the model function; finished runs are not trained again)"
        )
    return exp._session.load_model(run_id, exp._reporter)
