"""What the recorder prints: chunk lines only where no live panel shows them, each op outcome once, and the
training clock it keeps in the store's meta (no torch: a dict store and the real Recorder)."""

from __future__ import annotations

import threading
from typing import Any

from kernel_scheduler import Op, OpAck, OpKind, RunSnapshot, RunStatus
from rapidfire_nb.experiment.recorder import Recorder
from rapidfire_nb.experiment.reporter import Reporter


class DictStore:
    def __init__(self) -> None:
        self.meta: dict[str, Any] = {}
        self.runs: dict[int, dict[str, Any]] = {}

    def upsert_run(self, run_id: int, **fields: Any) -> None:
        self.runs.setdefault(run_id, {}).update(fields)

    def get_meta(self, key: str, default: Any = None) -> Any:
        return self.meta.get(key, default)

    def set_meta(self, key: str, value: Any) -> None:
        self.meta[key] = value

    def heartbeat(self) -> None:
        return None

    def latest_metrics(self, names: Any) -> dict[int, dict[str, float]]:
        return {}

    def add_op(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def beat(self) -> None:
        pass


class NullTracker:
    def mark_deleted(self, run_id: int) -> None:
        pass


def _recorder() -> tuple[Recorder, DictStore, list[str]]:
    lines: list[str] = []
    store = DictStore()
    rec = Recorder(store, Reporter(printer=lines.append), NullTracker(), 4, [], lambda rid: None, lambda: [])
    return rec, store, lines


def _snap(run_id: int, status: RunStatus, segments: int, error: str | None = None) -> RunSnapshot:
    return RunSnapshot(
        run_id,
        status,
        3 * segments,
        12,
        segments,
        4,
        (1, segments + 1),
        4 * segments,
        False,
        None,
        False,
        error,
        None,
    )


def test_chunk_lines_in_scripts_but_only_failures_under_a_live_panel() -> None:
    rec, _, lines = _recorder()
    rec.on_run(_snap(1, RunStatus.ONGOING, 1))
    assert lines == ["[rapidfire] run 1 · chunk 1/4 of epoch 1 done · step 3/12"]
    rec.reporter.panel_live = True
    rec.on_run(_snap(1, RunStatus.ONGOING, 2))
    rec.on_run(_snap(2, RunStatus.ONGOING, 1))
    assert len(lines) == 1, lines  # the panel shows the chunks
    rec.on_run(_snap(2, RunStatus.FAILED, 1, error="CUDA out of memory"))
    assert lines[-1] == "[rapidfire] run 2 · FAILED: CUDA out of memory"
    rec.reporter.progress_lines = True  # asked for: the lines under the panel too
    rec.on_run(_snap(1, RunStatus.ONGOING, 3))
    assert "chunk 3/4" in lines[-1]


def test_an_op_outcome_is_printed_once_by_whoever_decided_it() -> None:
    rec, _, lines = _recorder()
    op = Op(OpKind.STOP, 2, source="magic")
    rec.on_op(
        op, OpAck(op.op_id, 2, "stop", "rejected", "run 2 is STOPPED")
    )  # at submit: the magic prints it
    assert lines == []
    loop = threading.Thread(
        target=lambda: (rec.on_heartbeat(), rec.on_op(op, OpAck(op.op_id, 2, "stop", "applied", "ok")))
    )
    loop.start()
    loop.join()  # decided later on the scheduler thread: the recorder prints it
    assert lines == ["[rapidfire] op stop run 2: applied — ok"]


def test_the_clock_is_written_when_training_starts_and_stops() -> None:
    rec, store, _ = _recorder()
    rec.on_run(_snap(1, RunStatus.ONGOING, 0))
    started = store.meta["clock"]
    assert started["busy_s"] == 0.0 and started["busy_since"] is not None
    rec.on_run(_snap(1, RunStatus.ONGOING, 1))
    assert store.meta["clock"] is started  # no write while training goes on
    rec.on_run(_snap(1, RunStatus.COMPLETED, 4))
    assert store.meta["clock"]["busy_since"] is None and store.meta["clock"]["busy_s"] >= 0.0
