"""What the panel's front ends hold, and the messages that bring one up to date: pushes and answers to pulls.

A front end holds the source's metric points up to a *cursor* (``metrics_since``'s, the store's metric row id)
and the snapshot of a *version* (``version`` counts the snapshot's changes, the clock aside; ``ops_version``
the ops log's). Every state message the kernel sends carries these sequence numbers (``since``: the cursor
before its points, ``cursor``: after them), so a front end can tell whether the points continue what it holds,
are held already, or whether it missed something:

* the **pump** (:meth:`Feed.push`, every ~200 ms from the pump thread) sends what changed since the last
  message any front end was sent (the fast path, where unsolicited kernel messages arrive);
* a **pull** (``{"type": "pull", "req", "since", "version", "ops_version"}``, about every second from each
  front end) is answered by :meth:`Feed.answer` in the comm handler, i.e. *in reply to the front end's own
  message* (its parent header), with exactly what that front end lacks. Where the front end drops kernel
  messages that answer none of its requests (Colab, some VS Code versions), pulls are the path that works;
* ``hello`` (:meth:`Feed.full`): a full snapshot, every point from cursor 0 (``reset``).

Both paths broadcast on the widget's comm (every view of the model gets every message) and run under the
panel's one lock, so their messages go out in sequence order and the sequence numbers stay consistent.

Messages (all also carry ``cursor``, ``version``, ``ops_version``; a reply carries ``reply_to``: the pull's
``req``): ``snapshot`` (``reset``), ``update`` (``since``; ``snapshot`` without ``ops`` when the ops log did not
change for this front end; ``None`` when nothing did) and, when a message would carry more than
:data:`POINTS_PER_MESSAGE` points, ``parts`` on it and that many ``points`` messages after it (``part`` 1..).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..view.wire import clean_json, encode_points
from .progress import PanelSource

__all__ = ["POINTS_PER_MESSAGE", "Feed", "plot_settings_request", "pull_request", "same_reply_route"]

#: Points per message (keeps each websocket frame a few MB at most).
POINTS_PER_MESSAGE = 20_000
#: Snapshot keys that move with the clock alone: not a change (the front end extrapolates the clock).
_CLOCK_KEYS = ("now", "elapsed_s", "stats")

Emit = Callable[[dict[str, Any]], None]


@contextlib.contextmanager
def same_reply_route(comm: Any) -> Iterator[None]:
    """Leave the comm's routing of front-end messages as it was across a message the panel publishes on it.

    ipykernel 7 sends a comm's next front-end message to the subshell of the last message published on the comm
    (``BaseComm._reply_subshell_id``: the subshell of that message's parent request), and JupyterLab 4.6 sends
    widget messages on a subshell. Answers (parented to the front end's pulls) and the pump's pushes (parented to
    whichever request the kernel handled last) would move the comm's messages onto that subshell: handled while a
    cell runs, their busy/idle statuses show the kernel idle in the notebook while the cell runs, at random. The
    route stays the one the comm's opening set (the main shell for a panel shown by a cell: requests wait while a
    cell runs, as in Colab, and the pump's pushes keep the panel live meanwhile). A comm without that attribute
    (other kernels, ipykernel 6) is left alone.
    """
    lock = getattr(comm, "_reply_subshell_lock", None)
    if lock is None or not hasattr(comm, "_reply_subshell_id"):
        yield
        return
    with lock:
        route = comm._reply_subshell_id
    try:
        yield
    finally:
        with lock:
            comm._reply_subshell_id = route


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def pull_request(content: Mapping[str, Any]) -> tuple[str, int | None, int | None, int | None]:
    """``(req, since, version, ops_version)`` of a front end's ``pull``; a field it does not hold (or a bad one)
    is None (``since`` None: it holds nothing, the answer is a full snapshot)."""
    req = content.get("req")
    return (
        str(req) if isinstance(req, (str, int)) else "",
        _int_or_none(content.get("since")),
        _int_or_none(content.get("version")),
        _int_or_none(content.get("ops_version")),
    )


#: Bounds of a front end's ``plot_settings`` message (it comes from a browser): plots, characters per metric name.
MAX_PLOTS, MAX_METRIC_CHARS = 8, 200
_Y_SCALES = ("auto", "linear", "log")


def plot_settings_request(content: Mapping[str, Any]) -> dict[str, Any] | None:
    """The curve settings of a front end's ``plot_settings`` message (``{"metrics": [str], "smoothing": number,
    "y_scale": "auto"|"linear"|"log"}``), as the static copy's ``plot_settings``
    (:func:`rapidfire_nb.panel.static.plot_settings`); None when any field is missing or bad: 1 to
    :data:`MAX_PLOTS` metric names of 1 to :data:`MAX_METRIC_CHARS` characters, a finite smoothing in 0..0.999
    (a bool is not a number), a known y scale."""
    metrics, smoothing, scale = content.get("metrics"), content.get("smoothing"), content.get("y_scale")
    if not isinstance(metrics, list) or not 0 < len(metrics) <= MAX_PLOTS:
        return None
    if not all(isinstance(m, str) and 0 < len(m) <= MAX_METRIC_CHARS for m in metrics):
        return None
    if not isinstance(smoothing, (int, float)) or isinstance(smoothing, bool) or not 0 <= smoothing <= 0.999:
        return None  # NaN fails the comparison too
    if not isinstance(scale, str) or scale not in _Y_SCALES:
        return None
    return {"metrics": list(metrics), "smoothing": float(smoothing), "y_scale": scale}


class Feed:
    """The sequence numbers of one panel and the messages built from its source.

    Thread-safety: every method takes ``lock`` (the panel's one lock, held while anything writes the widget),
    so the pump thread and the comm handler (the kernel's shell or a subshell thread) never interleave.

    Args:
        source: the panel source (``panel_snapshot``, ``metrics_since``).
        emit: sends one message on the widget's comm (the panel's ``send``, a no-op once closed).
        lock: the panel's lock (re-entrant: the panel holds it around a reply and its trait update).
    """

    def __init__(self, source: PanelSource, emit: Emit, lock: threading.RLock) -> None:
        self._source = source
        self._emit = emit
        self._lock = lock
        self.cursor = 0  # the newest point any front end was sent
        self.version = 0  # the snapshot's version (bumped when it changed, the clock aside)
        self.ops_version = 0  # the version in which the ops log last changed
        self._key: str | None = None
        self._ops_key: str | None = None
        self._sent_version = -1  # the newest version any front end was sent

    def _read(self) -> dict[str, Any]:
        """The source's snapshot now; bumps the versions when it changed."""
        snapshot: dict[str, Any] = clean_json(self._source.panel_snapshot())
        key = json.dumps({k: v for k, v in snapshot.items() if k not in _CLOCK_KEYS}, sort_keys=True)
        if key != self._key:
            self._key = key
            self.version += 1
            ops_key = json.dumps(snapshot.get("ops"), sort_keys=True)
            if ops_key != self._ops_key:
                self._ops_key = ops_key
                self.ops_version = self.version
        return snapshot

    def _seq(self, since: int | None = None) -> dict[str, Any]:
        seq: dict[str, Any] = {
            "now": time.time(),
            "cursor": self.cursor,
            "version": self.version,
            "ops_version": self.ops_version,
        }
        if since is not None:
            seq["since"] = since
        return seq

    def _send(self, head: dict[str, Any], points: list[dict[str, Any]]) -> None:
        """``head`` with the first batch of ``points``, then one ``points`` message per further batch."""
        batches = [points[i : i + POINTS_PER_MESSAGE] for i in range(0, len(points), POINTS_PER_MESSAGE)]
        head["points"] = encode_points(batches[0]) if batches else None
        if len(batches) > 1:
            head["parts"] = len(batches)
        self._emit(head)
        for part, batch in enumerate(batches[1:], start=1):
            self._emit(
                {
                    "type": "points",
                    "points": encode_points(batch),
                    "cursor": head["cursor"],
                    "part": part,
                    "parts": len(batches),
                }
            )
        self._sent_version = max(self._sent_version, self.version if head.get("snapshot") else -1)

    def full(self, reply_to: str | None = None) -> dict[str, Any]:
        """Send a full snapshot and every point so far (``reset``); returns the snapshot."""
        with self._lock:
            snapshot = self._read()
            points, self.cursor = self._source.metrics_since(0)
            head = {"type": "snapshot", "reset": True, "snapshot": snapshot, **self._seq()}
            if reply_to is not None:
                head["reply_to"] = reply_to
            self._send(head, points)
            return snapshot

    def push(self) -> dict[str, Any] | None:
        """The pump's tick: send what changed since the last message any front end got. Returns the snapshot
        when something was sent, else None."""
        with self._lock:
            snapshot = self._read()
            since = self.cursor
            points, self.cursor = self._source.metrics_since(since)
            fresh = self.version > self._sent_version
            if not points and not fresh:
                return None
            sent = None
            if fresh:
                # the ops log only when it changed since the last snapshot sent
                with_ops = self.ops_version > self._sent_version
                sent = snapshot if with_ops else {k: v for k, v in snapshot.items() if k != "ops"}
            self._send({"type": "update", "snapshot": sent, **self._seq(since)}, points)
            return snapshot

    def answer(
        self, req: str, since: int | None, version: int | None, ops_version: int | None
    ) -> dict[str, Any]:
        """Answer one front end's pull: the points after its cursor ``since`` and the snapshot when its
        ``version`` is not the current one (with the ops log when its ``ops_version`` is not). A front end that
        holds nothing, or a cursor ahead of the source's, gets a full snapshot. Returns the snapshot."""
        with self._lock:
            snapshot = self._read()
            if since is None or since > self.cursor:
                return self.full(reply_to=req)
            points, cursor = self._source.metrics_since(since)
            self.cursor = max(self.cursor, cursor)
            sent = None
            if version != self.version:
                with_ops = ops_version != self.ops_version
                sent = snapshot if with_ops else {k: v for k, v in snapshot.items() if k != "ops"}
            head = {"type": "update", "snapshot": sent, "reply_to": req, **self._seq(since)}
            head["cursor"] = cursor
            self._send(head, points)
            return snapshot
