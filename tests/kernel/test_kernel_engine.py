"""A real IPython kernel (this venv's Python, driven with ``jupyter_client``) trains 3 tiny runs in the background.

What a notebook user relies on, checked at the message level:

* the ``run_fit`` cell returns (``execute_reply``) as soon as the runs are validated, long before training
  ends — later cells run while the runs are NEW/ONGOING;
* the panel's widget comm opens (``comm_open`` of an anywidget model, displayed by the ``run_fit`` cell);
* the front-end protocol: a ``hello`` custom message is answered by a full ``snapshot``; ``update`` messages
  then append metric points (coalesced: a few messages per second at most); an ``op`` click stops run 2
  (acknowledged, de-duplicated by ``op_id``, STOPPED in ``get_runs_info()``) while runs 1 and 3 complete;
* the chunk lines printed by the scheduler thread belong to the ``run_fit`` cell (its ``msg_id`` is their
  parent), even while another cell is executing;
* ``%load_ext rapidfire_nb``, ``%rapidfire clone 1 --warm learning_rate=5e-4`` (a 4th run appears and
  completes) and ``%rapidfire`` (the status table).

Sizes: 128 rows, batch 2, 2 epochs, 4 chunks per epoch -> 128 optimizer steps and 8 chunks per run (about
20-60 s of training for the three runs on a 2-core machine).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

pytestmark = pytest.mark.kernel

SETUP = """\
import json, time
import torch, transformers, trl, peft  # the heavy imports, outside the timed run_fit cell
from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset
train, evald = tiny_sft_dataset(128), tiny_sft_dataset(4, seed=1)
group = RFGridSearch(List([
    RFModelConfig(model_name="tiny",
                  peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
                  training_args=RFSFTConfig(learning_rate=lr, per_device_train_batch_size=2, num_train_epochs=2,
                                            max_length=48, logging_steps=1))
    for lr in (1e-3, 2e-3, 3e-3)]), "SFT")
exp = Experiment("kernel-engine")
exp.progress_lines = True  # the chunk lines too, under the panel (checked below: they land in run_fit's cell)
"""

RUN_FIT = "exp.run_fit(group, tiny_create_model, train, evald, num_chunks=4, seed=7)"

STATUSES = "print('STATUS', json.dumps({int(r.run_id): r.status for r in exp.get_runs_info().itertuples()}))"

CHUNK_LINE = re.compile(r"\[rapidfire\] run (\d+) · (chunk \d+/\d+ of epoch \d+ done|completed)")


def _statuses(cell: Any) -> dict[int, str]:
    m = re.search(r"STATUS (\{.*\})", cell.stdout)
    assert m, cell.text
    return {int(k): v for k, v in json.loads(m.group(1)).items()}


def _custom(rec: Any, comm_id: str) -> dict[str, Any] | None:
    """The custom content of a widget ``comm_msg`` sent by the kernel on ``comm_id``, else None."""
    if rec.msg_type != "comm_msg" or rec.content.get("comm_id") != comm_id:
        return None
    data = rec.content.get("data") or {}
    if data.get("method") != "custom":
        return None
    content = data.get("content")
    return content if isinstance(content, dict) else None


def _n_points(content: dict[str, Any]) -> int:
    pts = content.get("points") or {}
    return len(pts.get("run") or [])


def test_run_fit_in_a_real_kernel(ipy_kernel: Any) -> None:
    k = ipy_kernel
    k.execute(SETUP, timeout=180)

    # ------------------------------------------------------------------ run_fit returns at once
    fit = k.execute(RUN_FIT, timeout=120)
    assert "training in the background" in fit.stdout, fit.text
    right_after = _statuses(k.execute(STATUSES, timeout=60))
    assert set(right_after) == {1, 2, 3}
    assert set(right_after.values()) <= {"NEW", "ONGOING"}, right_after

    # the panel's comm opened from the run_fit cell, and the cell displays its view
    opens = [
        r
        for r in k.messages_of(fit.msg_id)
        if r.msg_type == "comm_open"
        and r.content.get("target_name") == "jupyter.widget"
        and (r.content.get("data") or {}).get("state", {}).get("_model_module") == "anywidget"
    ]
    assert len(opens) == 1, [r.content for r in k.messages_of(fit.msg_id) if r.msg_type == "comm_open"]
    comm_id = opens[0].content["comm_id"]
    state = opens[0].content["data"]["state"]
    assert state["summary"]["experiment"] == "kernel-engine" and state["summary"]["num_runs"] == 3
    views = fit.data("application/vnd.jupyter.widget-view+json")
    assert [v["model_id"] for v in views] == [comm_id]
    # synced state is small: metric history never goes into traits
    assert len(json.dumps(state["summary"])) < 2000

    # ------------------------------------------------------------------ hello -> snapshot
    hello_at = time.monotonic()
    k.send_custom(comm_id, {"type": "hello"})
    snap_rec = k.wait_for(
        lambda r: r.t >= hello_at and (_custom(r, comm_id) or {}).get("type") == "snapshot",
        30,
        "the snapshot answering hello",
    )
    snap = _custom(snap_rec, comm_id)
    assert snap is not None and snap["reset"] is True
    runs = {r["run_id"]: r for r in snap["snapshot"]["runs"]}
    assert sorted(runs) == [1, 2, 3]
    assert snap["snapshot"]["hparam_columns"] == ["learning_rate"]
    assert [runs[i]["hparams"]["learning_rate"] for i in (1, 2, 3)] == [1e-3, 2e-3, 3e-3]
    assert "stop" in runs[2]["legal_ops"] and runs[2]["total_steps"] == 128

    # ------------------------------------------------------------------ appended points over time
    def point_updates() -> list[Any]:
        return [
            r
            for r in k.iopub
            if r.t > snap_rec.t
            and (_custom(r, comm_id) or {}).get("type") == "update"
            and _n_points(_custom(r, comm_id) or {}) > 0
        ]

    k.wait_for(lambda r: len(point_updates()) >= 2, 90, "two update messages carrying metric points")
    ups = [_custom(r, comm_id) or {} for r in point_updates()]
    steps_run1 = [s for u in ups for rid, s in zip(u["points"]["run"], u["points"]["step"]) if rid == 1]
    assert steps_run1 == sorted(steps_run1), "points are append-only, in step order per run"

    # ------------------------------------------------------------------ op click: stop run 2
    before_stop = _statuses(k.execute(STATUSES, timeout=60))
    assert before_stop[2] in ("NEW", "ONGOING"), f"run 2 finished before the click: {before_stop}"
    click_at = time.monotonic()
    op = {"type": "op", "op_id": "kernel-test-stop-2", "kind": "stop", "run_id": 2}
    k.send_custom(comm_id, op)
    k.send_custom(comm_id, op)  # a repeated message (double click, resend) must not apply twice

    def acks_so_far() -> list[dict[str, Any]]:
        return [
            c for r in k.iopub if r.t >= click_at and (c := _custom(r, comm_id)) and c.get("type") == "ack"
        ]

    k.wait_for(lambda r: len(acks_so_far()) >= 2, 30, "the acks of both op messages")
    acks = acks_so_far()
    assert [a["ack"]["op_id"] for a in acks] == ["kernel-test-stop-2"] * 2
    assert acks[0]["ack"] == acks[1]["ack"]
    assert acks[0]["ack"]["state"] in ("queued", "applied"), acks[0]
    assert acks[0]["ack"]["run_id"] == 2 and acks[0]["ack"]["kind"] == "stop"

    def run2_stopped_in_panel(r: Any) -> bool:
        c = _custom(r, comm_id) or {}
        runs_ = (c.get("snapshot") or {}).get("runs") or []
        return any(x["run_id"] == 2 and x["status"] == "STOPPED" for x in runs_)

    k.wait_for(run2_stopped_in_panel, 120, "the panel's run table to show run 2 STOPPED")

    # ------------------------------------------------------------------ %rapidfire magic
    k.wait_for(
        lambda r: r.msg_type == "stream" and "run 1 · chunk 1/4 of epoch 1 done" in r.content.get("text", ""),
        120,
        "run 1's first chunk (a warm clone starts from its latest chunk boundary)",
    )
    magic = k.execute("%load_ext rapidfire_nb\n%rapidfire clone 1 --warm learning_rate=5e-4", timeout=60)
    assert "run 4 created from run 1" in magic.stdout, magic.text
    # the clone op is applied at the next chunk boundary; then the table shows where the clone starts
    k.execute(
        "import time\n"
        "_t = time.time()\n"
        "while time.time() - _t < 60 and exp.run_snapshot(4).total_steps == 0: time.sleep(0.2)",
        timeout=90,
    )
    clone_row = k.execute(
        "print('RUN4', json.dumps(exp.get_runs_info().set_index('run_id')"
        ".loc[4, ['status', 'completed_steps', 'total_steps', 'chunks_done']].tolist(), default=int))",
        timeout=60,
    )
    run4_info = json.loads(re.search(r"RUN4 (\[.*\])", clone_row.stdout).group(1))  # type: ignore[union-attr]
    table = k.execute("%rapidfire", timeout=60)
    plain = "\n".join(table.data("text/plain"))
    assert table.data("text/html"), "the status table renders as an HTML DataFrame in a notebook"
    rows = {  # indexed by run id (no 0-based pandas index beside it)
        int(m.group(1)): m.group(0)
        for m in re.finditer(r"^\s*(\d+)\s+(NEW|ONGOING|STOPPED|COMPLETED|FAILED)\b.*$", plain, re.MULTILINE)
    }
    assert sorted(rows) == [1, 2, 3, 4], plain
    assert "STOPPED" in rows[2], plain
    assert re.search(r"\b(NEW|ONGOING)\b", rows[4]), plain
    # the hyperparameter columns follow the metrics (pandas may print them as a second block of rows)
    assert re.search(r"^\s*4\s+(.*\s)?0\.0005\b", plain, re.MULTILINE), plain
    assert "config" not in plain and "checkpoint_dir" not in plain and "learning_rate" in plain, plain

    # ------------------------------------------------------------------ wait: the others complete
    wait = k.execute("print('WAITED', exp.wait(timeout=400))", timeout=420)
    assert "WAITED True" in wait.stdout, wait.text
    final = _statuses(k.execute(STATUSES, timeout=60))
    assert final == {1: "COMPLETED", 2: "STOPPED", 3: "COMPLETED", 4: "COMPLETED"}, final
    ops = k.execute(
        "print('OPS', json.dumps(exp.ops()[['op_id', 'kind', 'run_id', 'source', 'state']]"
        ".to_dict('records')))",
        timeout=60,
    )
    op_rows = json.loads(re.search(r"OPS (\[.*\])", ops.stdout).group(1))  # type: ignore[union-attr]
    stops = [o for o in op_rows if o["op_id"] == "kernel-test-stop-2"]
    assert stops == [
        {"op_id": "kernel-test-stop-2", "kind": "stop", "run_id": 2, "source": "panel", "state": "applied"}
    ], op_rows

    # the panel's table shows the end state too
    def panel_statuses(r: Any) -> dict[int, str]:
        runs_ = ((_custom(r, comm_id) or {}).get("snapshot") or {}).get("runs") or []
        return {x["run_id"]: x["status"] for x in runs_}

    k.wait_for(lambda r: panel_statuses(r) == final, 30, "the panel's run table to show the final statuses")

    # ------------------------------------------------------------------ background output -> run_fit cell
    lines = [
        (r, m)
        for r in k.iopub
        if r.msg_type == "stream"
        for m in CHUNK_LINE.finditer(r.content.get("text", ""))
    ]
    assert lines, k.tail()
    misplaced = sorted({(r.parent_id, m.group(0)) for r, m in lines if r.parent_id != fit.msg_id})
    assert not misplaced, f"chunk lines attached to other cells than run_fit's: {misplaced[:5]}"
    # ... including the ones printed while the wait cell was the executing cell
    during_wait = [m.group(0) for r, m in lines if wait.sent_at <= r.t <= wait.reply_at]
    assert during_wait, "expected chunk lines while exp.wait() ran"
    done = {(int(m.group(1)), m.group(2)) for _, m in lines}
    for rid in (1, 3, 4):
        assert (rid, "completed") in done, sorted(done)
    assert (2, "completed") not in done
    # the op outcome line goes to the run_fit cell as well
    op_lines = [
        r for r in k.iopub if r.msg_type == "stream" and "op stop run 2: applied" in r.content.get("text", "")
    ]
    assert op_lines and all(r.parent_id == fit.msg_id for r in op_lines), [r.parent_id for r in op_lines]

    # run_fit returned long before training ended: every chunk line came after its reply
    before_reply = [m.group(0) for r, m in lines if r.t < fit.reply_at]
    assert not before_reply, before_reply
    trained_after_reply = wait.reply_at - fit.reply_at
    assert trained_after_reply > 2 * fit.elapsed, (fit.elapsed, trained_after_reply)

    # coalescing: at most ~10 custom messages per second from the panel, whatever the step rate
    times = [r.t for r in k.iopub if _custom(r, comm_id) is not None]
    busiest = max(sum(1 for t in times if t0 <= t < t0 + 1.0) for t0 in times)
    assert busiest <= 15, f"{busiest} panel messages within one second"

    print(
        f"\nrun_fit cell {fit.elapsed:.1f}s; training went on {trained_after_reply:.1f}s after its reply; "
        f"{len(lines)} chunk lines; {len(times)} panel messages (busiest second {busiest})"
    )
    k.execute("exp.end()", timeout=120)

    # A NEW warm clone starts at its parent's chunk boundary: the panel shows it (step 16/128, 1 chunk);
    # get_runs_info() / %rapidfire must say the same, not 0/0 (checked last: a table-only inconsistency).
    if run4_info[0] == "NEW":
        assert run4_info[2] == 128, (
            f"get_runs_info() row of the NEW warm clone (status, completed, total, chunks) = {run4_info}; "
            "the panel shows total_steps 128 for it"
        )
