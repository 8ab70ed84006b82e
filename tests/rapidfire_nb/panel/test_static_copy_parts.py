"""The static copy's new parts (issue 37, "a static copy worth keeping"): one line per cell with an ellipsis and the
whole value in a title, each stop's reason, a collapsed ops log, the plot settings used (the live panel's when the
snapshot has them, else its defaults: the auto y scale, no smoothing) and one x range for every plot."""

from __future__ import annotations

import base64
import re
import time
from typing import Any

import pytest

from rapidfire_nb.panel.static import plot_settings, render_html, static_bundle
from rapidfire_nb.panel.static_svg import scale_cue, smooth, y_scale
from rapidfire_nb.view.text import chunks_note

EVIL = '<script>alert("x")</script>'
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
BULK = "stop all but best 1 by eval_loss"


def _svgs(html: str) -> list[str]:
    return [
        base64.b64decode(m).decode() for m in re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', html)
    ]


def _run(run_id: int, status: str = "COMPLETED", **extra: Any) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "status": status,
        "hparams": {"lora.target_modules": TARGETS, "learning_rate": 1e-4},
        "completed_steps": 8,
        "total_steps": 8,
        "chunks_done": 2,
        "num_segments": 2,
        "samples_seen": 32,
        "loss": 1.0,
        "eval_loss": 1.0 + run_id / 10,
        **extra,
    }


def _snapshot(runs: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "experiment": "exp",
        "now": 1000.0,
        "progress": "idle",
        "num_chunks": 2,
        "hparam_columns": ["learning_rate", "lora.target_modules"],
        "runs": runs,
        **extra,
    }


def _points(run_id: int, name: str, values: dict[int, float]) -> list[dict[str, Any]]:
    return [{"run_id": run_id, "step": s, "name": name, "value": v} for s, v in values.items()]


def test_a_long_value_stays_on_one_line_cut_with_an_ellipsis_and_whole_in_its_title() -> None:
    html = render_html(_snapshot([_run(1), _run(2)]), [])
    whole = '["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]'
    cells = re.findall(r'<span style="([^"]*)" title="([^"]*)">([^<]*)</span>', html)
    targets = [c for c in cells if c[2] == whole.replace('"', "&quot;")]
    assert len(targets) == 2  # one per run, its text whole in the title (hover) and in the cut cell
    style, title, _ = targets[0]
    assert title == whole.replace('"', "&quot;")
    assert "white-space:nowrap" in style and "text-overflow:ellipsis" in style and "max-width:12em" in style
    assert "word-break" not in html  # the 4-lines-per-row wrap is gone


def test_each_stop_says_why_in_a_row_the_badges_title_and_the_text_form() -> None:
    pruned = "pruned at chunk 1/2: eval_loss 1.3 not in the best 1 of 3 at this rung (cutoff 1.1)"
    runs = [
        _run(1),
        _run(2, "STOPPED", stop_reason=BULK),
        _run(3, "STOPPED", pruned=True, stop_reason=pruned),
        _run(4, "STOPPED", stop_reason=f"stopped {EVIL}"),
    ]
    bundle = static_bundle(_snapshot(runs), [])
    html = bundle["text/html"]
    assert re.findall(r'data-stopped-for="(\d+)"', html) == ["2", "4"]
    assert re.findall(r'data-pruned-for="(\d+)"', html) == ["3"]
    assert f"run 2 stopped: {BULK}</td>" in html and f"run 3 ✂ early stopping: {pruned}</td>" in html
    assert f'data-rf-status="STOPPED" title="{BULK}"' in html
    assert EVIL not in html and "stopped &lt;script&gt;" in html
    lines = bundle["text/plain"].splitlines()
    assert lines[2].endswith(f"({BULK})") and lines[3].endswith(f"({pruned})") and lines[1].endswith("1.100")


def test_the_ops_log_is_a_collapsed_details_oldest_first_escaped() -> None:
    ops = [
        {"op_id": "b", "run_id": 2, "kind": "stop", "state": "applied", "message": f"stop: {BULK}",
         "requested_at": 1010.0, "applied_at": 1012.0},
        {"op_id": "a", "run_id": 1, "kind": "clone", "state": "rejected", "message": f"bad {EVIL}",
         "requested_at": 1001.0, "applied_at": None},
    ]  # fmt: skip
    html = render_html(_snapshot([_run(1), _run(2)], ops=ops), [])
    block = re.search(r"<details data-rf-ops=\"\"[^>]*>(.*?)</details>", html, re.S)
    assert block and '<details data-rf-ops="" open' not in html  # collapsed
    assert "Ops log · 2 ops (how we got here)</summary>" in block.group(1)
    assert re.findall(r'data-rf-op="(\w+)"', block.group(1)) == ["a", "b"]  # by time
    row_b = re.search(r'data-rf-op="b">(.*?)</tr>', block.group(1))
    assert row_b
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", row_b.group(1))
    assert cells == [
        time.strftime("%H:%M:%S", time.localtime(1012.0)),
        "run 2",
        "stop",
        "applied",
        f"stop: {BULK}",
    ]
    assert EVIL not in html and "bad &lt;script&gt;" in block.group(1)
    assert "data-rf-ops" not in render_html(_snapshot([_run(1)]), [])  # no ops: no log


def test_a_long_ops_log_keeps_the_latest_and_says_how_many_are_left_out() -> None:
    ops = [
        {
            "op_id": f"o{i}",
            "run_id": 1,
            "kind": "stop",
            "state": "applied",
            "message": "",
            "requested_at": float(i),
        }
        for i in range(305)
    ]
    html = render_html(_snapshot([_run(1)], ops=ops), [])
    assert "Ops log · 305 ops" in html and "5 earlier ops left out" in html
    listed = re.findall(r'data-rf-op="(o\d+)"', html)
    assert len(listed) == 300 and listed[0] == "o5" and listed[-1] == "o304"


def test_the_plot_settings_are_the_live_panels_defaults_without_the_snapshots() -> None:
    runs = [_run(1), _run(2)]
    points = _points(1, "loss", {1: 2.0, 2: 1.5, 3: 1.2}) + _points(2, "loss", {1: 2.1, 2: 1.6, 3: 1.3})
    html = render_html(_snapshot(runs, panel_metrics=["loss", "eval_loss"]), points)
    line = re.search(r'data-rf-plot-settings=""[^>]*>([^<]*)</div>', html)
    assert line and line.group(1) == (
        "plots: loss, eval_loss · x: optimizer step · smoothing 0 (raw) · y scale auto (loss: linear; eval_loss: "
        "linear) · the live panel&#x27;s defaults"
    )
    assert plot_settings({}) == {"metrics": ["loss", "eval_loss"], "smoothing": 0.0, "y_scale": "auto",
                                 "from_panel": False}  # fmt: skip
    bad = {"plot_settings": {"metrics": [3], "smoothing": float("nan"), "y_scale": "cubic"}}
    assert plot_settings(bad) == {"metrics": ["loss", "eval_loss"], "smoothing": 0.0, "y_scale": "auto",
                                  "from_panel": True}  # fmt: skip


def test_the_live_panels_settings_are_drawn_and_named() -> None:
    settings = {"metrics": ["loss"], "smoothing": 0.6, "y_scale": "log"}
    points = _points(1, "loss", {1: 2.0, 2: 1.0, 3: 0.5, 4: 0.4})
    html = render_html(_snapshot([_run(1)], plot_settings=settings), points)
    (svg,) = _svgs(html)  # the panel's one plot, not the defaults' two
    assert 'data-rf-scale="log"' in svg and "log scale</text>" in svg
    assert svg.count("data-rf-raw") == 1  # the raw curve stays, faint, under the smoothed one
    assert (
        "smoothing 0.6 (raw curves faint) · y scale log (loss: log scale) · as the live panel had them"
        in html
    )


def test_auto_scale_goes_log_over_a_wide_span_and_clips_outliers_otherwise() -> None:
    runs = [_run(1), _run(2)]
    ipo = _points(1, "loss", {1: 25.0, 2: 24.0}) + _points(2, "loss", {1: 0.7, 2: 0.69})  # DPO ipo vs sigmoid
    (svg,) = _svgs(render_html(_snapshot(runs), ipo, metrics=["loss"]))
    assert 'data-rf-scale="log"' in svg and "log scale · auto (values span 36×)" in svg
    assert y_scale([25.0, 0.7]).kind == "log" and y_scale([25.0, 0.7], "linear").kind == "linear"
    rewards = [0.0, 0.1, 0.2, 0.1, 0.2, 0.15, 0.1, 0.2, 0.0, 0.1] * 3 + [-40.0]  # a reward with one outlier
    scale = y_scale(rewards)
    assert scale.kind == "linear" and scale.auto and scale.clipped == 1 and scale.range is not None
    assert scale.range[0] == pytest.approx(-0.01) and scale.range[1] == pytest.approx(0.21)
    assert scale_cue(scale) == "outliers clipped · auto (1 point off the range)"
    assert scale_cue(y_scale([1.0, 2.0, 3.0])) == ""


def test_smoothing_is_tensorboards_debiased_ema() -> None:
    assert smooth([1.0, 2.0, 3.0], 0.5) == pytest.approx([1.0, 5 / 3, 2.125 / 0.875])
    assert smooth([1.0, 2.0], 0.0) == [1.0, 2.0]


def test_every_plot_spans_the_same_steps() -> None:
    points = _points(1, "loss", {s: 2.0 - s / 10 for s in range(1, 21)}) + _points(
        1, "eval_loss", {5: 1.5, 10: 1.4}
    )
    loss, evals = _svgs(render_html(_snapshot([_run(1)]), points))
    ticks = [re.findall(r'text-anchor="middle">([0-9,]+)</text>', s) for s in (loss, evals)]
    assert ticks[0] == ticks[1] and ticks[0][0] == "5" and ticks[0][-1] == "20"


def test_a_run_whose_budget_ends_inside_an_epoch_says_why_its_chunks_are_fewer() -> None:
    grpo = _run(1, chunks_done=0, num_segments=1, total_steps=4, completed_steps=0, status="ONGOING")
    note = chunks_note(grpo, 2)
    assert note == (
        "1 chunk in all, with 2 chunks per epoch: its step budget (4 steps: max_steps, or a fractional "
        "num_train_epochs) ends in chunk 1/2 of epoch 1"
    )
    assert chunks_note({"num_segments": 5, "total_steps": 50}, 2) is not None
    assert "chunk 1/2 of epoch 3" in str(chunks_note({"num_segments": 5, "total_steps": 50}, 2))
    assert chunks_note({"num_segments": 4}, 2) is None and chunks_note({"num_segments": None}, 2) is None
    html = render_html(_snapshot([grpo, _run(2)]), [])
    assert f'title="{note}">0/1 *</td>' in html and ">2/2</td>" in html
