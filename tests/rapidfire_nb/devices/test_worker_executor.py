"""One device in a worker process (``rapidfire_nb.devices.WorkerExecutor``) trains exactly as plain TRL.

Tiny model, 12 train rows / 4 eval rows, batch 4 (3 optimizer steps), 3 chunks (boundaries at steps 1, 2, 3),
LoRA SFT. Worker A trains runs 1 and 2 in rotation and run 3 for one chunk (then exports it); worker B resumes
run 3 from that export (a run moving between devices), then is killed with SIGKILL mid-segment (run 4, 300
steps). Each finished run's final adapter is compared with a plain ``SFTTrainer(...).train()`` in this process.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from typing import Any

import pytest

from rapidfire_nb.spec.bundles import GroupSettings, TrainingCallbacks
from tests.helpers import adapter_from_folder, max_abs_diff, qa_dataset, qa_to_chat, train_plain_trl

SEED = 5
NUM_CHUNKS = 3


def _leaves() -> list[Any]:
    """Run 1 (lr 1e-3), run 2 (lr 3e-4), run 3 = run 1's config, run 4: 300 steps (the one killed)."""
    from rapidfire_nb.automl import RFLoraConfig, RFModelConfig, RFSFTConfig

    def leaf(lr: float, **extra: Any) -> Any:
        config = RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(
                r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"]
            ),
            formatting_func=qa_to_chat,
            training_args=RFSFTConfig(
                learning_rate=lr, per_device_train_batch_size=4, max_length=32, logging_steps=1, **extra
            ),
        )
        from rapidfire_nb.automl import RFGridSearch

        return RFGridSearch(config, trainer_type="SFT").expand(SEED)[0]

    return [
        leaf(1e-3, num_train_epochs=1),
        leaf(3e-4, num_train_epochs=1),
        leaf(1e-3, num_train_epochs=1),
        leaf(1e-3, max_steps=300),
    ]


def _main_create() -> Any:
    """A create_model_fn defined as in a notebook cell (module ``__main__``: cloudpickle sends it by value)."""
    ns: dict[str, Any] = {"__name__": "__main__"}
    exec(  # noqa: S102 - the test's stand-in for a notebook cell
        "def create_model(config):\n"
        "    from rapidfire_nb.testing import tiny_create_model\n"
        "    return tiny_create_model(config)\n",
        ns,
    )
    fn = ns["create_model"]
    assert fn.__module__ == "__main__"
    return fn


class Kernel:
    """The kernel's callbacks: every event in arrival order; ``in_record_order`` can hold the functions."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.held: list[Any] = []
        self.hold = False
        self.lock = threading.Lock()

    def sink(self, rid: int, step: int, seen: int, logs: dict[str, float]) -> None:
        with self.lock:
            self.events.append(("metrics", rid, step, seen, dict(logs)))

    def in_order(self, fn: Any) -> None:
        with self.lock:
            self.events.append(("order",))
            if self.hold:
                self.held.append(fn)
                return
        fn()

    def release(self) -> None:
        with self.lock:
            held, self.held, self.hold = self.held, [], False
        for fn in held:
            fn()

    def metrics(self, rid: int) -> list[tuple[int, dict[str, float]]]:
        return [(e[2], e[4]) for e in self.events if e[0] == "metrics" and e[1] == rid]

    def callbacks(self) -> TrainingCallbacks:
        return TrainingCallbacks(metric_sink=self.sink, in_record_order=self.in_order)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from rapidfire_nb.devices import WorkerSettings, share_datasets

    root = tmp_path_factory.mktemp("devices")
    train, evald = qa_dataset(12, seed=0), qa_dataset(4, seed=1)
    train_path, eval_path = share_datasets(root, train, evald)
    assert share_datasets(root, train, evald) == (train_path, eval_path)  # reused, not written again

    def settings(device: str) -> WorkerSettings:
        group = GroupSettings("SFT", _main_create(), NUM_CHUNKS, SEED)
        return WorkerSettings(device, group, train_path, eval_path, str(root), torch_threads=1)

    return {"root": root, "train": train, "eval": evald, "settings": settings, "leaves": _leaves()}


@pytest.fixture(scope="module")
def plain(world: dict[str, Any]) -> dict[int, Any]:
    from rapidfire_nb.testing import tiny_create_model

    leaves = world["leaves"]
    return {
        rid: train_plain_trl(
            leaves[rid - 1],
            tiny_create_model,
            world["train"],
            world["eval"],
            SEED,
            world["root"] / f"plain-{rid}",
        )
        for rid in (1, 2)
    }


def _loss_points(log_history: list[dict[str, Any]], name: str) -> list[tuple[int, float]]:
    return [(row["step"], row[name]) for row in log_history if name in row]


def _sent(kernel: Kernel, rid: int, name: str) -> list[tuple[int, float]]:
    return [(step, logs[name]) for step, logs in kernel.metrics(rid) if name in logs]


def test_two_runs_in_a_worker_end_exact_and_the_checkpoint_waits_for_the_kernel(
    world: dict[str, Any], plain: dict[int, Any]
) -> None:
    from rapidfire_nb.devices import WorkerExecutor

    kernel = Kernel()
    worker = WorkerExecutor(world["settings"]("cpu:0"), kernel.callbacks())
    leaves, root = world["leaves"], world["root"]
    try:
        starts = {rid: worker.add_run(rid, leaves[rid - 1]) for rid in (1, 2, 3)}
        plan = starts[1].plan
        assert [plan.boundary(i) for i in range(3)] == [1, 2, 3]
        assert worker.devices == ("cpu:0",) and worker.device_of(1) == "cpu:0" and worker.alive("cpu:0")
        # (e) the boundary checkpoint reaches the disk only after the kernel answered its order token
        kernel.hold = True
        first = worker.run_segment(1, 1).result(60)
        assert (first.step, first.samples_seen, first.finished) == (1, 4, False)
        worker.flush()
        time.sleep(0.3)
        assert kernel.held and not (root / "runs" / "1" / "checkpoint-1").exists()
        order_at = kernel.events.index(("order",))
        assert any(e[0] == "metrics" and e[1] == 1 and e[2] == 1 for e in kernel.events[:order_at])
        kernel.release()
        worker.flush()
        assert (root / "runs" / "1" / "checkpoint-1" / "COMPLETE").is_file()
        assert worker.checkpoint_dir(1) == root / "runs" / "1" / "checkpoint-1"
        # run 3 (run 1's config) trains one chunk here, then leaves with its boundary (for the next test)
        assert worker.run_segment(3, 1).result(60).step == 1
        worker.flush()
        written = root / "runs" / "3" / "checkpoint-1"
        marker = (written / "COMPLETE").stat().st_mtime_ns
        assert worker.export_boundary(3) == written  # the writer's folder of that step, reused
        assert (written / "COMPLETE").stat().st_mtime_ns == marker
        shutil.rmtree(written)  # gone (as after a failed write): written now from the in-memory snapshot
        exported = worker.export_boundary(3)
        assert exported == written and (exported / "COMPLETE").is_file()  # the next test resumes from it
        worker.drop_run(3)
        assert not worker.has_run(3)
        world["exported"] = exported
        results = {}
        for stop in (1, 2, 3):
            for rid in (1, 2):
                if rid == 1 and stop == 1:
                    continue
                results[rid] = worker.run_segment(rid, stop).result(60)
        assert all(r.finished and r.step == 3 and r.error is None for r in results.values())
        assert worker.has_boundary(1)
        for rid in (1, 2):
            worker.on_status(rid, "COMPLETED")  # saves the final weights
            final = worker.final_dir(rid)
            assert final == root / "runs" / str(rid) / "final"
            diff = max_abs_diff(adapter_from_folder(final), plain[rid].final)
            assert diff == 0.0, (rid, diff)
            assert _sent(kernel, rid, "loss") == _loss_points(plain[rid].log_history, "loss")
            assert _sent(kernel, rid, "loss"), rid
    finally:
        worker.close()
    assert worker._proc.poll() is not None


def test_a_run_moves_to_a_second_worker_and_a_killed_worker_loses_its_segment(
    world: dict[str, Any], plain: dict[int, Any]
) -> None:
    from rapidfire_nb.devices import WorkerExecutor, WorkerLost

    if "exported" not in world:
        pytest.skip("needs the first test's export")
    kernel = Kernel()
    worker = WorkerExecutor(world["settings"]("cpu:1"), kernel.callbacks())
    leaves = world["leaves"]
    try:
        start = worker.add_run(3, leaves[2], resume_from=world["exported"])
        assert (start.step, start.segments_done, start.samples_seen) == (1, 1, 4)
        for stop in (2, 3):
            result = worker.run_segment(3, stop).result(60)
        assert result.finished and result.step == 3
        diff = max_abs_diff(adapter_from_folder(worker.save_final(3)), plain[1].final)
        assert diff == 0.0, diff
        assert _sent(kernel, 3, "loss") == _loss_points(plain[1].log_history, "loss")[1:]  # steps 2 and 3
        # (c) SIGKILL in the middle of run 4's first segment (100 steps)
        worker.add_run(4, leaves[3])
        future = worker.run_segment(4, 100)
        deadline = time.monotonic() + 60
        while not kernel.metrics(4) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert kernel.metrics(4) and not future.done()
        pid = worker.pid
        os.kill(pid, signal.SIGKILL)
        lost = future.result(30)
        assert lost.device_lost and (lost.step, lost.samples_seen) == (0, 0)
        assert (
            lost.error
            == f"worker cpu:1 (pid {pid}) died: killed by signal 9 (SIGKILL; out of memory, or killed by hand)"
        )
        assert not worker.alive("cpu:1")
        with pytest.raises(WorkerLost, match="killed by signal 9"):
            worker.has_run(4)
        assert worker.run_segment(4, 200).result(1).device_lost
    finally:
        worker.close()
    with pytest.raises(ProcessLookupError):
        os.kill(worker.pid, 0)  # reaped: no orphan, no zombie
