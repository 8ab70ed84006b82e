"""RunPanel / TextProgress logic with a patched ``send`` (no front end, no kernel)."""

from __future__ import annotations

import io
import json
import math
import shutil
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb.errors import OpError
from rapidfire_nb.panel import (
    RunPanel,
    TextProgress,
    decode_points,
    display_panel,
    format_chunk_line,
    plotly_js_path,
)
from rapidfire_nb.panel import widget as panel_mod
from rapidfire_nb.testing.fake_source import FakeSource

REPO = Path(__file__).resolve().parents[3]


class ListSource:
    """A minimal panel source: points appended by the test, ops recorded."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.points: list[dict[str, Any]] = []
        self.calls: list[tuple[Any, ...]] = []
        self.call_threads: list[str] = []
        self.status = "ONGOING"
        self.fail_with: Exception | None = None

    def add(self, run_id: int, step: int, value: float, name: str = "loss") -> None:
        with self.lock:
            self.points.append(
                {"run_id": run_id, "step": step, "samples_seen": step * 8, "name": name, "value": value}
            )

    def panel_snapshot(self) -> dict[str, Any]:
        return {
            "experiment": "exp",
            "started_at": 1000.0,
            "now": time.time(),
            "progress": "chunk 1/4 of epoch 1",
            "on_device": 1,
            "num_chunks": 4,
            "hparam_columns": ["learning_rate"],
            "runs": [
                {
                    "run_id": 1,
                    "status": self.status,
                    "on_device": True,
                    "hparams": {"learning_rate": 1e-4},
                    "completed_steps": len(self.points),
                    "total_steps": 10_000,
                    "chunks_done": 0,
                    "epoch": 0.0,
                    "samples_seen": 0,
                    "loss": float("nan"),
                    "eval_loss": None,
                    "error": None,
                    "parent_id": None,
                    "warm_start": False,
                    "legal_ops": ["stop", "delete", "clone"],
                }
            ],
            "ops": [],
            "metric_names": ["loss"],
        }

    def metrics_since(self, cursor: int) -> tuple[list[dict[str, Any]], int]:
        with self.lock:
            return [dict(p) for p in self.points[cursor:]], len(self.points)

    def submit_op(
        self,
        kind: str,
        run_id: int,
        op_id: str | None = None,
        changes: dict[str, Any] | None = None,
        warm_start: bool = False,
        source: str = "panel",
    ) -> Any:
        self.calls.append((kind, run_id, op_id, changes, warm_start, source))
        self.call_threads.append(threading.current_thread().name)
        if self.fail_with is not None:
            raise self.fail_with
        from kernel_scheduler.ops import OpAck

        return OpAck(
            op_id or "x",
            run_id,
            kind,
            "queued",
            f"{kind} requested for run {run_id} — applies at the end of its current chunk",
        )


class Recorder:
    """Stands in for ``Widget.send``: records messages (checking they are strict JSON) and buffers."""

    def __init__(self) -> None:
        self.messages: list[tuple[dict[str, Any], list[bytes] | None]] = []
        self.lock = threading.Lock()

    def __call__(self, content: dict[str, Any], buffers: list[bytes] | None = None) -> None:
        json.dumps(content, allow_nan=False)  # what jupyter_client's packer needs
        with self.lock:
            self.messages.append((content, buffers))

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        with self.lock:
            return [m for m, _ in self.messages if m["type"] == kind]


def make_panel(source: Any, **kwargs: Any) -> tuple[RunPanel, Recorder]:
    panel = RunPanel(source, **kwargs)
    rec = Recorder()
    panel.send = rec  # type: ignore[method-assign]
    return panel, rec


def hello(panel: RunPanel, msg_type: str = "hello", **extra: Any) -> None:
    """Deliver a front-end message as the comm would (``on_msg`` handler)."""
    panel._on_frontend_msg(panel, {"type": msg_type, **extra}, [])


def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def delivered_points(rec: Recorder) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for msg, _ in rec.messages:
        if msg["type"] == "snapshot" and msg.get("reset"):
            out = []
        if msg.get("points"):
            out.extend(decode_points(msg["points"]))
    return out


# ---------------------------------------------------------------------------------------------------------


def test_hello_answers_with_full_snapshot() -> None:
    src = FakeSource(3, total_steps=40, eval_every=5, start=False)
    for _ in range(30):
        src.step()
    panel, rec = make_panel(src, start=False)
    try:
        hello(panel)  # answered in the comm handler (a reply to the front end's own message)
        (snap_msg,) = rec.of_type("snapshot")
        expected = src.panel_snapshot()
        got = snap_msg["snapshot"]
        assert snap_msg["reset"] is True
        assert [r["run_id"] for r in got["runs"]] == [1, 2, 3]
        assert got["runs"] == expected["runs"]
        assert (
            got["hparam_columns"]
            == expected["hparam_columns"]
            == ["learning_rate", "lora.r", "per_device_train_batch_size"]
        )
        assert set(got["metric_names"]) >= {"loss", "eval_loss", "learning_rate", "grad_norm"}
        assert decode_points(snap_msg["points"]) == src.metrics_since(0)[0]
        # nothing new -> nothing sent; new points -> an update with only those
        assert not panel.pump_once()
        cursor = len(src.metrics_since(0)[0])
        src.step()
        assert panel.pump_once()
        update = rec.of_type("update")[-1]
        assert decode_points(update["points"]) == src.metrics_since(cursor)[0] != []
        # a second view says hello: everything again, from the start
        hello(panel)
        panel.pump_once()
        assert decode_points(rec.of_type("snapshot")[-1]["points"]) == src.metrics_since(0)[0]
    finally:
        panel.close()


def test_points_coalesced_delivered_once_in_order() -> None:
    src = ListSource()
    panel, rec = make_panel(src, poll_interval=0.2)
    try:
        hello(panel)
        wait_for(lambda: rec.of_type("snapshot"))
        t0 = time.monotonic()
        for i in range(1000):
            src.add(1 + i % 3, i, 1.0 / (i + 1))
            if i % 100 == 0:
                time.sleep(0.03)
        wait_for(lambda: len(delivered_points(rec)) == 1000)
        elapsed = time.monotonic() - t0
        sent = [m for m, _ in rec.messages if m["type"] in ("update", "points")]
        assert 1 <= len(sent) <= max(3, 10 * elapsed), (len(sent), elapsed)
        got = delivered_points(rec)
        assert [(p["run_id"], p["step"]) for p in got] == [(1 + i % 3, i) for i in range(1000)]
        assert got[0]["samples_seen"] == 0 and got[999]["value"] == pytest.approx(1 / 1000)
    finally:
        panel.close()


def test_message_rate_capped_whatever_the_step_rate() -> None:
    src = ListSource()
    panel, rec = make_panel(src, poll_interval=0.05)  # even a too-eager poll interval
    stop = threading.Event()

    def produce() -> None:
        i = 0
        while not stop.wait(0.001):  # ~20,000 points/s
            for _ in range(20):
                src.add(1, i, 0.5)
                i += 1

    t = threading.Thread(target=produce)
    try:
        t.start()
        time.sleep(1.0)
        stop.set()
        t.join()
        n = len(src.points)
        wait_for(lambda: len(delivered_points(rec)) == n)
        assert len(rec.messages) <= 13  # <= ~10 messages/s
        assert [p["step"] for p in delivered_points(rec)] == list(range(n))
    finally:
        stop.set()
        panel.close()


def test_op_submitted_once_per_op_id_and_acked() -> None:
    src = ListSource()
    panel, rec = make_panel(src)
    try:
        op = {"op_id": "op-1", "kind": "stop", "run_id": 1, "changes": {}, "warm_start": False}
        # comm handlers may run on another thread (a kernel subshell): they answer in place, under the lock
        handler = threading.Thread(target=lambda: hello(panel, "op", **op))
        handler.start()
        handler.join()
        hello(panel, "op", **op)  # the same click delivered twice
        hello(
            panel,
            "op",
            op_id="op-2",
            kind="clone",
            run_id=1,
            changes={"learning_rate": 5e-4},
            warm_start=True,
        )
        wait_for(lambda: len(rec.of_type("ack")) == 3)
        assert src.calls == [
            ("stop", 1, "op-1", None, False, "panel"),
            ("clone", 1, "op-2", {"learning_rate": 5e-4}, True, "panel"),
        ]
        assert "rapidfire-panel-pump" not in src.call_threads
        acks = [m["ack"] for m in rec.of_type("ack")]
        assert [a["op_id"] for a in acks] == ["op-1", "op-1", "op-2"]
        assert (
            acks[0]["state"] == "queued" and "applies at the end of its current chunk" in acks[0]["message"]
        )
    finally:
        panel.close()


def test_op_error_becomes_rejected_ack() -> None:
    src = ListSource()
    src.fail_with = OpError("run 9 does not exist")
    panel, rec = make_panel(src, start=False)
    try:
        hello(panel, "op", op_id="bad", kind="stop", run_id=9)
        panel.pump_once()
        (ack,) = [m["ack"] for m in rec.of_type("ack")]
        assert ack == {
            "op_id": "bad",
            "run_id": 9,
            "kind": "stop",
            "state": "rejected",
            "message": "run 9 does not exist",
        }
    finally:
        panel.close()


def test_ops_through_fake_source_reach_the_ops_log() -> None:
    src = FakeSource(3, total_steps=40, start=False)
    src.step()  # run 1 on the device
    panel, rec = make_panel(src, start=False)
    try:
        hello(panel, "op", op_id="s2", kind="stop", run_id=2)
        hello(panel, "op", op_id="s1", kind="stop", run_id=1)
        panel.pump_once()
        acks = {m["ack"]["op_id"]: m["ack"] for m in rec.of_type("ack")}
        assert "applies now" in acks["s2"]["message"]
        assert "end of its current chunk" in acks["s1"]["message"]
        for _ in range(15):
            src.step()
        panel.pump_once()
        snap = rec.of_type("update")[-1]["snapshot"]
        assert {r["run_id"]: r["status"] for r in snap["runs"]} == {1: "STOPPED", 2: "STOPPED", 3: "ONGOING"}
        assert [(o["op_id"], o["state"]) for o in snap["ops"]] == [("s2", "applied"), ("s1", "applied")]
        src.step()
        panel.pump_once()
        assert "ops" not in rec.of_type("update")[-1]["snapshot"]  # unchanged ops log: not resent
        assert snap["runs"][0]["chunks_done"] == 1 and snap["runs"][0]["legal_ops"] == [
            "resume",
            "delete",
            "clone",
        ]
    finally:
        panel.close()


def test_need_plotly_sends_the_package_file_as_one_buffer() -> None:
    panel, rec = make_panel(ListSource(), start=False)
    try:
        hello(panel, "need_plotly")
        panel.pump_once()
        (msg, buffers) = next((m, b) for m, b in rec.messages if m["type"] == "plotly")
        path = plotly_js_path()
        assert path.name == "plotly.min.js" and path.parent.name == "package_data"
        assert buffers is not None and len(buffers) == 1
        assert len(buffers[0]) == path.stat().st_size == msg["size"]
        assert len(str(panel._esm)) < 100_000  # plotly is never inlined in the ES module
    finally:
        panel.close()


def test_close_stops_and_joins_the_pump() -> None:
    panel, _ = make_panel(ListSource())
    assert panel.pump_alive
    names = {t.name for t in threading.enumerate()}
    assert "rapidfire-panel-pump" in names
    panel.close()
    assert not panel.pump_alive
    assert panel._pump._thread not in threading.enumerate()
    panel.close()  # idempotent


def test_widget_state_stays_small() -> None:
    src = ListSource()
    for i in range(5000):
        src.add(1, i, 0.1)
    panel, _ = make_panel(src, start=False)
    try:
        hello(panel)
        panel.pump_once()
        state = panel.get_state()
        synced = {k: v for k, v in state.items() if k not in ("_esm", "_css")}
        assert len(json.dumps(synced)) < 2_000
        assert len(json.dumps(state)) < 150_000  # ES module + CSS included: a saved notebook stays < 200 KB
        assert set(panel.summary) >= {"experiment", "progress", "on_device", "counts", "started_at"}
        assert panel.summary["counts"] == {"ONGOING": 1}
    finally:
        panel.close()


def test_summary_trait_follows_the_source() -> None:
    src = ListSource()
    panel, _ = make_panel(src, start=False)
    try:
        assert panel.summary["active"] is True
        src.status = "STOPPED"
        panel.pump_once()
        assert panel.summary["counts"] == {"STOPPED": 1}
    finally:
        panel.close()


def test_text_repr_summarises_for_front_ends_without_widgets() -> None:
    panel, _ = make_panel(ListSource(), start=False)
    try:
        text = panel._repr_mimebundle_()[0]["text/plain"]  # type: ignore[index]
        assert text == "<RunPanel 'exp': 1 run (1 ongoing); chunk 1/4 of epoch 1; run 1 on device>"
    finally:
        panel.close()


def test_source_errors_are_reported_not_raised() -> None:
    src = ListSource()
    panel, rec = make_panel(src, start=False)

    def broken() -> dict[str, Any]:
        raise RuntimeError("store is locked")

    src.panel_snapshot = broken  # type: ignore[method-assign]
    try:
        panel.pump_once()
        panel.pump_once()
        assert [m["message"] for m in rec.of_type("error")] == ["RuntimeError: store is locked"]
    finally:
        panel.close()


def test_widget_files_are_the_real_files() -> None:
    # the ES module is widgets/panel.js with its sibling modules inlined (anywidget loads one module text)
    assert RunPanel._esm == panel_mod.bundle_esm(REPO / "widgets" / "panel.js")
    assert "export default" in str(RunPanel._esm)
    assert ".rf-panel" in str(RunPanel._css)


@pytest.mark.skipif(shutil.which("node") is None, reason="node not installed")
def test_front_end_module_parses_and_formats_numbers() -> None:
    script = (
        "import('./widgets/panel.js').then(m => {"
        " if (typeof m.default.render !== 'function') process.exit(3);"
        " console.log(JSON.stringify([m.fmtNum(1e-4), m.fmtNum(0.812345), m.fmtNum(2.5e-5), m.fmtNum(12),"
        " m.fmtNum(1234.5678), m.fmtNum(null), m.runColor(1), m.runColor(11)])); })"
    )
    out = subprocess.run(
        ["node", "--input-type=module", "-e", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    dash = "\u2013"  # shown for missing values
    assert json.loads(out.stdout) == ["1e-4", "0.8123", "2.5e-5", "12", "1235", dash, "#425066", "#f9ab00"]


# ---------------------------------------------------------------------------------------------------------
# text fallback and environment choice


def test_text_progress_prints_one_line_per_chunk() -> None:
    src = FakeSource(2, total_steps=8, num_chunks=2, start=False, fail=(2, 6))
    out = io.StringIO()
    progress = TextProgress(src, file=out, start=False)
    progress.poll()
    for _ in range(30):
        src.step()
        progress.poll()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[fake-sft] 2 runs, 2 chunks per epoch")
    run_lines = lines[1:]
    assert [ln.split("  ")[1] for ln in run_lines] == ["run 1", "run 2", "run 1", "run 2"]
    assert "chunk 1/2" in run_lines[0] and "step 4/8" in run_lines[0] and "lr=1e-4" in run_lines[0]
    assert "COMPLETED" in run_lines[2] and "chunk 2/2" in run_lines[2]
    assert "FAILED: torch.OutOfMemoryError" in run_lines[3]
    progress.close()


def test_format_chunk_line_rounds_numbers() -> None:
    run = {
        "run_id": 3,
        "status": "ONGOING",
        "chunks_done": 2,
        "completed_steps": 60,
        "total_steps": 120,
        "loss": 0.812345678,
        "eval_loss": math.nan,
        "samples_seen": 480,
        "hparams": {"learning_rate": 0.0001, "lora.r": 16},
    }
    line = format_chunk_line(
        run, num_chunks=4, hparam_columns=["learning_rate", "lora.r"], experiment="demo", elapsed=83
    )
    assert line == (
        "[demo 0:01:23]  run 3  chunk 2/4  step 60/120  loss 0.8123  eval_loss nan  samples 480  "
        "lr=1e-4  r=16"
    )


def test_display_panel_outside_a_kernel_returns_text_progress() -> None:
    src = ListSource()
    out = io.StringIO()
    view = display_panel(src, file=out)
    try:
        assert isinstance(view, TextProgress)
        wait_for(lambda: "[exp] 1 run, 4 chunks per epoch" in out.getvalue())
    finally:
        view.close()


@pytest.mark.parametrize("colab", [False, True])
def test_display_panel_in_a_kernel_displays_the_widget(monkeypatch: pytest.MonkeyPatch, colab: bool) -> None:
    shown: list[Any] = []
    monkeypatch.setattr(panel_mod, "in_kernel", lambda: True)
    import IPython.display

    def fake_display(obj: Any, **kwargs: Any) -> None:
        assert kwargs == {"display_id": True}  # freeze() replaces this output by the static copy
        shown.append(obj)

    monkeypatch.setattr(IPython.display, "display", fake_display)
    if colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    out = io.StringIO()
    view = display_panel(ListSource(), file=out)
    try:
        assert isinstance(view, RunPanel) and shown == [view]
        assert ("%rapidfire tensorboard" in out.getvalue()) is colab
        assert out.getvalue().count("\n") == (1 if colab else 0)
    finally:
        view.close()
