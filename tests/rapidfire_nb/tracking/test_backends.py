"""Choosing the trackers (argument, environment, installed packages) and the fan-out that isolates them (issue 15).

Pure logic: no torch, no backend package (fake trackers; a fake ``wandb`` module for the W&B tracker).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb.errors import ConfigError
from rapidfire_nb.tracking import TrackedRun, backends
from rapidfire_nb.tracking.backends import resolve_tracking
from rapidfire_nb.tracking.base import HeldSteps
from rapidfire_nb.tracking.fanout import TrackerSet
from rapidfire_nb.tracking.mlflow_tracker import shown_uri
from tests.rapidfire_nb.tracking._tracking_helpers import need


# ============================================================================================ choosing
def test_default_is_tensorboard_and_the_rf_variables_change_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "installed", lambda module: True)
    assert resolve_tracking(None, {}) == ("tensorboard",)
    env = {"RF_MLFLOW_ENABLED": "true", "RF_TRACKIO_ENABLED": "1", "RF_TENSORBOARD_ENABLED": "yes"}
    assert resolve_tracking(None, env) == ("tensorboard", "mlflow", "trackio")
    assert resolve_tracking(None, {"RF_TENSORBOARD_ENABLED": "false", "RF_WANDB_ENABLED": "on"}) == ("wandb",)
    assert resolve_tracking(None, {"RF_TENSORBOARD_ENABLED": "0"}) == ()
    assert resolve_tracking(None, {"RF_MLFLOW_ENABLED": "  "}) == ("tensorboard",)  # empty: unset


def test_the_argument_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "installed", lambda module: True)
    env = {"RF_MLFLOW_ENABLED": "true"}
    assert resolve_tracking(["trackio", "TensorBoard", "trackio"], env) == ("trackio", "tensorboard")
    assert resolve_tracking("mlflow", env) == ("mlflow",)
    assert resolve_tracking([], env) == ()


@pytest.mark.parametrize(
    ("tracking", "env", "words"),
    [
        (["mlfow"], {}, ["unknown tracker 'mlfow'", "did you mean 'mlflow'?", "known trackers: tensorboard"]),
        (["comet"], {}, ["unknown tracker 'comet'", "known trackers: tensorboard, mlflow, trackio, wandb"]),
        (42, {}, ["tracking=42 must be a list of tracker names", "[] for none"]),
        ({"mlflow": True}, {}, ["must be a list of tracker names"]),
        ([None], {}, ["tracking: None is not a tracker name"]),
        (None, {"RF_MLFLOW_ENABLED": "maybe"}, ["RF_MLFLOW_ENABLED='maybe' must be true or false"]),
    ],
)
def test_bad_tracking_input_is_a_config_error_naming_it(
    tracking: Any, env: dict[str, str], words: list[str]
) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_tracking(tracking, env)
    for word in words:
        assert word in str(err.value)


def test_a_backend_not_installed_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "installed", lambda module: module not in ("wandb", "trackio"))
    with pytest.raises(ConfigError) as err:
        resolve_tracking(["tensorboard", "wandb"], {})
    assert (
        "tracking=['wandb'] asks for W&B, which is not installed here: pip install 'rapidfire_nb[wandb]'"
        in str(err.value)
    )
    with pytest.raises(ConfigError) as err:
        resolve_tracking(None, {"RF_TRACKIO_ENABLED": "true"})
    assert "RF_TRACKIO_ENABLED=true asks for Trackio" in str(err.value)
    assert "pip install 'rapidfire_nb[trackio]'" in str(err.value)


def test_mlflow_skinny_without_its_sqlite_store_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "installed", lambda module: module != "alembic")
    with pytest.raises(ConfigError) as err:
        resolve_tracking(["mlflow"], {})
    assert "MLflow's local SQLite store needs alembic" in str(err.value)
    assert "pip install 'rapidfire_nb[mlflow]'" in str(err.value)
    assert resolve_tracking(["mlflow"], {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000"}) == ("mlflow",)


def test_experiment_refuses_a_tracker_not_installed_before_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rapidfire_nb import Experiment

    monkeypatch.setattr(backends, "installed", lambda module: module != "mlflow")
    with pytest.raises(ConfigError, match=r"pip install 'rapidfire_nb\[mlflow\]'"):
        Experiment("needs-mlflow", experiment_path=tmp_path, tracking=["tensorboard", "mlflow"])
    assert not (tmp_path / "needs-mlflow").exists()  # refused before the folder was made


def test_a_password_in_the_tracking_uri_is_never_shown() -> None:
    assert shown_uri("https://me:s3cret@mlflow.example:443/x") == "https://me:<redacted>@mlflow.example:443/x"
    assert shown_uri("sqlite:////tmp/a b/mlflow.db") == "sqlite:////tmp/a b/mlflow.db"


# ============================================================================================ the fan-out
class _Fake:
    """A tracker that records its calls; raises in ``fail_in`` (a method name)."""

    def __init__(self, name: str, style: str = "split", fail_in: str | None = None) -> None:
        self.name, self.metric_style, self.fail_in = name, style, fail_in
        self.calls: list[tuple[Any, ...]] = []

    def __getattr__(self, method: str) -> Any:
        def call(*args: Any) -> Any:
            self.calls.append((method, *args))
            if method == self.fail_in:
                raise OSError(28, "No space left on device")
            return f"{self.name} says hello" if method == "describe" else None

        return call


def test_a_backend_that_raises_is_reported_once_and_left_out_the_others_go_on() -> None:
    good, bad = _Fake("tensorboard"), _Fake("mlflow", style="trl", fail_in="log_scalars")
    said: list[str] = []
    off: set[str] = set()
    fan = TrackerSet([("tensorboard", lambda: good), ("mlflow", lambda: bad)], said.append, off)
    fan.open()
    assert said == ["tensorboard says hello", "mlflow says hello"]
    for step in (1, 2, 3):
        fan.log_metrics(1, step, {"loss": 1.0 / step, "eval_loss": 2.0})
    fan.set_status(1, "COMPLETED")
    fan.close()
    assert [c for c in good.calls if c[0] == "log_scalars"] == [
        ("log_scalars", 1, s, {"train/loss": 1.0 / s, "eval/loss": 2.0}, None) for s in (1, 2, 3)
    ]
    assert ("set_status", 1, "COMPLETED", None, None) in good.calls and good.calls[-1] == ("close",)
    assert [c[0] for c in bad.calls] == [
        "describe",
        "log_scalars",
        "close",
    ]  # TRL names, then closed and left out
    assert bad.calls[1] == ("log_scalars", 1, 1, {"loss": 1.0, "eval_loss": 2.0}, None)
    assert said[2:] == [
        "mlflow tracking failed (log_scalars: OSError: [Errno 28] No space left on device); it is off for the rest "
        "of this experiment. Training, the store and the other trackers go on (get_results() has every metric)"
    ]
    assert off == {"mlflow"} and fan.names == []
    again = TrackerSet(
        [("tensorboard", lambda: _Fake("tensorboard")), ("mlflow", lambda: bad)], said.append, off
    )
    again.open()
    assert again.names == ["tensorboard"]  # the next run_fit of the same Experiment object leaves it out


def test_a_backend_that_cannot_open_or_close_is_reported_never_raised() -> None:
    def refuse() -> Any:
        raise ConnectionError("no tracking server at http://127.0.0.1:1")

    said: list[str] = []
    closing = _Fake("trackio", fail_in="close")
    fan = TrackerSet([("mlflow", refuse), ("trackio", lambda: closing)], said.append)
    fan.open()
    fan.open()  # idempotent
    fan.start_run(TrackedRun(1, {}, {}, "SFT"), "NEW")
    fan.close()
    assert said == [
        "mlflow tracking failed (opening it: ConnectionError: no tracking server at http://127.0.0.1:1); it is off "
        "for the rest of this experiment. Training, the store and the other trackers go on (get_results() has "
        "every metric)",
        "trackio says hello",
        "trackio tracking failed (close: OSError: [Errno 28] No space left on device); it is off for the rest of "
        "this experiment. Training, the store and the other trackers go on (get_results() has every metric)",
    ]


def test_held_steps_skip_what_the_backend_holds_above_the_restart_point() -> None:
    held = HeldSteps()
    held.hold(1, 4, {"loss": 6, "eval_loss": 4, "grad_norm": 5})  # eval_loss: not above the checkpoint
    assert held.new_only(1, 5, {"loss": 1.0, "grad_norm": 2.0}) == {}
    assert held.new_only(1, 6, {"loss": 1.0, "grad_norm": 2.0, "eval_loss": 3.0}) == {
        "grad_norm": 2.0,
        "eval_loss": 3.0,
    }
    assert held.new_only(1, 7, {"loss": 1.0}) == {"loss": 1.0}
    assert held.new_only(2, 5, {"loss": 1.0}) == {"loss": 1.0}  # another run: nothing held
    held.hold(3, 8, {"loss": 8})
    assert held.new_only(3, 9, {"loss": 1.0}) == {"loss": 1.0}


def test_held_points_count_each_point_of_a_step() -> None:
    """TRL's ``epoch`` is in the training and the evaluation log of one step: holding one of the two points of
    step 6 keeps the other (the highest step alone would skip both), and a stored point is handed back only as
    often as the backend lacks it."""
    held = HeldSteps()
    held.hold_points(1, 4, {"epoch": [3, 4, 5, 6], "eval_loss": []})
    assert held.lacking(1, 4, {"eval_loss": 3.0, "epoch": 0.5}) == {"eval_loss": 3.0}  # the training log's
    assert held.lacking(1, 4, {"epoch": 0.5}) == {"epoch": 0.5}  # the evaluation log's: not held
    assert held.new_only(1, 6, {"loss": 1.0, "epoch": 0.75}) == {"loss": 1.0}
    assert held.new_only(1, 6, {"eval_loss": 2.0, "epoch": 0.75}) == {"eval_loss": 2.0, "epoch": 0.75}
    assert held.knows(1) and not held.knows(2)


# ============================================================================================ W&B (a fake wandb)
class _FakeWandbRun:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.logged: list[tuple[dict[str, float], int]] = []
        self.summary: dict[str, Any] = {}
        self.tags = tuple(kwargs.get("tags") or ())
        self.config = types.SimpleNamespace(
            update=lambda values, allow_val_change: self.updates.append(values)
        )
        self.updates: list[dict[str, Any]] = []
        self.exit_code: int | None = None

    def log(self, data: dict[str, float], step: int) -> None:
        self.logged.append((data, step))

    def finish(self, exit_code: int = 0) -> None:
        self.exit_code = exit_code


@pytest.fixture
def fake_wandb(monkeypatch: pytest.MonkeyPatch) -> list[_FakeWandbRun]:
    made: list[_FakeWandbRun] = []

    def init(**kwargs: Any) -> _FakeWandbRun:
        made.append(_FakeWandbRun(**kwargs))
        return made[-1]

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    return made


def test_wandb_one_handle_per_run_offline_with_the_lifecycle(tmp_path: Path, fake_wandb: list[Any]) -> None:
    from rapidfire_nb.tracking.wandb_tracker import WandbTracker

    state: dict[str, Any] = {}
    tracker = WandbTracker("exp", tmp_path, {}, lambda s: state.update(s))
    assert "offline runs in" in tracker.describe() and "wandb sync" in tracker.describe()
    tracker.start_run(TrackedRun(1, {"learning_rate": 1e-3, "hub_token": "<redacted>"}, {}, "SFT"), "NEW")
    tracker.start_run(TrackedRun(2, {}, {}, "SFT", parent_id=1, warm_start=True), "NEW")
    for rid in (1, 2):
        tracker.set_status(rid, "ONGOING")
        tracker.log_scalars(rid, 1, {"train/loss": 2.0})
    tracker.set_status(1, "STOPPED")
    tracker.set_status(2, "FAILED", "CUDA out of memory")
    first, second = fake_wandb
    assert first.kwargs["reinit"] == "create_new" and first.kwargs["mode"] == "offline"
    assert first.kwargs["dir"] == str(tmp_path) and first.kwargs["name"] == "run-1"
    assert first.kwargs["resume"] == "allow" and first.kwargs["id"] == state["runs"]["1"]
    assert first.kwargs["config"]["hub_token"] == "<redacted>" and first.kwargs["tags"] == ["SFT"]
    assert (
        second.kwargs["tags"] == ["SFT", "clone", "warm-start"]
        and second.kwargs["config"]["rapidfire.parent_run"] == 1
    )
    assert first.logged == [({"train/loss": 2.0}, 1)] and first.summary["rapidfire.status"] == "killed"
    assert first.exit_code is None  # a stopped run stays open: it may be resumed
    assert second.exit_code == 1 and second.summary["rapidfire.error"] == "CUDA out of memory"
    tracker.close()
    assert first.exit_code == 0

    restarted = WandbTracker(
        "exp", tmp_path, dict(state), lambda s: None
    )  # a new kernel: the same W&B run ids
    restarted.start_run(TrackedRun(1, {}, {}, "SFT"), "STOPPED")
    restarted.start_run(TrackedRun(2, {}, {}, "SFT"), "FAILED")
    restarted.continue_from(1, 4)
    restarted.set_status(1, "ONGOING")
    restarted.log_scalars(2, 9, {"train/loss": 1.0})  # an ended run is not opened again
    restarted.mark_deleted(1)
    third = fake_wandb[2]
    assert len(fake_wandb) == 3 and third.kwargs["id"] == first.kwargs["id"]
    assert third.kwargs["config"]["rapidfire.continued_from_step"] == 4
    assert "deleted" in third.tags and third.exit_code == 0


def test_wandb_offline_for_real_when_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """wandb is not in the test extra (a 20 MB wheel and a service process per kernel): this runs where it is."""
    pytest.importorskip("wandb")
    from rapidfire_nb.tracking.wandb_tracker import WandbTracker

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    state: dict[str, Any] = {}
    tracker = WandbTracker("exp", tmp_path, {}, lambda s: state.update(s))
    for rid in (1, 2):
        tracker.start_run(TrackedRun(rid, {"learning_rate": 1e-3}, {}, "SFT"), "NEW")
        tracker.set_status(rid, "ONGOING")
        tracker.log_scalars(rid, 1, {"train/loss": 2.0})
    tracker.set_status(1, "STOPPED")
    tracker.set_status(2, "COMPLETED")
    tracker.close()
    ids = {p.name.rsplit("-", 1)[1] for p in (tmp_path / "wandb").glob("offline-run-*")}
    assert ids == {state["runs"]["1"], state["runs"]["2"]}  # one offline run per run id


def test_a_refusing_mlflow_server_fails_at_once_and_its_password_is_never_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34 item 6: a server refusing connections held a blocking run_fit ~4 minutes (MLflow's retries), and
    the failure line printed the password of MLFLOW_TRACKING_URI."""
    import socket
    import time

    need("mlflow")
    from rapidfire_nb.tracking.mlflow_tracker import MlflowTracker

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://alice:S3cretPW@127.0.0.1:{port}")
    said: list[str] = []
    fan = TrackerSet(
        [("mlflow", lambda: MlflowTracker("refused", tmp_path, {}, lambda state: None))], said.append
    )
    started = time.monotonic()
    fan.open()
    assert time.monotonic() - started < 5
    assert len(said) == 1 and "S3cretPW" not in said[0]
    assert said[0].startswith(
        f"mlflow tracking failed (opening it: ConnectionError: no MLflow tracking server answers at "
        f"http://alice:<redacted>@127.0.0.1:{port} ("
    )
    assert fan.names == []
    fan.close()


def test_passwords_in_urls_are_hidden_in_any_failure_text() -> None:
    from rapidfire_nb.redact import hide_url_passwords

    text = "API request to http://alice:S3cretPW@127.0.0.1:5000/api/2.0 failed; see https://h.example/x"
    assert hide_url_passwords(text) == (
        "API request to http://alice:<redacted>@127.0.0.1:5000/api/2.0 failed; see https://h.example/x"
    )

    class Quoting(_Fake):
        def log_scalars(self, *args: Any) -> None:
            raise ConnectionError(text)  # MLflow's client quotes the URI it called

    said: list[str] = []
    fan = TrackerSet([("mlflow", lambda: Quoting("mlflow", style="trl"))], said.append)
    fan.open()
    fan.log_metrics(1, 1, {"loss": 1.0})
    fan.close()
    assert said[1] == (
        "mlflow tracking failed (log_scalars: ConnectionError: API request to http://alice:<redacted>@127.0.0.1:5000"
        "/api/2.0 failed; see https://h.example/x); it is off for the rest of this experiment. Training, the store "
        "and the other trackers go on (get_results() has every metric)"
    )
