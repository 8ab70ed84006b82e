"""The rows of each run in one fused call over a shared base, and each run's own random stream while it draws.

A fused call (:mod:`~rapidfire_nb.training.packing`'s forward, :mod:`~rapidfire_nb.training.pack_generate`'s
``generate``) puts the runs' micro-batches one after another on the batch dimension. :func:`routing` publishes
which rows are whose for the duration of the call (the device thread is the only one that reads it), and
:func:`own_rng` swaps a run's own random state in around a draw (LoRA dropout, sampling), so each run draws what
it would draw alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Rows", "current_route", "own_rng", "routing"]


@dataclass
class Rows:
    """One run's rows ``start:stop`` of a fused call.

    Attributes:
        adapter: the run's adapter on the shared base.
        start, stop: its rows (batch dimension).
        rng: its random state (:func:`~rapidfire_nb.training.rng.capture_rng`'s dict), advanced by its draws;
            None: it draws nothing in this call.
        finished: (generation) every row of the run has ended: it draws nothing more, as alone it would have
            stopped.
        length: (generation) how many tokens it generated when it finished (None: not finished).
    """

    adapter: str
    start: int
    stop: int
    rng: dict[str, Any] | None
    finished: bool = False
    length: int | None = None


_ROUTE: list[list[Rows] | None] = [None]  # the route of the fused call in progress (device thread only)


def current_route() -> list[Rows] | None:
    """The rows of each run of the fused call in progress, or None outside one."""
    return _ROUTE[0]


@contextlib.contextmanager
def routing(route: list[Rows]) -> Iterator[None]:
    """Publish ``route`` for the duration of one fused call."""
    _ROUTE[0] = route
    try:
        yield
    finally:
        _ROUTE[0] = None


@contextlib.contextmanager
def own_rng(rows: Rows, device: Any) -> Iterator[None]:
    """Draw on ``device`` from ``rows``' own random state (swapped in, and its advanced state kept, around it)."""
    if rows.rng is None:
        yield
        return
    cuda = torch.device(device).type == "cuda"
    index = torch.device(device).index or 0 if cuda else 0
    saved = torch.cuda.get_rng_state(index) if cuda else torch.random.get_rng_state()
    if cuda:
        torch.cuda.set_rng_state(rows.rng["cuda"][index], index)
    else:
        torch.random.set_rng_state(rows.rng["cpu"])
    try:
        yield
    finally:
        if cuda:
            rows.rng["cuda"][index] = torch.cuda.get_rng_state(index)
            torch.cuda.set_rng_state(saved, index)
        else:
            rows.rng["cpu"] = torch.random.get_rng_state()
            torch.random.set_rng_state(saved)
