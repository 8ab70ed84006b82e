"""An experiment's lifecycle behind the facade's documentation: opening its folder, ``run_fit``, ``end``.

``run_fit``: refuse what cannot train (ended, read-only, training already, another writer), check the inputs
(:mod:`.inputs`), decide what each stored run becomes (:mod:`.start`, :mod:`.restore`), wire one
:class:`~.session.FitSession` and start its scheduler thread. All of it runs on the calling thread; nothing
trains before every check has passed. ``end``: wait, save, record the end, freeze the panels, drop the lock.
Each function reads and changes the experiment's :class:`~.state.ExperimentState`; ``run_fit`` also gets the facade
as an :class:`~.state.Owner` (the experiment the registry makes current and the panel reads).
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
    from .state import ExperimentState, Owner

__all__ = ["announce_owner", "end_experiment", "load_model", "run_fit", "training", "wait", "wipe_folder"]


def wipe_folder(path: Path, name: str) -> None:
    """``overwrite=True``: empty the experiment folder, unless this process may not (read-only, another writer).

    Raises:
        ExperimentError: the folder is read-only here, or another process trains it.
    """
    refused = read_only_reason(path, name)
    if refused is not None:
        raise ExperimentError(f"{refused}; overwrite=True cannot delete it")
    wipe(path, name)


def announce_owner(state: ExperimentState) -> None:
    """Say why an opened experiment is read-only here; else settle what a dead writer left behind."""
    if state.read_only is not None:
        state.say(state.read_only)
        return
    other = settle_orphan(state.lock, state.store)
    if other is not None:
        state.say(
            f"experiment {state.name!r} is being trained by process {other}; its state is shown read-only here"
        )


def training(state: ExperimentState) -> bool:
    """True while a run is left to train in this process (or an op is still to be applied). Frees the calling
    thread's OpenMP team: a polling loop's thread must not keep one (``training/openmp.py``)."""
    release_thread_team()
    return state.session is not None and not state.session.scheduler.is_idle()


def wait(state: ExperimentState, timeout: float | None = None, chunks: int | None = None) -> bool:
    """``Experiment.wait`` once its arguments are checked: True at once when nothing was trained here."""
    if state.session is None:
        return True
    release_thread_team()  # torch code run on this thread since run_fit would slow training (training/openmp.py)
    return state.session.wait(timeout, chunks, state.reporter)


def run_fit(state: ExperimentState, args: FitArgs, owner: Owner) -> None:
    """Check, wire and start one ``run_fit`` of the experiment.

    Order: ``background``, ``num_gpus``, ``monte_carlo_simulations`` and ``num_shards`` are checked first; then the
    experiment must be free to train (not ended, not read-only, not training, its writer lock taken); then the rest
    of ``args`` (:func:`~.inputs.check_fit_inputs`) and the stored group (:func:`~.start.check_group`). Only then is
    anything built. A refusal after the lock was taken gives it back.

    Args:
        state: the experiment's state (its ``session`` is the new one once training starts).
        args: ``Experiment.run_fit``'s arguments, as given.
        owner: the facade (made the current experiment; what its panel reads).

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
        state.say(note)
    num_chunks, note = chunks_from_shards(args.num_chunks, args.num_shards)
    if note:
        state.say(note)
    args = replace(args, num_chunks=num_chunks, num_shards=None)
    _refuse_if_busy(state)
    background = in_kernel() if args.background is None else args.background
    held_before = _acquire_writer(state)
    try:
        if state.session is not None and state.session.halted is not None:
            state.session.close()  # a write to disk failed: the runs continue through the restore path
            state.session = None
        if not held_before and state.session is None:
            settle_orphan(state.lock, state.store)  # its writer may have died since this opened it read-only
        inputs = check_fit_inputs(args, exp_dir=state.path)
        for line in inputs.notes:
            state.say(line)
        existing = check_group(state.name, state.store, inputs, trained_here=state.session is not None)
        if existing is None:
            state.say(
                "the same config group is already in this experiment; every run has finished "
                "(see experiment.get_runs_info())"
            )
            return
        session = open_session(
            state.store, state.reporter, state.path, inputs, existing, state.tracking, state.trackers_off
        )
        _start(state, owner, session, bool(existing), background)
    except BaseException as exc:
        if not held_before and state.session is None:
            state.lock.release()  # refused before training: another process may train it
        failure = storage_error(exc, str(state.store.path)) if isinstance(exc, Exception) else None
        if failure is not None and failure is not exc:
            raise failure from exc
        raise
    if not background:
        wait(state)
        halted = state.session.halted if state.session is not None else None
        if halted is not None:  # a script must not go on (and exit 0) as if its runs had trained
            raise ExperimentError(f"training stopped: {halted}")


def _refuse_if_busy(state: ExperimentState) -> None:
    if state.ended:
        raise ExperimentError(
            f"experiment {state.name!r} was ended (experiment.end()); to continue it, run "
            f"Experiment({state.name!r}) again, then run_fit(...)"
        )
    if state.read_only is not None:
        raise ExperimentError(state.read_only)
    if training(state):
        raise ExperimentError(
            f"experiment {state.name!r} is training; use its IC Ops (experiment.stop(run_id), "
            "resume, clone_modify, delete) or experiment.wait() before calling run_fit again"
        )


def _acquire_writer(state: ExperimentState) -> bool:
    """Take the experiment's writer lock; returns whether this object held it already."""
    held_before = state.lock.held
    if not state.lock.acquire():
        other = state.lock.holder_pid()
        who = "another Experiment object in this process" if other == os.getpid() else f"process {other}"
        raise ExperimentError(
            f"experiment {state.name!r} is being trained by {who}; continue it there, or end it "
            "(experiment.end(), or shut that kernel down) and run this again"
        )
    return held_before


def _start(
    state: ExperimentState, owner: Owner, session: FitSession, continued: bool, background: bool
) -> None:
    """Make ``session`` the experiment's, say what starts, start the scheduler thread, show the panel."""
    session.started_at = time.time()
    state.session = session
    registry.set_current(owner)
    session.scheduler.on_thread_start = thread_parent_hook()
    session.recorder.start(thread_parent_hook())
    state.say(start_message(state.name, session, continued, background))
    state.store.reopen()  # an experiment ended before is trained again: the server accepts ops again
    session.scheduler.start()
    release_thread_team()  # this thread's OpenMP team would slow the device thread's (training/openmp.py)
    after_each_cell(_release_after_cell)  # a kernel: the same after every cell that ran torch code meanwhile
    if background and in_kernel():
        panel_source.show_panel(state, owner)
    elif background:
        script_exit.watch(session)  # a script that ends while it trains: park the runs before Python exits


def _release_after_cell() -> None:
    """After a cell, while an experiment trains: free the main thread's OpenMP team (``training/openmp.py``)."""
    if registry.any_training():
        release_thread_team()


def end_experiment(state: ExperimentState) -> None:
    """Wait for the runs still training, save their final weights, record the end, freeze the panels."""
    if state.ended:
        return
    if state.session is not None:
        wait(state)
        state.session.end()  # meta ended_at: the server refuses ops from now on (409, saying how to continue)
    state.ended = True
    panel_source.freeze_panels(state.panels)
    state.panels.clear()
    state.reporter.panel_live = False
    state.lock.release()
    if state.session is not None:
        state.say(panel_source.final_summary(state))


def load_model(state: ExperimentState, run_id: int) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of run ``run_id`` (see ``Experiment.load_model``).

    Raises:
        ExperimentError: nothing was trained in this kernel, no such run, it trains now, no final weights.
    """
    if state.session is None:
        raise ExperimentError(
            "no run trained in this kernel yet: call run_fit with the same arguments first (it "
            "gives this kernel the model function; finished runs are not trained again)"
        )
    return state.session.load_model(run_id, state.reporter)
