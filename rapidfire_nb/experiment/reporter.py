"""Where the library's messages go: ``[rapidfire] ...`` lines, or nothing when quiet.

The scheduler thread prints into the cell that called ``run_fit`` through
:func:`rapidfire_nb.frontend.thread_parent_hook`.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Reporter"]


class Reporter:
    """Prints the library's user-facing lines, each prefixed ``[rapidfire] ``.

    Args:
        quiet: print nothing (errors still raise).
        printer: where lines go (default ``print``); e.g. ``list.append`` to collect them.

    Attributes:
        panel_live: True while a live panel shows the progress and the ops log (set by the facade when it
            displays one): chunk lines and op outcomes are then not printed, only failures, notes and the
            final summary.
        progress_lines: None (default): chunk lines and op outcomes unless a live panel shows them; True:
            always; False: never (:meth:`wants_progress`).

    Thread-safety: ``say`` may be called from any thread; ``quiet``, ``printer`` and ``panel_live`` are plain
    attributes set by the user or the caller's thread.
    """

    def __init__(self, quiet: bool = False, printer: Callable[[str], None] | None = None) -> None:
        self.quiet = quiet
        self.printer: Callable[[str], None] = printer or print
        self.panel_live = False
        self.progress_lines: bool | None = None

    def wants_progress(self) -> bool:
        """Whether chunk lines and op outcomes are printed (see ``progress_lines``)."""
        return self.progress_lines if self.progress_lines is not None else not self.panel_live

    def say(self, text: str) -> None:
        """Print one line (unless quiet)."""
        if not self.quiet:
            self.printer(f"[rapidfire] {text}")
