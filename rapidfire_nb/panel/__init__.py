"""The notebook's windows on a running experiment.

* :mod:`.widget` — the live anywidget panel (:class:`RunPanel`, :func:`display_panel`, :func:`display_static`;
  re-exported here);
* :mod:`.static` — its static HTML copy, saved with the notebook;
* :mod:`.progress` — the text progress for scripts and front ends without widgets, and the pump that feeds both;
* :mod:`.esm_bundle` — one ES module text from ``widgets/*.js`` (no npm).
"""

from __future__ import annotations

from ..view.wire import clean_json, decode_points, encode_points
from .widget import *  # noqa: F403  (the package's face: the live panel)
from .widget import __all__ as _widget_all

__all__ = [*_widget_all, "clean_json", "decode_points", "encode_points"]
