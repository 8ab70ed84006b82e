"""Ctrl-C in a plain script: the runs park at the end of their chunk, then KeyboardInterrupt is raised again
(exit status 130, never 0) with a line saying how to continue; the script's code after run_fit never runs.

A real ``python script.py`` child trains one tiny run (128 steps, 8 chunks: long enough that its first chunk line,
printed by the recorder thread, comes while it still trains on a loaded machine) with a blocking ``run_fit`` and
gets SIGINT after that line. In a kernel, ``wait()`` keeps returning False after the graceful stop (the
same code path, ``in_kernel()`` true): checked in-process with the kernel detector patched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent(
    """
    import sys
    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import RFGridSearch, RFModelConfig, RFSFTConfig
    from rapidfire_nb.testing import tiny_create_model
    from tests.helpers import qa_dataset, qa_to_chat

    group = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            formatting_func=qa_to_chat,
            training_args=RFSFTConfig(per_device_train_batch_size=2, num_train_epochs=1, max_length=32),
        ),
        "SFT",
    )
    exp = Experiment("ctrl-c", experiment_path=sys.argv[1])
    exp.run_fit(group, tiny_create_model, qa_dataset(256), num_chunks=8, seed=1)
    print("AFTER RUN_FIT", flush=True)
    exp.end()
    """
)


def test_ctrl_c_in_a_script_parks_the_runs_and_exits_130(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 240
        for line in proc.stdout:  # until run 1 ends its first chunk
            lines.append(line)
            if "chunk 1/8 of epoch 1 done" in line or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    stdout = "".join(lines) + out
    assert proc.returncode in (130, -signal.SIGINT), (proc.returncode, stdout, err[-3000:])
    assert "AFTER RUN_FIT" not in stdout
    assert (
        "interrupted: stopping runs [1] at the end of their current chunk (press interrupt again to quit now)"
        in (stdout)
    )
    assert "STOPPED (checkpoints and weights saved). To continue, run the script again with " in stdout
    assert "experiment.resume([1]) and experiment.wait() after run_fit" in stdout
    assert "KeyboardInterrupt: interrupted: run 1 at step " in err

    from rapidfire_nb.store import Store

    with Store(tmp_path / "ctrl-c") as store:
        run = store.get_run(1)
    assert run is not None and run["status"] == "STOPPED"
    assert 0 < run["completed_steps"] < 128 and run["completed_steps"] % 16 == 0  # parked at a chunk boundary
    assert any(Path(run["checkpoint_dir"]).glob("*.safetensors"))  # its final weights were saved


def _interrupted_once_in_a_kernel(h: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A FitSession over the harness whose first ``wait`` is interrupted, as by Ctrl-C in a kernel's cell."""
    from rapidfire_nb.experiment import session as session_mod

    real_wait = h.sched.wait
    calls = {"n": 0}

    def wait(*args: Any, **kwargs: Any) -> bool:
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt
        return real_wait(*args, **kwargs)

    monkeypatch.setattr(h.sched, "wait", wait)
    monkeypatch.setattr(session_mod, "in_kernel", lambda: True)
    recorder = types.SimpleNamespace(flush=lambda timeout=None: True)  # nothing to write here
    return session_mod.FitSession(h.sched, h.fake, recorder, None, None, None)


def test_ctrl_c_in_a_kernel_still_returns_false_after_the_graceful_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kernel_scheduler import RunStatus
    from rapidfire_nb.experiment.reporter import Reporter
    from rapidfire_nb.testing.fakes import FakeSpec, Harness

    h = Harness([FakeSpec(rows=16, batch=4)], num_chunks=4, mode="thread")
    h.fake.delay = 0.05
    said: list[str] = []
    fit = _interrupted_once_in_a_kernel(h, monkeypatch)
    try:
        assert fit.wait(None, None, Reporter(printer=said.append)) is False
        assert h.status(1) is RunStatus.STOPPED
        assert said == [
            "[rapidfire] interrupted: stopping runs [1] at the end of their current chunk (press interrupt again "
            "to return now)"
        ]
    finally:
        h.close()


def test_ctrl_c_once_every_run_ended_says_nothing_about_stopping(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh-user pass: Ctrl-C after the runs had finished printed "stopping runs [] at the end of their current
    chunk"."""
    from kernel_scheduler import RunStatus
    from rapidfire_nb.experiment.reporter import Reporter
    from rapidfire_nb.testing.fakes import TIMEOUT, FakeSpec, Harness

    h = Harness([FakeSpec(rows=16, batch=4)], num_chunks=4, mode="thread")
    assert h.sched.wait(timeout=TIMEOUT)
    said: list[str] = []
    fit = _interrupted_once_in_a_kernel(h, monkeypatch)  # after the end, as while the trackers are flushed
    try:
        assert fit.wait(None, None, Reporter(printer=said.append)) is False
        assert h.status(1) is RunStatus.COMPLETED and said == []
    finally:
        h.close()


def test_wait_is_false_once_training_stopped_for_good() -> None:
    """A fresh-user pass: ``wait()`` returned True after every device's worker had died, as if the runs had
    trained. A halted scheduler leaves runs untrained: ``wait`` says False (the halt's reason is said by then)."""
    from rapidfire_nb.experiment import session as session_mod
    from rapidfire_nb.experiment.reporter import Reporter
    from rapidfire_nb.testing.fakes import TIMEOUT, FakeSpec, Harness

    h = Harness([FakeSpec(rows=64, batch=4)], num_chunks=4, mode="thread")
    h.fake.delay = 0.05
    recorder = types.SimpleNamespace(flush=lambda timeout=None, trackers=True: True)
    fit = session_mod.FitSession(h.sched, h.fake, recorder, None, None, None)
    try:
        assert fit.wait(TIMEOUT, 1, Reporter(printer=lambda _: None)) is True  # one chunk trained
        h.sched.halt("every device's worker died (test)")
        assert fit.wait(TIMEOUT, None, Reporter(printer=lambda _: None)) is False
        assert fit.halted == "every device's worker died (test)"
    finally:
        h.close()
