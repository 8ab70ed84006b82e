"""The tracker interfaces are complete (issue 33): :class:`Tracker` declares every call the fan-out makes on a
backend, :class:`Trackers` every call the recorder's feed makes on its tracker object, and the defaults of
:class:`BackendTracker` / :class:`NullTracker` let a tracker that defines none of the optional calls work through
both, without being turned off."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from kernel_scheduler import RunStatus
from rapidfire_nb.experiment.record_items import TrackedItem
from rapidfire_nb.experiment.record_trackers import TrackerFeed
from rapidfire_nb.store import Store
from rapidfire_nb.tracking import BackendTracker, NullTracker, TensorBoardTracker, TrackedRun, Tracker
from rapidfire_nb.tracking.base import Trackers
from rapidfire_nb.tracking.fanout import TrackerSet
from rapidfire_nb.tracking.mlflow_tracker import MlflowTracker
from rapidfire_nb.tracking.trackio_tracker import TrackioTracker
from rapidfire_nb.tracking.wandb_tracker import WandbTracker


def _members(protocol: type) -> set[str]:
    """The methods and attributes a protocol declares (not those of ``object`` or ``Protocol``)."""
    names = {n for n in vars(protocol) if not n.startswith("_")}
    return names | set(getattr(protocol, "__annotations__", {}))


class _ScalarsOnly(BackendTracker):
    """A backend that writes scalars and nothing else: every other call is BackendTracker's default."""

    name = "scalars"

    def __init__(self) -> None:
        self.points: list[tuple[int, int, dict[str, Any]]] = []

    def log_scalars(self, run_id: int, step: int, scalars: Any, wall_time: float | None = None) -> None:
        self.points.append((run_id, step, dict(scalars)))


class _Spy(BackendTracker):
    """Records every call of :class:`Tracker` the fan-out makes (``__getattribute__``: defaults included)."""

    name = "spy"

    def __init__(self, style: str) -> None:
        self.metric_style = style
        self.calls: list[tuple[Any, ...]] = []

    def __getattribute__(self, attr: str) -> Any:
        value = object.__getattribute__(self, attr)
        if attr in _members(Tracker) and callable(value):
            calls = object.__getattribute__(self, "calls")

            def spy(*args: Any) -> Any:
                calls.append((attr, *args))
                return value(*args)

            return spy
        return value


def test_every_backend_and_the_null_tracker_have_every_call_of_the_protocols() -> None:
    backends = (TensorBoardTracker, MlflowTracker, TrackioTracker, WandbTracker, NullTracker, BackendTracker)
    assert {"end_batch", "restore_points", "describe", "flush", "metric_style", "name"} <= _members(Tracker)
    for cls in backends:
        missing = {m for m in _members(Tracker) if not hasattr(cls, m)}
        assert not missing, (cls.__name__, missing)
    assert {"open", "end_batch", "restore_points", "flush", "log_metrics"} <= _members(Trackers)
    for cls in (TrackerSet, NullTracker):
        missing = {m for m in _members(Trackers) if not hasattr(cls, m)}
        assert not missing, (cls.__name__, missing)
    assert isinstance(NullTracker(), Trackers) and isinstance(NullTracker(), Tracker)
    assert isinstance(TrackerSet([], print), Trackers)


def test_a_backend_with_only_log_scalars_works_through_the_fanout_and_is_never_turned_off() -> None:
    lines: list[str] = []
    backend = _ScalarsOnly()
    fan = TrackerSet([("scalars", lambda: backend)], lines.append, write_every_s=0.0)
    fan.open()
    fan.start_run(TrackedRun(1, {"learning_rate": 0.1}, {}, "SFT"), "NEW")
    fan.set_status(1, "ONGOING")
    fan.log_metrics(1, 2, {"loss": 1.5, "eval_loss": 2.5}, 10.0)
    fan.continue_from(1, 2)
    fan.restore_points(1, 2, [(1, {"loss": 3.0}, 9.0)])
    fan.end_batch()
    fan.end_batch()
    fan.mark_deleted(1)
    fan.flush()
    assert fan.names == ["scalars"] and fan.failures == {} and lines == []
    assert backend.points == [(1, 2, {"train/loss": 1.5, "eval/loss": 2.5})]  # the split style's names
    fan.close()
    assert fan.names == [] and fan.failures == {}


def test_the_fanout_makes_every_optional_call_on_every_backend_in_its_names() -> None:
    split, trl = _Spy("split"), _Spy("trl")
    fan = TrackerSet([("split", lambda: split), ("trl", lambda: trl)], lambda line: None, write_every_s=0.0)
    fan.open()
    fan.restore_points(3, 2, [(1, {"eval_loss": 2.0}, 5.0), (2, {"loss": 1.0}, None)])
    fan.end_batch()  # a window of 0 s: every batch's end writes
    fan.flush()
    fan.close()
    for spy, points in (
        (split, [(1, {"eval/loss": 2.0}, 5.0), (2, {"train/loss": 1.0}, None)]),
        (trl, [(1, {"eval_loss": 2.0}, 5.0), (2, {"loss": 1.0}, None)]),
    ):
        assert spy.calls == [
            ("describe",),
            ("restore_points", 3, 2, points),
            ("end_batch",),
            ("flush",),
            ("close",),
        ], spy.metric_style
    assert fan.failures == {}


def test_the_feed_runs_on_the_null_trackers_defaults_and_confirms_an_ended_run(tmp_path: Path) -> None:
    """The null tracker defines none of ``open`` / ``restore_points`` of its own: the feed calls them all the same
    (BackendTracker's no-ops), restores a continued run and confirms a run that ended unconfirmed, as a
    :class:`TrackerSet` without backends does."""
    store = Store(tmp_path / "exp")
    store.add_metrics(
        [
            {"run_id": r, "step": 1, "samples_seen": 4, "name": "loss", "value": 1.0, "wall_time": 1.0}
            for r in (1, 2)
        ]
    )
    handed: list[Any] = []
    for tracker in (NullTracker(), TrackerSet([], print)):
        feed = TrackerFeed(tracker, handed.append)
        feed.start()
        runs = [
            (TrackedRun(1, {}, {}, "SFT"), RunStatus.COMPLETED),
            (TrackedRun(2, {}, {}, "SFT"), RunStatus.ONGOING),
        ]
        feed.open_runs(store, runs, {2: 1})
        done = threading.Event()
        feed.release(done)
        feed.end_batch()
        feed.close()
        assert done.is_set()
        assert [type(i) for i in handed] == [TrackedItem] and handed[0].run_id == 1, type(tracker).__name__
        handed.clear()
