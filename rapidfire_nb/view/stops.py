"""Why each run stopped, read from the ops log: the early-stopping policy's reason or who stopped it.

Torch-free. The ops log is the record: a stop from source ``early_stopping`` carries the policy's reason and the
chunk in its payload, a user's resume after it exempts the run from the rungs up to that chunk. Used for
``get_runs_info()``'s ``stop_reason`` and to register the runs of a restarted kernel as they were.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kernel_scheduler import (
    EARLY_STOPPING,
    OpAck,
    StopInfo,
)  # StopInfo: one run's stops (the scheduler's own)

__all__ = ["StopInfo", "answered_ops", "stop_history"]


def stop_history(ops: Iterable[Mapping[str, Any]]) -> dict[int, StopInfo]:
    """Run id -> :class:`StopInfo`, from the ops log (``store.ops()``; applied ops count, in the order applied)."""
    out: dict[int, StopInfo] = {}
    chunk_of: dict[int, int] = {}
    for op in sorted(ops, key=lambda o: float(o.get("applied_at") or o.get("requested_at") or 0.0)):
        run_id, kind = op.get("run_id"), op.get("kind")
        if op.get("state") != "applied" or not isinstance(run_id, int) or kind not in ("stop", "resume"):
            continue
        prev = out.get(run_id, StopInfo())
        raw = op.get("payload")
        payload: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        by_policy = op.get("source") == EARLY_STOPPING
        if kind == "stop":
            if by_policy:
                chunk_of[run_id] = int(payload.get("chunk") or 0)
                reason = str(payload.get("reason") or "stopped by early stopping")
            else:  # a bulk stop names its own reason ("stop all but best 2 by eval_loss")
                reason = str(payload.get("reason") or f"stopped by the user ({op.get('source')})")
            out[run_id] = StopInfo(reason, by_policy, prev.exempt_through)
        elif prev.pruned and not by_policy:
            out[run_id] = StopInfo(None, False, max(prev.exempt_through, chunk_of.get(run_id, 0)))
        else:
            out[run_id] = StopInfo(None, False, prev.exempt_through)
    return out


def answered_ops(ops: Iterable[Mapping[str, Any]]) -> list[OpAck]:
    """The applied and rejected ops of the ops log (``store.ops()``) as the acknowledgements they got, for
    ``Scheduler.remember``: a restarted kernel answers their op ids again instead of applying them twice. Ops
    still ``queued`` (their kernel died first) are left out: sent again, they apply."""
    return [
        OpAck(
            str(op["op_id"]),
            int(op["run_id"]),
            str(op["kind"]),
            str(op["state"]),
            str(op.get("message") or ""),
        )
        for op in ops
        if op.get("state") in ("applied", "rejected")
        and isinstance(op.get("run_id"), int)
        and op.get("op_id")
    ]
