"""Jupyter authorization: an authorizer that denies the ``rapidfire`` resource closes every endpoint."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest
from jupyter_server.auth import Authorizer
from tornado.httpclient import HTTPClientError
from traitlets.config import Config

from rapidfire_nb.server.handlers import AUTH_RESOURCE
from rapidfire_nb.store import Store


class DenyRapidfire(Authorizer):
    """Allows everything except the extension's resource; records what it was asked."""

    asked: ClassVar[list[tuple[str, str]]] = []

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        DenyRapidfire.asked.append((action, resource))
        return resource != AUTH_RESOURCE


@pytest.fixture
def jp_server_config(rf_root: Any) -> Config:
    return Config(
        {
            "ServerApp": {
                "jpserver_extensions": {"rapidfire_nb.server": True},
                "authorizer_class": DenyRapidfire,
            },
            "RapidfireApp": {"experiments_root": str(rf_root)},
        }
    )


async def test_every_endpoint_asks_the_authorizer(jp_fetch: Any, writers: dict[str, Store]) -> None:
    DenyRapidfire.asked.clear()
    assert (await jp_fetch("api", "status")).code == 200  # the rest of Jupyter still works
    calls: list[tuple[tuple[str, ...], dict[str, Any]]] = [
        (("rapidfire/",), {}),
        (("rapidfire", "static", "app.js"), {}),
        (("rapidfire", "static", "plotly.min.js"), {}),
        (("rapidfire", "api", "experiments"), {}),
        (("rapidfire", "api", "experiments", "live"), {}),
        (("rapidfire", "api", "experiments", "live", "runs"), {}),
        (("rapidfire", "api", "experiments", "live", "metrics"), {}),
        (("rapidfire", "api", "experiments", "live", "snapshot"), {}),
        (
            ("rapidfire", "api", "experiments", "live", "ops"),
            {"method": "POST", "body": json.dumps({"kind": "stop", "run_id": 1})},
        ),
    ]
    for parts, kwargs in calls:
        with pytest.raises(HTTPClientError) as exc:
            await jp_fetch(*parts, **kwargs)
        assert exc.value.code == 403, parts
    assert ("write", AUTH_RESOURCE) in DenyRapidfire.asked
    assert DenyRapidfire.asked.count(("read", AUTH_RESOURCE)) == len(calls) - 1
    assert writers["live"].take_inbox_ops() == []
