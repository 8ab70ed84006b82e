"""The panel source the kernel's panel reads (the contract in docs/ARCHITECTURE.md, "Panel source").

``panel_snapshot`` hands the store's rows and the live session's state to :func:`rapidfire_nb.view.kernel_snapshot`
(the one snapshot builder, shared with the server); ``metrics_since`` pages through the store's metric rows.
"""

from __future__ import annotations

from typing import Any

from ..view import KernelState, StoreRows, kernel_snapshot

__all__ = ["metrics_since", "panel_snapshot", "show_panel"]


def panel_snapshot(name: str, store: Any, session: Any) -> dict[str, Any]:
    """JSON-able state for the panel; ``session`` is the live :class:`~.session.FitSession` or None."""
    if session is None:
        kernel = KernelState(started_at=None, num_chunks=0, hparam_columns=[])
    else:
        snaps = session.scheduler.snapshot()
        kernel = KernelState(
            started_at=session.started_at,
            num_chunks=session.num_chunks,
            hparam_columns=session.columns,
            runs=snaps,
            on_device=session.scheduler.on_device(),
            live_steps={s.run_id: session.recorder.live_step(s.run_id) for s in snaps},
        )
    return kernel_snapshot(name, StoreRows.read(store), kernel)


def metrics_since(store: Any, cursor: int) -> tuple[list[dict[str, Any]], int]:
    """Metric points after ``cursor`` (the store's row id) and the new cursor."""
    points, new = store.metrics_since(cursor)
    return [{k: p[k] for k in ("run_id", "step", "samples_seen", "name", "value")} for p in points], new


def show_panel(source: Any, reporter: Any) -> Any:
    """Display the live panel of ``source`` (the widget in a kernel, text progress elsewhere).

    Returns:
        The panel (to close at ``end()``), or None when no panel can be shown (no anywidget, or it failed: the
        reason is printed and progress stays in text lines).
    """
    try:
        from ..panel import display_panel
    except Exception:  # panel unavailable (no anywidget): text lines only
        return None
    try:
        panel = display_panel(source)
    except Exception as exc:
        reporter.say(f"panel unavailable ({exc}); progress is printed as text")
        return None
    return panel if hasattr(panel, "close") else None
