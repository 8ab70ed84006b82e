"""The live panel: ``RunPanel`` (an ``anywidget.AnyWidget``) and a text fallback for scripts.

How data flows (measured facts behind it are in ``shared/DESIGN.md``, "The notebook side"):

* The panel reads a *panel source* (the contract in ``docs/ARCHITECTURE.md``: ``panel_snapshot()``,
  ``metrics_since(cursor)``, ``submit_op(...)``). ``Experiment`` implements it;
  ``rapidfire_nb.testing.fake_source.FakeSource`` does too, for tests and demos.
* Two paths bring the front ends up to date (:mod:`rapidfire_nb.panel.pull`, its sequence numbers): the
  **pump thread** pushes what changed every ~200 ms (at most one coalesced ``update``, so the front end gets a
  few messages per second whatever the step rate; the server drops IOPub messages above 1,000/s), and each
  front end **pulls** about every second (``pull``), answered in the comm handler. The push is the fast path
  where unsolicited kernel messages arrive; the pull works where only replies to the front end's own messages
  do (Colab, some VS Code versions).
* Comm handlers (``on_msg``; the kernel's shell thread, or a subshell thread) answer in place, so the answer is
  a reply to the front end's request (its parent header): ``hello`` (sent by every rendered view) -> a full
  ``snapshot`` with every metric point so far (covers reloads, second views, redisplay); ``pull`` -> what that
  front end lacks; ``op`` -> ``source.submit_op`` once per ``op_id``, then an ``ack``; ``plot_settings`` (the
  view's curve metrics, smoothing, y scale, checked by :func:`~.pull.plot_settings_request`) -> kept for the static
  copy (:meth:`RunPanel.static_bundle`), no answer; ``need_plotly`` ->
  plotly.min.js from the installed ``plotly`` package as one binary buffer (never inlined in ``_esm``: it would
  cost 4.8 MB per widget and per saved notebook). Two threads write the widget: one lock (``_lock``) guards
  every send and trait set, and the sequence numbers.
* Synced traits hold only the small header (``summary``), so a notebook saved with widget state stays small.

Messages (Python -> front end, all ``{"type": ...}``):

* ``snapshot``: ``{"snapshot": <panel_snapshot()>, "points": <encoded>, "reset": true, "now": float}``;
  when there are many points, further ``{"type": "points", "points": <encoded>, "part": i}`` messages follow.
* ``update``: ``{"snapshot": <panel_snapshot()> | None, "points": <encoded> | None, "now": float}``; the
  snapshot is sent only when it changed, and without its ``ops`` key when the ops log did not change.
* Both carry the sequence numbers ``since`` / ``cursor`` / ``version`` / ``ops_version`` and, in answer to a
  ``pull`` (``{"req", "since", "version", "ops_version"}``) or a ``hello``, ``reply_to`` (see :mod:`.pull`).
* ``ack``: ``{"ack": <OpAck.to_dict()>}``; ``plotly`` (with one buffer); ``error``: ``{"message": str}``.
* ``frozen``: ``{"html": str}``, the static copy (:mod:`rapidfire_nb.panel.static`), sent by :meth:`RunPanel.freeze`
  just before the widget closes: a view whose output the display update did not reach shows it in place.

Encoded points are columnar: ``{"names": [metric names], "run": [...], "step": [...], "samples": [...],
"name": [index into names], "value": [...], "wall": [...]}`` (non-finite values become ``null``; ``wall`` is the
point's wall time in unix seconds).

The static copy: :func:`display_panel` displays the widget with a display id. :meth:`RunPanel.freeze`
(``experiment.end()``, and a clean kernel shutdown or restart through :func:`rapidfire_nb.frontend.on_kernel_shutdown`)
replaces that output by the panel's final state as ``text/html`` (tables and inline SVG images) + ``text/plain``,
which the saved notebook keeps and GitHub / nbviewer display, then closes the widget.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import anywidget
import traitlets

from kernel_scheduler import RunStatus

from ..frontend import in_colab, in_kernel, on_kernel_shutdown
from ..view import format_chunk_line
from ..view.wire import clean_json, decode_points, encode_points  # noqa: F401  (re-exported: the wire format)
from .esm_bundle import bundle_esm
from .progress import PanelSource, Pump, TextProgress, print_chunk_line
from .pull import Feed, plot_settings_request, pull_request, same_reply_route
from .static import static_bundle

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "PanelSource",
    "RunPanel",
    "TextProgress",
    "bundle_esm",
    "display_panel",
    "display_static",
    "format_chunk_line",
    "plotly_js_path",
    "print_chunk_line",
]

_log = logging.getLogger(__name__)

#: Seconds between two polls of the source while something changes.
POLL_INTERVAL_S = 0.2
#: Acks remembered for de-duplicating op_ids.
_MAX_REMEMBERED_ACKS = 10_000


def _widgets_dir() -> Path:
    """The folder of panel.js, its sibling modules and panel.css: ``rapidfire_nb/_widgets`` in a wheel, else the
    repo's ``widgets/``."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "_widgets"
    if (installed / "panel.js").is_file():
        return installed
    return package.parent / "widgets"


def plotly_js_path() -> Path:
    """Path of ``plotly.min.js`` shipped inside the installed ``plotly`` package (found without importing it).

    Raises:
        ImportError: when plotly is not installed.
    """
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("The panel's curves need plotly: pip install plotly")
    for location in spec.submodule_search_locations:
        path = Path(location) / "package_data" / "plotly.min.js"
        if path.is_file():
            return path
    raise ImportError(
        "plotly is installed but plotly/package_data/plotly.min.js is missing; reinstall plotly"
    )


def _ack_dict(ack: Any) -> dict[str, Any]:
    if hasattr(ack, "to_dict"):
        return dict(ack.to_dict())
    if isinstance(ack, Mapping):
        return dict(ack)
    return dict(vars(ack))


def _reason(cmd: Mapping[str, Any]) -> dict[str, Any]:
    """A stop's own reason from the front end ("stop all but best 2 by eval_loss"), as ``submit_op`` keywords."""
    reason = cmd.get("reason")
    return {"reason": reason} if isinstance(reason, str) and reason else {}


def _summary(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """The small header state kept in a synced trait (saved with the notebook's widget state)."""
    runs = snapshot.get("runs") or []
    counts: dict[str, int] = {}
    for run in runs:
        counts[str(run.get("status"))] = counts.get(str(run.get("status")), 0) + 1
    active = snapshot.get("on_device") is not None or any(
        run.get("status") in (RunStatus.NEW.value, RunStatus.ONGOING.value) for run in runs
    )
    summary: dict[str, Any] = clean_json(
        {
            "experiment": snapshot.get("experiment", ""),
            "started_at": snapshot.get("started_at"),
            "progress": snapshot.get("progress", ""),
            "on_device": snapshot.get("on_device"),
            "num_chunks": snapshot.get("num_chunks"),
            "num_runs": len(runs),
            "counts": counts,
            "active": bool(active),
        }
    )
    return summary


class RunPanel(anywidget.AnyWidget):
    """Live panel of an experiment: header, run table with IC Ops buttons, Plotly curves, ops log.

    Args:
        source: a panel source (see :class:`PanelSource`).
        poll_interval: seconds between polls of the source (default 0.2).
        start: start the pump thread now (tests may pass ``False`` and call :meth:`pump_once`).

    Call :meth:`close` to stop the pump thread (it also closes the widget's views).
    """

    #: widgets/panel.js with its sibling modules inlined (anywidget loads one module text)
    _esm = bundle_esm(_widgets_dir() / "panel.js")
    _css = _widgets_dir() / "panel.css"

    #: Small header state (experiment, progress, run on device, status counts); never metric history.
    summary = traitlets.Dict().tag(sync=True)

    def __init__(
        self,
        source: PanelSource,
        *,
        poll_interval: float = POLL_INTERVAL_S,
        start: bool = True,
        **kwargs: Any,
    ) -> None:
        snapshot = clean_json(source.panel_snapshot())
        summary = _summary(snapshot)
        summary["updated_at"] = clean_json(snapshot.get("now") or time.time())
        super().__init__(summary=summary, **kwargs)
        self._source = source
        # one lock, held while anything writes the widget (sends, trait sets) and around the sequence numbers:
        # the pump thread and the comm handler (the shell or a subshell thread) both write
        self._lock = threading.RLock()
        self._feed = Feed(source, self._emit, self._lock)
        self._acks: dict[str, dict[str, Any]] = {}
        self._last_error: str | None = None
        self._closed = False
        self._frozen = False
        self._plot_settings: dict[str, Any] | None = None  # the front end's last valid ``plot_settings``
        self._display_handles: list[Any] = []  # IPython DisplayHandles of this panel's outputs
        self.on_msg(self._on_frontend_msg)
        self._pump = Pump(self.pump_once, poll_interval, name="rapidfire-panel-pump")
        if start:
            self._pump.start()

    # -- comm side: answer in place (a reply to the front end's own message) -----------------------------
    def _on_frontend_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if not isinstance(content, dict):
            return
        kind = content.get("type")
        with self._lock:
            if self._closed:
                return
            if kind == "op":
                self._emit({"type": "ack", "ack": self._submit(content)})
                self._pump.wake()  # the op's effect (a queued stop...) goes out on the next tick
            elif kind == "need_plotly":
                self._push_plotly()
            elif kind == "hello":
                self._guarded(self._feed.full)
            elif kind == "pull":
                self._guarded(lambda: self._feed.answer(*pull_request(content)))
            elif kind == "plot_settings":  # a bad one (it comes from a browser) is ignored
                self._plot_settings = plot_settings_request(content) or self._plot_settings

    # -- pump side: the fast path -----------------------------------------------------------------------
    def _emit(self, content: dict[str, Any], buffers: list[bytes] | None = None) -> None:
        with self._lock, same_reply_route(getattr(self, "comm", None)):
            if not self._closed:
                self.send(content, buffers=buffers)

    def pump_once(self) -> bool:
        """One pump tick: send what changed since the last message. Returns True if anything was sent.

        Called by the pump thread; tests may call it directly on a panel made with ``start=False``.
        """
        with self._lock:
            return self._guarded(self._feed.push)

    def _guarded(self, read: Callable[[], dict[str, Any] | None]) -> bool:
        """Run ``read`` (a :class:`~rapidfire_nb.panel.pull.Feed` call returning the snapshot it read, or None when
        it sent nothing); a source that fails is reported to the panel once per distinct message, not raised.
        Returns whether anything was sent."""
        try:
            snapshot = read()
            self._last_error = None
        except Exception as exc:  # noqa: BLE001 - report to the panel, keep pumping
            message = f"{type(exc).__name__}: {exc}"
            if message == self._last_error:
                return False
            self._last_error = message
            _log.warning("rapidfire panel: reading the experiment failed: %s", message)
            self._emit({"type": "error", "message": message})
            return True
        if snapshot is None:
            return False
        self._set_summary(snapshot)
        return True

    def _submit(self, cmd: dict[str, Any]) -> dict[str, Any]:
        op_id = str(cmd.get("op_id") or "")
        if op_id and op_id in self._acks:
            return self._acks[op_id]  # a repeated message: answered, never applied twice
        kind = str(cmd.get("kind", ""))
        run_id = cmd.get("run_id")
        ack: dict[str, Any]
        try:
            if not isinstance(run_id, int) or isinstance(run_id, bool):
                raise TypeError(f"bad run id {run_id!r}")
            ack = clean_json(
                _ack_dict(
                    self._source.submit_op(
                        kind,
                        run_id,
                        op_id=op_id or None,
                        changes=cmd.get("changes") or None,
                        warm_start=bool(cmd.get("warm_start", False)),
                        source="panel",
                        **_reason(cmd),
                    )
                )
            )
        except Exception as exc:  # noqa: BLE001 - an op error is shown in the panel, not raised
            ack = {
                "op_id": op_id,
                "run_id": run_id,
                "kind": kind,
                "state": "rejected",
                "message": str(exc) or type(exc).__name__,
            }
        ack.setdefault("op_id", op_id)
        ack.setdefault("kind", kind)
        if op_id:
            if len(self._acks) >= _MAX_REMEMBERED_ACKS:
                self._acks.pop(next(iter(self._acks)))
            self._acks[op_id] = ack
        return ack

    def _push_plotly(self) -> None:
        try:
            data = plotly_js_path().read_bytes()
        except (ImportError, OSError) as exc:
            self._emit({"type": "error", "message": f"cannot load plotly.js: {exc}"})
            return
        self._emit({"type": "plotly", "size": len(data)}, buffers=[data])

    def _set_summary(self, snapshot: Mapping[str, Any]) -> None:
        summary = _summary(snapshot)
        if summary != {k: v for k, v in self.summary.items() if k != "updated_at"}:
            summary["updated_at"] = clean_json(snapshot.get("now") or time.time())
            with self._lock, same_reply_route(getattr(self, "comm", None)):
                if not self._closed:
                    self.summary = summary

    def __repr__(self) -> str:
        """One line, shown as text/plain where widgets do not render (e.g. ``jupyter console``)."""
        s = self.summary or {}
        counts = ", ".join(f"{n} {st.lower()}" for st, n in sorted((s.get("counts") or {}).items()))
        device = f"run {s['on_device']} on device" if s.get("on_device") is not None else "device idle"
        runs = s.get("num_runs", 0)
        return (
            f"<RunPanel {s.get('experiment', '')!r}: {runs} run{'' if runs == 1 else 's'}"
            f"{' (' + counts + ')' if counts else ''}; {s.get('progress') or '-'}; {device}>"
        )

    # -- lifecycle --------------------------------------------------------------------------------------
    def static_bundle(self, note: str | None = None) -> dict[str, str]:
        """The panel's current state as ``{"text/html", "text/plain"}`` (:func:`~rapidfire_nb.panel.static.static_bundle`),
        its curves drawn with the plot settings a view last reported (``plot_settings``), else the defaults."""
        snapshot = clean_json(self._source.panel_snapshot())
        with self._lock:
            if self._plot_settings is not None:
                snapshot = {**snapshot, "plot_settings": dict(self._plot_settings)}
        points, _ = self._source.metrics_since(0)
        return static_bundle(snapshot, points, note=note)

    def add_display_handle(self, handle: Any) -> None:
        """Remember an IPython ``DisplayHandle`` of this panel: :meth:`freeze` replaces that output."""
        self._display_handles.append(handle)

    def freeze(self, note: str | None = None) -> None:
        """Replace every output of this panel by its static copy, then stop the pump and close the widget.

        The outputs displayed by :func:`display_panel` are updated in place (``update_display_data``), so the
        notebook keeps the final state as ``text/html``; views that update does not reach (a page reloaded
        since) get a ``frozen`` message and show the copy themselves. Idempotent; never raises (a failure is
        logged and the widget is closed as before).
        """
        if self._frozen:
            return
        self._frozen = True
        self._pump.stop()
        try:
            bundle = self.static_bundle(note)
            for handle in self._display_handles:
                handle.update(bundle, raw=True)
            self._emit({"type": "frozen", "html": bundle["text/html"]})
        except Exception:  # noqa: BLE001 - a panel that cannot be drawn is still closed
            _log.exception("rapidfire panel: could not draw the static copy")
        _LIVE_PANELS.discard(self)
        self.close()

    @property
    def frozen(self) -> bool:
        """True once :meth:`freeze` ran."""
        return self._frozen

    @property
    def pump_alive(self) -> bool:
        """Whether the pump thread is running."""
        pump = getattr(self, "_pump", None)
        return pump is not None and pump.alive

    def close(self) -> None:
        """Stop the pump thread (joined) and close the widget."""
        pump = getattr(self, "_pump", None)
        if pump is not None:
            pump.stop()
        lock = getattr(self, "_lock", None)
        if lock is not None:
            with lock:
                self._closed = True
        super().close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------------------
# Choosing the view
# ---------------------------------------------------------------------------------------------------------

COLAB_FALLBACK_HINT = (
    "If the panel below stays blank, widgets are not rendering here: run "
    "`%rapidfire tensorboard` for the curves (TensorBoard)."
)


#: Panels displayed in this kernel and not frozen yet (frozen at a clean kernel shutdown).
_LIVE_PANELS: weakref.WeakSet[RunPanel] = weakref.WeakSet()
SHUTDOWN_NOTE = (
    "The kernel shut down: a static copy of the live panel at that moment, readable without a kernel."
)


def _freeze_live_panels() -> None:
    for panel in list(_LIVE_PANELS):
        panel.freeze(note=SHUTDOWN_NOTE)


def display_panel(source: PanelSource, *, file: IO[str] | None = None) -> RunPanel | TextProgress:
    """Show the experiment where the user looks: the widget in a kernel, text progress elsewhere.

    * In an IPython kernel (JupyterLab, Notebook 7, VS Code, Colab): displays a :class:`RunPanel` with a
      display id (:meth:`RunPanel.freeze` replaces that output by the static copy; so does a clean kernel
      shutdown), returns it. In Colab it also prints one line naming ``%rapidfire tensorboard`` as the fallback.
    * Outside a kernel (scripts, terminal IPython): returns a started :class:`TextProgress`.

    The caller should not also return the panel as a cell's last value (it would be displayed twice).
    """
    if not in_kernel():
        return TextProgress(source, file=file)
    from IPython.display import display

    panel = RunPanel(source)
    if in_colab():
        print(COLAB_FALLBACK_HINT, file=file if file is not None else sys.stdout)
    handle = display(panel, display_id=True)
    if handle is not None:
        panel.add_display_handle(handle)
    _LIVE_PANELS.add(panel)
    on_kernel_shutdown(_freeze_live_panels)
    return panel


def display_static(source: PanelSource, *, note: str | None = None) -> dict[str, str]:
    """Display the static copy of ``source``'s panel (e.g. after ``experiment.end()``) and return its bundle."""
    points, _ = source.metrics_since(0)
    bundle = static_bundle(clean_json(source.panel_snapshot()), points, note=note)
    if in_kernel():
        from IPython.display import display

        display(bundle, raw=True)
    else:
        print(bundle["text/plain"])
    return bundle
