"""SessionBinding (experiment/binding.py): the recorder's and executor's late calls, bound after construction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb.errors import StorageError
from rapidfire_nb.experiment.binding import SessionBinding


class _Executor:
    def checkpoint_dir(self, run_id: int) -> Path | None:
        return Path(f"/runs/{run_id}/checkpoint-3")


class _Session:
    def __init__(self) -> None:
        self.failures: list[StorageError] = []

    def inbox_ops(self) -> list[Any]:
        return ["op"]

    def storage_failed(self, failure: StorageError) -> None:
        self.failures.append(failure)


def test_a_call_before_binding_is_a_clear_error() -> None:
    late = SessionBinding()
    with pytest.raises(
        RuntimeError, match="checkpoint_dir was called before open_session bound the executor"
    ):
        late.checkpoint_dir(1)
    with pytest.raises(RuntimeError, match="inbox_ops was called before open_session bound the session"):
        late.inbox_ops()
    with pytest.raises(RuntimeError, match="storage_failed was called before open_session bound the session"):
        late.storage_failed(StorageError("/x", "disk full"))


def test_bound_calls_reach_the_executor_and_the_session() -> None:
    late = SessionBinding()
    late.bind_executor(_Executor())
    assert late.checkpoint_dir(2) == Path("/runs/2/checkpoint-3")
    with pytest.raises(RuntimeError, match="bound the session"):  # the executor alone is not enough
        late.inbox_ops()
    session = _Session()
    late.bind_session(session)
    failure = StorageError("/x", "disk full")
    late.storage_failed(failure)
    assert late.inbox_ops() == ["op"] and session.failures == [failure]
