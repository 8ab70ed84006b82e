"""rapidfire_nb.tracking: TensorBoard event files read back with TensorBoard's own reader."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rapidfire_nb.tracking import NullTracker, TensorBoardTracker, TrackedRun, Tracker
from rapidfire_nb.tracking.tensorboard import HPARAMS_TAG

REPO_ROOT = Path(__file__).resolve().parents[3]


def _load(run_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _series(acc: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_scalars_of_two_runs_read_back(tmp_path):
    with TensorBoardTracker(tmp_path) as tb:
        tb.log_scalars(1, 1, {"train/loss": 2.5, "train/learning_rate": 1e-4})
        tb.log_scalars(2, 1, {"train/loss": 3.25})
        tb.log_scalars(1, 2, {"train/loss": 2.0})
        tb.log_scalars(1, 2, {"eval/loss": 1.75}, wall_time=123.0)
        tb.log_scalars(2, 2, {"train/loss": 3.0, "eval/loss": 2.5})
        tb.flush()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["run-1", "run-2"]
        run1 = _load(tmp_path / "run-1")
        assert sorted(run1.Tags()["scalars"]) == ["eval/loss", "train/learning_rate", "train/loss"]
        assert _series(run1, "train/loss") == [(1, 2.5), (2, 2.0)]
        assert _series(run1, "eval/loss") == [(2, 1.75)]
        assert run1.Scalars("eval/loss")[0].wall_time == 123.0
        assert _series(run1, "train/learning_rate") == [(1, pytest.approx(1e-4))]
    run2 = _load(tmp_path / "run-2")
    assert sorted(run2.Tags()["scalars"]) == ["eval/loss", "train/loss"]
    assert _series(run2, "train/loss") == [(1, 3.25), (2, 3.0)]
    assert _series(run2, "eval/loss") == [(2, 2.5)]


def test_non_numeric_values_are_skipped(tmp_path):
    import numpy as np

    with TensorBoardTracker(tmp_path) as tb:
        tb.log_scalars(1, 1, {"a": np.float32(0.5), "b": "text", "c": None, "d": [1, 2], "e": 3, "f": True})
        tb.log_scalars(1, 2, {"b": "only text"})  # nothing numeric: no event
    acc = _load(tmp_path / "run-1")
    assert sorted(acc.Tags()["scalars"]) == ["a", "e"]
    assert _series(acc, "a") == [(1, 0.5)]
    assert _series(acc, "e") == [(1, 3.0)]


def test_hparams_are_a_text_summary(tmp_path):
    with TensorBoardTracker(tmp_path) as tb:
        tb.log_hparams(3, {"learning_rate": 1e-4, "lora.r": 8, "model_kwargs.dtype": "float32"})
    acc = _load(tmp_path / "run-3")
    assert acc.Tags()["tensors"] == [HPARAMS_TAG]
    [event] = acc.Tensors(HPARAMS_TAG)
    text = event.tensor_proto.string_val[0].decode()
    assert "| learning_rate | 0.0001 |" in text
    assert "| lora.r | 8 |" in text
    assert "| model_kwargs.dtype | float32 |" in text
    assert acc.SummaryMetadata(HPARAMS_TAG).plugin_data.plugin_name == "text"


def test_mark_deleted_renames_and_stops_logging(tmp_path):
    tb = TensorBoardTracker(tmp_path)
    tb.log_scalars(1, 1, {"train/loss": 1.0})
    tb.log_scalars(2, 1, {"train/loss": 2.0})
    assert tb.mark_deleted(1) == tmp_path / "deleted-run-1"
    tb.log_scalars(1, 2, {"train/loss": 0.5})  # ignored
    assert tb.mark_deleted(7) is None  # never logged
    tb.close()
    tb.close()  # idempotent
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deleted-run-1", "run-2"]
    assert _series(_load(tmp_path / "deleted-run-1"), "train/loss") == [(1, 1.0)]
    with pytest.raises(RuntimeError, match="closed"):
        tb.log_scalars(2, 2, {"train/loss": 1.0})


def test_logging_from_many_threads(tmp_path):
    with TensorBoardTracker(tmp_path) as tb:

        def work(t: int) -> None:
            for step in range(50):
                tb.log_scalars(t % 2 + 1, t * 100 + step, {"train/loss": float(step)})

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert len(_load(tmp_path / "run-1").Scalars("train/loss")) == 100
    assert len(_load(tmp_path / "run-2").Scalars("train/loss")) == 100


def test_continue_from_hides_what_a_dead_process_logged_after_the_checkpoint(tmp_path):
    """A process logs steps 1..7 and dies (its checkpoint is at step 4); the next one continues from step 4 and logs
    5..10 again: TensorBoard shows each step once, steps 5..7 with the new values."""
    first = TensorBoardTracker(tmp_path)
    for step in range(1, 8):
        first.log_scalars(1, step, {"train/loss": 10.0 + step})
    first.log_scalars(1, 4, {"eval/loss": 1.0})
    first.log_scalars(1, 6, {"eval/loss": 0.5})  # an eval after the checkpoint: gone too
    first.flush()  # the process dies without closing
    second = TensorBoardTracker(tmp_path)
    second.continue_from(1, 4)
    for step in range(5, 11):
        second.log_scalars(1, step, {"train/loss": 20.0 + step})
    second.log_scalars(1, 8, {"eval/loss": 0.25})
    second.close()
    acc = _load(tmp_path / "run-1")
    assert _series(acc, "train/loss") == [(s, 10.0 + s) for s in range(1, 5)] + [
        (s, 20.0 + s) for s in range(5, 11)
    ]
    assert _series(acc, "eval/loss") == [(4, 1.0), (8, 0.25)]
    first.close()


def test_null_tracker_does_nothing(tmp_path):
    null = NullTracker()
    null.log_scalars(1, 1, {"train/loss": 1.0})
    null.log_hparams(1, {"learning_rate": 1.0})
    null.continue_from(1, 3)
    null.flush()
    assert null.mark_deleted(1) is None
    null.close()
    assert isinstance(null, Tracker)
    with TensorBoardTracker(tmp_path) as tb:
        assert isinstance(tb, Tracker)
    assert list(tmp_path.iterdir()) == []


def test_importing_tracking_does_not_import_tensorboard_or_torch():
    script = (
        f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r}); import rapidfire_nb.tracking; "
        "print(sorted(m for m in ('tensorboard', 'torch', 'tensorflow') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_restore_points_brings_back_what_a_killed_process_had_not_flushed(tmp_path):
    """A process logs steps 1..6 (checkpoint at step 4) but only steps 1..2 reach its event file before it is
    killed; the next one restores steps 0..4 from the store and logs 5..6 again: each step once, with the stored
    values and wall times."""
    first = TensorBoardTracker(tmp_path)
    first.start_run(TrackedRun(1, {"learning_rate": 1e-3}, {}, "SFT"), "ONGOING")
    first.log_scalars(1, 0, {"eval/loss": 3.0})  # eval_on_start
    for step in (1, 2):
        first.log_scalars(1, step, {"train/loss": 10.0 + step})
    first.flush()  # then steps 3..6 stay in the writer's buffer: the process is killed
    stored = [(0, {"eval/loss": 3.0}, 100.0)] + [
        (s, {"train/loss": 10.0 + s}, 100.0 + s) for s in range(1, 7)
    ]
    stored.insert(5, (4, {"eval/loss": 1.0}, 104.5))
    second = TensorBoardTracker(tmp_path)
    second.start_run(TrackedRun(1, {"learning_rate": 1e-3}, {}, "SFT"), "ONGOING")
    second.continue_from(1, 4)
    second.restore_points(1, 4, stored)  # points above the checkpoint are not written
    for step in (5, 6):
        second.log_scalars(1, step, {"train/loss": 20.0 + step})
    second.close()
    acc = _load(tmp_path / "run-1")
    assert _series(acc, "train/loss") == [(s, 10.0 + s) for s in range(1, 5)] + [(5, 25.0), (6, 26.0)]
    assert _series(acc, "eval/loss") == [(0, 3.0), (4, 1.0)]
    assert [e.wall_time for e in acc.Scalars("train/loss")[:4]] == [101.0, 102.0, 103.0, 104.0]
    assert (
        len(acc.Tensors(HPARAMS_TAG)) == 2
    )  # one per process's start_run (the purge keeps text); none added
    first.close()
