"""A pruned run's label (view.text.status_label): PRUNED beside the user's STOPPED, in the counts, the end summary
and the text-progress lines (issue 37: PRUNED is a mark; the run's status stays STOPPED)."""

from __future__ import annotations

from typing import Any

from rapidfire_nb.view.text import final_summary, format_chunk_line, status_counts, status_label


def _run(run_id: int, status: str, pruned: bool = False) -> dict[str, Any]:
    return {"run_id": run_id, "status": status, "pruned": pruned, "completed_steps": 4, "total_steps": 8}


def test_a_pruned_stop_is_labelled_pruned_a_users_stop_stopped() -> None:
    assert status_label(_run(1, "STOPPED", pruned=True)) == "PRUNED"
    assert status_label(_run(1, "STOPPED")) == "STOPPED"
    assert status_label(_run(1, "ONGOING", pruned=True)) == "ONGOING"  # a stale flag marks only a STOPPED run


def test_counts_most_first_pruned_after_stopped_on_a_tie() -> None:
    runs = [_run(1, "STOPPED", True), _run(2, "STOPPED"), _run(3, "COMPLETED"), _run(4, "COMPLETED")]
    assert list(status_counts(runs).items()) == [("COMPLETED", 2), ("STOPPED", 1), ("PRUNED", 1)]


def test_the_end_summary_and_the_chunk_line_say_pruned() -> None:
    runs = [_run(1, "COMPLETED"), _run(2, "STOPPED", True), _run(3, "STOPPED", True), _run(4, "STOPPED")]
    text = final_summary({"experiment": "e", "runs": runs})
    assert text.startswith("experiment 'e' ended: 4 runs (2 pruned, 1 completed, 1 stopped)"), text
    assert "  PRUNED  " in format_chunk_line(runs[1]) and "  STOPPED  " in format_chunk_line(runs[3])
