"""The snapshot's per-run ``chunks_note`` (rapidfire_nb/view/snapshot.py): why a run's chunks are not a whole number
of epochs' chunks (:func:`rapidfire_nb.view.text.chunks_note`), in every snapshot the panel and the page show."""

from __future__ import annotations

from typing import Any

from kernel_scheduler import RunStatus
from rapidfire_nb import view
from rapidfire_nb.view import KernelState, StoreRows
from rapidfire_nb.view.text import chunks_note
from tests.rapidfire_nb.view.test_view import _row, _snap

META = {"created_at": 1000.0, "num_chunks": 2, "hparam_columns": [], "metric_names": ["loss"]}
# run 1: the GRPO tutorial's CPU settings (a max_steps of 4 ends in chunk 1 of 2): 1 chunk in all; run 2: 2 epochs
STORED = [
    _row(1, "COMPLETED", num_segments=1, total_steps=4, chunks_done=1),
    _row(2, "COMPLETED", num_segments=4, total_steps=16, chunks_done=4),
]
GRPO_NOTE = (
    "1 chunk in all, with 2 chunks per epoch: its step budget (4 steps: max_steps, or a fractional "
    "num_train_epochs) ends in chunk 1/2 of epoch 1"
)


def _rows() -> StoreRows:
    return StoreRows(meta=META, runs=list(STORED), latest={}, ops=[])


def _notes(snapshot: dict[str, Any]) -> dict[int, str | None]:
    return {r["run_id"]: r["chunks_note"] for r in snapshot["runs"]}


def test_the_page_and_a_reopened_panel_carry_each_runs_chunks_note() -> None:
    assert chunks_note(STORED[0], 2) == GRPO_NOTE
    for snapshot in (
        view.store_snapshot("exp", _rows(), writer_alive=False, now=5.0),
        view.reopened_snapshot("exp", _rows(), ended=True, now=5.0),
    ):
        assert _notes(snapshot) == {1: GRPO_NOTE, 2: None}


def test_the_kernels_snapshot_uses_the_schedulers_chunks() -> None:
    kernel = KernelState(
        started_at=2000.0,
        num_chunks=2,
        hparam_columns=[],
        runs=[
            _snap(1, RunStatus.ONGOING, step=0, total_steps=4, num_segments=1, segments_done=0),
            _snap(2, RunStatus.ONGOING, step=0, total_steps=16, num_segments=4, segments_done=0),
        ],
    )
    snapshot = view.kernel_snapshot("exp", _rows(), kernel, now=5.0)
    assert _notes(snapshot) == {1: GRPO_NOTE, 2: None}
    no_chunks = KernelState(started_at=None, num_chunks=0, hparam_columns=[])  # before run_fit: no note
    assert _notes(view.kernel_snapshot("exp", _rows(), no_chunks, now=5.0)) == {1: None, 2: None}
