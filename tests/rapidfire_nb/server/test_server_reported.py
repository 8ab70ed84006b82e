"""Bugs a user reported in the server extension: deeply nested op bodies, doubled ``%`` in error messages,
the page's Chunks column (done/total, as the kernel's panel) and its device chip (what the store can tell)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from rapidfire_nb.server.manager import (
    MAX_JSON_DEPTH,
    ApiError,
    ExperimentsManager,
    json_depth,
    json_text_depth,
)
from rapidfire_nb.store import Store
from tests.rapidfire_nb.server._stores import make_experiment

API = ("rapidfire", "api", "experiments")


async def _error(jp_fetch: Any, *parts: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(HTTPClientError) as exc:
        await jp_fetch(*parts, **kwargs)
    assert exc.value.response is not None
    return exc.value.code, json.loads(exc.value.response.body)


# ---------------------------------------------------------------------------------------------- 1. nesting


def _nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


NESTED_BODIES = [
    b"[" * 3000,
    b"[" * 3000 + b"]" * 3000,
    b'{"a":' * 3000 + b"1" + b"}" * 3000,
    b'{"kind": "clone", "run_id": 1, "changes": {"lora.target_modules": ' + b"[" * 5000 + b"]" * 5000 + b"}}",
    # deep but under Python's recursion limit: json.loads succeeds, the op is refused all the same
    json.dumps({"kind": "clone", "run_id": 1, "changes": {"lora.target_modules": _nested(500)}}).encode(),
]


async def test_deeply_nested_json_is_400(jp_fetch: Any, writers: dict[str, Store]) -> None:
    for body in NESTED_BODIES:
        code, reply = await _error(jp_fetch, *API, "live", "ops", method="POST", body=body)
        assert code == 400, (body[:60], reply)
        assert "nested too deeply" in reply["message"], reply
    assert writers["live"].take_inbox_ops() == []
    # brackets inside strings are text, not nesting
    body = {"kind": "clone", "run_id": 1, "changes": {"lr_scheduler_type": "[" * 3000 + "{" * 3000}}
    resp = await jp_fetch(*API, "live", "ops", method="POST", body=json.dumps(body))
    assert resp.code == 202
    assert [o["payload"]["changes"] for o in writers["live"].take_inbox_ops()] == [body["changes"]]


def test_manager_refuses_nested_op_bodies(rf_root: Path, writers: dict[str, Store]) -> None:
    mgr = ExperimentsManager(rf_root)
    deep = {"kind": "clone", "run_id": 1, "changes": {"lora.target_modules": _nested(10_000)}}
    with pytest.raises(ApiError) as exc:
        mgr.post_op("live", deep)
    assert exc.value.status == 400 and "nested too deeply" in exc.value.message
    assert writers["live"].take_inbox_ops() == []


def test_json_depth_helpers() -> None:
    assert json_text_depth('{"a": [1, {"b": "[[[{{{"}], "c": "\\"[["}') == 3
    assert json_text_depth("[" * 100_000) == 100_000
    assert json_text_depth('"unterminated [[[') == 0
    assert json_depth(1) == 0 and json_depth({"a": [1, {"b": 2}]}) == 3
    assert json_depth(_nested(100_000)) == MAX_JSON_DEPTH + 1  # stops counting past the limit
    assert json_depth(_nested(MAX_JSON_DEPTH)) == MAX_JSON_DEPTH


# ---------------------------------------------------------------------------------------------- 2. "%" in errors


async def test_error_messages_show_percent_signs_as_sent(
    jp_fetch: Any, http_server_client: Any, jp_base_url: str, jp_auth_header: dict[str, str], writers: Any
) -> None:
    for tail in ("", "/runs", "/metrics", "/snapshot", "/ops"):
        resp = await http_server_client.fetch(
            f"{jp_base_url}rapidfire/api/experiments/%252e%252e{tail}",
            method="POST" if tail == "/ops" else "GET",
            body=json.dumps({"kind": "stop", "run_id": 1}) if tail == "/ops" else None,
            headers=jp_auth_header,
            raise_error=False,
        )
        message = json.loads(resp.body)["message"]
        assert resp.code == 400 and "experiment name" in message, (tail, message)
        assert "'%2e%2e'" in message and "%%" not in message, (tail, message)
    code, reply = await _error(
        jp_fetch, *API, "live", "ops", method="POST", body=json.dumps({"kind": "100%", "run_id": 1})
    )
    assert code == 400 and "'100%'" in reply["message"] and "%%" not in reply["message"], reply
    code, reply = await _error(jp_fetch, *API, "live", "metrics", params={"format": "50%"})
    assert code == 400 and "'50%'" in reply["message"] and "%%" not in reply["message"], reply


# ---------------------------------------------------------------------------------------------- 3. chunks


def test_snapshot_chunks_are_done_over_total(rf_root: Path) -> None:
    make_experiment(rf_root, "multi", epochs=3).close()  # 3 epochs x 4 chunks = 12 chunks per run
    snap = ExperimentsManager(rf_root).snapshot("multi")
    assert snap["num_chunks"] == 4
    chunks = {r["run_id"]: (r["chunks_done"], r["num_segments"]) for r in snap["runs"]}
    assert chunks == {1: (9, 12), 2: (12, 12), 3: (0, 12)}


async def test_snapshot_over_http_has_num_segments(jp_fetch: Any, rf_root: Path) -> None:
    make_experiment(rf_root, "multi", epochs=2).close()
    snap = json.loads((await jp_fetch(*API, "multi", "snapshot")).body)
    assert [(r["chunks_done"], r["num_segments"]) for r in snap["runs"]] == [(5, 8), (8, 8), (0, 8)]


def test_snapshot_of_a_store_without_num_segments(rf_root: Path) -> None:
    """A store from before schema v2 (no num_segments written): None, and the panel shows chunks per epoch."""
    make_experiment(rf_root, "old").close()
    snap = ExperimentsManager(rf_root).snapshot("old")
    assert [r["num_segments"] for r in snap["runs"]] == [None, None, None]


async def test_server_snapshot_chunks_match_the_kernels_panel(jp_fetch: Any, rf_root: Path) -> None:
    """A real tiny experiment (2 epochs x 4 chunks): the server's num_segments are the kernel's, always."""
    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
    from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset

    config = RFModelConfig(
        model_name="tiny",
        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(
            learning_rate=List([1e-3, 5e-4]),
            per_device_train_batch_size=2,
            num_train_epochs=2,
            logging_steps=4,
            max_length=48,
        ),
    )
    exp = Experiment("chunks", experiment_path=rf_root)
    exp.quiet = True
    try:
        exp.run_fit(
            RFGridSearch(configs=config, trainer_type="SFT"),
            tiny_create_model,
            tiny_sft_dataset(16),
            num_chunks=4,
            background=True,
        )
        compared = 0
        deadline = time.monotonic() + 60
        while True:
            kernel = {r["run_id"]: r for r in exp.panel_snapshot()["runs"]}
            snap = json.loads((await jp_fetch(*API, "chunks", "snapshot")).body)
            for run in snap["runs"]:
                mine, theirs = run["num_segments"], kernel[run["run_id"]]["num_segments"]
                if theirs:  # 0 until the kernel has planned the run
                    assert mine == theirs == 8, (run, kernel[run["run_id"]])
                    compared += 1
                if mine is not None:
                    assert run["chunks_done"] <= mine
            if all(r["status"] == "COMPLETED" for r in snap["runs"]):
                break
            assert time.monotonic() < deadline, snap["runs"]
            await asyncio.sleep(0.05)
        assert compared and [(r["chunks_done"], r["num_segments"]) for r in snap["runs"]] == [(8, 8), (8, 8)]
    finally:
        exp.end()


# ---------------------------------------------------------------------------------------------- 4. device chip


def test_device_status_says_what_the_store_knows(rf_root: Path, writers: dict[str, Store]) -> None:
    mgr = ExperimentsManager(rf_root)
    live = mgr.snapshot("live")
    assert live["on_device"] is None  # the store does not record which run holds the device
    assert live["device_status"] == "training (kernel alive)"
    assert mgr.snapshot("dead")["device_status"] == "no kernel running"
    for rid in (1, 3):
        writers["live"].upsert_run(rid, status="STOPPED")
    assert mgr.snapshot("live")["device_status"] == "device idle (kernel alive)"
