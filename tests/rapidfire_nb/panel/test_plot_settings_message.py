"""The live panel's plot settings reach the static copy: a front end's ``plot_settings`` message (widgets/view.js
``sendPlotSettings``) is checked (:func:`rapidfire_nb.panel.pull.plot_settings_request`) and kept by the panel, and
the copy written at the end (``RunPanel.freeze`` -> ``static_bundle``) draws its curves with it."""

from __future__ import annotations

import re
from typing import Any

import pytest

from rapidfire_nb.panel import RunPanel
from rapidfire_nb.panel.pull import plot_settings_request
from rapidfire_nb.testing.fake_source import FakeSource
from tests.rapidfire_nb.panel.test_panel import make_panel

GOOD = {"metrics": ["loss"], "smoothing": 0.6, "y_scale": "log"}


def _send(panel: RunPanel, **content: Any) -> None:
    panel._on_frontend_msg(panel, {"type": "plot_settings", **content}, [])


def _settings_line(html: str) -> str:
    line = re.search(r'data-rf-plot-settings=""[^>]*>([^<]*)</div>', html)
    assert line
    return line.group(1)


def _plots(html: str) -> list[str]:
    return re.findall(r'<img [^>]*alt="([^"]*) by optimizer step"', html)


@pytest.fixture
def panel() -> Any:
    src = FakeSource(2, total_steps=8, eval_every=2, start=False)
    for _ in range(8):
        src.step()
    p, _ = make_panel(src, start=False)
    yield p
    p.close()
    src.close()


def test_a_settings_message_changes_the_static_copys_settings_line_and_plots(panel: RunPanel) -> None:
    before = panel.static_bundle()["text/html"]
    assert _plots(before) == ["loss", "eval_loss"]
    assert _settings_line(before).startswith("plots: loss, eval_loss · x: optimizer step · smoothing 0 (raw)")
    assert _settings_line(before).endswith("the live panel&#x27;s defaults")
    _send(panel, **GOOD)
    after = panel.static_bundle()["text/html"]
    assert _plots(after) == ["loss"]  # the panel's one plot, not the defaults' two
    line = _settings_line(after)
    assert line.startswith("plots: loss · x: optimizer step · smoothing 0.6 (raw curves faint) · y scale log")
    assert line.endswith("as the live panel had them")
    _send(panel, metrics=["eval_loss", "loss"], smoothing=0, y_scale="linear")  # a later change wins
    assert _plots(panel.static_bundle()["text/html"]) == ["eval_loss", "loss"]


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {**GOOD, "metrics": "loss"},
        {**GOOD, "metrics": []},
        {**GOOD, "metrics": ["loss"] * 9},
        {**GOOD, "metrics": ["loss", 3]},
        {**GOOD, "metrics": [""]},
        {**GOOD, "metrics": ["x" * 201]},
        {**GOOD, "smoothing": "0.5"},
        {**GOOD, "smoothing": True},
        {**GOOD, "smoothing": float("nan")},
        {**GOOD, "smoothing": -0.1},
        {**GOOD, "smoothing": 1.0},
        {**GOOD, "y_scale": "cubic"},
        {**GOOD, "y_scale": ["log"]},
    ],
)
def test_a_bad_settings_message_is_ignored(panel: RunPanel, bad: dict[str, Any]) -> None:
    assert plot_settings_request(bad) is None
    _send(panel, **GOOD)
    kept = panel.static_bundle()["text/html"]
    _send(panel, **bad)  # the settings sent before stay
    html = panel.static_bundle()["text/html"]
    assert _settings_line(html) == _settings_line(kept) and _plots(html) == ["loss"]


def test_a_good_message_is_read_as_the_static_copys_settings() -> None:
    assert plot_settings_request({**GOOD, "smoothing": 0, "extra": 1}) == {
        "metrics": ["loss"],
        "smoothing": 0.0,
        "y_scale": "log",
    }
    assert plot_settings_request({"metrics": ["a"] * 8, "smoothing": 0.999, "y_scale": "auto"}) is not None


def test_the_settings_message_gets_no_answer(panel: RunPanel) -> None:
    sent: list[Any] = []
    panel.send = lambda content, buffers=None: sent.append(content)  # type: ignore[method-assign]
    _send(panel, **GOOD)
    assert sent == []
