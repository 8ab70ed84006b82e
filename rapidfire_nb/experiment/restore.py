"""The restore planner: what each stored run becomes when an experiment is trained again (standard library only).

Pure decisions from store rows and run folders, read-only on disk; :func:`apply_restore` and :func:`reconcile`
carry out the few writes (removing half-written leftovers, setting a damaged checkpoint aside, settling a dead
kernel's runs and ops). For each run, :func:`plan_restore` says one of:

* ``new`` — never trained: built and trained from step 0;
* ``finished`` — COMPLETED / FAILED / DELETED: shown, never trained again (a COMPLETED run whose final weights
  were never saved, the kernel having died right after its last chunk, continues from its latest checkpoint);
* ``continue`` — resumed from its latest complete, readable chunk checkpoint (or, for a warm clone stopped
  before its first chunk ended, from its warm start) through TRL's own ``resume_from_checkpoint``;
* ``restart`` — it trained before but has no usable checkpoint: from step 0 (its checkpoint was damaged, or
  none was complete);
* ``failed`` — cannot be continued (a warm clone whose warm start was never written).

The early-stopping policy's decisions survive the restart too: :func:`keep_rung_book` hands it the rung book the
earlier kernel kept in the store (and keeps what it decides from now on), :func:`recover_rung_values` the values of
chunks a continued run completed whose own record a kill lost.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from kernel_scheduler import ChunkResult, EarlyStoppingPolicy, RunStart, RunStatus

from .._atomic import is_complete_dir, leftovers
from ..run_folder import (
    CHECKPOINT_PREFIX,
    DAMAGED_PREFIX,
    WARM_START_PREFIX,
    latest_checkpoint,
    readable_checkpoint,
)
from ..store.rung_book import append_rung_events, book_policy, metrics_by_segment, rung_events

FINAL_DIR = "final"
"""A run's final weights: ``runs/<id>/final`` (written atomically by the executor's final save)."""

__all__ = [
    "FINAL_DIR",
    "Reconciliation",
    "RestoreAction",
    "RunRestore",
    "apply_restore",
    "keep_rung_book",
    "other_policy_note",
    "plan_reconcile",
    "plan_restore",
    "reconcile",
    "recover_rung_values",
    "warm_start_checkpoint",
]

NO_WARM_START = "interrupted before its warm start was written; clone it again"


class RestoreAction(str, Enum):
    NEW = "new"
    FINISHED = "finished"
    CONTINUE = "continue"
    RESTART = "restart"
    FAILED = "failed"


@dataclass(frozen=True)
class RunRestore:
    """The plan for one run.

    Attributes:
        run_id: the run.
        action: see the module docstring.
        status: the status it is registered with (``STOPPED`` stays stopped; a continued run is ONGOING; a new or
            restarted one NEW; a finished one keeps its status; a failed one FAILED).
        prior: its stored row, or None for a run the store does not know yet.
        checkpoint: the folder to resume from (``continue``), else None.
        leftovers: half-written temporary folders of a dead writer, to remove before training.
        damaged: an unreadable checkpoint to set aside (renamed ``damaged-<name>``), or None.
        error: why it failed (``failed``).
    """

    run_id: int
    action: RestoreAction
    status: RunStatus
    prior: Mapping[str, Any] | None = None
    checkpoint: Path | None = None
    leftovers: tuple[Path, ...] = ()
    damaged: Path | None = None
    error: str | None = None

    @property
    def from_warm_start(self) -> bool:
        """True when it continues from its warm-start checkpoint (a warm clone before its first chunk)."""
        return self.checkpoint is not None and self.checkpoint.name.startswith(WARM_START_PREFIX)

    @property
    def restart_reason(self) -> str:
        """Why a ``restart`` starts from step 0 (for the message)."""
        return (
            "its checkpoint was damaged"
            if self.damaged is not None
            else "it had no complete chunk checkpoint"
        )


def warm_start_checkpoint(folder: Path) -> Path | None:
    """The complete, readable ``warm-start-from-run-<parent>-step-<s>`` folder a warm clone was created from."""
    ckpt = latest_checkpoint(folder, WARM_START_PREFIX)
    return ckpt if ckpt is not None and readable_checkpoint(ckpt) else None


def _final_weights_lost(folder: Path) -> bool:
    """A COMPLETED run whose ``final`` folder is not complete while a complete, readable chunk checkpoint is
    there: the store recorded COMPLETED (the scheduler emits it first) and the process died before the final
    weights were saved. Without any checkpoint either (the run folder was removed) it stays finished."""
    if is_complete_dir(folder / FINAL_DIR):
        return False
    ckpt = latest_checkpoint(folder)
    return ckpt is not None and readable_checkpoint(ckpt)


def plan_restore(run_id: int, prior: Mapping[str, Any] | None, folder: Path) -> RunRestore:
    """Decide what run ``run_id`` becomes, from its stored row (None: not stored yet) and its run folder.

    Reads the folder only (which checkpoints are complete and readable); writes nothing.
    """
    if prior is None:
        return RunRestore(run_id, RestoreAction.NEW, RunStatus.NEW)
    status = RunStatus(prior["status"])
    if status is RunStatus.COMPLETED and _final_weights_lost(folder):
        # the kernel died between the store's COMPLETED and the final save: the last chunk is trained again
        status = RunStatus.INTERRUPTED
    stale = tuple(leftovers(folder, f"{CHECKPOINT_PREFIX}*"))
    if status.is_finished():
        # a finished run may have leftovers too: the writer lags training, so the kernel can die in the middle of
        # a checkpoint of a run the store already has as COMPLETED (found by the crash test under load)
        return RunRestore(run_id, RestoreAction.FINISHED, status, prior, leftovers=stale)
    ckpt = latest_checkpoint(folder)
    damaged = ckpt if ckpt is not None and not readable_checkpoint(ckpt) else None
    if damaged is not None:
        ckpt = None
    if ckpt is None and prior.get("warm_start"):
        ckpt = warm_start_checkpoint(
            folder
        )  # stopped before its own first chunk: from the state it was given
        if ckpt is None:
            return RunRestore(
                run_id,
                RestoreAction.FAILED,
                RunStatus.FAILED,
                prior,
                leftovers=stale,
                damaged=damaged,
                error=NO_WARM_START,
            )
    if status is RunStatus.STOPPED:
        new_status = RunStatus.STOPPED
    else:
        new_status = RunStatus.ONGOING if ckpt is not None else RunStatus.NEW
    action = RestoreAction.CONTINUE if ckpt is not None else RestoreAction.RESTART
    return RunRestore(run_id, action, new_status, prior, checkpoint=ckpt, leftovers=stale, damaged=damaged)


def apply_restore(plan: RunRestore) -> str | None:
    """Carry out the plan's writes: remove the leftovers, set the damaged checkpoint aside.

    Returns:
        The message to show about a damaged checkpoint, or None.
    """
    for stale in plan.leftovers:
        shutil.rmtree(stale, ignore_errors=True)
    if plan.damaged is None:
        return None
    aside = plan.damaged.with_name(f"{DAMAGED_PREFIX}{plan.damaged.name}")
    shutil.rmtree(aside, ignore_errors=True)
    plan.damaged.rename(aside)  # kept for a look; latest_checkpoint no longer sees it
    again = "from its warm start" if plan.prior and plan.prior.get("warm_start") else "from step 0"
    return (
        f"run {plan.run_id}: checkpoint {plan.damaged.name} is damaged (a missing, empty or unreadable file; "
        f"moved to {aside.name}); the run starts again {again}"
    )


# ---------------------------------------------------------------------------------------------- reconciliation
@dataclass(frozen=True)
class Reconciliation:
    """What a dead writer left behind, and how to settle it.

    Attributes:
        rejected_inbox: inbox ops it never took (answered rejected: they are not applied later by surprise).
        op_updates: ``(op_id, state, message)`` for ops it took but never applied.
        interrupted: run ids it left ONGOING (they become INTERRUPTED, resumable).
    """

    rejected_inbox: tuple[Mapping[str, Any], ...]
    op_updates: tuple[tuple[str, str, str], ...]
    interrupted: tuple[int, ...]


def plan_reconcile(
    runs: Sequence[Mapping[str, Any]], ops: Sequence[Mapping[str, Any]], inbox: Sequence[Mapping[str, Any]]
) -> Reconciliation:
    """Settle a dead writer's state from the store's runs, ops log and untaken inbox ops (pure)."""
    by_id = {r["run_id"]: r for r in runs}
    updates = []
    for op in ops:
        if op["state"] != "queued":
            continue
        child = (op.get("payload") or {}).get("child_id") if op["kind"] == "clone" else None
        if child is not None and child in by_id and by_id[child]["status"] != RunStatus.FAILED.value:
            updates.append((op["op_id"], "applied", f"run {child} created; it continues after the restart"))
        else:
            updates.append((op["op_id"], "rejected", "the kernel stopped before applying it; send it again"))
    interrupted = tuple(r["run_id"] for r in runs if r["status"] == RunStatus.ONGOING.value)
    return Reconciliation(tuple(inbox), tuple(updates), interrupted)


def reconcile(store: Any) -> None:
    """Apply :func:`plan_reconcile` to ``store`` (an experiment whose writer is gone)."""
    plan = plan_reconcile(store.runs(), store.ops(), store.take_inbox_ops())
    for op in plan.rejected_inbox:
        store.add_op(
            op["op_id"],
            str(op.get("kind")),
            op.get("run_id"),
            op.get("payload"),
            source="inbox",
            state="rejected",
            message="the kernel that was to apply it stopped first; send it again",
        )
    for op_id, state, message in plan.op_updates:
        store.update_op(op_id, state, message, applied_at=time.time())
    for run_id in plan.interrupted:
        store.upsert_run(run_id, status=RunStatus.INTERRUPTED.value)


# ---------------------------------------------------------------------------------------------- early stopping
def other_policy_note(policy: EarlyStoppingPolicy | None, store: Any) -> str | None:
    """The note for a restart whose early-stopping policy is not the one that kept the stored rung book (other
    settings, another metric): its rungs start afresh. None when it is the same, or either is missing."""
    before = book_policy(store)
    if policy is None or before is None or before == policy.describe():
        return None
    return (
        f"early stopping: the rungs decided before this restart were {before}'s; {policy.describe()} starts its "
        "own (a run already past one of its rungs is not compared there). Pass the earlier policy to keep them"
    )


def keep_rung_book(
    policy: EarlyStoppingPolicy | None, store: Any, in_order: Callable[[Callable[[], None]], None]
) -> int:
    """Rebuild ``policy``'s rung book from the store (what an earlier kernel decided with the same policy) and
    store the events it tells from now on through ``in_order`` (the recorder's: in order with the stop ops and
    before any checkpoint handed to the writer later). The events of one decision are written together: one
    write, at the place in the recorder's order of the first of them. Call before the runs are registered.

    Returns:
        The events it took (0 without a policy or a stored book).
    """
    if policy is None:
        return 0
    label = policy.describe()
    pending: list[dict[str, Any]] = []  # told on the scheduler thread, written on the recorder thread
    lock = threading.Lock()

    def write() -> None:
        with lock:
            events = list(pending)
            pending.clear()
        append_rung_events(store, label, events)

    def journal(event: Mapping[str, Any]) -> None:
        with lock:
            pending.append(dict(event))
            first = len(pending) == 1
        if first:  # a write is not queued yet: queue one (it takes every event told until it runs)
            in_order(write)

    in_order(write)  # this policy's book, before any checkpoint
    return policy.keep_book(journal, rung_events(store, label) or [])


def recover_rung_values(policy: EarlyStoppingPolicy | None, store: Any, run_id: int, start: RunStart) -> int:
    """Hand ``policy`` the metrics of each chunk run ``run_id`` completed before its restart point ``start``, read
    from the store's metric rows, when the earlier kernel kept a book for the same policy: a kill may have lost a
    value's own event after the run's checkpoint was written (the run never reports that chunk again). Values the
    book has stay. Returns the chunks it recorded."""
    if policy is None or start.segments_done <= 0 or rung_events(store, policy.describe()) is None:
        return 0
    plan = start.plan
    points, _ = store.metrics_since(0, run_id=run_id)
    by_segment = metrics_by_segment(points, lambda step: plan.segments_done_at(step - 1) + 1)
    recorded = 0
    for segment in sorted(s for s in by_segment if s <= start.segments_done):
        chunk = plan.full_chunks_at(segment)  # as the scheduler reports a chunk: whole chunks only
        recorded += policy.restore_chunk(ChunkResult(run_id, chunk, by_segment[segment]))
    return recorded
