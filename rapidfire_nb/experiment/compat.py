"""``rapidfireai``'s ``run_fit`` arguments that mean nothing different here, or cannot be honoured yet.

``rapidfireai.Experiment.run_fit(..., seed=42, num_gpus=1, monte_carlo_simulations=1000)``: code written for it
passes them, often positionally. ``num_gpus`` is the number of devices one run trains on at once: k > 1 makes each
run that leaves ``RFModelConfig.num_gpus`` out a gang of k devices (``rapidfire_nb.spec.gangs``: FSDP with
``fsdp`` in its training args, else DDP), checked against ``run_fit(devices=...)`` before training.
``monte_carlo_simulations`` tunes rapidfireai's multi-GPU schedule
search: it has no effect here, and says so once per process. ``num_shards`` is rapidfireai 0.16.2's newer name for
``num_chunks`` (it calls chunks "shards"): the same knob, accepted under either name. Torch-free.
"""

from __future__ import annotations

import numbers
from typing import Any

from ..errors import ConfigError

__all__ = ["DEFAULT_NUM_CHUNKS", "check_drop_in_args", "chunks_from_shards"]

_NOTED: set[str] = set()  # the notes already said in this process

DEFAULT_NUM_CHUNKS = 4
"""``run_fit``'s default ``num_chunks``."""


def chunks_from_shards(num_chunks: Any, num_shards: Any) -> tuple[Any, str | None]:
    """``num_chunks`` once ``num_shards`` (rapidfireai 0.16.2's name for it) is taken into account.

    Args:
        num_chunks: ``run_fit``'s ``num_chunks`` (chunks per epoch; checked later with the other inputs).
        num_shards: None, or the same number under rapidfireai's newer name.

    Returns:
        ``(num_chunks, note)``: ``num_shards`` when it is given, and the note to show the first time it is given in
        this process (else None).

    Raises:
        ConfigError: ``num_shards`` is not an int or is below 1, or both are given with different values.
    """
    if num_shards is None:
        return num_chunks, None
    if isinstance(num_shards, bool) or not isinstance(num_shards, numbers.Integral):
        raise ConfigError(
            f"num_shards must be an int (rapidfireai's name for num_chunks: chunks per epoch), got "
            f"{type(num_shards).__name__} {num_shards!r}"
        )
    if num_shards < 1:
        raise ConfigError(
            f"num_shards={num_shards}: it is the number of chunks per epoch (num_chunks); use 1 or more"
        )
    if num_chunks != DEFAULT_NUM_CHUNKS and num_chunks != num_shards:
        raise ConfigError(
            f"num_chunks={num_chunks!r} and num_shards={num_shards}: both name the chunks per epoch (rapidfireai "
            "0.16.2 renamed num_chunks to num_shards); pass one of them"
        )
    note = None
    if "num_shards" not in _NOTED:
        _NOTED.add("num_shards")
        note = (
            f"num_shards={num_shards} is rapidfireai's newer name for num_chunks: {num_shards} chunks per epoch "
            "(rapidfire_nb calls them chunks)"
        )
    return int(num_shards), note


def check_drop_in_args(num_gpus: Any, monte_carlo_simulations: Any) -> str | None:
    """Check ``run_fit``'s ``num_gpus`` and ``monte_carlo_simulations``.

    Args:
        num_gpus: devices each run trains on at once (None or an int >= 1; k > 1: a gang of k devices,
            ``rapidfire_nb.spec.gangs``, checked against the devices with the configs in ``check_fit_inputs``).
        monte_carlo_simulations: None, or a positive int (accepted, no effect).

    Returns:
        The note to show the first time ``monte_carlo_simulations`` is given in this process, else None.

    Raises:
        ConfigError: ``num_gpus`` not a positive int, or ``monte_carlo_simulations`` not a positive int.
    """
    if num_gpus is not None and (
        isinstance(num_gpus, bool) or not isinstance(num_gpus, numbers.Integral) or num_gpus < 1
    ):
        raise ConfigError(
            f"num_gpus must be a positive int (the devices each run trains on at once), got "
            f"{type(num_gpus).__name__} {num_gpus!r}; leave it out or pass num_gpus=1"
        )
    if monte_carlo_simulations is None:
        return None
    if (
        isinstance(monte_carlo_simulations, bool)
        or not isinstance(monte_carlo_simulations, numbers.Integral)
        or monte_carlo_simulations < 1
    ):
        raise ConfigError(
            f"monte_carlo_simulations must be a positive int, got {monte_carlo_simulations!r} (it has no effect "
            "in rapidfire_nb; leave it out)"
        )
    if "monte_carlo_simulations" in _NOTED:
        return None
    _NOTED.add("monte_carlo_simulations")
    return (
        f"monte_carlo_simulations={monte_carlo_simulations} has no effect in rapidfire_nb: the runs take turns "
        "on one device in a fixed fairness order (the run furthest behind trains next), so there is no "
        "schedule to simulate"
    )
