"""``run_fit(devices=2)`` on a CPU machine: two worker processes, every run exact against plain TRL.

One experiment (4 LoRA runs on the tiny model, 3 chunks per epoch) where the runs of one device train 3 epochs
and the other's 1, so the other device runs out of work and takes runs over through their checkpoints (rows,
not steps, decide the time: with the same rows per chunk, 3x the steps alone left the takeover to chance and a
clean-clone CI run saw none); a second one where a worker is killed with SIGKILL in the middle of a chunk and
its runs continue on the other worker.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from typing import Any

import pytest

from tests.helpers import (
    adapter_from_folder,
    child_pids,
    max_abs_diff,
    metric_points,
    qa_dataset,
    qa_to_chat,
    train_plain_trl,
)

SEED = 7
DEVICES = ["cpu:0", "cpu:1"]


def _group(batches: list[int], lrs: list[float], epochs: list[int] | None = None) -> Any:
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    configs = List(
        [
            RFModelConfig(
                model_name="tiny",
                formatting_func=qa_to_chat,
                peft_config=RFLoraConfig(
                    r=2 + 2 * (i % 2), lora_alpha=8, target_modules=["q_proj", "v_proj"]
                ),
                training_args=RFSFTConfig(
                    learning_rate=lr,
                    per_device_train_batch_size=batch,
                    num_train_epochs=n_epochs,
                    max_length=48,
                    logging_steps=1,
                ),
            )
            for i, (batch, lr, n_epochs) in enumerate(
                zip(batches, lrs, epochs or [1] * len(batches), strict=True)
            )
        ]
    )
    return RFGridSearch(configs=configs, trainer_type="SFT")


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from rapidfire_nb import Experiment, magic
    from rapidfire_nb.testing import tiny_create_model
    from rapidfire_nb.view import StoreRows, store_snapshot

    root = tmp_path_factory.mktemp("devices")
    train, evald = qa_dataset(24, seed=0), qa_dataset(6, seed=1)
    # runs 1, 3 (cpu:0) take 4 steps (24 rows); runs 2, 4 (cpu:1) 36 steps (3 epochs, 72 rows): cpu:0 runs
    # out of work and takes runs over
    group = _group([6, 2, 6, 2], [1e-3, 1e-3, 5e-4, 5e-4], [1, 3, 1, 3])
    before = child_pids()
    exp = Experiment("two-devices", experiment_path=root)
    notes: list[str] = []
    exp.on_message(notes.append)  # the scheduler's notes ("run 4 moved from cpu:1 to cpu:0 at step 8")
    exp.progress_lines = False
    exp.run_fit(group, tiny_create_model, train, evald, num_chunks=3, seed=SEED, devices=2, background=True)
    both = None  # a panel snapshot taken while two runs trained at the same moment
    deadline = time.monotonic() + 240
    while both is None and time.monotonic() < deadline and not exp.wait(timeout=0.01):
        snap = exp.panel_snapshot()
        if _two_training(snap):
            both = snap
    assert exp.wait(timeout=300)
    views = {
        "both": both,
        "final": exp.panel_snapshot(),
        "status": magic._status(exp),
        "page": store_snapshot("two-devices", StoreRows.read(exp.store), writer_alive=True),
        "points": exp.metrics_since(0)[0],
    }
    info = exp.get_runs_info()
    exp.end()
    refs = {
        rid: train_plain_trl(leaf, tiny_create_model, train, evald, SEED, root / f"plain-{rid}")
        for rid, leaf in enumerate(group.expand(SEED), start=1)
    }
    return {
        "exp": exp,
        "info": info,
        "refs": refs,
        "views": views,
        "leftover": child_pids() - before,
        "notes": notes,
    }


def _two_training(snap: dict[str, Any]) -> bool:
    """Two runs train at this moment, one per device, and the runs' entries agree with the header's map."""
    running = snap["device_runs"]
    if len(running) != 2 or len(set(running.values())) != 2:
        return False
    runs = {r["run_id"]: r for r in snap["runs"]}
    return all(runs[rid]["on_device"] and runs[rid]["device"] == dev for dev, rid in running.items())


def test_two_runs_train_at_once_and_every_view_names_their_device(two_devices: dict[str, Any]) -> None:
    from rapidfire_nb.panel.static import static_bundle

    views, info = two_devices["views"], two_devices["info"].set_index("run_id")
    both, final, status, page = views["both"], views["final"], views["status"], views["page"]
    assert both is not None, "never saw two runs training at the same moment"
    # the moment both trained: the header's chips, the runs' devices
    assert [d["name"] for d in both["devices"]] == DEVICES
    assert all(d["state"] == "training" for d in both["devices"])
    assert len(set(both["device_runs"].values())) == 2
    json.dumps(both)  # the snapshot goes to the front end as it is
    # when it is over: the devices idle, each run's device known everywhere
    assert final["devices"] == [{"name": d, "state": "idle", "run_id": None} for d in DEVICES]
    assert final["device_runs"] == {}
    devices = {r["run_id"]: r["device"] for r in final["runs"]}
    assert set(devices.values()) <= set(DEVICES)
    assert info.device.to_dict() == devices  # get_runs_info()
    assert (
        list(status.columns[:2]) == ["status", "device"] and status.device.to_dict() == devices
    )  # %rapidfire
    assert {r["run_id"]: r["device"] for r in page["runs"]} == devices  # the server page, from the store
    assert [(d["name"], d["state"]) for d in page["devices"]] == [
        (d, "—") for d in sorted(set(devices.values()))
    ]
    html = static_bundle(final, views["points"])["text/html"]  # the static copy end() leaves
    assert ">Device</th>" in html and all(f"{d} · idle" in html for d in DEVICES)


def test_every_run_on_two_workers_equals_plain_trl(two_devices: dict[str, Any]) -> None:
    info = two_devices["info"].set_index("run_id")
    assert list(info.status) == ["COMPLETED"] * 4
    assert set(info.device) <= {"cpu:0", "cpu:1"} and "cpu:0" in set(info.device)
    for rid, ref in two_devices["refs"].items():
        saved = adapter_from_folder(info.loc[rid, "checkpoint_dir"])
        assert max_abs_diff(saved, ref.final) == 0.0, f"run {rid}"


def test_the_fast_device_took_runs_over_and_the_schedule_stayed_fair(two_devices: dict[str, Any]) -> None:
    results = two_devices["exp"].get_results()
    moves = [
        tuple(int(x) for x in m.groups())
        for m in map(
            re.compile(r"run (\d+) moved from cpu:1 to cpu:0 at step (\d+)").search, two_devices["notes"]
        )
        if m
    ]
    assert {rid for rid, _ in moves} & {2, 4}, (
        f"no run of cpu:1 was taken over by cpu:0: {two_devices['notes']}"
    )
    assert all(0 <= step < 36 for _, step in moves), moves
    # the losses logged by a moved run are plain TRL's, step by step (its checkpoint carried it exactly)
    for rid in sorted({rid for rid, _ in moves}):
        ref = two_devices["refs"][rid].series("loss")
        mine = results[(results.run_id == rid) & results["loss"].notna()].sort_values("step")
        assert list(mine.step) == [s for s, _ in ref]
        assert max(abs(a - b) for a, (_, b) in zip(mine["loss"], ref, strict=True)) == 0.0


def test_no_worker_outlives_end(two_devices: dict[str, Any]) -> None:
    assert two_devices["leftover"] == set()


def test_a_killed_worker_hands_its_runs_to_the_other_and_they_end_exact(tmp_path: Any) -> None:
    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model
    from tests.helpers import slow_create_model

    train, evald = qa_dataset(24, seed=0), qa_dataset(6, seed=1)
    group = _group([2, 2], [1e-3, 5e-4])  # 12 steps each, chunks of 4
    before = child_pids()
    exp = Experiment("killed", experiment_path=tmp_path)
    exp.run_fit(group, slow_create_model, train, evald, num_chunks=3, seed=SEED, devices=2, background=True)
    pool = exp.session.executor
    victim = pool.member("cpu:1")
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # run 2 (cpu:1) inside its second chunk
        snap = exp.session.scheduler.run_snapshot(2)
        if (
            snap is not None
            and snap.on_device
            and snap.segments_done == 1
            and exp.session.recorder.live_step(2)
        ):
            if (exp.session.recorder.live_step(2) or 0) > 4:
                break
        time.sleep(0.05)
    else:
        pytest.fail("run 2 never reached its second chunk")
    os.kill(victim.pid, signal.SIGKILL)
    assert exp.wait(timeout=300)
    info = exp.get_runs_info().set_index("run_id")
    losses = [(p["run_id"], p["step"]) for p in metric_points(exp, "loss")]
    exp.end()
    assert list(info.status) == ["COMPLETED", "COMPLETED"], info[["status", "error"]]
    assert list(info.device) == ["cpu:0", "cpu:0"]
    # what run 2 logged after its checkpoint, before the kill, was dropped: every step once
    assert sorted(losses) == sorted(set(losses)) and len([k for k in losses if k[0] == 2]) == 12
    for rid, leaf in enumerate(group.expand(SEED), start=1):
        ref = train_plain_trl(leaf, tiny_create_model, train, evald, SEED, tmp_path / f"plain-{rid}")
        assert max_abs_diff(adapter_from_folder(info.loc[rid, "checkpoint_dir"]), ref.final) == 0.0, (
            f"run {rid}"
        )
    assert child_pids() - before == set()
