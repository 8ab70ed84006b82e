"""The recorder: events are queued by whoever reports them and written, in order, by its own thread."""

from __future__ import annotations

import threading
import types
from pathlib import Path
from typing import Any

from kernel_scheduler import Op, OpAck, OpKind, RunSnapshot, RunStatus
from rapidfire_nb.experiment.recorder import Recorder
from rapidfire_nb.experiment.reporter import Reporter
from rapidfire_nb.store import Store
from rapidfire_nb.tracking.tensorboard import NullTracker


class _SpyStore(Store):
    """A real store that also records which thread made each write."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.writers: list[tuple[str, str]] = []
        self.metric_batches: list[int] = []

    def add_metrics(self, rows: Any) -> int:
        rows = list(rows)
        self.writers.append(("add_metrics", threading.current_thread().name))
        self.metric_batches.append(len(rows))
        return super().add_metrics(rows)

    def upsert_run(self, run_id: int, **fields: Any) -> None:
        self.writers.append(("upsert_run", threading.current_thread().name))
        super().upsert_run(run_id, **fields)


def _snap(run_id: int, status: RunStatus, step: int, segments: int) -> RunSnapshot:
    return RunSnapshot(
        run_id=run_id,
        status=status,
        step=step,
        total_steps=8,
        segments_done=segments,
        num_segments=4,
        position=(1, segments + 1),
        samples_seen=step * 4,
        on_device=False,
        parent_id=None,
        warm_start=False,
        error=None,
        spec=None,
        steps_per_epoch=8,
    )


def _recorder(tmp_path: Path) -> tuple[Recorder, _SpyStore, list[str]]:
    store = _SpyStore(tmp_path / "exp")
    said: list[str] = []
    rec = Recorder(
        store,
        Reporter(printer=said.append),
        NullTracker(),
        4,
        ["learning_rate"],
        checkpoint_dir=lambda rid: None,
        inbox=lambda: [],
    )
    return rec, store, said


def test_writes_happen_on_the_recorder_thread_in_order(tmp_path: Path) -> None:
    rec, store, said = _recorder(tmp_path)
    rec.start()
    for step in (1, 2):
        rec.on_metrics(1, step, step * 4, {"loss": 3.0 - step, "learning_rate": 1e-3})
    assert rec.live_step(1) == 2  # known at once, before anything is written
    rec.on_run(_snap(1, RunStatus.ONGOING, 2, 1))
    assert rec.flush(5)
    assert {thread for _, thread in store.writers} == {"rapidfire-recorder"}
    assert [p["value"] for p in store.metrics_since(0)[0] if p["name"] == "loss"] == [2.0, 1.0]
    assert store.get_run(1)["completed_steps"] == 2
    assert said == ["[rapidfire] run 1 · chunk 1/4 of epoch 1 done · step 2/8 · loss 1"]  # after its metrics
    assert store.get_meta("metric_names") == ["learning_rate", "loss"]
    rec.close()


def test_consecutive_log_calls_are_one_store_transaction(tmp_path: Path) -> None:
    rec, store, _ = _recorder(tmp_path)
    for step in range(1, 51):  # queued before the thread starts: then written as one batch
        rec.on_metrics(1, step, step, {"loss": 1.0, "grad_norm": 0.5})
    rec.start()
    assert rec.flush(5)
    assert store.metric_batches == [100]
    rec.close()


def test_ops_clones_and_the_end_are_written_and_close_flushes(tmp_path: Path) -> None:
    rec, store, said = _recorder(tmp_path)
    rec.start()
    rec.on_heartbeat()  # this thread plays the scheduler thread: the outcome it decides later is printed
    op = Op(OpKind.STOP, 1, op_id="a", source="panel")
    rec.on_op(op, OpAck("a", 1, "stop", "queued", "stop requested"))
    rec.on_op(op, OpAck("a", 1, "stop", "applied", "run 1 stopped at step 2"))
    rec.on_final(1, tmp_path / "final")
    rec.close()  # writes everything queued, then stops its thread
    assert [(o["op_id"], o["state"]) for o in store.ops()] == [("a", "applied")]
    assert store.get_run(1)["checkpoint_dir"] == str(tmp_path / "final")
    assert said == ["[rapidfire] op stop run 1: applied — run 1 stopped at step 2"]
    rec.on_metrics(1, 9, 9, {"loss": 1.0})  # after close: dropped, never a stuck producer
    assert store.metrics_since(0)[0] == []


def test_the_inbox_is_read_at_most_once_a_second(tmp_path: Path) -> None:
    reads: list[int] = []
    store = Store(tmp_path / "exp")
    rec = Recorder(
        store,
        Reporter(quiet=True),
        NullTracker(),
        4,
        [],
        checkpoint_dir=lambda rid: None,
        inbox=lambda: reads.append(1) or [],
    )
    for _ in range(20):
        rec.poll_ops()
    assert len(reads) == 1


def test_log_calls_while_training_are_batched_not_written_one_by_one(tmp_path: Path) -> None:
    import time

    rec, store, _ = _recorder(tmp_path)
    rec.start()
    for step in range(1, 41):  # 40 log calls within ~0.1 s, as fast steps log them
        rec.on_metrics(1, step, step, {"loss": 1.0})
        time.sleep(0.0025)
    assert rec.flush(5)
    assert sum(store.metric_batches) == 40
    assert len(store.metric_batches) <= 3, store.metric_batches  # one wake-up per ~0.2 s, not one per step
    rec.close()


class _SpyTracker(NullTracker):
    """A null tracker that records what the recorder tells the trackers, and on which thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.threads: set[str] = set()

    def _note(self, *call: Any) -> None:
        self.calls.append(call)
        self.threads.add(threading.current_thread().name)

    def open(self) -> None:
        self._note("open")

    def start_run(self, run: Any, status: str) -> None:
        self._note("start_run", run.run_id, run.parent_id, run.warm_start, status)

    def set_status(self, run_id: int, status: str, error: str | None = None, at: float | None = None) -> None:
        self._note("set_status", run_id, status, error)

    def mark_deleted(self, run_id: int) -> None:
        self._note("mark_deleted", run_id)

    def continue_from(self, run_id: int, step: int) -> None:
        self._note("continue_from", run_id, step)

    def log_metrics(self, run_id: int, step: int, metrics: Any, wall_time: float | None = None) -> None:
        self._note("log_metrics", run_id, step, dict(metrics))


def test_trackers_hear_each_run_start_and_status_change_once_on_the_recorder_thread(tmp_path: Path) -> None:
    from rapidfire_nb.experiment.clones import CloneRequest
    from rapidfire_nb.tracking import TrackedRun

    store = Store(tmp_path / "exp")
    spy = _SpyTracker()
    rec = Recorder(store, Reporter(quiet=True), spy, 4, [], checkpoint_dir=lambda rid: None, inbox=lambda: [])
    rec.tracked_run = lambda rid, spec, parent, warm: TrackedRun(rid, {}, {}, "SFT", parent, warm)
    runs = [(TrackedRun(1, {}, {}, "SFT"), RunStatus.NEW), (TrackedRun(2, {}, {}, "SFT"), RunStatus.STOPPED)]
    rec.track_runs(runs, {2: 4})
    rec.start()
    rec.on_run(_snap(1, RunStatus.NEW, 0, 0))  # as registered: nothing to tell
    rec.on_run(_snap(1, RunStatus.ONGOING, 2, 1))
    rec.on_metrics(1, 2, 8, {"loss": 1.5, "epoch": 0.25, "note": "text"})
    rec.on_run(_snap(1, RunStatus.ONGOING, 4, 2))  # progress only
    rec.on_run(_snap(2, RunStatus.DELETED, 4, 2))
    rec.on_run(_snap(3, RunStatus.NEW, 0, 0))  # a clone's first snapshot may come before its record
    spec = types.SimpleNamespace(to_json=lambda: {}, hparams=lambda: {}, fingerprint=lambda: "f")
    rec.record_clone(3, 1, CloneRequest(spec=spec, changes={}, encoded={}, warm_start=True))
    rec.on_run(_snap(1, RunStatus.FAILED, 4, 2))
    rec.close()
    assert spy.calls == [
        ("open",),
        ("start_run", 1, None, False, "NEW"),
        ("start_run", 2, None, False, "STOPPED"),
        ("continue_from", 2, 4),
        ("set_status", 1, "ONGOING", None),
        ("log_metrics", 1, 2, {"loss": 1.5, "epoch": 0.25}),  # TRL's names, numbers only
        ("mark_deleted", 2),
        ("set_status", 3, "NEW", None),
        ("start_run", 3, 1, True, "NEW"),
        ("set_status", 1, "FAILED", None),
    ]
    assert spy.threads == {"rapidfire-trackers"}


def test_flush_makes_the_trackers_write_what_they_hold_on_the_recorder_thread(tmp_path: Path) -> None:
    class _Flushed(_SpyTracker):
        def flush(self) -> None:
            self._note("flush")

    spy = _Flushed()
    rec = Recorder(Store(tmp_path / "exp"), Reporter(quiet=True), spy, 4, [], lambda rid: None, lambda: [])
    rec.start()
    rec.on_metrics(1, 2, 8, {"loss": 1.5})
    assert rec.flush(timeout=30)
    # the points, then the trackers' flush
    assert spy.calls == [("log_metrics", 1, 2, {"loss": 1.5}), ("flush",)]
    assert spy.threads == {"rapidfire-trackers"}
    rec.close()


def test_flush_waits_for_what_was_reported_before_it_not_for_training_that_goes_on(tmp_path: Path) -> None:
    """A run that keeps logging (training goes on) and a slow tracker (MLflow: ~10 ms a request) never empty the
    queue; a flush (``wait(chunks=k)``, ``get_runs_info()``) returns once what came before it is written."""
    import time

    class _Slow(_SpyTracker):
        def log_metrics(self, run_id: int, step: int, metrics: Any, wall_time: float | None = None) -> None:
            time.sleep(0.01)
            super().log_metrics(run_id, step, metrics, wall_time)

        def flush(self) -> None:
            self._note("flush")

    spy = _Slow()
    store = Store(tmp_path / "exp")
    rec = Recorder(store, Reporter(quiet=True), spy, 4, [], lambda rid: None, lambda: [])
    rec.start()
    stop = threading.Event()

    def train() -> None:  # ~2 log calls per 10 ms of the tracker's time: the queue only grows
        step = 0
        while not stop.is_set():
            step += 1
            rec.on_metrics(2, step, step, {"loss": 1.0})
            time.sleep(0.005)

    feeder = threading.Thread(target=train)
    feeder.start()
    try:
        time.sleep(0.5)
        rec.on_run(_snap(1, RunStatus.ONGOING, 2, 1))
        t0 = time.monotonic()
        assert rec.flush(timeout=20, trackers=False)
        store_only = time.monotonic() - t0
        assert store.get_run(1)["completed_steps"] == 2  # written before flush returned
        assert "flush" not in [c[0] for c in spy.calls]
        t0 = time.monotonic()
        assert rec.flush(timeout=20)
        with_trackers = time.monotonic() - t0
        assert ("flush",) in spy.calls
        assert feeder.is_alive()  # training went on all along
    finally:
        stop.set()
        feeder.join()
    assert store_only < 10 and with_trackers < 10, (store_only, with_trackers)
    rec.close()


def test_a_restarted_run_hands_the_trackers_its_stored_points_up_to_the_checkpoint(tmp_path: Path) -> None:
    """A killed process may not have flushed its trackers; the store holds every point up to the checkpoint
    (a checkpoint is written after them), so the restart hands those points, as the log calls that made them."""
    from rapidfire_nb.tracking import TrackedRun

    class _Restoring(_SpyTracker):
        def restore_points(self, run_id: int, step: int, points: Any) -> None:
            self._note("restore_points", run_id, step, [(s, dict(m), w) for s, m, w in points])

    store = Store(tmp_path / "exp")
    store.add_metrics(
        [
            {"run_id": 2, "step": 1, "samples_seen": 4, "name": "loss", "value": 2.0, "wall_time": 10.0},
            {"run_id": 2, "step": 1, "samples_seen": 4, "name": "grad_norm", "value": 0.5, "wall_time": 10.0},
            {"run_id": 1, "step": 1, "samples_seen": 4, "name": "loss", "value": 9.0, "wall_time": 10.5},
            {"run_id": 2, "step": 2, "samples_seen": 8, "name": "loss", "value": 1.5, "wall_time": 11.0},
            # the chunk-end eval at the same step: a log call of its own (its own wall time)
            {
                "run_id": 2,
                "step": 2,
                "samples_seen": 8,
                "name": "eval_loss",
                "value": 1.75,
                "wall_time": 11.5,
            },
            {"run_id": 2, "step": 3, "samples_seen": 12, "name": "loss", "value": 1.25, "wall_time": 12.0},
        ]
    )
    spy = _Restoring()
    rec = Recorder(store, Reporter(quiet=True), spy, 4, [], checkpoint_dir=lambda rid: None, inbox=lambda: [])
    runs = [(TrackedRun(1, {}, {}, "SFT"), RunStatus.NEW), (TrackedRun(2, {}, {}, "SFT"), RunStatus.ONGOING)]
    rec.track_runs(runs, {2: 2})
    rec.start()
    rec.close()
    assert spy.calls[-2:] == [
        ("continue_from", 2, 2),
        (
            "restore_points",
            2,
            2,
            [
                (1, {"loss": 2.0, "grad_norm": 0.5}, 10.0),
                (2, {"loss": 1.5}, 11.0),
                (2, {"eval_loss": 1.75}, 11.5),
            ],
        ),
    ]
    assert spy.threads == {"rapidfire-trackers"}


def test_a_run_that_ended_in_a_dead_kernel_gets_all_its_points_back_until_the_trackers_confirm_it(
    tmp_path: Path,
) -> None:
    """A run that COMPLETED in a kernel killed before its trackers wrote its points is not continued by the restart,
    so nothing would log them again: the restart hands the trackers all its stored points, unless an earlier
    kernel recorded (meta ``tracked_runs``) that the trackers wrote and flushed them."""
    from rapidfire_nb.experiment.recorder import TRACKED_RUNS_META_KEY
    from rapidfire_nb.tracking import TrackedRun

    class _Restoring(_SpyTracker):
        def restore_points(self, run_id: int, step: int, points: Any) -> None:
            self._note("restore_points", run_id, step, [(s, dict(m)) for s, m, _ in points])

        def flush(self) -> None:
            self._note("flush")

    store = Store(tmp_path / "exp")
    store.add_metrics(
        [
            {
                "run_id": r,
                "step": s,
                "samples_seen": 4 * s,
                "name": "loss",
                "value": 10.0 * r + s,
                "wall_time": s,
            }
            for r in (1, 3)
            for s in (1, 2)
        ]
    )
    store.set_meta(TRACKED_RUNS_META_KEY, [3])  # run 3 ended in a kernel whose trackers caught up
    spy = _Restoring()
    rec = Recorder(store, Reporter(quiet=True), spy, 4, [], checkpoint_dir=lambda rid: None, inbox=lambda: [])
    done = [(TrackedRun(r, {}, {}, "SFT"), RunStatus.COMPLETED) for r in (1, 3)]
    rec.track_runs([*done, (TrackedRun(2, {}, {}, "SFT"), RunStatus.ONGOING)], {})
    rec.start()
    rec.on_run(_snap(2, RunStatus.ONGOING, 2, 1))
    rec.on_run(_snap(2, RunStatus.COMPLETED, 8, 4))  # ends in this kernel: confirmed once the trackers flush
    rec.close()
    restored = [c for c in spy.calls if c[0] == "restore_points"]
    assert restored == [("restore_points", 1, 2, [(1, {"loss": 11.0}), (2, {"loss": 12.0})])]
    assert store.get_meta(TRACKED_RUNS_META_KEY) == [1, 2, 3]
    # each confirmation comes after a flush of the trackers
    assert spy.calls.index(("set_status", 2, "COMPLETED", None)) < max(
        i for i, c in enumerate(spy.calls) if c == ("flush",)
    )


def test_the_heartbeat_goes_on_while_the_scheduler_thread_is_held(tmp_path: Path, monkeypatch: Any) -> None:
    """Issue 34 item 5: building a clone's trainer held the scheduler thread (no turn, no on_heartbeat) for 35 s and
    the server called the live kernel dead. The recorder thread beats while that thread lives, and stops after."""
    import time

    from rapidfire_nb.experiment import recorder as recorder_module

    monkeypatch.setattr(recorder_module, "HEARTBEAT_EVERY_S", 0.05)
    rec, store, _ = _recorder(tmp_path)
    rec.start()
    held, gone = threading.Event(), threading.Event()

    def scheduler() -> None:
        rec.on_heartbeat()  # its one turn, then a long build
        held.wait(10)

    loop = threading.Thread(target=scheduler, name="rapidfire-scheduler")
    loop.start()
    try:
        deadline = time.monotonic() + 5
        while store.heartbeat() is None and time.monotonic() < deadline:  # the turn's own beat
            time.sleep(0.01)
        beats = []
        for _ in range(6):
            time.sleep(0.12)
            beat = store.heartbeat()
            beats.append(beat["beat_at"] if beat else None)
        assert None not in beats and len(set(beats)) >= 4, beats  # still beating though the loop made no turn
        assert store.writer_alive(stale_after=1.0)
    finally:
        held.set()
        loop.join(5)
    time.sleep(0.15)  # a beat due just as the thread ended may still land
    last = store.heartbeat()
    time.sleep(0.3)
    assert store.heartbeat() == last  # the scheduler thread is gone: no more beats
    gone.set()
    rec.close()
