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

    Thread-safety: ``say`` may be called from any thread; ``quiet`` and ``printer`` are plain attributes set
    by the user.
    """

    def __init__(self, quiet: bool = False, printer: Callable[[str], None] | None = None) -> None:
        self.quiet = quiet
        self.printer: Callable[[str], None] = printer or print

    def say(self, text: str) -> None:
        """Print one line (unless quiet)."""
        if not self.quiet:
            self.printer(f"[rapidfire] {text}")
