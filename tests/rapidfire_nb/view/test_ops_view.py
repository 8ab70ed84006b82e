"""The front end's op-kind table (widgets/op_kinds.js) is generated from kernel_scheduler's and kept fresh."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from kernel_scheduler.op_kinds import front_end_table
from rapidfire_nb.view import op_kinds_js

REPO = Path(__file__).resolve().parents[3]


def test_widgets_op_kinds_js_is_fresh() -> None:
    text = (REPO / "widgets" / "op_kinds.js").read_text(encoding="utf-8")
    assert text == op_kinds_js(), "widgets/op_kinds.js is stale: run .venv/bin/python scripts/op_kinds_js.py"


@pytest.mark.skipif(shutil.which("node") is None, reason="node not installed")
def test_front_end_reads_the_same_table() -> None:
    script = (
        "Promise.all([import('./widgets/op_kinds.js'), import('./widgets/format.js')]).then(([t, f]) => "
        "console.log(JSON.stringify([t.OP_KINDS, f.OP_LABEL, f.takesChanges('clone'), f.takesChanges('stop'), "
        "f.requestedText('resume', 7)])))"
    )
    out = subprocess.run(
        ["node", "--input-type=module", "-e", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    table, labels, clone_takes, stop_takes, notice = json.loads(out)
    assert table == front_end_table()
    assert labels == {"stop": "Stop", "resume": "Resume", "delete": "Delete", "clone": "Clone…"}
    assert (clone_takes, stop_takes) == (True, False)
    assert notice == "resume requested for run 7 — it rejoins the rotation at the next chunk"
