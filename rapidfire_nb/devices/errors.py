"""Errors of the device layer (no torch)."""

from __future__ import annotations

__all__ = ["WorkerLost"]


class WorkerLost(RuntimeError):
    """A device's worker process died (killed, out of memory, a crash) or could not start.

    Raised by every call to that device's executor made or pending after the death, except ``run_segment``,
    whose Future resolves with ``SegmentResult(device_lost=True)`` instead.
    """
