"""The panel's static copy (rapidfire_nb.static_panel) and how it replaces the live panel (RunPanel.freeze, a clean
kernel shutdown): no kernel, no network, every user string escaped."""

from __future__ import annotations

import base64
import re
import time
import types
from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb import frontend
from rapidfire_nb.panel import RunPanel, display_panel
from rapidfire_nb.panel import widget as panel_mod
from rapidfire_nb.panel.static import (
    PALETTE,
    curve_series,
    nice_ticks,
    render_html,
    static_bundle,
)
from rapidfire_nb.testing.fake_source import FakeSource

REPO = Path(__file__).resolve().parents[3]
EVIL = '<script>alert("x")</script>'


def _svgs(html: str) -> list[str]:
    return [
        base64.b64decode(m).decode() for m in re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', html)
    ]


def _run(run_id: int, status: str = "COMPLETED", **extra: Any) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "status": status,
        "hparams": {},
        "completed_steps": 4,
        "total_steps": 4,
        "chunks_done": 4,
        "num_segments": 4,
        "samples_seen": 16,
        "loss": 1.0,
        "eval_loss": 1.0 + run_id / 10,
        "error": None,
        "parent_id": None,
        "warm_start": False,
        **extra,
    }


def _snapshot(runs: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "experiment": "exp",
        "now": 1000.0,
        "progress": "idle — 2/2 runs completed",
        "num_chunks": 4,
        "hparam_columns": [],
        "runs": runs,
        "elapsed_s": 83.0,
        "stats": {"percent": 100.0, "training": False},
        **extra,
    }


def _points(run_id: int, steps: range, name: str = "loss", base: float = 2.0) -> list[dict[str, Any]]:
    return [{"run_id": run_id, "step": s, "name": name, "value": base - s / 10} for s in steps]


def test_renders_a_fake_experiment_without_a_kernel_or_network() -> None:
    with FakeSource(4, total_steps=24, steps_per_tick=4, tick_s=0.01, fail=(4, 6)) as src:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(
            r["status"] in ("COMPLETED", "FAILED") for r in src.runs.values()
        ):
            time.sleep(0.05)
        snapshot = src.panel_snapshot()
        bundle = static_bundle(snapshot, src.metrics_since(0)[0])
    html = bundle["text/html"]
    assert html.startswith("<div data-rf-static") and html.count('<tr data-run-id="') == 4
    for bad in ("<script", "<svg", "<style", "http://", "https://", "plotly"):
        assert bad not in html, bad  # self-contained: nothing to load, nothing a sanitizer strips
    assert "torch.OutOfMemoryError" in html  # the failed run's error, in the table
    best = min((r for r in snapshot["runs"] if r["eval_loss"] is not None), key=lambda r: r["eval_loss"])
    best_row = re.search(rf'<tr data-run-id="{best["run_id"]}"[^>]*>.*?</tr>', html)
    assert best_row and "★" in best_row.group(0) and "background-color" in best_row.group(0)
    assert html.count("★") == 1
    svgs = _svgs(html)
    assert len(svgs) == 2 and all(s.count("<polyline") >= 3 for s in svgs)  # loss and eval_loss curves
    assert "training time" in html and "run 4" in bundle["text/plain"] and "FAILED" in bundle["text/plain"]
    assert len(html) < 60_000


def test_escapes_every_user_string() -> None:
    runs = [
        _run(
            1,
            "FAILED",
            hparams={f"lr{EVIL}": EVIL},
            error=f"bad <b>value</b> {EVIL}",
            loss=float("nan"),
            eval_loss=None,
        ),
        _run(2, parent_id=1, warm_start=True),
    ]
    snap = _snapshot(runs, experiment=f"e{EVIL}", hparam_columns=[f"lr{EVIL}"], progress=EVIL)
    points = _points(1, range(1, 5), name=f"loss{EVIL}") + _points(2, range(5, 9), name=f"loss{EVIL}")
    html = render_html(snap, points, note=EVIL, metrics=(f"loss{EVIL}",))
    assert EVIL not in html and "<b>value" not in html
    assert (
        html.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;") >= 5
    )  # name, column, value, error, note
    (svg,) = _svgs(html)
    assert EVIL not in svg and "loss&lt;script&gt;" in svg
    assert "nan" not in html.lower()  # a NaN is never shown as a number


def test_a_warm_clone_curve_starts_at_its_parent_at_the_branch_step() -> None:
    runs = [_run(1), _run(2, parent_id=1, warm_start=True), _run(3, parent_id=1, warm_start=False)]
    points = _points(1, range(1, 9)) + _points(2, range(5, 9), base=3.0) + _points(3, range(1, 9), base=4.0)
    series = curve_series(points, runs, "loss")
    assert series[2][0] == (4.0, pytest.approx(2.0 - 0.4))  # run 1's point at step 4, then the clone's own
    assert [x for x, _ in series[2]] == [4.0, 5.0, 6.0, 7.0, 8.0]
    assert series[3][0] == (1.0, pytest.approx(3.9))  # a cold clone starts from scratch: not joined
    deleted = curve_series(points, [*runs[:2], _run(3, "DELETED")], "loss")
    assert 3 not in deleted


def test_integer_ticks_on_the_step_axis() -> None:
    assert nice_ticks(1, 4, 6, integer=True) == [1, 2, 3, 4]  # never 1.5
    assert nice_ticks(0, 100, 5, integer=True) == [0, 20, 40, 60, 80, 100]
    assert nice_ticks(0.52, 0.97, 4) == pytest.approx([0.6, 0.8])
    assert nice_ticks(3, 3) == [3]


def test_the_palette_is_the_front_ends_and_tensorboards() -> None:
    text = (REPO / "widgets" / "format.js").read_text()
    m = re.search(r"export const PALETTE = \[([^\]]*)\]", text)
    assert m, "PALETTE in widgets/format.js"
    assert tuple(re.findall(r'"(#[0-9a-f]{6})"', m.group(1))) == PALETTE
    # TensorBoard 2.x Time Series run colours (tensorboard/webapp/util/colors.ts DEFAULT_PALETTE, light theme)
    assert PALETTE == ("#425066", "#12b5cb", "#e52592", "#f9ab00", "#9334e6", "#7cb342", "#e8710a")


# ------------------------------------------------------------------------------------------------ freeze


class Handle:
    def __init__(self) -> None:
        self.updates: list[tuple[Any, dict[str, Any]]] = []

    def update(self, obj: Any, **kwargs: Any) -> None:
        self.updates.append((obj, kwargs))


def _sent(panel: RunPanel, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    sent: list[Any] = []
    monkeypatch.setattr(panel, "send", lambda content, buffers=None: sent.append(content))
    return sent


def test_freeze_replaces_the_output_by_the_static_copy_and_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeSource(2, total_steps=8, start=False) as src:
        for _ in range(4):
            src.step()
        panel = RunPanel(src, start=False)
        sent = _sent(panel, monkeypatch)
        handle = Handle()
        panel.add_display_handle(handle)
        panel.freeze()
        panel.freeze()  # idempotent
    assert panel.frozen and not panel.pump_alive and panel.comm is None
    ((bundle, kwargs),) = handle.updates
    assert kwargs == {"raw": True} and set(bundle) == {"text/html", "text/plain"}
    assert "data-rf-static" in bundle["text/html"]
    frozen = [m for m in sent if m.get("type") == "frozen"]
    assert len(frozen) == 1 and frozen[0]["html"] == bundle["text/html"]


def test_a_clean_kernel_shutdown_freezes_the_displayed_panels(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    kernel = types.SimpleNamespace(
        do_shutdown=lambda restart: calls.append(f"shutdown {restart}") or {"ok": 1}
    )
    monkeypatch.setattr(frontend, "ipython", lambda: types.SimpleNamespace(kernel=kernel))
    monkeypatch.setattr(panel_mod, "in_kernel", lambda: True)
    handle = Handle()
    import IPython.display

    monkeypatch.setattr(IPython.display, "display", lambda obj, **kw: handle)
    with FakeSource(2, total_steps=8, start=False) as src:
        shown = display_panel(src)
        assert isinstance(shown, RunPanel)
        _sent(shown, monkeypatch)
        assert kernel.do_shutdown(False) == {"ok": 1}  # what ipykernel calls on a shutdown_request
    assert calls == ["shutdown False"] and shown.frozen
    ((bundle, _),) = handle.updates
    assert "kernel shut down" in bundle["text/html"]
    frontend.on_kernel_shutdown(lambda: calls.append("again"))  # one wrapper, hooks added to it
    kernel.do_shutdown(True)
    assert calls == ["shutdown False", "again", "shutdown True"]


def test_on_kernel_shutdown_outside_a_kernel_registers_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frontend, "ipython", lambda: None)
    assert frontend.on_kernel_shutdown(lambda: None) is False


def test_several_devices_a_device_column_and_a_chip_per_device() -> None:
    runs = [_run(1, device="cpu:0"), _run(2, "ONGOING", device="cpu:1")]
    devices = [
        {"name": "cpu:0", "state": "idle", "run_id": None},
        {"name": "cpu:1", "state": "training", "run_id": 2},
        {"name": "cpu:2", "state": "lost", "run_id": None},
    ]
    bundle = static_bundle(_snapshot(runs, devices=devices), [])
    html = bundle["text/html"]
    assert ">Device</th>" in html
    assert re.findall(r'data-rf-device-cell="">([^<]*)<', html) == ["cpu:0", "cpu:1"]
    assert all(c in html for c in ("cpu:0 · idle", "cpu:1 · run 2", "cpu:2 · lost"))
    assert "run 2  ONGOING  cpu:1  step" in bundle["text/plain"]
    one = static_bundle(_snapshot([_run(1, device=None)]), [])["text/html"]  # one device: nothing new
    assert "Device</th>" not in one and "data-rf-device-cell" not in one


def test_a_pruned_run_wears_the_pruned_badge_and_counts_apart_from_the_stopped() -> None:
    reason = "eval_loss 2.71 not in the best 2 of 4 at this rung (cutoff 2.43)"
    runs = [
        _run(1),
        _run(2, "STOPPED", pruned=True, stop_reason=reason),
        _run(3, "STOPPED", pruned=True, stop_reason=reason),
        _run(4, "STOPPED", pruned=False, stop_reason="stopped by the user (panel)"),
    ]
    points = [p for rid in (1, 2, 4) for p in _points(rid, range(1, 5))]
    bundle = static_bundle(_snapshot(runs), points)
    html = bundle["text/html"]
    loss_svg = _svgs(html)[0]
    assert re.findall(r'data-rf-pruned="(\d+)"', loss_svg) == ["2"]  # a cross where run 2 was cut; none for 4
    assert re.findall(r'data-rf-status="([A-Z]+)"', html) == ["COMPLETED", "PRUNED", "PRUNED", "STOPPED"]
    assert html.count("✂ PRUNED</span>") == 2
    assert "2 pruned" in html and "1 stopped" in html and "1 completed" in html
    assert re.findall(r'data-pruned-for="(\d+)"', html) == ["2", "3"]  # the reasons stay in the record
    # each stop's reason: a row under the run (the policy's for a pruned run, the user's for a stop) and the badge's title
    assert html.count(f"early stopping: {reason}</td>") == 2 and html.count(f'title="{reason}"') == 2
    assert re.findall(r'data-stopped-for="(\d+)"', html) == ["4"]
    assert "run 4 stopped: stopped by the user (panel)</td>" in html
    lines = bundle["text/plain"].splitlines()
    assert "run 2  PRUNED  step" in lines[2] and "run 4  STOPPED  step" in lines[4]
