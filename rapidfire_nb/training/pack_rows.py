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

__all__ = ["Rows", "current_route", "join_calls", "own_rng", "routing", "slice_output"]


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


def join_calls(calls: list[dict[str, Any]]) -> tuple[dict[str, Any], list[int]] | None:
    """The keyword arguments of one backbone call over every call's rows (concatenated on dim 0), and each call's
    row count; None when they cannot be joined (other keys, shapes, non-tensor values, a cache)."""
    first = calls[0]
    if (
        any(set(c) != set(first) for c in calls)
        or first.get("past_key_values") is not None
        or first.get("use_cache")
    ):
        return None
    lead = first.get("input_ids", first.get("inputs_embeds"))
    if not isinstance(lead, torch.Tensor):
        return None
    sizes = [int(c.get("input_ids", c.get("inputs_embeds")).shape[0]) for c in calls]
    joined: dict[str, Any] = {}
    for key, value in first.items():
        values = [c[key] for c in calls]
        if isinstance(value, torch.Tensor):
            if all(
                isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == n for v, n in zip(values, sizes)
            ):
                if any(v.shape[1:] != value.shape[1:] for v in values):
                    return None
                joined[key] = torch.cat(values)
            elif all(
                isinstance(v, torch.Tensor) and v.shape == value.shape and torch.equal(v, value)
                for v in values
            ):
                joined[key] = value
            else:
                return None
        elif all(v is value or (not isinstance(v, torch.Tensor) and v == value) for v in values):
            joined[key] = value
        else:
            return None
    return joined, sizes


def slice_output(out: Any, start: int, stop: int) -> Any:
    """The backbone output of rows ``start:stop`` (every tensor, or tuple of tensors, sliced on dim 0)."""
    values = {}
    for key, value in out.items():
        if isinstance(value, torch.Tensor):
            value = value[start:stop]
        elif isinstance(value, tuple):
            value = tuple(v[start:stop] if isinstance(v, torch.Tensor) else v for v in value)
        values[key] = value
    return type(out)(**values)
