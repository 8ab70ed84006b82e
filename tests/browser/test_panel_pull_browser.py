"""The panel where unsolicited kernel messages are dropped (Colab, some VS Code versions), emulated in JupyterLab.

The page's kernel connection is patched (through ``window.jupyterapp``) so that it delivers an IOPub message only
while it answers one of this front end's own requests: its parent header names a shell request the page sent
(an ``execute_request``, a widget's ``comm_msg``...) whose ``idle`` status has not arrived yet. Everything else
(the pump thread's pushes once the cell has finished) is dropped, as Colab's front end drops (or holds until the
next cell) widget messages sent from a background thread (googlecolab/colabtools#3373). Colab itself was not tried.

The panel must still show live curves: it asks the kernel for what changed since its last sequence number about
every second, and the kernel answers in the comm handler, i.e. in reply to that request. A Stop is acknowledged
(the ack is the reply to the op's own message) and the run reaches STOPPED. The latency of each chunk end (the
chunk's last loss point: the kernel's wall time when it was logged, to the moment the page's loss plot holds it)
is written to ``artifacts/browser/colab_latency.txt``. On the push-only panel (before pulls) this test fails:
the curves stay empty (plotly.js and the first snapshot were pushed by the pump, after the request's idle).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts" / "browser"

pytestmark = pytest.mark.browser

#: Seconds from a chunk end to its points in the page's plot (the issue's "~2 s").
MAX_LATENCY_S = 2.0

CELL = """\
from rapidfire_nb.testing.fake_source import FakeSource
from rapidfire_nb.panel import RunPanel
source = FakeSource(3, total_steps=160, num_chunks=4, steps_per_tick=1, tick_s=0.04, eval_every=20,
                    experiment="colab-pull")
panel = RunPanel(source)
panel
"""
WALLS_CELL = """\
import json
_points, _ = source.metrics_since(0)
json.dump([[p["run_id"], p["step"], p["wall_time"]] for p in _points if p["name"] == "loss"],
          open("colab_walls.json", "w"))
panel.close(); source.close()
"""

# Installed in the page before the cell runs: the Colab-like filter on the notebook's kernel connection, and a
# sampler that notes when the loss plot first holds each (run, step).
EMULATE_COLAB = """() => {
  const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  const active = new Set();  // msg_ids of this page's shell requests still being answered
  const stats = { sent: 0, passed: 0, dropped: 0, droppedComm: 0 };
  const send = kernel.sendShellMessage.bind(kernel);
  kernel.sendShellMessage = (msg, ...rest) => {
    active.add(msg.header.msg_id); stats.sent += 1;
    return send(msg, ...rest);
  };
  const handle = kernel._handleMessage.bind(kernel);
  kernel._handleMessage = (msg) => {
    if (msg.channel === "iopub") {
      const parent = msg.parent_header && msg.parent_header.msg_id;
      const own = !!parent && active.has(parent);
      if (msg.header.msg_type === "status") {
        if (own && msg.content.execution_state === "idle") active.delete(parent);
      } else if (!own) {
        stats.dropped += 1;
        if (msg.header.msg_type.startsWith("comm_")) stats.droppedComm += 1;
        return Promise.resolve();
      } else {
        stats.passed += 1;
      }
    }
    return handle(msg);
  };
  window.__rfColab = stats;
  window.__rfSeen = [];
  const best = {};
  setInterval(() => {
    const div = document.querySelector('[data-rf-panel] .rf-card[data-metric="loss"] .rf-plot');
    for (const tr of (div && div.data) || []) {
      if (!tr.meta || tr.meta.raw || tr.meta.pruned || !tr.customdata || !tr.customdata.length) continue;
      const step = Math.max(...tr.customdata.map((c) => c[0]));
      if (step > (best[tr.meta.run] || 0)) {
        best[tr.meta.run] = step;
        window.__rfSeen.push([tr.meta.run, step, Date.now() / 1000]);
      }
    }
  }, 50);
}"""


def _chunk_ends(walls: list[list[Any]]) -> list[tuple[int, int, float]]:
    """(run, step, wall) of each chunk's last loss point: the run on the device changes after it."""
    return [
        (int(r), int(s), float(w))
        for (r, s, w), nxt in zip(walls, walls[1:], strict=False)
        if int(nxt[0]) != int(r)
    ]


def _latencies(walls: list[list[Any]], seen: list[list[Any]], until: float) -> list[tuple[int, int, float]]:
    """(run, step, seconds until the page's plot held it) of every chunk end logged while the page showed curves
    (after its first plotted point: plotly.js loads meanwhile) and before ``until``."""
    out = []
    first = min(t for _, _, t in seen)
    for run, step, wall in _chunk_ends(walls):
        if not first <= wall <= until:
            continue
        shown = [t for r, s, t in seen if r == run and s >= step]
        out.append((run, step, (min(shown) if shown else float("inf")) - wall))
    return out


def test_panel_live_where_only_replies_arrive(lab: Any) -> None:
    page = lab.page
    lab.open_notebook("colab_pull.ipynb", [CELL, WALLS_CELL])
    page.evaluate(EMULATE_COLAB)
    started = time.time()
    lab.run_cell(0)
    panel = page.locator("[data-rf-panel]")
    panel.wait_for(timeout=30_000)
    page.wait_for_function(
        "() => Number(document.querySelector('[data-rf-plots]').dataset.points) > 0", timeout=20_000
    )
    # several chunk ends while the cell is long finished (the pump's pushes are dropped meanwhile)
    page.wait_for_function(
        """() => { const c = document.querySelector('[data-rf-panel] tr[data-run-id="3"] .rf-col-step');
                   return !!c && !c.textContent.trim().startsWith('0/'); }""",
        timeout=30_000,
    )
    time.sleep(6.0)
    observed_until = time.time()

    # Stop the run on the device: the ack is the reply to the op's own message, well before the 2.5 s fallback
    row = panel.locator('tr[data-on-device="true"]')
    row.wait_for(timeout=10_000)
    run_id = int(row.get_attribute("data-run-id") or 0)
    clicked = time.monotonic()
    row.locator('button[data-op="stop"]').click()
    page.wait_for_function(
        """() => [...document.querySelectorAll('[data-rf-panel] .rf-notice')]
            .some((n) => n.dataset.state === 'queued' || n.dataset.state === 'applied')""",
        timeout=10_000,
    )
    acked_s = time.monotonic() - clicked
    notice = panel.locator(".rf-notice").first.inner_text()
    assert "through the server" not in notice, notice
    page.wait_for_selector(
        f'[data-rf-panel] tr[data-run-id="{run_id}"][data-status="STOPPED"]', timeout=20_000
    )
    stopped_s = time.monotonic() - clicked
    stats = page.evaluate("() => window.__rfColab")
    seen = page.evaluate("() => window.__rfSeen")

    lab.run_cell(1)
    walls_path = lab.server.root_dir / "colab_walls.json"
    deadline = time.monotonic() + 20
    while not walls_path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.3)
    walls = json.loads(walls_path.read_text())
    lat = _latencies(walls, seen, observed_until)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "colab_latency.txt").write_text(
        f"first points plotted {min(t for _, _, t in seen) - started:.2f} s after the cell was run\n"
        + "\n".join(f"run {r} step {s}: {d:.2f} s" for r, s, d in lat)
        + f"\nstop acked after {acked_s:.2f} s, STOPPED after {stopped_s:.2f} s; messages {stats}\n"
    )
    assert stats["droppedComm"] > 0, stats  # the emulation did drop the pump's pushes
    assert len(lat) >= 4, lat
    assert max(d for _, _, d in lat) <= MAX_LATENCY_S, lat
    assert acked_s < 2.5, acked_s
