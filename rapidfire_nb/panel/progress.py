"""Text progress for scripts and terminals, and the pump thread the panel shares with it.

:class:`TextProgress` prints one line per finished chunk or status change, read from a panel source (the
contract in docs/ARCHITECTURE.md, "Panel source"); :class:`Pump` is the background thread (a ``Thread`` plus
``Event`` s) that both it and the notebook panel poll their source with.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import IO, TYPE_CHECKING, Any, Protocol

from kernel_scheduler import RunStatus

from ..view import format_chunk_line

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["PanelSource", "Pump", "TextProgress", "print_chunk_line"]

_log = logging.getLogger(__name__)

#: Poll interval once nothing changed for ``_IDLE_AFTER_S`` seconds (commands still wake the pump at once).
_IDLE_INTERVAL_S = 1.0
_IDLE_AFTER_S = 30.0
#: Minimum gap between two pump ticks, whatever wakes it: caps the message rate at ~10/s.
_MIN_GAP_S = 0.1


class PanelSource(Protocol):
    """What the panel reads and calls (implemented by ``Experiment``; see ``docs/ARCHITECTURE.md``)."""

    def panel_snapshot(self) -> dict[str, Any]: ...

    def metrics_since(self, cursor: int) -> tuple[list[dict[str, Any]], int]: ...

    def submit_op(
        self,
        kind: str,
        run_id: int,
        op_id: str | None = None,
        changes: dict[str, Any] | None = None,
        warm_start: bool = False,
        source: str = "panel",
        reason: str | None = None,
    ) -> Any: ...


class Pump:
    """A background thread calling ``tick()`` every ``interval`` seconds, or at once when woken.

    A ``Thread`` plus ``Event`` s, used as a context manager; ``stop()`` joins the thread.
    """

    def __init__(self, tick: Callable[[], bool], interval: float, name: str) -> None:
        self._tick = tick
        self.interval = interval
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _loop(self) -> None:
        quiet_since = time.monotonic()
        while not self._stop.is_set():
            interval = self.interval
            if time.monotonic() - quiet_since > _IDLE_AFTER_S:
                interval = max(interval, _IDLE_INTERVAL_S)
            self._wake.wait(interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                changed = self._tick()
            except Exception:  # noqa: BLE001 - the pump must outlive a bad tick
                _log.exception("rapidfire panel: pump tick failed")
                changed = False
            if changed:
                quiet_since = time.monotonic()
            self._stop.wait(_MIN_GAP_S)


def print_chunk_line(run: Mapping[str, Any], *, file: IO[str] | None = None, **kwargs: Any) -> str:
    """Print :func:`format_chunk_line` (to ``file``, default stdout) and return the line."""
    line = format_chunk_line(run, **kwargs)
    print(line, file=file if file is not None else sys.stdout, flush=True)
    return line


class TextProgress:
    """Compact text progress for scripts and terminals: one line per finished chunk or status change.

    A pump thread polls ``source.panel_snapshot()`` (every ``interval`` seconds) and prints a line per run
    whose ``chunks_done`` or status changed since the last poll. Use as a context manager or call
    :meth:`close`; :meth:`poll` does one round synchronously.
    """

    def __init__(
        self, source: PanelSource, *, interval: float = 0.5, file: IO[str] | None = None, start: bool = True
    ) -> None:
        self._source = source
        self._file = file
        self._seen: dict[Any, tuple[Any, Any]] = {}
        self._header_done = False
        self._pump = Pump(self.poll, interval, name="rapidfire-text-progress")
        if start:
            self._pump.start()

    def poll(self) -> bool:
        """Print lines for what changed since the last call. Returns True if anything was printed."""
        snap = self._source.panel_snapshot()
        out = self._file if self._file is not None else sys.stdout
        printed = False
        if not self._header_done:
            runs = snap.get("runs") or []
            print(
                f"[{snap.get('experiment', '')}] {len(runs)} run{'' if len(runs) == 1 else 's'}, "
                f"{snap.get('num_chunks')} chunks per epoch"
                " (text progress: one line per chunk)",
                file=out,
                flush=True,
            )
            self._header_done = True
            printed = True
        elapsed = snap.get("elapsed_s")  # training time (frozen while nothing trains)
        if elapsed is None and snap.get("started_at"):  # a source without a training clock
            elapsed = (snap.get("now") or time.time()) - snap["started_at"]
        for run in snap.get("runs") or []:
            key = (run.get("chunks_done"), run.get("status"))
            old = self._seen.get(run.get("run_id"), (0, RunStatus.NEW.value))
            self._seen[run.get("run_id")] = key
            chunk_done = (key[0] or 0) > (old[0] or 0)
            status_news = key[1] != old[1] and key[1] not in (RunStatus.NEW.value, RunStatus.ONGOING.value)
            if not (chunk_done or status_news):
                continue
            print_chunk_line(
                run,
                file=out,
                num_chunks=snap.get("num_chunks"),
                hparam_columns=snap.get("hparam_columns") or (),
                experiment=snap.get("experiment", ""),
                elapsed=elapsed,
            )
            printed = True
        return printed

    def close(self) -> None:
        """Stop the polling thread (joined)."""
        self._pump.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
