"""TRL's full garbage collection at every ``train()`` start, done once per device until a run may have left garbage.

``transformers.Trainer.train`` begins with ``accelerator.free_memory()``, which calls ``gc.collect()``: a full
collection that traverses every tracked object of the process (~440k on the tiny case: the libraries, the
datasets, the notebook's own objects), 0.15-0.2 s each on the tiny case's 2-core machine, and it never releases
the GIL. A sequential user pays it once per run, after the previous trainer was freed, which is when it finds
something. rapidfire_nb starts every run's ``train()`` in the first round, one after the other, while every run
is alive: a second full collection right after the first finds nothing the first did not, but costs the same
(4 LoRA runs of the tiny case: 0.63-0.68 s of a 1.8-2.3 s training phase, measured with ``gc.callbacks``,
2026-12-02).

:class:`TrainStartCollections` keeps the full collection where it can find garbage — the first ``train()`` start
on a device, and the first one after a run's ``train()`` ended (finished, failed or released: its trainer may
now be garbage held by reference cycles) — and makes the others cheap: ``free_memory`` runs as TRL has it (its
references dropped, its device cache emptied), with every tracked object frozen (``gc.freeze``, CPython 3.7+),
so its ``gc.collect()`` has nothing to traverse; ``gc.unfreeze`` puts them back in the oldest generation, where
Python's own automatic collections find them as before. Nothing else changes: no tensor or RNG is touched.
Standard library only.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

__all__ = ["TrainStartCollections"]


class TrainStartCollections:
    """One executor's record (its one device thread) of whether the next ``train()`` start needs TRL's full
    ``gc.collect()``. Two experiments in one kernel keep one each: the first start of each collects.

    Attributes:
        full: full collections run at ``train()`` starts (TRL's own ``free_memory``, unchanged).
        skipped: ``train()`` starts whose collection ran with every object frozen (nothing traversed).
    """

    def __init__(self) -> None:
        self._needed = True
        self.full = 0
        self.skipped = 0

    def run_left(self) -> None:
        """A run's ``train()`` ended or was unwound: its trainer may be garbage, so collect at the next start."""
        self._needed = True

    def wrap(self, accelerator: Any) -> None:
        """Route ``accelerator.free_memory`` (called by ``Trainer.train`` on entry) through this record.

        Only that accelerator (one trainer's) changes. Where the user froze objects themselves
        (``gc.get_freeze_count() > 0``) or turned the collector off, TRL's call runs unchanged.
        """
        original: Callable[..., Any] = accelerator.free_memory

        def free_memory(*objects: Any) -> Any:
            if self._needed or gc.get_freeze_count() or not gc.isenabled():
                self._needed = False
                self.full += 1
                return original(*objects)
            self.skipped += 1
            gc.freeze()
            try:
                return original(*objects)
            finally:
                gc.unfreeze()

        accelerator.free_memory = free_memory
