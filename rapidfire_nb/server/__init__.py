"""rapidfire_nb's Jupyter server extension (module ``rapidfire_nb.server``).

Authenticated REST over the experiment stores under the experiments root, the ops inbox (the one channel from
another process into a training kernel), and a page at ``<base_url>/rapidfire/`` that works with no kernel.
Enabled on install by ``jupyter-config/server-config/rapidfire_nb.json``; by hand:
``jupyter server extension enable rapidfire_nb.server``.

Imports only :mod:`rapidfire_nb.store` / :mod:`rapidfire_nb.paths` and jupyter_server (never torch).
"""

from __future__ import annotations

from typing import Any

__all__ = ["_jupyter_server_extension_points"]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    """Where Jupyter finds this extension's application."""
    from .app import RapidfireApp

    return [{"module": "rapidfire_nb.server", "app": RapidfireApp}]
