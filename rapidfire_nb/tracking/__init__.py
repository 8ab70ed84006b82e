"""Experiment trackers: TensorBoard by default; MLflow, Trackio and W&B optional, alone or together.

Every backend has the methods of :class:`Tracker` (:class:`BackendTracker` gives each a default that does
nothing); the recorder calls those of :class:`Trackers`; :class:`NullTracker` is the null object used when tracking
is off. The backends are chosen with ``Experiment(name, tracking=[...])`` (or the ``RF_*_ENABLED`` environment
variables, :mod:`.backends`) and put behind one :class:`~.fanout.TrackerSet`, the one object the recorder talks
to: it isolates the backends from each other and from training. A backend's own package (tensorboard, mlflow,
trackio, wandb) is imported only when its tracker is made.

Metric names: the recorder hands over TRL's names (``loss``, ``eval_loss``, ``learning_rate``); a tracker whose
``metric_style`` is ``"split"`` gets them as transformers' TensorBoard/W&B/Trackio callbacks write them
(``train/loss``, ``eval/loss``), one whose style is ``"trl"`` (MLflow, as transformers' MLflow callback) as they are.
"""

from __future__ import annotations

from rapidfire_nb.tracking.base import BackendTracker, TrackedRun, Tracker, Trackers, split_name
from rapidfire_nb.tracking.tensorboard import NullTracker, TensorBoardTracker

__all__ = [
    "BackendTracker",
    "NullTracker",
    "TensorBoardTracker",
    "TrackedRun",
    "Tracker",
    "Trackers",
    "split_name",
]
