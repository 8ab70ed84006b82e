"""Which trackers an experiment uses: ``Experiment(name, tracking=[...])``, else the environment, else TensorBoard.

:func:`resolve_tracking` turns the user's choice into backend names and checks, before any training, that each
one's package is installed (a :class:`~rapidfire_nb.errors.ConfigError` naming the extra to install otherwise).
:func:`openers` gives the :class:`~.fanout.TrackerSet` one factory per backend; the factories run on the recorder
thread. Backend packages are looked up with ``importlib.util.find_spec`` here, never imported.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rapidfire_nb.errors import ConfigError, closest_name
from rapidfire_nb.tracking.base import Tracker
from rapidfire_nb.tracking.fanout import Opener

__all__ = ["BACKENDS", "DEFAULT_TRACKING", "ENV_VARS", "openers", "resolve_tracking"]


@dataclass(frozen=True)
class Backend:
    """One tracking backend: its name, the packages it needs and how to install them."""

    name: str
    label: str
    modules: tuple[str, ...]
    install: str


BACKENDS: dict[str, Backend] = {
    "tensorboard": Backend("tensorboard", "TensorBoard", ("tensorboard",), "pip install 'tensorboard>=2.15'"),
    "mlflow": Backend("mlflow", "MLflow", ("mlflow",), "pip install 'rapidfire_nb[mlflow]'"),
    "trackio": Backend("trackio", "Trackio", ("trackio",), "pip install 'rapidfire_nb[trackio]'"),
    "wandb": Backend("wandb", "W&B", ("wandb",), "pip install 'rapidfire_nb[wandb]'"),
}
DEFAULT_TRACKING = ("tensorboard",)
"""The trackers of an experiment that names none (and sets no ``RF_*_ENABLED`` variable), Colab included."""
ENV_VARS = {
    "tensorboard": "RF_TENSORBOARD_ENABLED",
    "mlflow": "RF_MLFLOW_ENABLED",
    "trackio": "RF_TRACKIO_ENABLED",
    "wandb": "RF_WANDB_ENABLED",
}
"""The environment variables (as rapidfireai's) that turn a backend on (``true``/``1``/``yes``) or off."""
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def resolve_tracking(tracking: Any = None, environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The backends to track with, checked.

    Args:
        tracking: ``Experiment(tracking=...)``: a list of names (``"tensorboard"``, ``"mlflow"``, ``"trackio"``,
            ``"wandb"``), one name, or ``[]`` for none. None: :data:`DEFAULT_TRACKING`, changed by the
            ``RF_*_ENABLED`` variables of ``environ``.
        environ: the environment (default ``os.environ``).

    Returns:
        The backend names, each once, in the order given.

    Raises:
        ConfigError: an unknown name (with the closest one), a value that is not a name, an ``RF_*_ENABLED``
            value that is not true/false, or a backend whose package is not installed (naming the extra).
    """
    env = os.environ if environ is None else environ
    if tracking is None:
        names, origin = _from_env(env), {n: f"{ENV_VARS[n]}=true" for n in ENV_VARS}
    else:
        names, origin = _from_argument(tracking), {}
    for name in names:
        _check_installed(name, origin.get(name, f"tracking=[{name!r}]"), env)
    return tuple(names)


def _from_argument(tracking: Any) -> list[str]:
    items = [tracking] if isinstance(tracking, str) else tracking
    if not isinstance(items, Iterable) or isinstance(items, (bytes, Mapping)):
        raise ConfigError(
            f"tracking={tracking!r} must be a list of tracker names, e.g. tracking=['tensorboard', 'mlflow'] "
            f"(known: {', '.join(BACKENDS)}; [] for none)"
        )
    names: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(
                f"tracking: {item!r} is not a tracker name; use names among {', '.join(BACKENDS)}"
            )
        name = item.strip().lower()
        if name not in BACKENDS:
            near = closest_name(name, BACKENDS)
            hint = f"did you mean {near!r}? " if near else ""
            raise ConfigError(
                f"tracking: unknown tracker {item!r}; {hint}known trackers: {', '.join(BACKENDS)}"
            )
        if name not in names:
            names.append(name)
    return names


def _from_env(env: Mapping[str, str]) -> list[str]:
    names = list(DEFAULT_TRACKING)
    for name, var in ENV_VARS.items():
        raw = env.get(var)
        if raw is None or not raw.strip():
            continue
        value = raw.strip().lower()
        if value not in _TRUE + _FALSE:
            raise ConfigError(f"{var}={raw!r} must be true or false (1/0, yes/no) to turn {name} on or off")
        if value in _TRUE and name not in names:
            names.append(name)
        elif value in _FALSE and name in names:
            names.remove(name)
    return names


def installed(module: str) -> bool:
    """True when ``module`` can be imported (looked up, not imported)."""
    return importlib.util.find_spec(module) is not None


def _check_installed(name: str, asked: str, env: Mapping[str, str]) -> None:
    backend = BACKENDS[name]
    missing = [m for m in backend.modules if not installed(m)]
    if name == "mlflow" and not missing and _sqlite_uri(env):
        missing = [m for m in ("sqlalchemy", "alembic") if not installed(m)]
        if missing:
            raise ConfigError(
                f"{asked}: MLflow's local SQLite store needs {' and '.join(missing)} (mlflow-skinny comes without "
                f"them): {backend.install}, or set MLFLOW_TRACKING_URI to a tracking server"
            )
    if missing:
        raise ConfigError(
            f"{asked} asks for {backend.label}, which is not installed here: {backend.install} "
            f"(or leave {name!r} out of tracking=[...])"
        )


def _sqlite_uri(env: Mapping[str, str]) -> bool:
    uri = env.get("MLFLOW_TRACKING_URI", "").strip()
    return not uri or uri.startswith("sqlite:")


def openers(
    names: Iterable[str],
    exp_dir: Path,
    experiment: str,
    state: Mapping[str, Any],
    save: Callable[[str, dict[str, Any]], None],
) -> list[Opener]:
    """One ``(name, factory)`` per backend; a factory imports its backend's package and opens it.

    Args:
        names: the backends (:func:`resolve_tracking`).
        exp_dir: the experiment folder (TensorBoard's ``tensorboard/``, MLflow's default store, W&B's ``wandb/``).
        experiment: the experiment name (the MLflow experiment, Trackio and W&B project).
        state: per backend, what it saved in an earlier kernel (its run ids).
        save: ``save(backend name, state)`` keeps a backend's state in the experiment's store.
    """

    def factory(name: str) -> Callable[[], Tracker]:
        own = dict(state.get(name) or {})

        def keep(value: dict[str, Any]) -> None:
            save(name, value)

        def make() -> Tracker:
            if name == "tensorboard":
                from rapidfire_nb.tracking.tensorboard import TensorBoardTracker

                return TensorBoardTracker(Path(exp_dir) / "tensorboard")
            if name == "mlflow":
                from rapidfire_nb.tracking.mlflow_tracker import MlflowTracker

                return MlflowTracker(experiment, Path(exp_dir), own, keep)
            if name == "trackio":
                from rapidfire_nb.tracking.trackio_tracker import TrackioTracker

                return TrackioTracker(experiment, own, keep)
            from rapidfire_nb.tracking.wandb_tracker import WandbTracker

            return WandbTracker(experiment, Path(exp_dir), own, keep)

        return make

    return [(name, factory(name)) for name in names]
