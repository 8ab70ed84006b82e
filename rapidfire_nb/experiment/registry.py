"""The live ``Experiment`` objects of this process: one per experiment folder, and the current one.

``Experiment(name)`` again in one process (a notebook cell run twice) returns the live object of that folder;
``%rapidfire`` addresses the current experiment (the one most recently created or trained here). Entries are
weak: an experiment nobody refers to any more leaves the registry. Keys are ``str`` (no ``Path`` objects are
needed at interpreter exit). Called from the caller's thread only (cells, the magic).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from ..errors import ExperimentError
from ..paths import experiment_dir, experiments_root, validate_experiment_name


class Experiment(Protocol):
    """What the registry needs of an experiment object (the facade's ``Experiment``)."""

    @property
    def experiment_name(self) -> str: ...

    @property
    def path(self) -> Path: ...

    @property
    def ended(self) -> bool: ...

    @property
    def training(self) -> bool: ...

    def end(self) -> None: ...


__all__ = [
    "any_training",
    "current_experiment",
    "keep_current",
    "live_at",
    "live_experiment",
    "register",
    "reuse",
    "set_current",
]

_BY_NAME: weakref.WeakValueDictionary[str, Experiment] = weakref.WeakValueDictionary()
_BY_PATH: weakref.WeakValueDictionary[str, Experiment] = weakref.WeakValueDictionary()
_CURRENT: list[weakref.ref[Experiment] | None] = [None]


def current_experiment() -> Any:
    """The experiment most recently created or trained in this process (what ``%rapidfire`` addresses)."""
    ref = _CURRENT[0]
    return ref() if ref is not None else None


def any_training() -> bool:
    """True while an experiment of this process has a run left to train."""
    return any(exp.training for exp in list(_BY_PATH.values()))


def live_roots() -> list[Path]:
    """The experiments roots of this process' experiments (``experiment_path``), the current one's first."""
    current = current_experiment()
    ordered = ([current] if current is not None else []) + list(_BY_PATH.values())
    return list(dict.fromkeys(Path(exp.path).parent for exp in ordered))


def live_experiment(name: str) -> Any:
    """The live Experiment object of that name in this process, if any."""
    return _BY_NAME.get(name)


def live_at(path: Path) -> Any:
    """The live object of the experiment folder ``path`` unless it was ended."""
    live = _BY_PATH.get(str(path))
    return None if live is None or live.ended else live


def reuse(experiment_name: Any, experiment_path: Any, overwrite: bool) -> Any:
    """What ``Experiment(name, ...)`` returns when that folder has a live object: the object itself, or None
    (make a new one: no live object, a bad name — the constructor then raises —, or ``overwrite=True``, which
    ends the live one first).

    Raises:
        ExperimentError: ``overwrite=True`` while the live object trains.
    """
    try:
        path = experiment_dir(experiments_root(experiment_path), validate_experiment_name(experiment_name))
    except Exception:  # the constructor raises the error with its message
        return None
    live = live_at(path)
    if live is None or not overwrite:
        return live
    if live.training:
        raise ExperimentError(
            f"experiment {live.experiment_name!r} is training in this kernel; it cannot be overwritten while it "
            "trains. Stop or wait for it (experiment.wait()), then end it (experiment.end()), or pick a new name"
        )
    live.end()
    return None


def register(exp: Experiment) -> None:
    """Record ``exp`` as the live object of its name and folder, and make it the current experiment."""
    _BY_NAME[exp.experiment_name] = exp
    _BY_PATH[str(exp.path)] = exp
    set_current(exp)


def set_current(exp: Experiment) -> None:
    """Make ``exp`` the experiment ``%rapidfire`` addresses."""
    _CURRENT[0] = weakref.ref(exp)


@contextlib.contextmanager
def keep_current() -> Iterator[None]:
    """Open experiments inside this block without changing the current one (the magic reading another)."""
    saved = _CURRENT[0]
    try:
        yield
    finally:
        _CURRENT[0] = saved
