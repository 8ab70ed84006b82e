"""The REST API as an attacker would try it (issue 12): wrong methods, bodies at and past the limits, numbers JSON
allows but an op cannot mean, odd names and tokens, and many POSTs racing. Nothing reaches the inbox unless it is a
valid op, each at most once; no reply leaks a store's contents."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from typing import Any

from tornado.httpclient import HTTPResponse

from rapidfire_nb.server.handlers import MAX_BODY_BYTES
from rapidfire_nb.store import Store

BASE = "rapidfire/api/experiments"
ENDPOINTS = ["", "/live", "/live/runs", "/live/metrics", "/live/snapshot", "/live/ops"]


async def _raw(client: Any, base_url: str, path: str, **kwargs: Any) -> HTTPResponse:
    kwargs.setdefault("raise_error", False)
    kwargs.setdefault("follow_redirects", False)
    return await client.fetch(base_url + path, **kwargs)  # type: ignore[no-any-return]


async def test_wrong_methods_are_405_and_write_nothing(
    http_server_client: Any, jp_base_url: str, jp_auth_header: dict[str, str], writers: dict[str, Store]
) -> None:
    body = json.dumps({"kind": "stop", "run_id": 1})
    for tail in ENDPOINTS:
        wrong = ["PUT", "DELETE", "PATCH"] + (["GET", "HEAD"] if tail.endswith("ops") else ["POST"])
        for method in wrong:
            resp = await _raw(
                http_server_client,
                jp_base_url,
                BASE + tail,
                method=method,
                body=body if method in ("POST", "PUT", "PATCH") else None,
                headers=jp_auth_header,
                allow_nonstandard_methods=True,
            )
            assert resp.code == 405, (method, tail, resp.code)
            assert b"learning_rate" not in resp.body and b"ONGOING" not in resp.body
    assert writers["live"].take_inbox_ops() == []


def _padded(size: int) -> bytes:
    """A valid stop op of exactly ``size`` bytes (whitespace is valid JSON)."""
    core = json.dumps({"op_id": f"pad-{size}", "kind": "stop", "run_id": 1})
    return (core[:-1] + " " * (size - len(core)) + "}").encode()


async def test_the_body_limit_is_exact(jp_fetch: Any, writers: dict[str, Store]) -> None:
    ok = await jp_fetch(*BASE.split("/"), "live", "ops", method="POST", body=_padded(MAX_BODY_BYTES))
    assert ok.code == 202
    resp = await jp_fetch(
        *BASE.split("/"), "live", "ops", method="POST", body=_padded(MAX_BODY_BYTES + 1), raise_error=False
    )
    assert resp.code == 413 and f"at most {MAX_BODY_BYTES} bytes" in json.loads(resp.body)["message"]
    assert [o["op_id"] for o in writers["live"].take_inbox_ops()] == [f"pad-{MAX_BODY_BYTES}"]


HOSTILE_BODIES = [
    (
        b'{"kind": "clone", "run_id": 1, "changes": {"learning_rate": 1e400}}',
        "learning_rate must be a number",
    ),
    (b'{"kind": "stop", "run_id": 1e400}', "run_id must be"),
    (b'{"kind": "stop", "run_id": ' + b"9" * 5000 + b"}", "not valid JSON"),  # beyond Python's int digits
    (b'{"kind": "stop", "run_id": -Infinity}', "not valid JSON"),
    ('\ufeff{"kind": "stop", "run_id": 1}'.encode(), "not valid JSON"),
    (b"kind=stop&run_id=1", "not valid JSON"),
    (b"null", "JSON object"),
    (b'"stop"', "JSON object"),
    (b'{"kind": "stop", "run_id": 1, "__proto__": {"admin": true}}', "unknown key"),
    (b'{"kind": "clone", "run_id": 1, "changes": {"hub_token": "hf_x"}}', "hub_token is a secret"),
    (
        b'{"kind": "clone", "run_id": 1, "changes": {"lora.target_modules": ["q"' + b', "q"' * 1000 + b"]}}",
        "list",
    ),
    (
        b'{"kind": "clone", "run_id": 1, "changes": {"lr_scheduler_type": "' + b"x" * 10_001 + b'"}}',
        "at most",
    ),
]


async def test_hostile_bodies_are_400(jp_fetch: Any, writers: dict[str, Store]) -> None:
    for body, fragment in HOSTILE_BODIES:  # one server for all (a server per case costs ~0.5 s)
        resp = await jp_fetch(*BASE.split("/"), "live", "ops", method="POST", body=body, raise_error=False)
        message = json.loads(resp.body)["message"]
        assert resp.code == 400 and fragment in message, (body[:60], resp.code, message)
    assert writers["live"].take_inbox_ops() == []


async def test_duplicate_keys_mean_what_the_kernel_receives(jp_fetch: Any, writers: dict[str, Store]) -> None:
    body = (
        b'{"op_id": "dup", "kind": "clone", "run_id": 1, "kind": "stop"}'  # the last one wins, for both sides
    )
    resp = await jp_fetch(*BASE.split("/"), "live", "ops", method="POST", body=body)
    assert resp.code == 202 and json.loads(resp.body)["kind"] == "stop"
    assert [(o["kind"], o["payload"]) for o in writers["live"].take_inbox_ops()] == [("stop", None)]


ODD_NAMES = ["%E2%80%AElive", "live%00", "live%0A", "x" * 5000, "LIVE%2e%2e", "%C0%AE%C0%AE"]


async def test_odd_names_never_reach_a_store(
    http_server_client: Any, jp_base_url: str, jp_auth_header: dict[str, str], writers: dict[str, Store]
) -> None:
    for name in ODD_NAMES:
        resp = await _raw(http_server_client, jp_base_url, f"{BASE}/{name}/runs", headers=jp_auth_header)
        assert resp.code in (400, 404), (name[:20], resp.code)
        assert b"learning_rate" not in resp.body


HOSTILE_QUERIES = [
    "cursor=1%3BDROP%20TABLE%20metrics",
    "cursor=1e3",
    "limit=1e9",
    "format=..%2Fx",
    "run_id=-1",
]


async def test_hostile_metric_queries_are_400(jp_fetch: Any, writers: dict[str, Store]) -> None:
    for query in HOSTILE_QUERIES:
        params = dict(urllib.parse.parse_qsl(query))
        resp = await jp_fetch(*BASE.split("/"), "live", "metrics", params=params, raise_error=False)
        assert resp.code == 400, (query, resp.code)
    with Store(writers["live"].path, read_only=True) as reader:
        assert reader.count_metrics() == 9  # the table is still there, whole


async def test_wrong_tokens_are_403(
    http_server_client: Any, jp_base_url: str, writers: dict[str, Store]
) -> None:
    for headers, query in (
        ({"Authorization": "Bearer x"}, ""),
        ({"Authorization": "token"}, ""),
        ({}, "?token="),
        ({}, "?token=wrong"),
        ({"Cookie": "username-localhost-8888=forged"}, ""),
    ):
        resp = await _raw(http_server_client, jp_base_url, f"{BASE}/live/runs{query}", headers=headers)
        assert resp.code == 403 and b"learning_rate" not in resp.body, (headers, query, resp.code)
        post = await _raw(
            http_server_client,
            jp_base_url,
            f"{BASE}/live/ops{query}",
            method="POST",
            body=json.dumps({"kind": "stop", "run_id": 1}),
            headers=headers,
        )
        assert post.code == 403, (headers, query, post.code)
    assert writers["live"].take_inbox_ops() == []


async def test_racing_posts_queue_each_op_once(jp_fetch: Any, writers: dict[str, Store]) -> None:
    async def post(op_id: str) -> dict[str, Any]:
        body = json.dumps({"op_id": op_id, "kind": "stop", "run_id": 1})
        return json.loads((await jp_fetch(*BASE.split("/"), "live", "ops", method="POST", body=body)).body)  # type: ignore[no-any-return]

    same = await asyncio.gather(*(post("same") for _ in range(24)))
    distinct = await asyncio.gather(*(post(f"op-{i}") for i in range(24)))
    assert sum(not r["duplicate"] for r in same) == 1
    assert not any(r["duplicate"] for r in distinct)
    taken = sorted(o["op_id"] for o in writers["live"].take_inbox_ops())
    assert taken == sorted(["same", *(f"op-{i}" for i in range(24))])


BAD_META = [  # issue 34 item 9: each gave a bare "500 Unhandled error" from at least one endpoint
    ("hparam_columns", 7),
    ("metric_names", [{"a": 1}]),
    ("num_chunks", "4"),
    ("ended_at", "yesterday"),
    ("panel_metrics", {"plots": 5}),
    ("clock", "busy"),
    ("devices", ["cpu"]),
    ("editable_fields", "garbage"),
    ("early_stopping", 3),
]


async def test_malformed_meta_values_are_ignored_with_a_warning(
    jp_fetch: Any, writers: dict[str, Store]
) -> None:
    writers["live"].update_meta(dict(BAD_META))
    for tail in ("", "/live", "/live/runs", "/live/metrics", "/live/snapshot"):
        resp = await jp_fetch(*BASE.split("/"), *tail.split("/")[1:], raise_error=False)
        assert resp.code == 200, (tail, resp.code, resp.body[:200])
    snap = json.loads((await jp_fetch(*BASE.split("/"), "live", "snapshot")).body)
    assert snap["hparam_columns"] == [] and snap["num_chunks"] == 0
    assert sorted(w.split("'")[1] for w in snap["warnings"]) == sorted(k for k, _ in BAD_META)
    assert "meta 'hparam_columns' holds a number, not a list of names; ignored" in snap["warnings"]
    ended = "meta 'ended_at' holds a string, not a number (unix seconds); read as ended at an unknown time"
    assert ended in snap["warnings"]
    assert all(r["legal_ops"] == [] for r in snap["runs"])  # the store takes no op while ended_at is set
    summary = json.loads((await jp_fetch(*BASE.split("/"), "live")).body)
    assert summary["ended"] is True and summary["writer_alive"] is False
    assert len(summary["warnings"]) == len(BAD_META)
    stop = await jp_fetch(
        *BASE.split("/"),
        "live",
        "ops",
        method="POST",
        body=b'{"kind": "stop", "run_id": 1}',
        raise_error=False,
    )
    assert stop.code == 409 and "at an unknown time" in json.loads(stop.body)["message"]
    writers["live"].update_meta({"ended_at": None})  # the others stay malformed: ops are taken again
    clone = await jp_fetch(
        *BASE.split("/"),
        "live",
        "ops",
        method="POST",
        body=b'{"kind": "clone", "run_id": 1, "changes": {"learning_rate": 0.1}}',
    )
    assert clone.code == 202  # editable_fields ignored: the run's stored hparams say what a clone may change
    assert [o["kind"] for o in writers["live"].take_inbox_ops()] == ["clone"]
