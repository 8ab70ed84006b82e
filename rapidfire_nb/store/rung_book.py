"""The early-stopping rung book in the store: what a rung policy decided, kept so that a restart rebuilds it.

A rung policy tells its journal every value it records at a rung, every rung it decides and every run it judges
(:mod:`kernel_scheduler.early_stopping.book`). The events are kept, in order, in the experiment's meta
(:data:`rapidfire_nb.meta_keys.EARLY_STOPPING_BOOK`: ``{"policy": describe(), "events": [...]}``), appended on the
recorder thread after everything reported before them (so a kill keeps a prefix, the stop ops included); a
restarted kernel hands them back to the policy (``EarlyStoppingPolicy.keep_book``). A book kept by another policy
(other settings, another metric) is not handed to this one. Standard library only.

:func:`metrics_by_segment` reads a run's metrics of each chunk back from the store's metric rows: what the policy
saw, for a value whose own event a kill lost after the run's checkpoint was written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import meta_keys

__all__ = ["append_rung_events", "book_policy", "metrics_by_segment", "rung_events"]


def rung_events(store: Any, policy: str) -> list[dict[str, Any]] | None:
    """The events stored for the policy described as ``policy`` (its ``describe()``), in order; None when no book
    of that policy is stored (none at all, or another policy kept it)."""
    doc = store.get_meta(meta_keys.EARLY_STOPPING_BOOK)
    if not isinstance(doc, Mapping) or doc.get("policy") != policy or not isinstance(doc.get("events"), list):
        return None
    return [dict(e) for e in doc["events"] if isinstance(e, Mapping)]


def book_policy(store: Any) -> str | None:
    """The ``describe()`` of the policy whose book is stored, or None when none is."""
    doc = store.get_meta(meta_keys.EARLY_STOPPING_BOOK)
    policy = doc.get("policy") if isinstance(doc, Mapping) else None
    return policy if isinstance(policy, str) else None


def append_rung_events(store: Any, policy: str, events: Sequence[Mapping[str, Any]]) -> None:
    """Append ``events`` to the book of ``policy`` (started when there is none; a book another policy kept is
    replaced). Called by the one writer of the store (the recorder thread), so the read and the write do not
    interleave with another."""
    kept = rung_events(store, policy) or []
    store.set_meta(
        meta_keys.EARLY_STOPPING_BOOK, {"policy": policy, "events": kept + [dict(e) for e in events]}
    )


def metrics_by_segment(
    points: Sequence[Mapping[str, Any]], segment_of: Callable[[int], int]
) -> dict[int, dict[str, float]]:
    """The latest value of each metric per chunk segment, as the run reported them at each segment's end.

    Args:
        points: one run's metric points (``Store.metrics_since(run_id=...)``: ``step``, ``name``, ``value``), in
            the order they were logged.
        segment_of: optimizer step -> the 1-based segment it trains in (``ChunkPlan.segments_done_at(step - 1)
            + 1``).

    Returns:
        Segment -> {metric name -> value} (NaN kept); segments with nothing logged are absent.
    """
    out: dict[int, dict[str, float]] = {}
    for point in points:
        step, value = point.get("step"), point.get("value")
        if isinstance(step, int) and step > 0 and isinstance(value, (int, float)):
            out.setdefault(segment_of(step), {})[str(point.get("name"))] = float(value)
    return out
