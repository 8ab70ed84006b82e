"""What the panel, the page, ``%rapidfire status`` and the static copy show of ``run_fit(devices=2)``.

A real experiment (2 LoRA runs on the tiny model, two CPU worker processes) sampled through
``panel_snapshot()`` while it trains: two runs train at the same moment, one per device, and every view names
each run's device.
"""

from __future__ import annotations

import json
import time
from typing import Any

from tests.helpers import qa_dataset, qa_to_chat

DEVICES = ["cpu:0", "cpu:1"]


def _group() -> Any:
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    configs = List(
        [
            RFModelConfig(
                model_name="tiny",
                formatting_func=qa_to_chat,
                peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
                training_args=RFSFTConfig(
                    learning_rate=lr, per_device_train_batch_size=2, num_train_epochs=1, max_length=48
                ),
            )
            for lr in (1e-3, 5e-4)
        ]
    )
    return RFGridSearch(configs=configs, trainer_type="SFT")


def _two_training(snap: dict[str, Any]) -> bool:
    """Two runs train at this moment, one per device, and the runs' entries agree with the header's map."""
    running = snap["device_runs"]
    if len(running) != 2 or len(set(running.values())) != 2:
        return False
    runs = {r["run_id"]: r for r in snap["runs"]}
    return all(runs[rid]["on_device"] and runs[rid]["device"] == dev for dev, rid in running.items())


def test_two_runs_train_at_once_and_every_view_names_their_device(tmp_path: Any) -> None:
    from rapidfire_nb import Experiment, magic
    from rapidfire_nb.static_panel import static_bundle
    from rapidfire_nb.testing import tiny_create_model
    from rapidfire_nb.view import StoreRows, store_snapshot

    exp = Experiment("devices-panel", experiment_path=tmp_path)
    exp.quiet = True
    train = qa_dataset(24, seed=0)  # 12 steps per run, chunks of 6
    exp.run_fit(_group(), tiny_create_model, train, num_chunks=2, seed=5, devices=2, background=True)
    try:
        both = None
        deadline = time.monotonic() + 240
        while both is None and time.monotonic() < deadline and not exp.wait(timeout=0.01):
            snap = exp.panel_snapshot()
            if _two_training(snap):
                both = snap
        assert both is not None, "never saw two runs training at the same moment"
        assert exp.wait(timeout=240)
        final = exp.panel_snapshot()
        info = exp.get_runs_info().set_index("run_id")
        status = magic._status(exp)
        page = store_snapshot("devices-panel", StoreRows.read(exp.store), writer_alive=True)
        points = exp.metrics_since(0)[0]
    finally:
        exp.end()
    # the moment both trained: the header's chips, the runs' devices
    assert [d["name"] for d in both["devices"]] == DEVICES
    assert all(d["state"] == "training" for d in both["devices"])
    assert sorted(both["device_runs"].values()) == [1, 2]
    assert {d["run_id"] for d in both["devices"]} == {1, 2}
    json.dumps(both)  # the snapshot goes to the front end as it is
    # when it is over: the devices idle, each run's device known everywhere
    assert final["devices"] == [{"name": d, "state": "idle", "run_id": None} for d in DEVICES]
    assert final["device_runs"] == {}
    devices = {r["run_id"]: r["device"] for r in final["runs"]}
    assert set(devices.values()) <= set(DEVICES) and list(info.status) == ["COMPLETED", "COMPLETED"]
    assert info.device.to_dict() == devices  # get_runs_info()
    assert (
        list(status.columns[:2]) == ["status", "device"] and status.device.to_dict() == devices
    )  # %rapidfire
    assert {r["run_id"]: r["device"] for r in page["runs"]} == devices  # the server page, from the store
    assert [(d["name"], d["state"]) for d in page["devices"]] == [
        (d, "—") for d in sorted(set(devices.values()))
    ]
    html = static_bundle(final, points)["text/html"]  # the static copy end() leaves
    assert ">Device</th>" in html and all(f"{d} · idle" in html for d in DEVICES)
