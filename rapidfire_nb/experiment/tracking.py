"""The experiment's trackers: made from the backends chosen at ``Experiment(name, tracking=[...])``, with the
backend run ids an earlier kernel kept in the store (meta ``trackers``), so a restarted kernel continues the same
MLflow / Trackio / W&B runs.

Secrets: a tracker is told a run's hyperparameters and config through :func:`tracked_run`, which redacts them
(``<redacted>``) once more on top of the spec's own redaction; the stored backend state never holds a password
(an MLflow URI is stored without it).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableSet, Sequence
from pathlib import Path
from typing import Any

from .. import meta_keys
from ..redact import redact
from ..tracking import TrackedRun
from ..tracking.backends import openers
from ..tracking.fanout import TrackerSet
from .reporter import Reporter

__all__ = ["TRACKERS_META", "make_trackers", "tracked_run"]

TRACKERS_META = meta_keys.TRACKERS
"""Store meta key: ``{backend name: its state}`` (:data:`rapidfire_nb.meta_keys.TRACKERS`)."""


def make_trackers(
    store: Any,
    exp_dir: Path,
    experiment: str,
    names: Sequence[str],
    reporter: Reporter,
    turned_off: MutableSet[str],
) -> TrackerSet:
    """A :class:`~rapidfire_nb.tracking.fanout.TrackerSet` over ``names``, not opened yet (the recorder opens it).

    Args:
        store: the experiment's store (the backends' saved run ids are read here, written on the recorder thread).
        exp_dir: the experiment folder.
        experiment: the experiment name.
        names: the chosen backends (``tracking.backends.resolve_tracking``).
        reporter: where the backends' start lines and failures are printed.
        turned_off: backends that failed earlier in this experiment object (left out; failures are added).
    """
    state: dict[str, Any] = dict(store.get_meta(TRACKERS_META, {}) or {})

    def save(name: str, value: dict[str, Any]) -> None:
        if state.get(name) != value:
            state[name] = value
            store.set_meta(TRACKERS_META, state)

    return TrackerSet(openers(names, exp_dir, experiment, state, save), reporter.say, turned_off)


def tracked_run(
    run_id: int,
    spec: Any,
    trainer_type: str,
    group: Mapping[str, Any],
    parent_id: int | None = None,
    warm_start: bool = False,
) -> TrackedRun:
    """What the trackers are told about run ``run_id`` (``spec``: its ``LeafConfig``), secrets redacted."""
    return TrackedRun(
        run_id=run_id,
        params=redact(spec.hparams()),
        config=redact(spec.to_json()),
        trainer_type=trainer_type,
        parent_id=parent_id,
        warm_start=warm_start,
        group=dict(group),
    )
