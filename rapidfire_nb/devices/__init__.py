"""Several devices: one worker process per device, each hosting a ``TorchExecutor`` (no torch imported here).

* :mod:`.settings` — :class:`WorkerSettings`, what a worker needs (picklable);
* :mod:`.datasets` — :func:`share_datasets`: the rows written once, memory-mapped by every worker;
* :mod:`.shipping` — :func:`ship`: user code to a process (cloudpickle), with a ConfigError naming what cannot go;
* :mod:`.local` — :class:`WorkerExecutor`: one device's worker process, the kernel side (an ``Executor``);
* :mod:`._child` — the worker process' entry point (imports ``rapidfire_nb.training.host`` there, not here).
"""

from __future__ import annotations

from .datasets import share_datasets
from .errors import WorkerLost
from .local import WorkerExecutor
from .settings import WorkerSettings
from .shipping import ship, unship

__all__ = ["WorkerExecutor", "WorkerLost", "WorkerSettings", "share_datasets", "ship", "unship"]
