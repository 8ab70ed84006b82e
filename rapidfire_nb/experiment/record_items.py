"""The items on the recorder's queue: one small frozen dataclass per kind of event.

Whoever reports an event (the scheduler thread, a run's training thread, the thread that submitted an op, the
trackers' thread) builds one of these and puts it on the :class:`~rapidfire_nb.experiment.recorder.Recorder`'s
queue; the recorder thread takes them in order and writes each through its dispatch table (item type -> write
method). An item holds only what its write needs, copied when it was reported (a mapping is the recorder's own
``dict``), so the reporting thread may change its own objects afterwards.

Units: ``step`` is optimizer steps, ``samples_seen`` training rows, times (``at``, ``wall_time``) unix seconds
(``time.time()``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias, get_args

from kernel_scheduler import Op, OpAck, RunSnapshot, RunStatus

from .clones import CloneRequest

__all__ = [
    "ITEM_TYPES",
    "AddedItem",
    "BeatItem",
    "CloneItem",
    "EarlyStoppingItem",
    "EditableItem",
    "FinalItem",
    "FlushItem",
    "InOrderItem",
    "MetricsItem",
    "NoteItem",
    "OpItem",
    "RecordItem",
    "RewoundItem",
    "RunItem",
    "StopItem",
    "TrackRunsItem",
    "TrackedItem",
]


@dataclass(frozen=True, slots=True)
class RunItem:
    """A run's snapshot (``Recorder.on_run``): its store row, device, status for the trackers, chunk line.

    Attributes:
        snap: the run as the scheduler saw it (steps, chunks, rows, status, device).
        at: when it was reported (unix seconds): the time of a status change for the trackers and the clock.
    """

    snap: RunSnapshot
    at: float


@dataclass(frozen=True, slots=True)
class OpItem:
    """An op and its outcome so far (``Recorder.on_op``): stored in the ops log, sometimes printed.

    Attributes:
        op: the op as submitted (its ``spec`` payload is not stored; secrets are redacted).
        ack: its state (``queued``, ``applied``, ``rejected``, ...) and message.
        later: True when the scheduler thread reported it (an outcome decided after the submitter's answer).
    """

    op: Op
    ack: OpAck
    later: bool


@dataclass(frozen=True, slots=True)
class MetricsItem:
    """One TRL log call (``Recorder.on_metrics``); consecutive ones are written in one store transaction.

    Attributes:
        run_id: the run that logged.
        step: the optimizer step it logged at.
        samples_seen: training rows consumed by then.
        logs: name -> value as TRL logged them (only the numbers, not bools, are stored and tracked).
        wall_time: when it was logged (unix seconds).
    """

    run_id: int
    step: int
    samples_seen: int
    logs: dict[str, Any]
    wall_time: float


@dataclass(frozen=True, slots=True)
class FinalItem:
    """A run's final weights were saved (``Recorder.on_final``): its row's ``checkpoint_dir``.

    Attributes:
        run_id: the run.
        folder: the folder holding them (a path, as text).
    """

    run_id: int
    folder: str


@dataclass(frozen=True, slots=True)
class CloneItem:
    """A clone the scheduler accepted (``Recorder.record_clone``): its row, recipe, tracker run and columns.

    Attributes:
        child_id: the new run's id.
        parent_id: the run it was cloned from.
        request: the checked clone (spec, changes, warm start).
    """

    child_id: int
    parent_id: int
    request: CloneRequest


@dataclass(frozen=True, slots=True)
class AddedItem:
    """A run the early-stopping policy added (``Recorder.on_added``, e.g. an Optuna trial).

    Attributes:
        snap: the new run (its spec gives the stored config).
        info: what the policy added it with (e.g. ``{"source": "trial", "trial": 9}``), kept in meta
            ``added_runs`` for a restart.
    """

    snap: RunSnapshot
    info: dict[str, Any]


@dataclass(frozen=True, slots=True)
class NoteItem:
    """A sentence from the scheduler (``Recorder.on_note``), printed in the cell.

    Attributes:
        text: the sentence, without the ``[rapidfire]`` prefix.
    """

    text: str


@dataclass(frozen=True, slots=True)
class RewoundItem:
    """A run continues from an earlier checkpoint (``Recorder.on_rewound``): its later metric rows are dropped.

    Attributes:
        run_id: the run.
        step: the checkpoint's step; rows logged after it are deleted and the trackers continue from it.
    """

    run_id: int
    step: int


@dataclass(frozen=True, slots=True)
class EarlyStoppingItem:
    """The early-stopping policy's progress (``Recorder.on_early_stopping``), stored as meta ``early_stopping``.

    Attributes:
        progress: the policy's progress mapping, as it gave it.
    """

    progress: dict[str, Any]


@dataclass(frozen=True, slots=True)
class EditableItem:
    """The hyperparameters a clone may change (``Recorder.record_editable``), stored as meta ``editable_fields``.

    Attributes:
        fields: run id (as text) -> {hyperparameter name -> JSON type name}.
    """

    fields: dict[str, dict[str, str]]


@dataclass(frozen=True, slots=True)
class InOrderItem:
    """A call to make on the recorder thread once everything before it is written (``Recorder.in_order``).

    Attributes:
        fn: called with no arguments; not called once a write failed.
    """

    fn: Callable[[], None]


@dataclass(frozen=True, slots=True)
class TrackRunsItem:
    """Open the trackers and start tracking the session's runs (``Recorder.track_runs``).

    Attributes:
        runs: ``(TrackedRun, status as registered)`` for every run of the session.
        continued: run id -> the step it continues from (its stored points up to it are handed back).
    """

    runs: list[tuple[Any, RunStatus]]
    continued: dict[int, int]


@dataclass(frozen=True, slots=True)
class TrackedItem:
    """Handed back by the trackers' thread: every tracker wrote and flushed an ended run's points.

    Attributes:
        run_id: the run to add to meta ``tracked_runs``.
    """

    run_id: int


@dataclass(frozen=True, slots=True)
class BeatItem:
    """A heartbeat of the scheduler (about every 2 s): the store's ``beat_at``, and a check that its file is there."""


@dataclass(frozen=True, slots=True)
class FlushItem:
    """A marker put by ``Recorder.flush``: set once everything queued before it is written.

    Attributes:
        done: set by the recorder thread (or, with ``trackers``, by the trackers' thread after their flush).
        trackers: also make every tracker write what it holds before ``done`` is set.
    """

    done: threading.Event
    trackers: bool


@dataclass(frozen=True, slots=True)
class StopItem:
    """Put by ``Recorder.close`` after a flush: the recorder thread writes what came before it and ends."""


RecordItem: TypeAlias = (
    RunItem
    | OpItem
    | MetricsItem
    | FinalItem
    | CloneItem
    | AddedItem
    | NoteItem
    | RewoundItem
    | EarlyStoppingItem
    | EditableItem
    | InOrderItem
    | TrackRunsItem
    | TrackedItem
    | BeatItem
    | FlushItem
    | StopItem
)
"""Any item on the recorder's queue."""

ITEM_TYPES: tuple[type, ...] = get_args(RecordItem)
"""Every item type, in the order above (the dispatch test checks the recorder handles each)."""
