"""The static copy's Pack column: only when some run trained packed (``run_fit(packing=...)``)."""

from __future__ import annotations

import re
from typing import Any

from rapidfire_nb.panel.static import static_bundle


def _run(run_id: int, **extra: Any) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "status": "COMPLETED",
        "hparams": {},
        "completed_steps": 4,
        "total_steps": 4,
        "chunks_done": 4,
        "num_segments": 4,
        "samples_seen": 16,
        "loss": 1.0,
        "eval_loss": 1.5,
        "error": None,
        "parent_id": None,
        "warm_start": False,
        **extra,
    }


def _snapshot(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "experiment": "exp",
        "now": 1000.0,
        "progress": "idle",
        "num_chunks": 4,
        "hparam_columns": [],
        "runs": runs,
    }


def test_a_pack_column_with_each_runs_pack_and_a_dash_alone() -> None:
    html = static_bundle(_snapshot([_run(1, pack=1), _run(2, pack=1), _run(3, pack=None)]), [])["text/html"]
    assert ">Pack</th>" in html
    assert re.findall(r'data-rf-pack-cell="">([^<]*)<', html) == ["1", "1", "-"]
    plain = static_bundle(_snapshot([_run(1, pack=None), _run(2)]), [])["text/html"]
    assert "Pack</th>" not in plain and "data-rf-pack-cell" not in plain
