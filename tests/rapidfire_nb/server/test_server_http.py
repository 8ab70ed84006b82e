"""The server extension over HTTP (jupyter_server's pytest plugin): endpoints, auth, XSRF, validation, the page."""

from __future__ import annotations

import json
import time
from http.cookies import SimpleCookie
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError, HTTPResponse

from rapidfire_nb.store import Store

API = ("rapidfire", "api", "experiments")

GET_PATHS = [
    "rapidfire/api/experiments",
    "rapidfire/api/experiments/live",
    "rapidfire/api/experiments/live/runs",
    "rapidfire/api/experiments/live/metrics?cursor=0",
    "rapidfire/api/experiments/live/snapshot",
]
STATIC = ["app.js", "app.css", "panel.js", "panel.css", "plotly.min.js"]
# the panel's sibling ES modules, which app.js and panel.js import as they are
WIDGET_MODULES = ["dom.js", "format.js", "ops.js", "plots.js", "state.js", "view.js"]


def _json(resp: HTTPResponse) -> Any:
    return json.loads(resp.body)


async def _raw(client: Any, base_url: str, path: str, **kwargs: Any) -> HTTPResponse:
    """A request with NO authentication unless headers are given; the path is sent exactly as written."""
    kwargs.setdefault("raise_error", False)
    kwargs.setdefault("follow_redirects", False)
    return await client.fetch(base_url + path, **kwargs)  # type: ignore[no-any-return]


async def _error(jp_fetch: Any, *parts: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(HTTPClientError) as exc:
        await jp_fetch(*parts, **kwargs)
    assert exc.value.response is not None
    return exc.value.code, json.loads(exc.value.response.body)


async def test_extension_is_loaded(jp_serverapp: Any, rf_root: Any) -> None:
    points = jp_serverapp.extension_manager.extension_points
    assert "rapidfire_nb" in points
    assert str(points["rapidfire_nb"].app.manager.root) == str(rf_root)


async def test_list_experiments(jp_fetch: Any, writers: dict[str, Store], rf_root: Any) -> None:
    data = _json(await jp_fetch(*API))
    assert data["root"] == str(rf_root)
    assert [(x["name"], x["writer_alive"]) for x in data["experiments"]] == [("dead", False), ("live", True)]
    one = _json(await jp_fetch(*API, "live"))
    assert one["name"] == "live" and one["status_counts"]["ONGOING"] == 1


async def test_runs(jp_fetch: Any, writers: dict[str, Store]) -> None:
    resp = await jp_fetch(*API, "dead", "runs")
    assert resp.headers["Content-Type"].startswith("application/json")
    runs = _json(resp)["runs"]
    assert [(r["run_id"], r["status"]) for r in runs] == [(1, "INTERRUPTED"), (2, "COMPLETED"), (3, "NEW")]


async def test_metrics_with_cursor(jp_fetch: Any, writers: dict[str, Store]) -> None:
    first = _json(await jp_fetch(*API, "live", "metrics", params={"cursor": "0", "limit": "4"}))
    assert len(first["points"]) == 4 and first["more"] is True
    rest = _json(await jp_fetch(*API, "live", "metrics", params={"cursor": str(first["cursor"])}))
    assert len(rest["points"]) == 5 and rest["more"] is False
    assert rest["points"][-1]["value"] is None  # NaN is sent as null (strict JSON)
    writers["live"].add_metrics([{"run_id": 1, "step": 9, "name": "loss", "value": 0.5}])
    new = _json(
        await jp_fetch(*API, "live", "metrics", params={"cursor": str(rest["cursor"]), "format": "columnar"})
    )
    wall = new["points"].pop("wall")
    assert len(wall) == 1 and abs(wall[0] - time.time()) < 60  # the row's wall time (unix s)
    assert new["points"] == {
        "names": ["loss"],
        "run": [1],
        "step": [9],
        "samples": [None],
        "name": [0],
        "value": [0.5],
    }
    code, body = await _error(jp_fetch, *API, "live", "metrics", params={"cursor": "-3"})
    assert code == 400 and "cursor" in body["message"]


async def test_snapshot(jp_fetch: Any, writers: dict[str, Store]) -> None:
    snap = _json(await jp_fetch(*API, "live", "snapshot"))
    assert snap["experiment"] == "live" and len(snap["runs"]) == 3 and snap["runs"][0]["legal_ops"]
    assert _json(await jp_fetch(*API, "dead", "snapshot"))["runs"][0]["status"] == "INTERRUPTED"


async def test_post_op_reaches_the_writers_inbox(jp_fetch: Any, writers: dict[str, Store]) -> None:
    body = {
        "op_id": "http-1",
        "kind": "clone",
        "run_id": 1,
        "changes": {"learning_rate": 3e-4},
        "warm_start": True,
    }
    resp = await jp_fetch(*API, "live", "ops", method="POST", body=json.dumps(body))
    assert resp.code == 202
    assert _json(resp) == {
        "op_id": "http-1",
        "kind": "clone",
        "run_id": 1,
        "state": "queued",
        "duplicate": False,
        "message": _json(resp)["message"],
    }
    again = await jp_fetch(*API, "live", "ops", method="POST", body=json.dumps(body))
    assert again.code == 202 and _json(again)["duplicate"] is True
    taken = writers["live"].take_inbox_ops()
    assert [(o["op_id"], o["kind"], o["run_id"], o["payload"]) for o in taken] == [
        ("http-1", "clone", 1, {"changes": {"learning_rate": 3e-4}, "warm_start": True})
    ]


async def test_a_reused_op_id_with_another_op_is_refused_as_in_the_kernel(
    jp_fetch: Any, writers: dict[str, Store]
) -> None:
    """Issue 34 item 8: a resume posted with the op id of an earlier stop was answered 202 duplicate and dropped."""
    stop = {"op_id": "http-2", "kind": "stop", "run_id": 1}
    assert (await jp_fetch(*API, "live", "ops", method="POST", body=json.dumps(stop))).code == 202
    resume = {"op_id": "http-2", "kind": "resume", "run_id": 1}
    code, body = await _error(jp_fetch, *API, "live", "ops", method="POST", body=json.dumps(resume))
    assert (code, body["message"]) == (
        409,
        "op id 'http-2' was already used by the stop of run 1; an op id names one request: leave op_id out or use a "
        "new one",
    )
    writers["live"].add_op("http-3", "delete", 1, source="api", state="applied")  # the kernel's, never posted
    other = {"op_id": "http-3", "kind": "stop", "run_id": 1}
    code, body = await _error(jp_fetch, *API, "live", "ops", method="POST", body=json.dumps(other))
    assert code == 409 and "already used by the delete of run 1" in body["message"]
    same = {
        "op_id": "http-3",
        "kind": "delete",
        "run_id": 1,
    }  # the kernel answered it: a duplicate, not sent again
    resp = await jp_fetch(*API, "live", "ops", method="POST", body=json.dumps(same))
    assert resp.code == 202 and _json(resp)["duplicate"] is True
    assert [o["op_id"] for o in writers["live"].take_inbox_ops()] == ["http-2"]


BAD_BODIES = [
    (b"{not json", "not valid JSON"),
    (b'{"kind": "stop", "run_id": NaN}', "not valid JSON"),
    (b"\xff\xfe", "not valid JSON"),
    (b"", "not valid JSON"),
    (json.dumps({"kind": "stop", "run_id": "1"}).encode(), "run_id must be"),
    (json.dumps({"kind": "pickle", "run_id": 1}).encode(), "kind must be"),
    (json.dumps({"kind": "clone", "run_id": 1, "changes": {"nope": 1}}).encode(), "not an editable field"),
]


async def test_bad_payloads_are_400(jp_fetch: Any, writers: dict[str, Store]) -> None:
    for body, fragment in BAD_BODIES:
        code, reply = await _error(
            jp_fetch, *API, "live", "ops", method="POST", body=body, allow_nonstandard_methods=True
        )
        assert code == 400 and fragment in reply["message"], (body, reply)
    assert writers["live"].take_inbox_ops() == []


async def test_oversized_body_is_413(jp_fetch: Any, writers: dict[str, Store]) -> None:
    body = json.dumps({"kind": "clone", "run_id": 1, "changes": {"lr_scheduler_type": "x" * 70_000}})
    code, _ = await _error(jp_fetch, *API, "live", "ops", method="POST", body=body)
    assert code == 413


async def test_op_without_a_kernel_is_409(jp_fetch: Any, writers: dict[str, Store]) -> None:
    code, reply = await _error(
        jp_fetch, *API, "dead", "ops", method="POST", body=json.dumps({"kind": "resume", "run_id": 1})
    )
    assert code == 409 and "no kernel" in reply["message"]


async def test_unknown_experiment_is_404(jp_fetch: Any, writers: dict[str, Store]) -> None:
    for tail in ((), ("runs",), ("metrics",), ("snapshot",)):
        code, reply = await _error(jp_fetch, *API, "missing", *tail)
        assert code == 404 and "no experiment named 'missing'" in reply["message"]
    code, _ = await _error(
        jp_fetch, *API, "missing", "ops", method="POST", body=json.dumps({"kind": "stop", "run_id": 1})
    )
    assert code == 404


BAD_NAMES = [
    "..",
    "%2e%2e",
    "%2E%2E",
    "a%2Fb",
    "..%2Flive",
    "%2e%2e%2flive",
    ".hidden",
    "a%20b",
    "%00",
    "caf%C3%A9",
]


async def test_bad_names_are_400(
    http_server_client: Any, jp_base_url: str, jp_auth_header: dict[str, str], writers: dict[str, Store]
) -> None:
    for name in BAD_NAMES:
        for tail in ("", "/runs", "/metrics", "/snapshot"):
            resp = await _raw(
                http_server_client,
                jp_base_url,
                f"rapidfire/api/experiments/{name}{tail}",
                headers=jp_auth_header,
            )
            assert resp.code == 400, (name, tail, resp.code)
            assert "experiment name" in _json(resp)["message"]
        resp = await _raw(
            http_server_client,
            jp_base_url,
            f"rapidfire/api/experiments/{name}/ops",
            method="POST",
            body=json.dumps({"kind": "stop", "run_id": 1}),
            headers=jp_auth_header,
        )
        assert resp.code == 400, (name, resp.code)
    assert writers["live"].take_inbox_ops() == []


async def test_slashes_never_reach_a_store(
    http_server_client: Any, jp_base_url: str, jp_auth_header: dict[str, str], writers: dict[str, Store]
) -> None:
    for path in ("a/b/runs", "../../live/runs", "live/../../runs", "/live/runs", "live/runs/extra"):
        resp = await _raw(
            http_server_client, jp_base_url, f"rapidfire/api/experiments/{path}", headers=jp_auth_header
        )
        assert resp.code in (400, 404), (path, resp.code)


async def test_get_without_a_token_is_403(
    http_server_client: Any, jp_base_url: str, writers: dict[str, Store]
) -> None:
    for path in GET_PATHS:
        for headers in ({}, {"Authorization": ""}, {"Authorization": "token wrong"}):
            resp = await _raw(http_server_client, jp_base_url, path, headers=headers)
            assert resp.code == 403, (path, headers)
            assert b"ONGOING" not in resp.body and b"learning_rate" not in resp.body


async def test_post_without_a_token_is_403(
    http_server_client: Any, jp_base_url: str, writers: dict[str, Store]
) -> None:
    resp = await _raw(
        http_server_client,
        jp_base_url,
        "rapidfire/api/experiments/live/ops",
        method="POST",
        body=json.dumps({"kind": "stop", "run_id": 1}),
        headers={"Authorization": "token wrong"},
    )
    assert resp.code == 403
    assert writers["live"].take_inbox_ops() == []


async def test_page_and_static_files_need_login(http_server_client: Any, jp_base_url: str) -> None:
    for path in ["rapidfire/", "rapidfire"] + [f"rapidfire/static/{f}" for f in STATIC]:
        resp = await _raw(http_server_client, jp_base_url, path)
        assert resp.code in (302, 403), (path, resp.code)
        if resp.code == 302:
            assert "/login" in resp.headers["Location"]


def _cookies(resp: HTTPResponse) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    for header in resp.headers.get_list("Set-Cookie"):
        jar.load(header)
    return {k: m.value for k, m in jar.items()}


async def test_cookie_login_needs_the_xsrf_token_to_post(
    http_server_client: Any, jp_base_url: str, jp_serverapp: Any, writers: dict[str, Store]
) -> None:
    token = jp_serverapp.identity_provider.token
    page = await _raw(http_server_client, jp_base_url, f"rapidfire/?token={token}")
    assert page.code == 200
    jar = _cookies(page)
    xsrf = jar["_xsrf"]
    login = "; ".join(f"{k}={v}" for k, v in jar.items() if k != "_xsrf")
    assert f'"xsrfToken": "{xsrf}"' in page.body.decode()
    path = "rapidfire/api/experiments/live/ops"
    body = json.dumps({"kind": "stop", "run_id": 1})
    got = await _raw(http_server_client, jp_base_url, "rapidfire/api/experiments", headers={"Cookie": login})
    assert got.code == 200  # the login cookie alone authenticates reads
    no_xsrf = await _raw(
        http_server_client, jp_base_url, path, method="POST", body=body, headers={"Cookie": login}
    )
    assert no_xsrf.code == 403
    wrong = await _raw(
        http_server_client,
        jp_base_url,
        path,
        method="POST",
        body=body,
        headers={"Cookie": f"{login}; _xsrf={xsrf}", "X-XSRFToken": "2|00|00|0"},
    )
    assert wrong.code == 403
    assert writers["live"].take_inbox_ops() == []
    ok = await _raw(
        http_server_client,
        jp_base_url,
        path,
        method="POST",
        body=body,
        headers={"Cookie": f"{login}; _xsrf={xsrf}", "X-XSRFToken": xsrf},
    )
    assert ok.code == 202
    assert len(writers["live"].take_inbox_ops()) == 1


async def test_page(jp_fetch: Any, jp_base_url: str, rf_root: Any) -> None:
    resp = await jp_fetch("rapidfire/")
    assert resp.code == 200 and resp.headers["Content-Type"].startswith("text/html")
    html = resp.body.decode()
    assert "data-rf-page" in html and f'src="{jp_base_url}rapidfire/static/app.js' in html
    start = html.index('id="rf-page-config">') + len('id="rf-page-config">')
    config = json.loads(html[start : html.index("</script>", start)])
    assert config["apiUrl"] == f"{jp_base_url}rapidfire/api/"
    assert config["staticUrl"] == f"{jp_base_url}rapidfire/static/"
    assert config["root"] == str(rf_root) and config["panelJs"] and config["plotlyJs"]


async def test_static_files(jp_fetch: Any) -> None:
    for name in STATIC + WIDGET_MODULES:
        resp = await jp_fetch("rapidfire", "static", name)
        kind = "css" if name.endswith(".css") else "javascript"
        assert resp.code == 200 and kind in resp.headers["Content-Type"] and len(resp.body) > 100, name
    assert len((await jp_fetch("rapidfire", "static", "plotly.min.js")).body) > 1_000_000


async def test_only_listed_static_files_are_served(jp_fetch: Any) -> None:
    for name in ("../app.py", "handlers.py", "..%2Fapp.py", "panel.py", "plotly.js", "store.sqlite"):
        with pytest.raises(HTTPClientError) as exc:
            await jp_fetch("rapidfire", "static", name)
        assert exc.value.code == 404
