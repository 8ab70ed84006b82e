"""Run names in the static copy: under the id in the Run cell (one line, cut with an ellipsis, whole in its title,
escaped), beside the id in the legend and the text form; a run without a name is shown by its id alone."""

from __future__ import annotations

import re
from typing import Any

from rapidfire_nb.panel.static import render_html, render_text

NAME = 'lr1e-04 <b>"bold"</b> ' + "x" * 80


def _run(run_id: int, name: str | None) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "run_name": name,
        "tags": [],
        "status": "COMPLETED",
        "hparams": {},
        "loss": 1.0,
        "eval_loss": 1.5,
        "completed_steps": 4,
        "total_steps": 4,
        "chunks_done": 2,
        "num_segments": 2,
    }


def _snapshot() -> dict[str, Any]:
    return {
        "experiment": "exp",
        "now": 1000.0,
        "progress": "idle",
        "num_chunks": 2,
        "hparam_columns": [],
        "runs": [_run(1, NAME), _run(2, None)],
    }


def test_the_run_cell_shows_the_name_under_the_id_cut_and_whole_in_its_title() -> None:
    points = [{"run_id": r, "step": s, "name": "loss", "value": 1.0 / s} for r in (1, 2) for s in (1, 2)]
    html = render_html(_snapshot(), points)
    escaped = NAME.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    assert '<b>"bold"</b>' not in html  # escaped, never markup
    cells = re.findall(r'data-rf-run-name=""[^>]*><span style="([^"]*)" title="([^"]*)">([^<]*)</span>', html)
    assert cells == [(cells[0][0], escaped, escaped)]  # run 1 only: run 2 has no name
    assert "text-overflow:ellipsis" in cells[0][0] and "white-space:nowrap" in cells[0][0]
    assert f"run 1 · {escaped}" in html  # the legend
    rows = re.findall(r'<tr data-run-id="(\d)"[^>]*>(.*?)</tr>', html)
    assert [rid for rid, _ in rows] == ["1", "2"] and "data-rf-run-name" not in rows[1][1]


def test_the_text_form_names_each_run_beside_its_id() -> None:
    lines = render_text(_snapshot()).splitlines()
    assert lines[1].startswith(f"  run 1 · {NAME}  COMPLETED") and lines[2].startswith("  run 2  COMPLETED")
