"""A bulk stop's own reason over the HTTP fallback (issue 37): the server's inbox takes an optional ``reason`` (a
stop's, a text of at most 200 characters, checked as the comm path checks it), and the kernel turns it into the
stop's payload, so the run's ``stop_reason`` is "stop all but best 2 by eval_loss", not "stopped by the user"."""

from __future__ import annotations

import json
import types
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from rapidfire_nb.experiment.session import FitSession
from rapidfire_nb.server.checks import ApiError, parse_reason
from rapidfire_nb.server.manager import ExperimentsManager
from rapidfire_nb.store import Store

API = ("rapidfire", "api", "experiments")
REASON = "stop all but best 2 by eval_loss"


def test_parse_reason_is_checked_as_the_comm_path() -> None:
    assert parse_reason("stop", {"reason": REASON}) == REASON
    assert parse_reason("stop", {"reason": "x" * 200}) == "x" * 200
    assert parse_reason("stop", {}) is None and parse_reason("stop", {"reason": ""}) is None
    assert parse_reason("resume", {}) is None
    for kind, body, fragment in [
        ("stop", {"reason": "x" * 201}, "at most 200 characters"),
        ("stop", {"reason": 5}, "at most 200 characters"),
        ("stop", {"reason": ["a"]}, "at most 200 characters"),
        ("resume", {"reason": REASON}, "a resume op takes no reason"),
        ("clone", {"reason": REASON}, "a clone op takes no reason"),
    ]:
        with pytest.raises(ApiError) as exc:
            parse_reason(kind, body)
        assert exc.value.status == 400 and fragment in exc.value.message


async def test_a_stop_posted_with_its_reason_reaches_the_inbox_with_it(
    jp_fetch: Any, writers: dict[str, Store]
) -> None:
    body = {"op_id": "bulk-1", "kind": "stop", "run_id": 1, "reason": REASON}
    resp = await jp_fetch(*API, "live", "ops", method="POST", body=json.dumps(body))
    assert resp.code == 202 and json.loads(resp.body)["state"] == "queued"
    plain = {"op_id": "plain-1", "kind": "stop", "run_id": 2}
    assert (await jp_fetch(*API, "live", "ops", method="POST", body=json.dumps(plain))).code == 202
    taken = writers["live"].take_inbox_ops()
    assert [(o["op_id"], o["payload"]) for o in taken] == [("bulk-1", {"reason": REASON}), ("plain-1", None)]


async def test_a_bad_reason_is_400_and_queues_nothing(jp_fetch: Any, writers: dict[str, Store]) -> None:
    for body in (
        {"kind": "stop", "run_id": 1, "reason": "x" * 201},
        {"kind": "resume", "run_id": 3, "reason": REASON},
    ):
        with pytest.raises(HTTPClientError) as exc:
            await jp_fetch(*API, "live", "ops", method="POST", body=json.dumps(body))
        assert exc.value.code == 400 and exc.value.response is not None
        assert "reason" in json.loads(exc.value.response.body)["message"]
    assert writers["live"].take_inbox_ops() == []


def test_the_kernel_keeps_an_inbox_stops_reason(rf_root: Any, writers: dict[str, Store]) -> None:
    mgr = ExperimentsManager(rf_root)
    mgr.post_op("live", {"op_id": "bulk-2", "kind": "stop", "run_id": 1, "reason": REASON})
    mgr.post_op("live", {"op_id": "plain-2", "kind": "stop", "run_id": 2})
    session = types.SimpleNamespace(store=writers["live"])  # inbox_ops reads only the store for stops
    ops = FitSession.inbox_ops(session)  # type: ignore[arg-type]
    assert [(o.op_id, o.kind.value, o.run_id, o.payload, o.source) for o in ops] == [
        ("bulk-2", "stop", 1, {"reason": REASON}, "inbox"),
        ("plain-2", "stop", 2, {}, "inbox"),
    ]
