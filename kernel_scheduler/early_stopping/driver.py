"""The scheduler's side of an early-stopping policy: when it is asked, and how its decisions are applied.

:class:`PolicyDriver` is owned by the scheduler thread. It hands the policy each finished chunk and, once per loop
turn, the runs whose status or progress changed; it turns the decisions into ordinary stop ops (source
:data:`~.base.EARLY_STOPPING`, the reason in the payload) and new runs. A policy that raises is switched off with
one note: training goes on without it.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from ..ops import Op, OpAck, OpKind
from ..status import RunStatus
from .base import EARLY_STOPPING, ChunkResult, Decisions, EarlyStoppingPolicy, NewRun, RunState

__all__ = ["PolicyDriver"]

log = logging.getLogger(__name__)


class PolicyDriver:
    """Asks ``policy`` at the scheduler's decision points and applies what it decides.

    Args:
        policy: the experiment's early-stopping policy.
        submit: the scheduler's ``submit`` (a stop becomes an op like any other).
        add: ``add(new_run) -> run_id``: register a new run mid-experiment (like a cold clone).
        note: shows a sentence to the user.
    """

    def __init__(
        self,
        policy: EarlyStoppingPolicy,
        submit: Callable[[Op], OpAck],
        add: Callable[[NewRun], int],
        note: Callable[[str], None],
    ) -> None:
        self.policy: EarlyStoppingPolicy | None = policy
        self._submit = submit
        self._add = add
        self._note = note
        self._seen: dict[int, tuple[RunStatus, int, int, bool, int]] = {}

    def chunk(self, result: ChunkResult, runs: Sequence[RunState]) -> None:
        """A run ended a chunk: ask the policy, then apply its decisions."""
        self._ask("on_chunk", result, runs)

    def review(self, runs: Sequence[RunState]) -> None:
        """Once per loop turn (and after each chunk): tell the policy which runs changed since the last review."""
        changed = [s for s in runs if self._seen.get(s.run_id) != self._key(s)]
        if not changed:
            return
        self._seen.update({s.run_id: self._key(s) for s in changed})
        self._ask("on_change", runs, changed)

    def waits_at(self, chunk: int) -> bool:
        """The policy's :meth:`~.base.EarlyStoppingPolicy.waits_at` (False once it was switched off or fails)."""
        if self.policy is None:
            return False
        try:
            return bool(self.policy.waits_at(chunk))
        except Exception:
            log.debug("early stopping waits_at failed", exc_info=True)
            return False

    def progress(self) -> dict[str, Any]:
        """The policy's progress for the panel header ({} once it was switched off or fails to say)."""
        if self.policy is None:
            return {}
        try:
            return dict(self.policy.progress())
        except Exception:
            log.debug("early stopping progress failed", exc_info=True)
            return {}

    @staticmethod
    def _key(s: RunState) -> tuple[RunStatus, int, int, bool, int]:
        return (s.status, s.chunks_done, s.total_chunks, s.exempt, s.exempt_through)

    def _ask(self, method: str, *args: Any) -> None:
        policy = self.policy
        if policy is None:
            return
        try:
            decisions: Decisions = getattr(policy, method)(*args)
            self._apply(policy, decisions)
        except Exception as exc:  # a broken policy never takes training down
            self.policy = None
            log.debug("early stopping failed:\n%s", traceback.format_exc())
            self._note(
                f"early stopping stopped working ({type(exc).__name__}: {exc}); the runs train on without it"
            )

    def _apply(self, policy: EarlyStoppingPolicy, decisions: Decisions) -> None:
        for text in decisions.notes:
            self._note(text)
        for stop in decisions.stops:
            payload = {"reason": stop.reason, "chunk": stop.chunk}
            self._submit(Op(OpKind.STOP, stop.run_id, payload=payload, source=EARLY_STOPPING))
        for new in decisions.new_runs:
            policy.on_added(self._add(new), new)
