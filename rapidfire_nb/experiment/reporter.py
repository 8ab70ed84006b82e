"""Where the library's messages go, and the one place that knows the front end (kernel or script).

A :class:`Reporter` prints ``[rapidfire] ...`` lines, or nothing when quiet. The scheduler thread prints into
the cell that called ``run_fit``: :func:`thread_parent_hook` returns the hook that ties that thread to the
cell (ipykernel >= 7's ``set_thread_parent``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["Reporter", "in_kernel", "ipython", "thread_parent_hook"]


def ipython() -> Any:
    """The running IPython shell, or None (IPython not imported or not running)."""
    if "IPython" not in sys.modules:
        return None
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return None
    return get_ipython()


def in_kernel() -> bool:
    """True inside a Jupyter kernel (JupyterLab, Notebook, VS Code, Colab), not a script or terminal IPython."""
    ip = ipython()
    return ip is not None and type(ip).__name__ in ("ZMQInteractiveShell", "Shell")  # Shell: Colab


def thread_parent_hook() -> Callable[[], None] | None:
    """A function that, called on another thread, makes that thread's output land in the current cell.

    None outside a kernel or with an ipykernel that cannot do it (its output then lands in the latest cell).
    """
    ip = ipython()
    if ip is None or not in_kernel():
        return None
    parent = getattr(ip, "parent_header", None) or getattr(getattr(ip, "kernel", None), "get_parent",
                                                           lambda: None)()
    if not parent or not hasattr(ip, "set_thread_parent"):
        return None
    return lambda: ip.set_thread_parent(parent)


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
