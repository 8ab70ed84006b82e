"""Thin tornado handlers of the server extension: authenticate, authorize, parse, hand work to the manager.

Every handler requires Jupyter's authentication (``@tornado.web.authenticated``) and authorization
(``@authorized`` on the resource :data:`AUTH_RESOURCE`: GET = ``read``, POST = ``write``). API handlers are
``APIHandler``s, so unauthenticated requests get 403 (never a login redirect) and cookie-authenticated POSTs
need Jupyter's XSRF token (``X-XSRFToken`` header or ``_xsrf`` argument), exactly as Jupyter's own REST API.
Store reads run on the manager's thread pool, never on the server's event loop.
"""

from __future__ import annotations

import asyncio
import html
import json
from collections.abc import Callable
from concurrent.futures import Executor
from http.client import responses
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from jupyter_server.utils import url_path_join
from tornado import web

from ..redact import redact
from ..view.wire import clean_json
from .checks import MAX_BODY_BYTES
from .manager import ApiError, ExperimentsManager

__all__ = [
    "AUTH_RESOURCE",
    "MAX_BODY_BYTES",
    "ExperimentHandler",
    "ExperimentsHandler",
    "MetricsHandler",
    "OpsHandler",
    "PageHandler",
    "RunsHandler",
    "SnapshotHandler",
    "StaticHandler",
    "script_json",
]

AUTH_RESOURCE = "rapidfire"
"""Resource name passed to Jupyter's authorizer (``Authorizer.is_authorized(handler, user, action, resource)``)."""


class _ApiBase(ExtensionHandlerMixin, APIHandler):
    auth_resource = AUTH_RESOURCE

    @property
    def manager(self) -> ExperimentsManager:
        return self.settings["rapidfire_manager"]  # type: ignore[no-any-return]

    @property
    def pool(self) -> Executor:
        return self.settings["rapidfire_executor"]  # type: ignore[no-any-return]

    async def call(self, fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
        """Run ``fn(*args)`` on the thread pool; an ApiError becomes that HTTP status with its message."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)
        except ApiError as exc:
            raise web.HTTPError(exc.status, exc.message, reason=_reason(exc.status)) from None

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """APIHandler's JSON error reply, with the message exactly as raised.

        ``HTTPError.log_message`` (what APIHandler sends) doubles every ``%`` of a message raised without
        format args (it is meant as a %-format for the log), so a name sent as ``%252e`` would be reported as
        ``'%%2e'``; ``get_message()`` is the text itself.
        """
        exc = (kwargs.get("exc_info") or (None, None, None))[1]
        if not isinstance(exc, web.HTTPError):
            super().write_error(status_code, **kwargs)
            return
        self.set_header("Content-Type", "application/json")
        message = exc.get_message() or responses.get(status_code, "Unknown HTTP Error")
        self.log.warning("wrote error: %r", message)
        self.finish(json.dumps({"message": message, "reason": exc.reason}))

    def reply(self, body: dict[str, Any], status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(
            json.dumps(clean_json(redact(body)), allow_nan=False)
        )  # a store from before redaction too


def _reason(status: int) -> str | None:
    return {400: "Bad Request", 404: "Not Found", 409: "Conflict", 413: "Payload Too Large"}.get(status)


class ExperimentsHandler(_ApiBase):
    """``GET rapidfire/api/experiments`` — the experiments under the configured root."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.reply(await self.call(self.manager.list_experiments))


class ExperimentHandler(_ApiBase):
    """``GET rapidfire/api/experiments/<name>`` — one experiment's summary (404 when unknown)."""

    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        self.reply(await self.call(self.manager.experiment, name))


class RunsHandler(_ApiBase):
    """``GET rapidfire/api/experiments/<name>/runs``."""

    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        self.reply(await self.call(self.manager.runs, name))


class MetricsHandler(_ApiBase):
    """``GET rapidfire/api/experiments/<name>/metrics?cursor=N[&seen=M][&run_id=R][&limit=L][&format=columnar]``."""

    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        args = (
            name,
            self.get_query_argument("cursor", "0"),
            self.get_query_argument("run_id", None),
            self.get_query_argument("limit", None),
            self.get_query_argument("format", "rows"),
            self.get_query_argument("seen", None),
        )
        self.reply(await self.call(self.manager.metrics, *args))


class SnapshotHandler(_ApiBase):
    """``GET rapidfire/api/experiments/<name>/snapshot`` — the panel's JSON, from the store alone."""

    @web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        self.reply(await self.call(self.manager.snapshot, name))


class OpsHandler(_ApiBase):
    """``POST rapidfire/api/experiments/<name>/ops`` — queue an IC Op in the experiment's inbox (202); the body is
    ``{op_id?, kind, run_id, changes?, warm_start?, reason?}`` (``reason``: a stop's own, e.g. the panel's bulk stop)."""

    @web.authenticated
    @authorized
    async def post(self, name: str) -> None:
        """The body is read and checked on the thread pool (:meth:`ExperimentsManager.post_op_request`)."""
        self.reply(await self.call(self.manager.post_op_request, name, self.request.body or b""), status=202)


_SCRIPT_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def script_json(value: Any) -> str:
    """``value`` as JSON text safe inside a ``<script>`` element: ``<``, ``>``, ``&`` and U+2028/2029 as ``\\uXXXX``.

    A script element's content is not HTML-decoded (``&amp;`` would reach ``JSON.parse`` as is), and a literal
    ``</script>`` or ``<!--`` in a string would end or change the element; the escapes keep the JSON value equal.
    """
    text = json.dumps(value)
    for char, escape in _SCRIPT_ESCAPES.items():
        text = text.replace(char, escape)
    return text


class PageHandler(ExtensionHandlerMixin, JupyterHandler):
    """``GET rapidfire/`` — the experiments page (a static shell; its script reads the REST API)."""

    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    def get(self) -> None:
        version = self.settings.get("rapidfire_version", "0")
        base = self.base_url
        page_config = {
            "baseUrl": base,
            "apiUrl": url_path_join(base, "rapidfire", "api") + "/",
            "staticUrl": url_path_join(base, "rapidfire", "static") + "/",
            "xsrfToken": self.xsrf_token.decode("ascii"),  # also sets the _xsrf cookie
            "version": version,
            "root": str(self.manager_root),
            "panelJs": bool(self.settings.get("rapidfire_panel_js")),
            "plotlyJs": bool(self.settings.get("rapidfire_plotly_js")),
        }
        self.set_header("Cache-Control", "no-store")
        self.finish(
            _PAGE.format(
                static=html.escape(page_config["staticUrl"]),
                v=html.escape(str(version)),
                config=script_json(page_config),
            )
        )

    @property
    def manager_root(self) -> Any:
        return self.settings["rapidfire_manager"].root


class StaticHandler(ExtensionHandlerMixin, JupyterHandler, web.StaticFileHandler):
    """``GET rapidfire/static/<file>`` — a fixed set of files (the routes list them), authenticated."""

    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    async def get(self, path: str, include_body: bool = True) -> None:
        await web.StaticFileHandler.get(self, path, include_body)

    @web.authenticated
    @authorized
    def head(self, path: str) -> Any:
        return web.StaticFileHandler.get(self, path, include_body=False)

    def set_extra_headers(self, path: str) -> None:
        if "v" not in self.request.arguments:
            self.set_header("Cache-Control", "no-cache")  # revalidate (304) rather than reuse stale code

    def compute_etag(self) -> str | None:
        return web.StaticFileHandler.compute_etag(self)


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>RapidFire experiments</title>
<link rel="stylesheet" href="{static}panel.css?v={v}">
<link rel="stylesheet" href="{static}app.css?v={v}">
<script type="application/json" id="rf-page-config">{config}</script>
<script type="module" src="{static}app.js?v={v}"></script>
</head>
<body>
<div class="rf-page" data-rf-page>
  <header class="rf-page-head">
    <h1>RapidFire experiments</h1>
    <span class="rf-page-root" data-rf-root></span>
  </header>
  <main>
    <section class="rf-page-list" data-rf-list><p class="rf-page-note">Loading…</p></section>
    <section class="rf-page-view" data-rf-view-host></section>
  </main>
  <noscript>This page needs JavaScript.</noscript>
</div>
</body>
</html>
"""
