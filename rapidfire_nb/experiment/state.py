"""What one :class:`~.facade.Experiment` object holds, in one typed place: :class:`ExperimentState`.

The facade keeps one state object and hands it to :mod:`.lifecycle` (opening, ``run_fit``, ``end``) and
:mod:`.panel_source` (the panel's reads), which read and change it instead of the facade's attributes. Where they
need the facade itself (the registry's current experiment, the object the panel reads), they get it as an
:class:`Owner`: the public surface it has. Threads: the state is read and changed on the caller's thread (cells,
the magic); the scheduler thread reads ``session`` through the panel source only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from kernel_scheduler import OpAck

    from .._writer_lock import WriterLock
    from ..store import Store
    from .reporter import Reporter
    from .session import FitSession

__all__ = ["ExperimentState", "Owner"]


@dataclass(eq=False)
class ExperimentState:
    """One experiment object's state.

    Attributes:
        name: the experiment's name (its folder's name).
        path: its folder (``<experiments root>/<name>``).
        store: its store (``store.sqlite``; read-only when ``read_only`` says why).
        lock: its writer lock (``writer.lock``: one process trains it).
        reporter: where its ``[rapidfire]`` lines go.
        tracking: the tracking backends chosen (``("tensorboard",)``, checked).
        read_only: why this process may only read the experiment (None: it may train it).
        trackers_off: backends that failed in this object: left out of its next ``run_fit`` too.
        session: what the latest ``run_fit`` in this process wired, or None.
        panels: the live panels shown (the widget or the text progress), frozen at ``end()``.
        ended: ``end()`` was called (no more training or IC Ops through this object).
    """

    name: str
    path: Path
    store: Store
    lock: WriterLock
    reporter: Reporter
    tracking: tuple[str, ...]
    read_only: str | None = None
    trackers_off: set[str] = field(default_factory=set)
    session: FitSession | None = None
    panels: list[Any] = field(default_factory=list)
    ended: bool = False

    def say(self, text: str) -> None:
        """Print one ``[rapidfire]`` line (unless quiet)."""
        self.reporter.say(text)


class Owner(Protocol):
    """The facade as :mod:`.lifecycle` and :mod:`.panel_source` see it: what the registry keeps (the current
    experiment) and what the panel reads and calls (``rapidfire_nb.panel.progress.PanelSource``)."""

    @property
    def experiment_name(self) -> str: ...

    @property
    def path(self) -> Path: ...

    @property
    def ended(self) -> bool: ...

    @property
    def training(self) -> bool: ...

    def end(self) -> None: ...

    def panel_snapshot(self) -> dict[str, Any]: ...

    def metrics_since(self, cursor: int) -> tuple[list[dict[str, Any]], int]: ...

    def submit_op(
        self,
        kind: str,
        run_id: int,
        op_id: str | None = None,
        changes: dict[str, Any] | None = None,
        warm_start: bool = False,
        source: str = "api",
        reason: str | None = None,
    ) -> OpAck: ...
