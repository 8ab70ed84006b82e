"""The late half of a ``run_fit`` session's wiring: the recorder is built before the executor and the session.

The recorder needs the executor (``checkpoint_dir``) and the session (the ops inbox, storage failures), and the
executor needs the recorder (its callbacks) before either of those exists. :class:`SessionBinding` breaks the
circle: its methods are handed to the recorder and to the executor's callbacks at construction, and
:func:`~rapidfire_nb.experiment.start.open_session` binds the executor, then the session, once they are built.
A call before its side is bound raises a clear RuntimeError instead of reaching a half-built session.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import StorageError

__all__ = ["SessionBinding"]


class SessionBinding:
    """Forwards the recorder's and the executor's calls to the executor and session, once they are bound.

    Thread-safe enough for its use: each attribute is set once, on ``run_fit``'s thread, before the scheduler and
    the recorder's thread start calling (a bound attribute is only read afterwards).
    """

    def __init__(self) -> None:
        self._executor: Any = None
        self._session: Any = None

    def bind_executor(self, executor: Any) -> None:
        """The executor whose ``checkpoint_dir`` the recorder reads (a ``TorchExecutor`` or a device pool)."""
        self._executor = executor

    def bind_session(self, session: Any) -> None:
        """The ``FitSession`` that serves the ops inbox and stops training on a storage failure."""
        self._session = session

    def _bound(self, value: Any, what: str, call: str) -> Any:
        if value is None:
            raise RuntimeError(f"{call} was called before open_session bound the {what}")
        return value

    # ------------------------------------------------------------------ the recorder's
    def checkpoint_dir(self, run_id: int) -> Path | None:
        """The run's latest written checkpoint folder (the executor's).

        Raises:
            RuntimeError: no executor bound yet.
        """
        path: Path | None = self._bound(self._executor, "executor", "checkpoint_dir").checkpoint_dir(run_id)
        return path

    def inbox_ops(self) -> Sequence[Any]:
        """The ops posted through the server since the last call (the session's).

        Raises:
            RuntimeError: no session bound yet.
        """
        ops: Sequence[Any] = self._bound(self._session, "session", "inbox_ops").inbox_ops()
        return ops

    # ------------------------------------------------------------------ the executor's
    def storage_failed(self, failure: StorageError) -> None:
        """A checkpoint or final-weights write failed: the session stops training (see ``FitSession``).

        Raises:
            RuntimeError: no session bound yet.
        """
        self._bound(self._session, "session", "storage_failed").storage_failed(failure)
