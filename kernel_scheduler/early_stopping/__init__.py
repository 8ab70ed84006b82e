"""Early stopping at chunk boundaries: pure policies (standard library only) and the scheduler's driver.

* :mod:`.base` — what a policy sees (:class:`ChunkResult`, :class:`RunState`) and decides (:class:`Decisions`),
  the :class:`EarlyStoppingPolicy` ABC.
* :mod:`.rungs` — when a rung is decided (every run in the rotation reached it; later arrivals on arrival).
* :mod:`.halving` — :class:`SuccessiveHalving`; :mod:`.median` — :class:`MedianStopping`.
* :mod:`.driver` — :class:`PolicyDriver`, the scheduler's side (decisions become stop ops from
  ``early_stopping``).
"""

from .base import (
    EARLY_STOPPING,
    ChunkResult,
    Decisions,
    EarlyStop,
    EarlyStoppingPolicy,
    NewRun,
    RunState,
    check_metric,
    check_mode,
)
from .driver import PolicyDriver
from .halving import SuccessiveHalving
from .median import MedianStopping
from .rungs import RungBook, RungPolicy

__all__ = [
    "EARLY_STOPPING",
    "ChunkResult",
    "Decisions",
    "EarlyStop",
    "EarlyStoppingPolicy",
    "MedianStopping",
    "NewRun",
    "PolicyDriver",
    "RunState",
    "RungBook",
    "RungPolicy",
    "SuccessiveHalving",
    "check_metric",
    "check_mode",
]
