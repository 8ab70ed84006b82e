"""The panel source the kernel's panel reads (the contract in docs/ARCHITECTURE.md, "Panel source").

``panel_snapshot`` hands the store's rows and the live session's state to :func:`rapidfire_nb.view.kernel_snapshot`
(the one snapshot builder, shared with the server); ``metrics_since`` pages through the store's metric rows.
``show_panel`` / ``freeze_panels`` / ``show_static`` display the live panel, turn it into its static copy at
``end()``, or show that copy (:mod:`rapidfire_nb.panel.static`). Each takes the experiment's
:class:`~.state.ExperimentState`, or the facade as the :class:`~.state.Owner` the panel reads.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kernel_scheduler import single_devices

from .. import view
from ..view import KernelState, StoreRows, kernel_snapshot, reopened_snapshot

if TYPE_CHECKING:
    from ..store import Store
    from .session import FitSession
    from .state import ExperimentState, Owner

__all__ = [
    "final_summary",
    "freeze_panels",
    "metrics_since",
    "panel_snapshot",
    "same_config",
    "same_config_note",
    "show_panel",
    "show_static",
]

_log = logging.getLogger(__name__)


def panel_snapshot(state: ExperimentState) -> dict[str, Any]:
    """JSON-able state for the panel: the store's rows and, while ``state.session`` is the live
    :class:`~.session.FitSession`, its scheduler's; after ``end()`` (``state.ended``) no op is legal and each run's
    ``op_hints`` say how to continue. Without a session (a kernel restart, or before ``run_fit``) the snapshot
    is the server page's (:func:`rapidfire_nb.view.reopened_snapshot`: the stored hyperparameter columns,
    editable fields, ops log and stop reasons), with no legal op: nothing here would apply one."""
    session, ended = state.session, state.ended
    if (
        session is None
    ):  # nothing trains here (a restart, or before run_fit): the store says it all, as on the page
        elsewhere = state.read_only is not None and _writer_alive(state.store)
        return reopened_snapshot(state.name, StoreRows.read(state.store), ended=ended, elsewhere=elsewhere)
    scheduler = session.scheduler
    snaps = scheduler.snapshot()
    running = scheduler.training()  # read once: the header's chips and the runs' devices agree
    several = len(single_devices(scheduler.devices)) > 1  # a gang's devices count each (cpu:0+cpu:1: two)
    kernel = KernelState(
        started_at=session.started_at,
        num_chunks=session.num_chunks,
        hparam_columns=session.columns,
        runs=snaps,
        on_device=scheduler.on_device(),
        devices=_device_states(scheduler.device_states(), running) if several else {},
        device_runs=running if several else {},
        live_steps={s.run_id: session.recorder.live_step(s.run_id) for s in snaps},
        accepting=not ended,
        early_stopping=scheduler.early_stopping_progress(),
    )
    return kernel_snapshot(state.name, StoreRows.read(state.store), kernel)


def _writer_alive(store: Store) -> bool:
    """Another process's fresh heartbeat (a store without one, or unreadable: no)."""
    try:
        return bool(store.writer_alive())
    except Exception:  # a panel must draw even when the heartbeat cannot be read
        return False


def _device_states(states: dict[str, str], running: dict[str, int]) -> dict[str, str]:
    """``Scheduler.device_states()`` (``"training run N"`` / ``"idle"`` / ``"lost"``) as the view's words
    (``"training"`` / ``"idle"`` / ``"lost"``), a device in ``running`` training."""
    return {d: "training" if d in running else "lost" if st == "lost" else "idle" for d, st in states.items()}


def metrics_since(store: Store, cursor: int) -> tuple[list[dict[str, Any]], int]:
    """Metric points after ``cursor`` (the store's row id) and the new cursor (points carry ``wall_time``)."""
    points, new = store.metrics_since(cursor)
    keys = ("run_id", "step", "samples_seen", "name", "value", "wall_time")
    return [{k: p.get(k) for k in keys} for p in points], new


def freeze_panels(panels: Iterable[Any]) -> None:
    """Turn each live panel into its static copy (``RunPanel.freeze``; a text progress is just closed)."""
    for panel in panels:
        try:
            freeze = getattr(panel, "freeze", None)
            if freeze is not None:
                freeze()
            else:
                panel.close()
        except Exception:  # a panel that cannot be frozen must not keep end() from finishing
            _log.exception("rapidfire: could not freeze a panel")


def show_static(source: Owner) -> None:
    """Display the static copy of ``source``'s panel (runs table and curves, no kernel needed)."""
    from ..panel import display_static

    display_static(source)


def final_summary(state: ExperimentState) -> str:
    """The line printed by ``end()``: runs by status, the best run, the training time."""
    return view.final_summary(panel_snapshot(state))


def same_config(session: FitSession | None, run_id: int) -> list[int]:
    """The other runs (not DELETED) whose config equals run ``run_id``'s (its spec's ``fingerprint()``)."""
    if session is None:
        return []
    snaps = {s.run_id: s for s in session.scheduler.snapshot()}
    mine = snaps.get(run_id)
    fingerprint = getattr(mine.spec if mine else None, "fingerprint", None)
    if fingerprint is None:
        return []
    key = fingerprint()
    return [
        rid
        for rid, s in sorted(snaps.items())
        if rid != run_id
        and s.status.value != "DELETED"
        and getattr(s.spec, "fingerprint", None) is not None
        and s.spec.fingerprint() == key
    ]


def same_config_note(session: FitSession | None, run_id: int, warm_start: bool) -> str | None:
    """The note printed after a clone whose config equals other runs' (None when it is new)."""
    twins = same_config(session, run_id)
    if not twins:
        return None
    warm = " (a warm start from a later step still differs)" if warm_start else ""
    return f"note: run {run_id} has the same config as run {', '.join(map(str, twins))}{warm}"


def show_panel(state: ExperimentState, source: Owner) -> None:
    """Display the live panel of ``source`` (the widget in a kernel, text progress elsewhere) and keep it in
    ``state.panels`` (to freeze at ``end()``); a widget shows the progress, so the chunk lines stop
    (``Reporter.panel_live``). Nothing is kept when no panel can be shown (no anywidget, or it failed: the reason
    is printed and progress stays in text lines)."""
    try:
        from ..panel import display_panel
    except Exception:  # panel unavailable (no anywidget): text lines only
        return
    try:
        panel = display_panel(source)
    except Exception as exc:
        state.say(f"panel unavailable ({exc}); progress is printed as text")
        return
    if hasattr(panel, "close"):
        state.panels.append(panel)
        state.reporter.panel_live = state.reporter.panel_live or hasattr(panel, "freeze")
