"""End to end: a real (tiny) experiment trains in this process; ops POSTed over HTTP are applied by its kernel."""

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


async def test_ops_posted_over_http_are_applied_by_the_kernel(
    jp_fetch: Any, rf_root: Any, monkeypatch: Any
) -> None:
    from transformers import Trainer

    from rapidfire_nb import Experiment

    step = Trainer.training_step

    def slow_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.1)  # run 1 must still train when the POSTed stop arrives (the numbers are unchanged)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "training_step", slow_step)
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
    from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset

    config = RFModelConfig(
        model_name="tiny",
        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(
            learning_rate=List([1e-3, 5e-4]),
            per_device_train_batch_size=2,
            max_steps=12,
            logging_steps=1,
            max_length=48,
        ),
    )
    exp = Experiment("e2e", experiment_path=rf_root)
    exp.quiet = True
    api = ("rapidfire", "api", "experiments", "e2e")

    async def post(body: dict[str, Any]) -> dict[str, Any]:
        resp = await jp_fetch(*api, "ops", method="POST", body=json.dumps(body))
        assert resp.code == 202
        return json.loads(resp.body)  # type: ignore[no-any-return]

    try:
        exp.run_fit(
            RFGridSearch(configs=config, trainer_type="SFT"),
            tiny_create_model,
            tiny_sft_dataset(32),
            num_chunks=6,
            background=True,
        )
        reader = Store(exp.path, read_only=True)
        try:
            await _until(reader.writer_alive)
            fields = reader.get_meta("editable_fields")
            assert fields["1"]["learning_rate"] == "float"

            await post({"op_id": "http-stop", "kind": "stop", "run_id": 1})
            op = await _until(lambda: (o := reader.get_op("http-stop")) and o["state"] != "queued" and o)
            assert (op["state"], op["source"]) == ("applied", "inbox"), op
            assert reader.get_run(1)["status"] == "STOPPED"
            snap = json.loads((await jp_fetch(*api, "snapshot")).body)
            assert snap["runs"][0]["status"] == "STOPPED" and snap["runs"][0]["legal_ops"] == [
                "resume",
                "delete",
                "clone",
            ]
            assert any(o["op_id"] == "http-stop" and o["state"] == "applied" for o in snap["ops"])

            await post(
                {"op_id": "http-clone", "kind": "clone", "run_id": 1, "changes": {"learning_rate": 2e-4}}
            )
            clone = await _until(lambda: (o := reader.get_op("http-clone")) and o["state"] != "queued" and o)
            assert clone["state"] != "rejected", clone
            child = await _until(lambda: reader.get_run(3))
            assert (child["parent_id"], child["source"], child["hparams"]["learning_rate"]) == (
                1,
                "clone",
                2e-4,
            )

            await post({"op_id": "http-resume", "kind": "resume", "run_id": 1})
            await _until(lambda: {r["status"] for r in reader.runs()} == {"COMPLETED"}, timeout=60)
            assert [r["completed_steps"] for r in reader.runs()] == [12, 12, 12]
            points = json.loads((await jp_fetch(*api, "metrics", params={"run_id": "3"})).body)["points"]
            assert {p["name"] for p in points} >= {"loss"}
        finally:
            reader.close()
    finally:
        exp.end()
