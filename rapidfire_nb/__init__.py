"""rapidfire_nb: compare many TRL fine-tuning configs at once, chunk by chunk, inside a Jupyter kernel.

``import rapidfire_nb`` is cheap: torch, TRL and PEFT are imported only when training starts.
"""

from __future__ import annotations

from kernel_scheduler import OpAck, RunStatus

from ._quiet_logs import hide_hub_kernel_line
from ._version import __version__
from .errors import ConfigError, ExperimentError, OpError
from .experiment import Experiment

hide_hub_kernel_line()  # before anything imports bitsandbytes (peft does): the kernel's and every worker's

__all__ = [
    "Experiment",
    "RunStatus",
    "OpAck",
    "ConfigError",
    "ExperimentError",
    "OpError",
    "__version__",
    "load_ipython_extension",
]


def load_ipython_extension(ipython):  # pragma: no cover - exercised through IPython
    """``%load_ext rapidfire_nb`` registers the ``%rapidfire`` magic."""
    from .magic import load_ipython_extension as _load

    _load(ipython)
