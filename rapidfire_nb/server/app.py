"""The server extension application: configuration (experiments root), settings, routes.

Configure it like any Jupyter server extension, e.g. in ``jupyter_server_config.py``::

    c.RapidfireApp.experiments_root = "/data/rapidfire"   # default: $RF_HOME, else the user data dir
    c.RapidfireApp.heartbeat_timeout = 30.0                # seconds before a silent kernel counts as gone

or on the command line: ``jupyter lab --RapidfireApp.experiments_root=/data/rapidfire``.
"""

from __future__ import annotations

import importlib.util
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from traitlets import Float, Unicode

from .handlers import (
    ExperimentHandler,
    ExperimentsHandler,
    MetricsHandler,
    OpsHandler,
    PageHandler,
    RunsHandler,
    SnapshotHandler,
    StaticHandler,
)
from .manager import ExperimentsManager

__all__ = ["RapidfireApp", "plotly_dir", "widget_files", "widgets_dir"]

_STATIC_DIR = Path(__file__).resolve().parent / "static"
_NAME = r"(?P<name>[^/]+)"  # validated by the manager (validate_experiment_name), never used unchecked


def widgets_dir() -> Path | None:
    """Folder of the panel's front end (panel.js, panel.css): ``_widgets`` in a wheel, else the repo's."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_widgets", package.parent / "widgets"):
        if (candidate / "panel.js").is_file():
            return candidate
    return None


def widget_files(folder: Path) -> list[str]:
    """The panel's front-end files in ``folder`` (``panel.js``, its sibling ES modules, ``panel.css``): the
    page imports the modules as they are (relative imports resolve under ``rapidfire/static/``)."""
    return sorted(f.name for f in folder.iterdir() if f.is_file() and f.suffix in (".js", ".css"))


def plotly_dir() -> Path | None:
    """``plotly/package_data`` of the installed plotly (found without importing plotly), if it has plotly.min.js."""
    try:
        spec = importlib.util.find_spec("plotly")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        folder = Path(location) / "package_data"
        if (folder / "plotly.min.js").is_file():
            return folder
    return None


class RapidfireApp(ExtensionApp):
    """rapidfire_nb's Jupyter server extension: REST over experiment stores + the ops inbox, and a page.

    Routes (under the server's ``base_url``): ``rapidfire/`` (page), ``rapidfire/api/experiments[/<name>[/runs|
    /metrics|/snapshot|/ops]]``, ``rapidfire/static/<file>``.
    """

    name = "rapidfire_nb"
    description = "RapidFire experiments: REST API and page"
    extension_url = "/rapidfire/"
    default_url = "/rapidfire/"
    load_other_extensions = True

    experiments_root = Unicode(
        "",
        config=True,
        help="Folder holding the experiments to serve. Empty: the kernel's default ($RF_HOME, else the user "
        "data dir, see rapidfire_nb.paths.experiments_root).",
    )
    heartbeat_timeout = Float(
        30.0,
        config=True,
        help="Seconds without a heartbeat after which an experiment's kernel counts as gone: its ONGOING runs "
        "are shown as INTERRUPTED and ops are refused (409).",
    )

    def initialize_settings(self) -> None:
        from rapidfire_nb._version import __version__

        self.manager = ExperimentsManager(self.experiments_root or None, stale_after=self.heartbeat_timeout)
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="rapidfire-server")
        self._widgets = widgets_dir()
        self._plotly = plotly_dir()
        self.settings.update(
            {
                "rapidfire_manager": self.manager,
                "rapidfire_executor": self._pool,
                "rapidfire_version": __version__,
                "rapidfire_panel_js": self._widgets is not None,
                "rapidfire_plotly_js": self._plotly is not None,
            }
        )
        self.log.info(
            "rapidfire_nb: serving experiments under %s at %srapidfire/",
            self.manager.root,
            self.serverapp.base_url if self.serverapp else "/",
        )

    def initialize_handlers(self) -> None:
        api = "rapidfire/api/experiments"
        handlers: list[tuple[Any, ...]] = [
            (r"rapidfire/?", PageHandler),
            (rf"{api}/?", ExperimentsHandler),
            (rf"{api}/{_NAME}/?", ExperimentHandler),
            (rf"{api}/{_NAME}/runs/?", RunsHandler),
            (rf"{api}/{_NAME}/metrics/?", MetricsHandler),
            (rf"{api}/{_NAME}/snapshot/?", SnapshotHandler),
            (rf"{api}/{_NAME}/ops/?", OpsHandler),
            (r"rapidfire/static/(app\.js|app\.css)", StaticHandler, {"path": str(_STATIC_DIR)}),
        ]
        if self._widgets is not None:
            names = "|".join(re.escape(name) for name in widget_files(self._widgets))
            handlers.append((rf"rapidfire/static/({names})", StaticHandler, {"path": str(self._widgets)}))
        if self._plotly is not None:
            handlers.append(
                (r"rapidfire/static/(plotly\.min\.js)", StaticHandler, {"path": str(self._plotly)})
            )
        self.handlers.extend(handlers)

    async def stop_extension(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
