"""The one place that knows which front end runs this process: a Jupyter kernel, Colab, or a plain script.

Standard library only (IPython is looked up in ``sys.modules``, never imported here).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["in_colab", "in_kernel", "ipython", "thread_parent_hook"]


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
