"""The one place that knows which front end runs this process: a Jupyter kernel, Colab, or a plain script.

Standard library only (IPython is looked up in ``sys.modules``, never imported here).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["after_each_cell", "in_colab", "in_kernel", "ipython", "on_kernel_shutdown", "thread_parent_hook"]

_log = logging.getLogger(__name__)


def ipython() -> Any:
    """The running IPython shell, or None (IPython not imported, or not running)."""
    module = sys.modules.get("IPython")
    if module is None:
        return None
    try:
        return module.get_ipython()
    except Exception:  # noqa: BLE001 - a broken IPython is no IPython
        return None


def in_kernel() -> bool:
    """True inside a Jupyter kernel (JupyterLab, Notebook, VS Code, Colab): a shell with a kernel, whose front end
    may render widgets; False in scripts and terminal IPython."""
    return getattr(ipython(), "kernel", None) is not None


def in_colab() -> bool:
    """True in Google Colab (no server extensions; TensorBoard is the fallback view)."""
    return "google.colab" in sys.modules


def thread_parent_hook() -> Callable[[], None] | None:
    """A function that, called on another thread, makes that thread's output land in the current cell.

    None outside a kernel or with an ipykernel that cannot do it (ipykernel >= 7's ``set_thread_parent``; the
    output then lands in the latest cell).
    """
    ip = ipython()
    if ip is None or not in_kernel():
        return None
    parent = (
        getattr(ip, "parent_header", None)
        or getattr(getattr(ip, "kernel", None), "get_parent", lambda: None)()
    )
    if not parent or not hasattr(ip, "set_thread_parent"):
        return None
    return lambda: ip.set_thread_parent(parent)


def on_kernel_shutdown(callback: Callable[[], None]) -> bool:
    """Call ``callback()`` when the front end shuts the kernel down or restarts it cleanly.

    It runs in ipykernel's ``do_shutdown`` (on the kernel's control thread, before the shutdown reply), while
    messages still reach the front end. A callback is registered once; an exception in it is logged. Killed
    kernels run nothing.

    Args:
        callback: a function of no arguments.

    Returns:
        False outside a kernel (nothing registered).
    """
    kernel = getattr(ipython(), "kernel", None)
    if kernel is None or not hasattr(kernel, "do_shutdown"):
        return False
    hooks: list[Callable[[], None]] | None = getattr(kernel, "_rapidfire_shutdown_hooks", None)
    if hooks is None:
        hooks = []
        original = kernel.do_shutdown
        registered = hooks

        def do_shutdown(restart: bool) -> Any:
            for hook in list(registered):
                try:
                    hook()
                except Exception:  # noqa: BLE001 - the kernel must shut down whatever a hook does
                    _log.exception("rapidfire: a kernel shutdown hook failed")
            return original(restart)

        kernel.do_shutdown = do_shutdown
        kernel._rapidfire_shutdown_hooks = hooks
    if callback not in hooks:
        hooks.append(callback)
    return True


def after_each_cell(callback: Callable[[], None]) -> bool:
    """Call ``callback()`` after every execution of this IPython shell (its ``post_execute`` event).

    It runs on the shell's main thread, once the code has finished: after every cell (also one that raised) and
    after the silent executions front ends send, which ``post_run_cell`` skips. A callback is registered once; an
    exception in it is logged, never shown in the cell.

    Args:
        callback: a function of no arguments.

    Returns:
        False outside IPython (nothing registered).
    """
    ip = ipython()
    events = getattr(ip, "events", None)
    if events is None or not hasattr(events, "register"):
        return False
    hooks: list[Callable[[], None]] | None = getattr(ip, "_rapidfire_cell_hooks", None)
    if hooks is None:
        hooks = []
        registered = hooks

        def post_execute() -> None:
            for hook in list(registered):
                try:
                    hook()
                except Exception:  # noqa: BLE001 - a hook must never break the user's next cell
                    _log.exception("rapidfire: an after-cell hook failed")

        events.register("post_execute", post_execute)
        ip._rapidfire_cell_hooks = hooks
    if callback not in hooks:
        hooks.append(callback)
    return True
