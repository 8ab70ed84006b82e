"""The experiment layer: the :class:`Experiment` facade and what it hands work to.

``facade`` (the public class), ``inputs`` (run_fit's checks, dataset fingerprints), ``restore`` (the pure restore
planner and crash reconciliation), ``session`` (what one run_fit wires), ``start`` (building it), ``recorder`` (the scheduler listener that
writes the store and trackers), ``clones`` (clone-modify), ``tables`` (pandas results), ``panel_source`` (what the
panel reads), ``ownership`` (the one-writer lock), ``registry`` (live objects of this process), ``reporter``
(messages, and the one place that knows the front end).
"""

from __future__ import annotations

from .clones import decode_changes, encode_changes
from .facade import Experiment
from .inputs import dataset_fingerprint
from .registry import current_experiment, live_experiment

__all__ = [
    "Experiment",
    "current_experiment",
    "dataset_fingerprint",
    "decode_changes",
    "encode_changes",
    "live_experiment",
]
