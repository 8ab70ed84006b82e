"""Each IC Op kind described once: what it may be applied to, what it leaves, when it applies, what it says.

:data:`OP_KINDS` is read by the scheduler (:func:`~kernel_scheduler.ops.decide`, the op book's queued message,
the applier), the view (legal ops, hints), the magic, the server (which fields an op request takes) and, through
the generated ``widgets/op_kinds.js`` (:func:`front_end_table`), the panel and the server page (button labels and
tooltips, the notice of a click, the body of a request).

To add an op kind: a member of :class:`OpKind` and its row here; in :mod:`kernel_scheduler.op_apply`, what it changes
besides the run's status (``_AFTER``; nothing for a kind like delete); its button icon (``OP_ICON``) in
``widgets/table.js``; then regenerate ``widgets/op_kinds.js`` (``.venv/bin/python scripts/op_kinds_js.py``). The view,
the server and the magic (a kind given run ids only) follow the table. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Any

from .status import RunStatus

__all__ = ["OP_KINDS", "OpKind", "OpKindInfo", "either", "front_end_table", "run_kinds"]


class OpKind(str, Enum):
    """The IC Op kinds, in the order of the panel's row buttons (each described in :data:`OP_KINDS`)."""

    STOP = "stop"
    RESUME = "resume"
    DELETE = "delete"
    CLONE = "clone"


@dataclass(frozen=True)
class OpKindInfo:
    """One op kind, described once.

    Attributes:
        kind: the op kind.
        label: its button's text (``"Clone…"``: it opens a form).
        title: its button's tooltip: what it does.
        past: the verb's past participle in a refusal (``only STOPPED or INTERRUPTED runs can be resumed``).
        allowed: the statuses of a run it may be applied to (a DELETED run takes no op).
        result: the status it leaves the run in; None when it leaves the run as it is (a clone makes a new run).
            An op with a result is a *run op*: a later run op of another kind cancels it while it waits.
        settled: statuses in which it has nothing left to do once the run ops it cancels are gone (the later
            request then wins at once: applied, nothing changes).
        at_boundary: a run training right now gets it at the end of its current chunk (else: at once).
        takes_changes: its request carries ``changes`` and ``warm_start`` (a new run from the target's config).
        queued: the ack's message once queued; ``{run_id}``, ``{when}`` (``now`` / ``at the end of its current
            chunk``), and for an op with changes ``{how}`` (warm or from scratch) and ``{child_id}``.
        requested: the panel's notice of a click before the kernel answers (``{run_id}``).
        applied: the message once applied, ``{run_id}`` and ``{step}``; empty when another part words it (a
            clone's builder).
    """

    kind: OpKind
    label: str
    title: str
    past: str
    allowed: tuple[RunStatus, ...]
    result: RunStatus | None
    settled: tuple[RunStatus, ...]
    at_boundary: bool
    takes_changes: bool
    queued: str
    requested: str
    applied: str = ""

    @property
    def name(self) -> str:
        """The kind's value (``"stop"``), as requests, the ops log and the front end spell it."""
        return self.kind.value


_LIVE = tuple(s for s in RunStatus if s is not RunStatus.DELETED)

OP_KINDS: Mapping[OpKind, OpKindInfo] = MappingProxyType(
    {
        OpKind.STOP: OpKindInfo(
            OpKind.STOP,
            label="Stop",
            title="Stop after the current chunk (all state kept; Resume continues it)",
            past="stopped",
            allowed=(RunStatus.NEW, RunStatus.ONGOING, RunStatus.INTERRUPTED),
            result=RunStatus.STOPPED,
            settled=(RunStatus.STOPPED,),
            at_boundary=True,
            takes_changes=False,
            queued="stop requested for run {run_id} — applies {when}",
            requested="stop requested for run {run_id} — applies at the end of its current chunk",
            applied="run {run_id} stopped at step {step}",
        ),
        OpKind.RESUME: OpKindInfo(
            OpKind.RESUME,
            label="Resume",
            title="Put the run back into the rotation",
            past="resumed",
            allowed=(RunStatus.STOPPED, RunStatus.INTERRUPTED),
            result=RunStatus.ONGOING,
            settled=tuple(s for s in RunStatus if s.in_rotation()),
            at_boundary=False,
            takes_changes=False,
            queued="resume requested for run {run_id} — it rejoins the rotation {when}",
            requested="resume requested for run {run_id} — it rejoins the rotation at the next chunk",
            applied="run {run_id} resumed from step {step}",
        ),
        OpKind.DELETE: OpKindInfo(
            OpKind.DELETE,
            label="Delete",
            title="Remove the run (hidden unless 'show deleted' is on)",
            past="deleted",
            allowed=_LIVE,
            result=RunStatus.DELETED,
            settled=(),
            at_boundary=True,
            takes_changes=False,
            queued="delete requested for run {run_id} — applies {when}",
            requested="delete requested for run {run_id} — applies at the end of its current chunk",
            applied="run {run_id} deleted",
        ),
        OpKind.CLONE: OpKindInfo(
            OpKind.CLONE,
            label="Clone…",
            title="Start a new run from this one's config, with changes",
            past="cloned",
            allowed=_LIVE,
            result=None,
            settled=(),
            at_boundary=False,
            takes_changes=True,
            queued="clone of run {run_id} requested ({how}) — run {child_id} joins the rotation at the next chunk "
            "boundary",
            requested="clone of run {run_id} requested — the new run joins at the next chunk boundary",
        ),
    }
)
"""Every op kind's description, in :class:`OpKind` order."""


def run_kinds() -> tuple[OpKind, ...]:
    """The run ops (a ``result`` status: stop, resume, delete): they wait in a run's queue and cancel each other."""
    return tuple(k for k, info in OP_KINDS.items() if info.result is not None)


def either(statuses: Sequence[RunStatus]) -> str:
    """``"NEW, ONGOING or INTERRUPTED"``: status values joined for a sentence."""
    values = [s.value for s in statuses]
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"


def front_end_table() -> list[dict[str, Any]]:
    """What the front end reads of each op kind (``widgets/op_kinds.js``), in :class:`OpKind` order:
    ``{"name", "label", "title", "takes_changes", "requested"}``."""
    return [
        {
            "name": info.name,
            "label": info.label,
            "title": info.title,
            "takes_changes": info.takes_changes,
            "requested": info.requested,
        }
        for info in OP_KINDS.values()
    ]
