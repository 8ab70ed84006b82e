"""A clone POSTed over HTTP whose run would be LoRA beyond full rank is refused by the kernel with the estimated
size (issue 34 item 7; before: ``{"lora.r": 65536}`` on the tiny model was applied, ~352 MB per checkpoint)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from rapidfire_nb.store import Store


async def _until(check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s")


async def test_a_posted_clone_beyond_full_rank_is_rejected_with_its_size(jp_fetch: Any, rf_root: Any) -> None:
    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
    from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset

    config = RFModelConfig(
        model_name="tiny",
        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(
            learning_rate=1e-3, per_device_train_batch_size=2, max_steps=2, max_length=32
        ),
    )
    exp = Experiment("bounds-http", experiment_path=rf_root)
    exp.quiet = True
    api = ("rapidfire", "api", "experiments", "bounds-http")
    try:
        exp.run_fit(
            RFGridSearch(configs=config, trainer_type="SFT"),
            tiny_create_model,
            tiny_sft_dataset(8),
            num_chunks=2,
            background=False,
        )
        reader = Store(exp.path, read_only=True)
        try:
            await _until(reader.writer_alive)
            body = {"op_id": "http-huge", "kind": "clone", "run_id": 1, "changes": {"lora.r": 65536}}
            resp = await jp_fetch(*api, "ops", method="POST", body=json.dumps(body))
            assert resp.code == 202  # the server checks the body; the kernel sizes the run
            op = await _until(lambda: (o := reader.get_op("http-huge")) and o["state"] != "queued" and o)
            assert op["state"] == "rejected", op
            assert "lora.r=65,536 is more than the full rank of the layers it adapts" in op["message"]
            assert "~352 MB per checkpoint (29,360,128 trainable parameters: weights 117 MB" in op["message"]
            assert "Use lora.r <= 32" in op["message"]
            snap = json.loads((await jp_fetch(*api, "snapshot")).body)
            assert [r["run_id"] for r in snap["runs"]] == [1], "no run was made"
            assert any(o["op_id"] == "http-huge" and "352 MB" in o["message"] for o in snap["ops"])
        finally:
            reader.close()
    finally:
        exp.end()
