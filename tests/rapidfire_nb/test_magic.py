"""``%rapidfire`` (issue 4) through a real IPython ``InteractiveShell``: every command, wrong usage, literals only.

One module-scoped experiment (3 runs on the tiny model, 16 rows, batch 2 -> 8 steps, 4 chunks), trained in the
background while the magic commands run.
"""

from __future__ import annotations

import gc
import re
import time
from typing import Any

import pytest

from tests.helpers import qa_dataset, qa_to_chat

WAIT_S = 150
NAME = "magic"


def _group() -> Any:
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    configs = List(
        [
            RFModelConfig(
                model_name="tiny",
                formatting_func=qa_to_chat,
                peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
                training_args=RFSFTConfig(
                    learning_rate=lr, per_device_train_batch_size=2, num_train_epochs=1, max_length=32
                ),
            )
            for lr in (1e-3, 5e-4, 2e-4)
        ]
    )
    return RFGridSearch(configs=configs, trainer_type="SFT")


def _until(cond: Any, timeout: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def shell() -> Any:
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "rapidfire_nb")
    return ip


@pytest.fixture(scope="module")
def mexp(tmp_path_factory: pytest.TempPathFactory, shell: Any) -> Any:
    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model

    root = tmp_path_factory.mktemp("magic_root")
    other = Experiment("other", experiment_path=root)  # a second experiment in the store, not live later
    other.store.update_meta({"trainer_type": "SFT"})
    del other
    gc.collect()
    exp = Experiment(NAME, experiment_path=root)
    exp.quiet = True
    exp.run_fit(_group(), tiny_create_model, qa_dataset(16), num_chunks=4, seed=3, background=True)
    yield exp
    exp.end()


@pytest.fixture()
def in_root(mexp: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``$RF_HOME`` pointing at the module experiment's root (``list`` and ``-e`` read the store there)."""
    monkeypatch.setenv("RF_HOME", str(mexp.root))
    return mexp


def _magic(ip: Any, line: str) -> Any:
    return ip.run_line_magic("rapidfire", line)


def _status(exp: Any, rid: int) -> str:
    snap = exp.run_snapshot(rid)
    return snap.status.value if snap else "MISSING"


# ============================================================================================ loading, views
def test_load_ext_registers_the_magic(shell: Any) -> None:
    assert "rapidfire" in shell.magics_manager.magics["line"]
    doc = shell.find_line_magic("rapidfire").__doc__ or ""
    assert "rapidfire" in doc.lower()


def test_stop_and_resume(shell: Any, in_root: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """First op test: run 2 (2nd of 3, 4 chunks) is still NEW or in its first chunk when stopped."""
    exp = in_root
    assert _magic(shell, "stop 2") is None
    out = capsys.readouterr().out
    assert "stop run 2" in out, out
    assert _until(lambda: _status(exp, 2) in ("STOPPED", "COMPLETED"))
    assert _status(exp, 2) == "STOPPED", "stop 2 (sent before run 2's last chunk) did not park it"
    capsys.readouterr()
    exp.quiet = False  # the experiment's own lines too
    try:
        _magic(shell, "stop 2")  # already stopped: the rejection is printed once, by the magic
    finally:
        exp.quiet = True
    out = capsys.readouterr().out
    assert out.count("rejected") == 1 and "only NEW, ONGOING or INTERRUPTED runs can be stopped" in out, out
    _magic(shell, "resume 2")
    out = capsys.readouterr().out
    assert "resume run 2" in out and "rejected" not in out, out
    assert _until(lambda: _status(exp, 2) != "STOPPED"), "resume 2 was never applied"
    assert _status(exp, 2) in ("ONGOING", "COMPLETED")
    ops = exp.ops()
    assert set(ops[(ops.run_id == 2)].kind) >= {"stop", "resume"}


def test_bare_magic_returns_the_status_table(shell: Any, in_root: Any) -> None:
    import pandas as pd

    df = _magic(shell, "")
    assert isinstance(df, pd.DataFrame)
    assert df.index.name == "run_id" and list(df.index)[:3] == [1, 2, 3]  # no 0-based index beside run ids
    assert "status" in df.columns and "config" not in df.columns and "checkpoint_dir" not in df.columns
    assert list(df.columns[:3]) == ["status", "loss", "eval_loss"]  # the metrics fit a ~1000 px output
    assert re.fullmatch(r"\d+/\d+", str(df.loc[1, "step"]))
    df2 = _magic(shell, "status")
    assert list(df2.index) == list(df.index)


def test_list_shows_experiments_in_the_store(shell: Any, in_root: Any) -> None:
    df = _magic(shell, "list")
    names = list(df.experiment)
    assert NAME in names and "other" in names, names
    row = df[df.experiment == NAME].iloc[0]
    assert row.runs >= 3 and row.trainer_type == "SFT"
    created = row.created_at
    assert created.tzinfo is not None and created.nanosecond == 0 and created.microsecond == 0, created


# ============================================================================================ ops
def test_delete(shell: Any, in_root: Any, capsys: pytest.CaptureFixture[str]) -> None:
    exp = in_root
    _magic(shell, "delete 3")
    assert "delete run 3" in capsys.readouterr().out
    assert _until(lambda: _status(exp, 3) == "DELETED")
    assert 3 not in list(_magic(shell, "").index)


def test_clone_warm_and_cold(shell: Any, in_root: Any, capsys: pytest.CaptureFixture[str]) -> None:
    exp = in_root
    before = {s.run_id for s in exp.run_snapshots()}
    # past run 1's end: whether it is training, in its last chunk or COMPLETED by now, the warm clone trains on
    total = exp.run_snapshot(1).total_steps
    _magic(shell, f"clone 1 --warm learning_rate=5e-5 max_steps={total + 4}")
    _magic(shell, "clone 1 lora.r=16")
    out = capsys.readouterr().out
    after = {s.run_id for s in exp.run_snapshots()}
    new = sorted(after - before)
    assert new == [max(before) + 1, max(before) + 2], new
    assert f"run {new[0]} created from run 1" in out and f"run {new[1]} created from run 1" in out, out
    warm, cold = (exp.run_snapshot(r) for r in new)
    assert warm.warm_start and warm.parent_id == 1 and warm.spec.hparams()["learning_rate"] == 5e-5
    assert not cold.warm_start and cold.spec.hparams()["lora.r"] == 16
    assert exp.wait(timeout=WAIT_S)
    assert _status(exp, new[0]) == "COMPLETED" and _status(exp, new[1]) == "COMPLETED"


# ============================================================================================ wrong usage
@pytest.mark.parametrize(
    "line", ["stop", "stop x", "frobnicate", "clone 1 badtoken", "clone", "resume 2 --warm"]
)
def test_wrong_usage_raises_usage_error_with_usage_line(shell: Any, in_root: Any, line: str) -> None:
    from IPython.core.error import UsageError

    n_ops = len(in_root.ops())
    with pytest.raises(UsageError) as ei:
        _magic(shell, line)
    assert "usage: %rapidfire" in str(ei.value), str(ei.value)
    assert len(in_root.ops()) == n_ops, "a wrong command submitted an op"


def test_values_are_literals_never_evaluated(
    shell: Any, in_root: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import threading

    from IPython.core.error import UsageError

    from rapidfire_nb.magic import parse_changes

    calls: list[int] = []
    real_getpid = os.getpid

    def getpid() -> int:  # counted on this thread only: the recorder's heartbeat asks for the pid every 2 s
        if threading.current_thread() is threading.main_thread():
            calls.append(1)
        return real_getpid()

    monkeypatch.setattr(os, "getpid", getpid)
    exp = in_root
    ids = {s.run_id for s in exp.run_snapshots()}
    n_ops = len(exp.ops())
    with pytest.raises(UsageError) as ei:
        _magic(shell, "clone 1 learning_rate=__import__('os').getpid()")
    monkeypatch.undo()
    assert calls == [], "the value was evaluated as code"
    assert "learning_rate" in str(ei.value), str(ei.value)
    assert {s.run_id for s in exp.run_snapshots()} == ids, "a run was created"
    assert len(exp.ops()) == n_ops
    assert parse_changes(["a=5e-5", "b=[1, 2]", "c=True", "d=abc", "e=None"]) == {
        "a": 5e-5,
        "b": [1, 2],
        "c": True,
        "d": "abc",
        "e": None,
    }


def test_magic_ops_reach_the_ops_log(in_root: Any) -> None:
    ops = in_root.ops()
    assert set(ops.kind) >= {"stop", "resume", "delete", "clone"}
    assert set(ops.state) <= {"applied", "rejected", "queued"}
    assert "magic" in set(ops.source) or "api" in set(ops.source)


# ============================================================================================ -e NAME
def test_dash_e_addresses_an_experiment_by_name(shell: Any, in_root: Any) -> None:
    """Last in the module: on failure, later %rapidfire calls would lose the current experiment."""
    df = _magic(shell, f"-e {NAME}")
    assert list(df.index)[:2] == [1, 2]
    other = _magic(shell, "-e other")
    assert len(other) == 0
    # addressing another experiment must not change the current one
    df2 = _magic(shell, "")
    assert list(df2.index)[:2] == [1, 2]
    with pytest.raises(Exception) as ei:
        _magic(shell, "-e no_such_experiment")
    assert type(ei.value).__name__ == "UsageError" and "no_such_experiment" in str(ei.value)


def test_tensorboard_runs_this_environments_binary_without_it_on_path(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """A kernel from a venv that is not activated: ``%rapidfire tensorboard`` must not need ``tensorboard`` on
    PATH. The env var it sets makes TensorBoard's own launcher start this environment's script."""
    import os
    import signal
    import sys
    from pathlib import Path

    from tensorboard import manager

    from rapidfire_nb.magic import _use_this_environments_tensorboard

    monkeypatch.delenv("TENSORBOARD_BINARY", raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no venv bin
    _use_this_environments_tensorboard()
    binary = os.environ["TENSORBOARD_BINARY"]
    assert Path(binary) == Path(sys.executable).parent / "tensorboard" and Path(binary).is_file()
    (tmp_path / "logs").mkdir()
    result = manager.start(["--logdir", str(tmp_path / "logs"), "--host", "127.0.0.1", "--port", "0"])
    try:
        assert isinstance(result, manager.StartLaunched), result
    finally:
        info = getattr(result, "info", None)
        if info is not None:
            os.kill(info.pid, signal.SIGTERM)
    # an explicit choice is kept
    monkeypatch.setenv("TENSORBOARD_BINARY", "/opt/tb/bin/tensorboard")
    _use_this_environments_tensorboard()
    assert os.environ["TENSORBOARD_BINARY"] == "/opt/tb/bin/tensorboard"
