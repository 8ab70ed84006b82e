"""Run status: one enum used everywhere (API, store, panel, magic) and its legal transitions."""

from __future__ import annotations

from enum import Enum

__all__ = ["RunStatus", "TRANSITIONS", "IllegalTransition", "check_transition"]


class RunStatus(str, Enum):
    """Lifecycle of one run (one expanded config).

    * ``NEW`` — created, not started yet (waits for its first chunk).
    * ``ONGOING`` — in the rotation: it gets a chunk whenever it is the furthest behind.
    * ``STOPPED`` — parked by the user (IC Op ``stop``); all state kept; ``resume`` puts it back.
    * ``COMPLETED`` — reached its ``max_steps`` / epochs.
    * ``FAILED`` — raised during training; the error is recorded, other runs go on.
    * ``DELETED`` — removed by the user (IC Op ``delete``); hidden from listings by default.
    * ``INTERRUPTED`` — its process died while it was ONGOING; resumable from its last chunk checkpoint.
    """

    NEW = "NEW"
    ONGOING = "ONGOING"
    STOPPED = "STOPPED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    DELETED = "DELETED"
    INTERRUPTED = "INTERRUPTED"

    def is_finished(self) -> bool:
        """True for the terminal states that never train again (COMPLETED, FAILED, DELETED)."""
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.DELETED)

    def in_rotation(self) -> bool:
        """True when the scheduler may give this run its next chunk (NEW or ONGOING)."""
        return self in (RunStatus.NEW, RunStatus.ONGOING)

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.value


#: The legal transitions, written once. Anything else raises :class:`IllegalTransition`.
TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.NEW: frozenset(
        {RunStatus.ONGOING, RunStatus.STOPPED, RunStatus.FAILED, RunStatus.DELETED, RunStatus.COMPLETED}
    ),
    RunStatus.ONGOING: frozenset(
        {RunStatus.STOPPED, RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.DELETED, RunStatus.INTERRUPTED}
    ),
    # STOPPED -> FAILED: a clone parked before it was created, whose creation then failed
    RunStatus.STOPPED: frozenset({RunStatus.ONGOING, RunStatus.FAILED, RunStatus.DELETED}),
    RunStatus.INTERRUPTED: frozenset(
        {RunStatus.ONGOING, RunStatus.STOPPED, RunStatus.FAILED, RunStatus.DELETED}
    ),
    RunStatus.COMPLETED: frozenset({RunStatus.DELETED}),
    RunStatus.FAILED: frozenset({RunStatus.DELETED}),
    RunStatus.DELETED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A status change that :data:`TRANSITIONS` does not allow."""


def check_transition(old: RunStatus, new: RunStatus) -> None:
    """Raise :class:`IllegalTransition` unless ``old -> new`` is legal (``old == new`` is always allowed)."""
    if old != new and new not in TRANSITIONS[old]:
        raise IllegalTransition(f"run status cannot go from {old.value} to {new.value}")
