"""The kernel side of the panel's pull (rapidfire_nb/panel/pull.py): answers since a sequence number, sent in the
comm handler, and one lock between the handler and the pump thread."""

from __future__ import annotations

import threading
import time
import types
from typing import Any

import pytest

from rapidfire_nb.panel import RunPanel, decode_points
from rapidfire_nb.panel.pull import POINTS_PER_MESSAGE, Feed, pull_request, same_reply_route
from rapidfire_nb.testing.fake_source import FakeSource
from tests.rapidfire_nb.panel.test_panel import ListSource, Recorder, make_panel


def send(panel: RunPanel, msg_type: str, **extra: Any) -> None:
    """Deliver a front-end message as the comm does (``on_msg`` handler)."""
    panel._on_frontend_msg(panel, {"type": msg_type, **extra}, [])


class FrontEnd:
    """The front end's rule (widgets/pull.js ``sequence``): take a message's points only when they continue the
    cursor it holds (a reset always); otherwise it is behind and pulls from its cursor."""

    def __init__(self) -> None:
        self.points: list[dict[str, Any]] = []
        self.cursor: int | None = None
        self.version: int | None = None
        self.ops_version: int | None = None
        self.behind = False
        self.serial = 0
        self.snapshot: dict[str, Any] | None = None

    def take(self, msg: dict[str, Any]) -> None:
        if msg["type"] not in ("snapshot", "update"):
            return
        assert "parts" not in msg  # these tests stay under POINTS_PER_MESSAGE
        if msg.get("reset"):
            self.points = []
        if msg.get("reset") or (self.cursor is not None and msg["since"] == self.cursor):
            self.points += decode_points(msg["points"]) if msg["points"] else []
            self.cursor = msg["cursor"]
        elif self.cursor is None or msg["cursor"] > self.cursor:
            self.behind = True
        if msg["snapshot"] is not None and (self.version is None or msg["version"] >= self.version):
            self.version, self.snapshot = msg["version"], msg["snapshot"]
            if "ops" in msg["snapshot"]:
                self.ops_version = msg["ops_version"]

    def pull(self, panel: RunPanel) -> str:
        self.serial += 1
        req = f"fe:{self.serial}"
        self.behind = False
        send(panel, "pull", req=req, since=self.cursor, version=self.version, ops_version=self.ops_version)
        return req


def test_pull_answers_what_changed_since_the_front_ends_cursor() -> None:
    src = ListSource()
    for i in range(5):
        src.add(1, i, 1.0 / (i + 1))
    panel, rec = make_panel(src, start=False)
    try:
        send(panel, "hello")
        (snap,) = rec.of_type("snapshot")
        assert snap["reset"] and snap["cursor"] == 5 and snap["version"] == 1 and snap["ops_version"] == 1
        assert "reply_to" not in snap and len(decode_points(snap["points"])) == 5
        for i in range(5, 8):
            src.add(1, i, 0.1)
        send(panel, "pull", req="r1", since=5, version=1, ops_version=1)
        reply = rec.messages[-1][0]
        assert reply["type"] == "update" and reply["reply_to"] == "r1"
        assert (reply["since"], reply["cursor"]) == (5, 8)
        assert [p["step"] for p in decode_points(reply["points"])] == [5, 6, 7]
        # the snapshot changed (completed_steps): version 2, without the ops log (unchanged since version 1)
        assert reply["version"] == 2 and reply["ops_version"] == 1
        assert reply["snapshot"]["runs"][0]["completed_steps"] == 8 and "ops" not in reply["snapshot"]
        send(panel, "pull", req="r2", since=8, version=2, ops_version=1)
        reply = rec.messages[-1][0]
        assert reply["snapshot"] is None and reply["points"] is None  # it holds everything
        assert (reply["reply_to"], reply["since"], reply["cursor"]) == ("r2", 8, 8)
        src.status = "STOPPED"
        send(panel, "pull", req="r3", since=8, version=2, ops_version=0)  # an older ops log, too
        reply = rec.messages[-1][0]
        assert reply["version"] == 3 and reply["snapshot"]["runs"][0]["status"] == "STOPPED"
        assert reply["snapshot"]["ops"] == []
        # a front end that holds nothing (or a cursor the kernel never sent) gets a full snapshot
        for since in (None, 99):
            send(panel, "pull", req="r4", since=since)
            reply = rec.messages[-1][0]
            assert reply["type"] == "snapshot" and reply["reset"] and reply["reply_to"] == "r4"
            assert len(decode_points(reply["points"])) == 8
    finally:
        panel.close()


def test_a_front_end_that_gets_only_replies_sees_every_point_once() -> None:
    """Colab: the pump's pushes are dropped; the pull answers carry every point, each once, in order."""
    src = FakeSource(3, total_steps=40, eval_every=5, start=False)
    panel, rec = make_panel(src, start=False)
    colab = FrontEnd()
    try:
        send(panel, "hello")
        colab.take(rec.messages[-1][0])
        for round_ in range(12):
            for _ in range(3):
                src.step()
                panel.pump_once()  # pushed to every front end: dropped here
            seen = len(rec.messages)
            req = colab.pull(panel)
            replies = [m for m, _ in rec.messages[seen:] if m.get("reply_to") == req]
            assert len(replies) == 1, round_
            colab.take(replies[0])
            assert not colab.behind
        assert colab.points == src.metrics_since(0)[0]
        assert colab.snapshot is not None
        assert colab.snapshot["runs"] == src.panel_snapshot()["runs"]
    finally:
        panel.close()
        src.close()


def test_pushes_and_pulls_from_two_threads_never_interleave_and_stay_in_sequence() -> None:
    """The comm handler (another thread) and the pump both write the widget: one lock keeps each message whole
    and the sequence numbers consistent (cursors never go back; each push continues from the newest cursor sent),
    and the front end that gets only its replies takes every point exactly once."""
    src = ListSource()
    panel = RunPanel(src, poll_interval=0.01)
    inside = threading.Semaphore(1)
    overlaps: list[str] = []
    rec = Recorder()

    def guarded_send(content: dict[str, Any], buffers: list[bytes] | None = None) -> None:
        if not inside.acquire(blocking=False):
            overlaps.append(content["type"])
            return
        try:
            time.sleep(0.003)  # widen the window a second writer would hit
            rec(content, buffers)
        finally:
            inside.release()

    panel.send = guarded_send  # type: ignore[method-assign]
    colab = FrontEnd()
    produced = threading.Event()

    def produce() -> None:
        for i in range(600):
            src.add(1 + i % 2, i, 1.0 / (i + 1))
            if i % 5 == 0:
                time.sleep(0.01)
        produced.set()

    def pulls() -> None:  # the comm handler's thread: the Colab front end pulls from its own cursor
        while True:
            done = produced.is_set()
            n = len(rec.messages)
            req = colab.pull(panel)
            for m, _ in rec.messages[n:]:
                if m.get("reply_to") == req:
                    colab.take(m)
            if done:
                return
            time.sleep(0.005)

    threads = [threading.Thread(target=produce), threading.Thread(target=pulls)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        time.sleep(0.05)
        panel.close()
        assert overlaps == []
        newest = 0
        pushes = 0
        for m, _ in rec.messages:
            assert m["cursor"] >= newest, m  # in sequence order
            if m["type"] == "update" and "reply_to" not in m:
                assert m["since"] == newest  # a push continues from the newest cursor any front end got
                pushes += 1
            newest = m["cursor"]
        assert pushes > 0
        assert [p["step"] for p in colab.points] == list(range(600))
    finally:
        produced.set()
        panel.close()


def test_ops_and_plotly_are_answered_in_the_handler_under_the_lock() -> None:
    src = ListSource()
    panel, rec = make_panel(src, start=False)
    held: list[bool] = []
    real = rec.__call__

    def check_lock(content: dict[str, Any], buffers: list[bytes] | None = None) -> None:
        held.append(panel._lock._is_owned())  # type: ignore[attr-defined]
        real(content, buffers)

    panel.send = check_lock  # type: ignore[method-assign]
    try:
        send(panel, "op", op_id="o1", kind="stop", run_id=1)
        send(panel, "need_plotly")
        send(panel, "pull", req="p", since=0, version=0, ops_version=0)
        assert [m["type"] for m, _ in rec.messages] == ["ack", "plotly", "update"]
        assert rec.messages[0][0]["ack"]["op_id"] == "o1" and src.calls[0][:3] == ("stop", 1, "o1")
        assert held == [True, True, True]
        panel.close()
        send(panel, "pull", req="q", since=0)  # a closed panel answers nothing
        assert len(rec.messages) == 3
    finally:
        panel.close()


def test_large_answers_come_in_parts_that_share_one_cursor() -> None:
    src = ListSource()
    n = POINTS_PER_MESSAGE + 10
    src.points = [{"run_id": 1, "step": i, "samples_seen": i, "name": "loss", "value": 1.0} for i in range(n)]
    rec = Recorder()
    feed = Feed(src, rec, threading.RLock())
    feed.answer("r", 0, None, None)
    head, part = (m for m, _ in rec.messages)
    assert (head["type"], head["parts"], head["since"], head["cursor"]) == ("update", 2, 0, n)
    assert (part["type"], part["part"], part["parts"], part["cursor"]) == ("points", 1, 2, n)
    got = decode_points(head["points"]) + decode_points(part["points"])
    assert [p["step"] for p in got] == list(range(n))


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ({"req": "a:1", "since": 4, "version": 2, "ops_version": 1}, ("a:1", 4, 2, 1)),
        ({"req": 7, "since": -1, "version": True, "ops_version": "1"}, ("7", None, None, None)),
        ({}, ("", None, None, None)),
    ],
)
def test_pull_request_reads_only_what_it_can_trust(
    content: dict[str, Any], expected: tuple[Any, ...]
) -> None:
    assert pull_request(content) == expected


def test_answers_and_pushes_leave_the_comms_route_on_the_main_shell() -> None:
    """Every message the panel publishes leaves the comm's route as it was (the main shell): the front end's
    next message waits for a running cell there, instead of being handled on a subshell whose idle status would
    show the kernel idle while the cell runs."""
    src = ListSource()
    panel = RunPanel(src, start=False)
    comm: Any = panel.comm  # given the routing part of ipykernel 7's comm
    comm._reply_subshell_lock, comm._reply_subshell_id = threading.Lock(), None
    routes: list[str | None] = []

    def publish(content: dict[str, Any], buffers: list[bytes] | None = None) -> None:
        with comm._reply_subshell_lock:  # what ipykernel does when the parent request came on a subshell
            comm._reply_subshell_id = "lab-widgets-subshell"
        routes.append(comm._reply_subshell_id)

    panel.send = publish  # type: ignore[method-assign]
    try:
        send(panel, "hello")
        src.add(1, 0, 1.0)
        send(panel, "pull", req="r", since=0, version=1, ops_version=1)
        src.add(1, 1, 0.5)
        assert panel.pump_once()
        send(panel, "op", op_id="o", kind="stop", run_id=1)
        assert routes == ["lab-widgets-subshell"] * 4  # each publish moved it...
        assert comm._reply_subshell_id is None  # ...and it was put back
    finally:
        panel.close()
    # a comm without ipykernel 7's routing (other kernels) is left alone
    plain = types.SimpleNamespace(x=1)
    with same_reply_route(plain), same_reply_route(None):
        pass
    assert vars(plain) == {"x": 1}
