"""RunStatus and its legal transitions (kernel_scheduler.status)."""

from __future__ import annotations

import itertools

import pytest

from kernel_scheduler import TRANSITIONS, IllegalTransition, RunStatus, check_transition

S = RunStatus
FINISHED = {S.COMPLETED, S.FAILED, S.DELETED}
TRAINING = {S.NEW, S.ONGOING}


def test_every_status_has_a_row_and_only_known_targets() -> None:
    assert set(TRANSITIONS) == set(RunStatus)
    for old, targets in TRANSITIONS.items():
        assert old not in targets, f"{old} lists itself"
        assert targets <= set(RunStatus)


def test_the_seven_statuses_and_their_values() -> None:
    assert [s.value for s in RunStatus] == [
        "NEW",
        "ONGOING",
        "STOPPED",
        "COMPLETED",
        "FAILED",
        "DELETED",
        "INTERRUPTED",
    ]
    assert RunStatus("STOPPED") is S.STOPPED
    assert str(S.ONGOING) == "ONGOING"
    assert S.NEW == "NEW"  # a str enum: stored and compared as its value


@pytest.mark.parametrize("old", sorted(FINISHED, key=lambda s: s.value))
def test_finished_states_never_train_again(old: RunStatus) -> None:
    assert not (TRANSITIONS[old] & (TRAINING | {S.STOPPED, S.INTERRUPTED}))
    for new in TRAINING | {S.STOPPED, S.INTERRUPTED}:
        with pytest.raises(IllegalTransition):
            check_transition(old, new)


def test_completed_and_failed_can_only_be_deleted() -> None:
    assert TRANSITIONS[S.COMPLETED] == {S.DELETED}
    assert TRANSITIONS[S.FAILED] == {S.DELETED}


def test_deleted_has_no_exit() -> None:
    assert TRANSITIONS[S.DELETED] == frozenset()
    for new in RunStatus:
        if new is not S.DELETED:
            with pytest.raises(IllegalTransition):
                check_transition(S.DELETED, new)


def test_nothing_goes_back_to_new() -> None:
    for old in RunStatus:
        assert S.NEW not in TRANSITIONS[old]


def test_the_ic_op_paths_are_legal() -> None:
    check_transition(S.NEW, S.ONGOING)  # first chunk
    check_transition(S.ONGOING, S.STOPPED)  # stop
    check_transition(S.STOPPED, S.ONGOING)  # resume
    check_transition(S.INTERRUPTED, S.ONGOING)  # resume after a dead process
    check_transition(S.ONGOING, S.COMPLETED)
    check_transition(S.ONGOING, S.FAILED)
    check_transition(S.NEW, S.COMPLETED)  # e.g. a warm clone of a finished parent has nothing left
    check_transition(S.STOPPED, S.FAILED)  # a clone parked before it was created, whose creation failed
    for old in set(RunStatus) - {S.DELETED}:
        check_transition(old, S.DELETED)  # delete is allowed from anything but DELETED


def test_stopped_run_cannot_complete_without_resuming() -> None:
    with pytest.raises(IllegalTransition):
        check_transition(S.STOPPED, S.COMPLETED)


@pytest.mark.parametrize("old,new", list(itertools.product(RunStatus, RunStatus)))
def test_check_transition_matches_the_table(old: RunStatus, new: RunStatus) -> None:
    if old == new or new in TRANSITIONS[old]:
        check_transition(old, new)
    else:
        with pytest.raises(IllegalTransition, match=f"from {old.value} to {new.value}"):
            check_transition(old, new)


def test_illegal_transition_is_a_runtime_error() -> None:
    assert issubclass(IllegalTransition, RuntimeError)


def test_is_finished() -> None:
    assert {s for s in RunStatus if s.is_finished()} == FINISHED


def test_in_rotation() -> None:
    assert {s for s in RunStatus if s.in_rotation()} == TRAINING
    assert not any(s.in_rotation() and s.is_finished() for s in RunStatus)
