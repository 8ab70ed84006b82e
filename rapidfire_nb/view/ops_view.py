"""Each run's ops as every window shows them: its status, the ops it allows, why the others are disabled, and
the fields a clone may change.

The rules are :func:`kernel_scheduler.ops.decide`'s (what the scheduler applies), the op kinds
:data:`kernel_scheduler.op_kinds.OP_KINDS`; :func:`op_kinds_js` writes the front end's copy of that table
(``widgets/op_kinds.js``). Standard library + :mod:`kernel_scheduler` + :mod:`rapidfire_nb.view.wire` only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kernel_scheduler import OpKind, PendingOp, RunStatus, decide
from kernel_scheduler.op_kinds import front_end_table, run_kinds

from .wire import json_type_name

__all__ = [
    "ELSEWHERE_HINT",
    "ENDED_HINT",
    "FIELD_TYPES",
    "NO_KERNEL_HINT",
    "editable_fields",
    "editable_values",
    "legal_ops",
    "op_hints",
    "op_kinds_js",
    "parse_status",
    "pending_ops",
    "reported_status",
]

#: JSON type names the kernel writes in meta ``editable_fields`` (``wire.json_type_name``).
FIELD_TYPES = ("bool", "int", "float", "str", "list", "null", "other")


def parse_status(value: Any) -> RunStatus | None:
    """``value`` as a :class:`RunStatus` (a member or its string value); None for anything else."""
    if isinstance(value, RunStatus):
        return value
    try:
        return RunStatus(value)
    except ValueError:
        return None


def reported_status(stored: str, writer_alive: bool) -> str:
    """Crash reconciliation as the server reports it: an ONGOING run whose writer is gone is INTERRUPTED.

    Args:
        stored: the status value in the store.
        writer_alive: whether a process holds the experiment (fresh heartbeat).

    Returns:
        The status value to show.
    """
    if stored == RunStatus.ONGOING.value and not writer_alive:
        return RunStatus.INTERRUPTED.value
    return stored


def legal_ops(
    status: RunStatus | str | None, *, accepting: bool = True, pending: Sequence[PendingOp] = ()
) -> list[str]:
    """The ops :func:`kernel_scheduler.ops.decide` would not reject for a run in ``status``, in OpKind order.

    Args:
        status: the run's status (member or value); None or an unknown value: no op.
        accepting: False when nobody would apply an op (the server without a live writer): no op.
        pending: the run's stop / resume / delete ops still queued (e.g. a stop waiting for the chunk boundary:
            a resume is then legal too, it cancels the stop).

    Returns:
        Op kind values, e.g. ``["stop", "delete", "clone"]``.
    """
    st = parse_status(status)
    if st is None or not accepting:
        return []
    return [
        k.value
        for k in OpKind
        if decide(k, st, False, 0).verdict != "reject" or decide(k, st, False, 0, pending).verdict != "reject"
    ]


def pending_ops(ops: Iterable[Mapping[str, Any]], run_id: Any) -> list[PendingOp]:
    """The queued stop / resume / delete ops of run ``run_id`` in an ops log (``store.ops()`` rows)."""
    kinds = {k.value: k for k in run_kinds()}
    return [
        PendingOp(kinds[o["kind"]], str(o.get("op_id")))
        for o in ops
        if o.get("run_id") == run_id and o.get("state") == "queued" and o.get("kind") in kinds
    ]


#: Why no op applies to any run: the experiment was ended in this kernel, or no kernel trains it (server).
ENDED_HINT = (
    "the experiment was ended; to continue: Experiment(name), then run_fit(...) with the same arguments"
)
NO_KERNEL_HINT = (
    "no kernel is running this experiment; ops are applied by the kernel that trains it: re-run its notebook "
    "(Experiment(name), then run_fit(...) with the same arguments)"
)
#: Why a panel in a kernel that does not train the experiment offers no op while another kernel trains it.
ELSEWHERE_HINT = (
    "another kernel is training this experiment; ops are applied by that kernel: use its panel or the "
    "/rapidfire/ page"
)


def op_hints(
    status: RunStatus | str | None, *, closed: str | None = None, pending: Sequence[PendingOp] = ()
) -> dict[str, str]:
    """Why each op a run's buttons offer is disabled: ``{op kind: reason}`` for the ops that are not legal.

    Args:
        status: the run's status (member or value).
        closed: the reason no op applies at all (e.g. :data:`ENDED_HINT`), or None.
        pending: the run's queued stop / resume / delete ops (as in :func:`legal_ops`).

    Returns:
        Op kind -> sentence (the reason :func:`kernel_scheduler.ops.decide` gives, or ``closed``).
    """
    st = parse_status(status)
    legal = set(legal_ops(st, pending=pending))
    out = {}
    for k in OpKind:
        if closed is not None:
            out[k.value] = closed
            continue
        decision = decide(k, st, False, 0)
        if decision.verdict == "reject" and k.value not in legal:
            out[k.value] = decision.reason.replace("run 0 is", "the run is").replace("run 0 ", "the run ")
    return out


def editable_fields(described: Any, run_id: int, hparams: Any) -> dict[str, str] | None:
    """The fields a clone of a run may change from the panel, the magic or the server: name -> JSON type.

    One rule for the snapshot's ``editable`` and for the server's op validation: the fields the kernel
    recorded for the run in meta ``editable_fields`` (its hyperparameters minus functions and ``model_type``);
    for a store written before those were recorded, the run's hyperparameters whose values are not object
    reprs (``"<function f>"``), typed by their current values.

    Args:
        described: meta ``editable_fields`` (``{str(run_id): {field: type name}}``), or None.
        run_id: the run.
        hparams: the run's stored hyperparameters.

    Returns:
        ``{field: type name}`` (unknown type names become ``"other"``), or None when the kernel recorded
        fields but none for this run.
    """
    if isinstance(described, Mapping):
        entry = described.get(str(run_id))
        if not isinstance(entry, Mapping):
            return None
        return {str(k): (v if v in FIELD_TYPES else "other") for k, v in entry.items()}
    if not isinstance(hparams, Mapping):
        return {}
    return {
        str(k): json_type_name(v)
        for k, v in hparams.items()
        if not (isinstance(v, str) and v.startswith("<"))
    }


def editable_values(described: Any, run_id: int, hparams: Mapping[str, Any]) -> dict[str, Any]:
    fields = editable_fields(described, run_id, hparams)
    if fields is None:
        fields = editable_fields(None, run_id, hparams) or {}
    return {k: v for k, v in hparams.items() if k in fields}


def op_kinds_js() -> str:
    """The text of ``widgets/op_kinds.js``: :func:`kernel_scheduler.op_kinds.front_end_table` as an ES module
    (``scripts/op_kinds_js.py`` writes it; a test fails while the file differs)."""
    rows = ",\n".join(f"  {json.dumps(row, ensure_ascii=False)}" for row in front_end_table())
    return (
        "// @ts-check\n"
        "// Generated from kernel_scheduler/op_kinds.py by scripts/op_kinds_js.py: do not edit by hand.\n"
        "/** The IC Op kinds (kernel_scheduler.op_kinds.OP_KINDS), in the order of the row buttons:\n"
        " * @type {{name: string, label: string, title: string, takes_changes: boolean, requested: string}[]} */\n"
        f"export const OP_KINDS = [\n{rows},\n];\n"
    )
