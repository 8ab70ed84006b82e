"""Experiment stores as a kernel leaves them, written directly (no torch), for the server tests."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rapidfire_nb.store import Store
from rapidfire_nb.view.wire import json_type_name

__all__ = ["HPARAMS", "make_experiment", "type_name"]

HPARAMS = {
    1: {
        "learning_rate": 1e-3,
        "per_device_train_batch_size": 4,
        "lora.r": 8,
        "packing": False,
        "lr_scheduler_type": "linear",
        "lora.target_modules": ["q_proj", "v_proj"],
        "formatting_func": "<function f>",
    },
    2: {
        "learning_rate": 5e-4,
        "per_device_train_batch_size": 4,
        "lora.r": 16,
        "packing": False,
        "lr_scheduler_type": "cosine",
        "lora.target_modules": ["q_proj", "v_proj"],
        "formatting_func": "<function f>",
    },
    3: {
        "learning_rate": 2e-4,
        "per_device_train_batch_size": 2,
        "lora.r": 8,
        "packing": False,
        "lr_scheduler_type": "linear",
        "lora.target_modules": ["q_proj", "v_proj"],
        "formatting_func": "<function f>",
    },
}


type_name = json_type_name  # the kernel's own rule for editable_fields


def make_experiment(
    root: Path,
    name: str,
    *,
    alive: bool = True,
    editable: bool = True,
    statuses: dict[int, str] | None = None,
    epochs: int | None = None,
) -> Store:
    """A store as a kernel leaves it: 3 runs, some metrics, an op; returns the writer's Store (caller closes).

    ``epochs``: written as a kernel does for runs of that many epochs of 12 steps and 4 chunks each
    (``training.num_train_epochs`` in the config, fractional ``epoch``, ``num_segments`` = 4 x epochs): run 1 is
    3 steps (1 chunk) into its last epoch, run 2 has done all, run 3 none. Default: the older layout (12 steps,
    no epoch, no training, no num_segments).
    """
    statuses = statuses or {1: "ONGOING", 2: "COMPLETED", 3: "NEW"}
    store = Store(root / name)
    meta: dict[str, Any] = {
        "name": name,
        "created_at": time.time() - 60,
        "trainer_type": "SFT",
        "num_chunks": 4,
        "seed": 42,
        "hparam_columns": ["learning_rate", "lora.r"],
        "metric_names": ["eval_loss", "learning_rate", "loss"],
    }
    if editable:
        meta["editable_fields"] = {
            str(rid): {
                k: type_name(v) for k, v in hp.items() if not (isinstance(v, str) and v.startswith("<"))
            }
            for rid, hp in HPARAMS.items()
        }
    store.update_meta(meta)
    for rid, hp in HPARAMS.items():
        if epochs is None:
            store.upsert_run(
                rid,
                status=statuses.get(rid, "NEW"),
                config={"model_name": "tiny", "rid": rid},
                hparams=hp,
                fingerprint=f"fp{rid}",
                total_steps=12,
                completed_steps=3 * (rid == 1) + 12 * (rid == 2),
                chunks_done=1 * (rid == 1) + 4 * (rid == 2),
                source="fit",
            )
            continue
        steps = {1: 12 * (epochs - 1) + 3, 2: 12 * epochs, 3: 0}[rid]
        store.upsert_run(
            rid,
            status=statuses.get(rid, "NEW"),
            config={"model_name": "tiny", "rid": rid, "training": {"num_train_epochs": epochs}},
            hparams=hp,
            fingerprint=f"fp{rid}",
            total_steps=12 * epochs,
            completed_steps=steps,
            chunks_done=steps // 3,
            num_segments=4 * epochs,
            epoch=steps / 12,
            samples_seen=steps * 4,
            source="fit",
        )
    rows = []
    for rid in (1, 2):
        for step in range(1, 4):
            rows.append(
                {"run_id": rid, "step": step, "samples_seen": 4 * step, "name": "loss", "value": 2.0 / step}
            )
        rows.append({"run_id": rid, "step": 3, "samples_seen": 12, "name": "eval_loss", "value": 1.5})
    rows.append({"run_id": 2, "step": 4, "samples_seen": 16, "name": "grad_norm", "value": float("nan")})
    store.add_metrics(rows)
    store.add_op("op-old", "stop", 2, {}, source="panel", state="rejected", message="run 2 is COMPLETED")
    if alive:
        store.beat()
    return store
