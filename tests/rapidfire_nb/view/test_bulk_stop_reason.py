"""A bulk stop records its own reason (issue 37): "stop all but best 2 by eval_loss" in the run's stop_reason, the
ops log's message and its payload, never "stopped by the user (panel)"; a plain stop stays the user's."""

from __future__ import annotations

import time
from typing import Any

from rapidfire_nb.panel import RunPanel
from rapidfire_nb.testing.fake_source import FakeSource
from rapidfire_nb.view.stops import StopInfo, stop_history

REASON = "stop all but best 2 by eval_loss"


def _stop(run_id: int, at: float, **payload: Any) -> dict[str, Any]:
    return {
        "op_id": f"o{run_id}",
        "run_id": run_id,
        "kind": "stop",
        "payload": payload,
        "source": "panel",
        "state": "applied",
        "requested_at": at,
        "applied_at": at,
    }


def test_stop_history_reads_a_bulk_stops_reason_from_its_payload() -> None:
    got = stop_history([_stop(1, 1.0, reason=REASON), _stop(2, 2.0)])
    assert got[1] == StopInfo(REASON, pruned=False)
    assert got[2] == StopInfo("stopped by the user (panel)", pruned=False)


def test_a_panel_stop_with_a_reason_is_recorded_with_it() -> None:
    with FakeSource(3, total_steps=400, steps_per_tick=1, tick_s=0.01) as src:
        panel = RunPanel(src, start=False)
        try:
            panel._on_frontend_msg(
                panel, {"type": "op", "op_id": "b1", "kind": "stop", "run_id": 2, "reason": REASON}, []
            )
            panel._on_frontend_msg(panel, {"type": "op", "op_id": "b2", "kind": "stop", "run_id": 3}, [])
            panel.pump_once()
            deadline = time.monotonic() + 30
            runs: dict[int, Any] = {}
            while time.monotonic() < deadline:
                snap = src.panel_snapshot()
                runs = {r["run_id"]: r for r in snap["runs"]}
                if runs[2]["status"] == runs[3]["status"] == "STOPPED":
                    break
                time.sleep(0.05)
        finally:
            panel.close()
    assert runs[2]["status"] == "STOPPED" and runs[2]["stop_reason"] == REASON and not runs[2]["pruned"]
    assert runs[3]["stop_reason"] == "stopped by the user (panel)"
    message = {o["op_id"]: o["message"] for o in snap["ops"]}
    assert message["b1"].endswith(f": {REASON}") and "stopped by the user" not in message["b1"]
    assert REASON not in message["b2"]
