"""``end()`` in a live process: no op posted through the server is lost, and re-training opens it again (issue 12).

A real (tiny) experiment trains in this process while a thread posts ops through the server's manager, before,
during and after ``end()``; every op the server accepted (202) gets an answer in the ops log, the later ones are
refused (409, saying how to continue); ``Experiment(...)`` and ``run_fit`` again make ops accepted again.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb import Experiment
from rapidfire_nb.errors import ExperimentError
from rapidfire_nb.server.manager import ApiError, ExperimentsManager
from rapidfire_nb.store import Store


def _group() -> Any:
    from rapidfire_nb.automl import RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    config = RFModelConfig(
        model_name="tiny",
        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(
            learning_rate=1e-3, per_device_train_batch_size=2, max_steps=4, logging_steps=1, max_length=48
        ),
    )
    return RFGridSearch(configs=config, trainer_type="SFT")


def _until(check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s")


class _Poster(threading.Thread):
    """Posts a ``resume`` of run 1 every 20 ms (rejected by the kernel while it trains or once it completed)."""

    def __init__(self, mgr: ExperimentsManager) -> None:
        super().__init__(daemon=True)
        self.mgr, self.stop = mgr, threading.Event()
        self.accepted: list[str] = []
        self.refused: list[str] = []

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                self.mgr.post_op("ending", {"op_id": f"p{n}", "kind": "resume", "run_id": 1})
                self.accepted.append(f"p{n}")
            except ApiError as exc:
                assert exc.status == 409, exc.message
                self.refused.append(exc.message)
            self.stop.wait(0.02)


def test_ops_posted_around_end_are_answered_or_refused_and_run_fit_reopens(tmp_path: Path) -> None:
    from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset

    mgr = ExperimentsManager(tmp_path)
    args = (_group(), tiny_create_model, tiny_sft_dataset(16))
    exp = Experiment("ending", experiment_path=tmp_path)
    exp.quiet = True
    exp.run_fit(*args, num_chunks=2, background=True)
    _until(lambda: mgr.experiment("ending")["writer_alive"])
    poster = _Poster(mgr)
    poster.start()
    try:
        exp.wait()
        time.sleep(0.3)  # ops posted while idle, before end()
        exp.end()
        time.sleep(0.3)  # ... and after it, the process alive and its last heartbeat fresh
    finally:
        poster.stop.set()
        poster.join()
    assert len(poster.accepted) >= 5 and poster.refused, (len(poster.accepted), poster.refused[:1])
    assert "experiment 'ending' has ended" in poster.refused[-1] and "run_fit(...)" in poster.refused[-1]
    with Store(exp.path, read_only=True) as reader:
        unanswered = [o for o in poster.accepted if (reader.get_op(o) or {}).get("state") in (None, "queued")]
        assert unanswered == []  # every 202 got an answer
        assert reader.get_run(1)["status"] == "COMPLETED"
    snap = mgr.snapshot("ending")
    assert (snap["ended"], snap["device_status"], snap["runs"][0]["legal_ops"]) == (
        True,
        "experiment ended",
        [],
    )

    again = Experiment("ending", experiment_path=tmp_path)  # the notebook's cells, re-run
    again.quiet = True
    assert again is not exp
    again.run_fit(*args, num_chunks=2, background=True)  # run 1 is finished: nothing trains until an op
    try:
        assert mgr.snapshot("ending")["ended"] is False
        reply = mgr.post_op(
            "ending",
            {"op_id": "clone-after", "kind": "clone", "run_id": 1, "changes": {"learning_rate": 5e-4}},
        )
        assert reply["state"] == "queued"
        with Store(exp.path, read_only=True) as reader:
            _until(lambda: (reader.get_op("clone-after") or {}).get("state") == "applied")
            again.wait()
            assert (reader.get_run(2)["status"], reader.get_run(2)["completed_steps"]) == ("COMPLETED", 4)
    finally:
        again.end()
    assert mgr.snapshot("ending")["ended"] is True
    for call in (lambda: again.stop(1), lambda: again.run_fit(*args, num_chunks=2)):
        with pytest.raises(
            ExperimentError, match=r"was ended \(experiment.end\(\)\).* Experiment\('ending'\)"
        ):
            call()
