"""The recorder's typed queue items, its dispatch table, and the store writes and tracker calls they make (fakes,
no thread: a recorder never started writes what is queued when it closes, on the caller's thread)."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest

from kernel_scheduler import Op, OpAck, OpKind, RunSnapshot, RunStatus
from rapidfire_nb.experiment import record_writes as writes
from rapidfire_nb.experiment.record_items import (
    ITEM_TYPES,
    FlushItem,
    MetricsItem,
    RunItem,
    StopItem,
)
from rapidfire_nb.experiment.recorder import NOT_DISPATCHED, Recorder
from rapidfire_nb.experiment.reporter import Reporter
from rapidfire_nb.tracking.tensorboard import NullTracker


class CallStore:
    """A store that records every call made on it, in order (``(method, args, kwargs)``)."""

    path = "call-store"  # not a file: never checked for

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.meta: dict[str, Any] = {}

    def _note(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, args, kwargs))

    def heartbeat(self) -> None:
        return None

    def get_meta(self, key: str, default: Any = None) -> Any:
        return self.meta.get(key, default)

    def set_meta(self, key: str, value: Any) -> None:
        self._note("set_meta", key, value)
        self.meta[key] = value

    def upsert_run(self, run_id: int, **fields: Any) -> None:
        self._note("upsert_run", run_id, **fields)

    def add_metrics(self, rows: Any) -> int:
        rows = list(rows)
        self._note("add_metrics", rows)
        return len(rows)

    def add_op(self, *args: Any, **kwargs: Any) -> bool:
        self._note("add_op", *args, **kwargs)
        return True

    def delete_metrics_after(self, run_id: int, step: int) -> None:
        self._note("delete_metrics_after", run_id, step)

    def beat(self) -> None:
        self._note("beat")


def _snap(run_id: int, status: RunStatus, step: int = 0, segments: int = 0) -> RunSnapshot:
    return RunSnapshot(
        run_id, status, step, 8, segments, 4, (1, segments + 1), 4 * step, False, None, False, None, None
    )


def _recorder(store: CallStore, tracker: Any = None) -> Recorder:
    tracker = tracker if tracker is not None else NullTracker()
    return Recorder(store, Reporter(quiet=True), tracker, 4, [], lambda rid: None, lambda: [])


def test_every_item_type_is_a_frozen_dataclass_with_a_docstring() -> None:
    assert len(set(ITEM_TYPES)) == len(ITEM_TYPES) >= 16
    for cls in ITEM_TYPES:
        assert dataclasses.is_dataclass(cls), cls
        assert cls.__dataclass_params__.frozen, cls  # type: ignore[attr-defined]
        assert cls.__doc__ and len(cls.__doc__) > 20, cls
        for field in dataclasses.fields(cls):  # each field is described in the docstring
            assert f"{field.name}:" in cls.__doc__, (cls, field.name)
    item = RunItem(_snap(1, RunStatus.NEW), 12.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        item.at = 13.0  # type: ignore[misc]


def test_the_dispatch_table_covers_every_item_type_but_the_batched_and_control_ones() -> None:
    table = _recorder(CallStore())._writers
    assert set(NOT_DISPATCHED) == {MetricsItem, FlushItem, StopItem}
    assert not set(table) & set(NOT_DISPATCHED)
    assert set(table) | set(NOT_DISPATCHED) == set(ITEM_TYPES)
    assert all(callable(write) for write in table.values())


def test_items_are_written_to_the_store_in_order_consecutive_metrics_in_one_call(tmp_path: Path) -> None:
    store = CallStore()
    rec = _recorder(store)
    rec.on_run(_snap(1, RunStatus.NEW))
    rec.on_metrics(1, 1, 4, {"loss": 2.0, "note": "text", "flag": True})
    rec.on_metrics(1, 2, 8, {"loss": 1.5, "grad_norm": 1})
    rec.on_op(
        Op(OpKind.STOP, 1, op_id="a", source="panel"), OpAck("a", 1, "stop", "queued", "stop requested")
    )
    rec.on_metrics(1, 3, 12, {"loss": 1.0})
    rec.on_final(1, tmp_path / "final")
    rec.on_early_stopping({"trials": 3})
    rec.on_rewound(_snap(1, RunStatus.ONGOING, 3, 1), 2)
    called: list[str] = []
    rec.in_order(lambda: called.append(f"after {len(store.calls)} calls"))
    rec.on_heartbeat()
    rec.close()  # never started: writes what is queued here, in order
    names = [(name, args[0] if name in ("set_meta", "upsert_run") else None) for name, args, _ in store.calls]
    assert names == [
        ("upsert_run", 1),
        ("set_meta", "clock"),  # training started (a NEW run is in the rotation)
        ("add_metrics", None),  # the two log calls before the op: one transaction
        ("set_meta", "metric_names"),
        ("add_op", None),
        ("add_metrics", None),
        ("upsert_run", 1),
        ("set_meta", "early_stopping"),
        ("delete_metrics_after", None),
        ("beat", None),
    ]
    first_rows = store.calls[2][1][0]
    assert [(r["step"], r["samples_seen"], r["name"], r["value"]) for r in first_rows] == [
        (1, 4, "loss", 2.0),  # numbers only: text and bools are not stored
        (2, 8, "loss", 1.5),
        (2, 8, "grad_norm", 1.0),
    ]
    assert store.meta["metric_names"] == ["grad_norm", "loss"]  # written once: step 3 brought no new name
    assert store.calls[6][2] == {"checkpoint_dir": str(tmp_path / "final")}
    assert store.calls[8][1] == (1, 2)
    assert called == ["after 9 calls"]  # after everything reported before it, before the heartbeat


def test_trackers_are_handed_the_calls_after_the_store_write_in_order() -> None:
    class Spy(NullTracker):
        def __init__(self) -> None:
            self.calls: list[tuple[Any, ...]] = []

        def set_status(
            self, run_id: int, status: str, error: str | None = None, at: float | None = None
        ) -> None:
            self.calls.append(("set_status", run_id, status))

        def log_metrics(self, run_id: int, step: int, metrics: Any, wall_time: float | None = None) -> None:
            self.calls.append(("log_metrics", run_id, step, dict(metrics)))

        def continue_from(self, run_id: int, step: int) -> None:
            self.calls.append(("continue_from", run_id, step))

    spy = Spy()
    rec = _recorder(CallStore(), spy)
    rec.on_run(_snap(1, RunStatus.ONGOING, 1, 0))
    rec.on_metrics(1, 1, 4, {"loss": 2.0})
    rec.on_metrics(1, 2, 8, {"loss": 1.5, "note": "text"})
    rec.on_rewound(_snap(1, RunStatus.ONGOING, 2, 0), 1)
    rec.on_run(_snap(1, RunStatus.ONGOING, 2, 0))  # no status change: nothing to tell
    rec.close()
    assert spy.calls == [
        ("set_status", 1, "ONGOING"),
        ("log_metrics", 1, 1, {"loss": 2.0}),
        ("log_metrics", 1, 2, {"loss": 1.5}),
        ("continue_from", 1, 1),
    ]


def test_a_failed_write_is_logged_and_the_items_after_it_are_still_written() -> None:
    class Flaky(CallStore):
        def upsert_run(self, run_id: int, **fields: Any) -> None:
            raise ValueError("bad row")

    store = Flaky()
    rec = _recorder(store)
    rec.on_final(1, Path("/tmp/final"))
    rec.on_note("hello")
    rec.on_early_stopping({"trials": 1})
    rec.close()
    assert [c[0] for c in store.calls] == ["set_meta"]
    assert rec.failed is None  # not a disk failure: the recorder goes on


def test_a_flush_marker_is_released_after_a_disk_failure_the_items_are_not_written() -> None:
    from rapidfire_nb.errors import StorageError

    store = CallStore()
    rec = _recorder(store)
    rec.failed = StorageError("call-store", "disk full")
    done = threading.Event()
    rec._write_batch([MetricsItem(1, 1, 4, {"loss": 2.0}, 10.0), FlushItem(done, trackers=False)])
    assert done.is_set()  # its caller goes on (and flush() answers False: the write failed)
    assert store.calls == []
    rec.close()


def test_chunk_reports_say_each_chunk_and_each_end_once() -> None:
    reports = writes.ChunkReports()
    reports.known(2, 3, finished=False)
    assert not reports.due(_snap(2, RunStatus.ONGOING, 6, 3))  # reported by an earlier process
    assert reports.due(_snap(2, RunStatus.ONGOING, 8, 4))
    assert reports.due(_snap(2, RunStatus.COMPLETED, 8, 4))  # the end: once
    assert not reports.due(_snap(2, RunStatus.COMPLETED, 8, 4))
    assert not reports.due(_snap(5, RunStatus.NEW, 4, 2))  # a warm clone starts at its parent's chunk
    assert not reports.due(_snap(5, RunStatus.ONGOING, 4, 2))
    assert reports.due(_snap(5, RunStatus.ONGOING, 6, 3))


def test_logged_points_group_rows_into_the_log_calls_that_made_them() -> None:
    class Rows:
        def metrics_since(self, since: int, run_id: int) -> tuple[list[dict[str, Any]], int]:
            rows = [
                {"step": 1, "name": "loss", "value": 2.0, "wall_time": 10.0},
                {"step": 1, "name": "grad_norm", "value": 0.5, "wall_time": 10.0},
                {"step": 2, "name": "loss", "value": 1.5, "wall_time": 11.0},
                {"step": 2, "name": "eval_loss", "value": 1.7, "wall_time": 11.5},
                {"step": 3, "name": "loss", "value": 1.2, "wall_time": 12.0},
            ]
            return rows, len(rows)

    assert writes.logged_points(Rows(), 1, 2) == [
        (1, {"loss": 2.0, "grad_norm": 0.5}, 10.0),
        (2, {"loss": 1.5}, 11.0),
        (2, {"eval_loss": 1.7}, 11.5),
    ]
    assert len(writes.logged_points(Rows(), 1, None)) == 4


class _SpyTracker(NullTracker):
    """Records each tracker call (run on the caller's thread: the trackers' thread is never started here)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def open(self) -> None:
        self.calls.append(("open",))

    def start_run(self, run: Any, status: str) -> None:
        self.calls.append(("start_run", run.run_id, status))

    def set_status(self, run_id: int, status: str, error: str | None = None, at: float | None = None) -> None:
        self.calls.append(("set_status", run_id, status, at))

    def mark_deleted(self, run_id: int) -> None:
        self.calls.append(("mark_deleted", run_id))

    def continue_from(self, run_id: int, step: int) -> None:
        self.calls.append(("continue_from", run_id, step))

    def restore_points(self, run_id: int, step: int, points: Any) -> None:
        self.calls.append(("restore_points", run_id, step, len(points)))

    def flush(self) -> None:
        self.calls.append(("flush",))


def test_the_tracker_feed_tells_each_status_change_once_and_confirms_ended_runs() -> None:
    from rapidfire_nb.experiment.record_items import TrackedItem
    from rapidfire_nb.experiment.record_trackers import TrackerFeed

    spy, handed = _SpyTracker(), list[Any]()
    feed = TrackerFeed(spy, handed.append)
    feed.status(_snap(1, RunStatus.ONGOING), 5.0)
    feed.status(_snap(1, RunStatus.ONGOING, 4, 1), 6.0)  # progress only: nothing to tell
    feed.status(_snap(2, RunStatus.DELETED), 7.0)
    feed.status(_snap(1, RunStatus.COMPLETED, 8, 4), 8.0)
    feed.close()  # the calls handed over run (here, on this thread)
    assert spy.calls == [
        ("set_status", 1, "ONGOING", 5.0),
        ("mark_deleted", 2),
        ("set_status", 1, "COMPLETED", 8.0),
        ("flush",),  # then, once it ran, the run is handed back as tracked
    ]
    assert handed == [TrackedItem(1)]


def test_the_tracker_feed_opens_runs_and_hands_back_stored_points() -> None:
    from rapidfire_nb.experiment.record_trackers import TrackerFeed
    from rapidfire_nb.tracking import TrackedRun

    class Rows(CallStore):
        def metrics_since(self, since: int, run_id: int) -> tuple[list[dict[str, Any]], int]:
            rows = [{"step": s, "name": "loss", "value": 1.0, "wall_time": float(s)} for s in (1, 2, 3)]
            return rows, 3

    store = Rows()
    store.meta[writes.TRACKED_RUNS_META_KEY] = [3]  # run 3's points were written by an earlier kernel
    spy, handed = _SpyTracker(), list[Any]()
    feed = TrackerFeed(spy, handed.append)
    runs = [(TrackedRun(r, {}, {}, "SFT"), s) for r, s in ((1, RunStatus.COMPLETED), (2, RunStatus.STOPPED))]
    feed.open_runs(store, [*runs, (TrackedRun(3, {}, {}, "SFT"), RunStatus.FAILED)], {2: 2})
    feed.start_added(TrackedRun(4, {}, {}, "SFT"), RunStatus.NEW)
    feed.status(_snap(4, RunStatus.NEW), 1.0)  # known as NEW already: nothing to tell
    feed.start_clone(TrackedRun(5, {}, {}, "SFT"))
    feed.close()
    assert spy.calls == [
        ("open",),
        ("start_run", 1, "COMPLETED"),
        ("start_run", 2, "STOPPED"),
        ("start_run", 3, "FAILED"),
        ("continue_from", 2, 2),
        ("restore_points", 2, 2, 2),  # its points up to the checkpoint's step
        ("restore_points", 1, 3, 3),  # ended, not confirmed: all of them again
        ("flush",),
        ("start_run", 4, "NEW"),
        ("start_run", 5, "NEW"),
    ]
    assert [item.run_id for item in handed] == [1]
