"""GroupSettings and TrainingCallbacks (spec/bundles.py), and how the devices layer carries them (no torch)."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb.devices._replies import event_sinks
from rapidfire_nb.devices.settings import WorkerSettings
from rapidfire_nb.errors import StorageError
from rapidfire_nb.spec.bundles import GroupSettings, TrainingCallbacks


def _create(config: dict[str, Any]) -> Any:
    return None, None


def test_the_default_callbacks_ignore_events_run_at_once_and_log_storage_failures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    callbacks = TrainingCallbacks()
    callbacks.metric_sink(1, 2, 8, {"loss": 1.0})
    callbacks.notes("a note")
    callbacks.on_final(1, Path("/runs/1/final"))
    callbacks.on_eval_metrics(["eval_bleu"])
    ran: list[int] = []
    callbacks.in_record_order(lambda: ran.append(1))
    assert ran == [1]
    with caplog.at_level(logging.ERROR):
        callbacks.on_storage_error(StorageError("/runs/1/checkpoint-2", "No space left on device"))
    assert "No space left on device" in caplog.text


def test_worker_settings_hold_the_group_and_send_it_without_the_function() -> None:
    group = GroupSettings("SFT", _create, num_chunks=3, seed=7, checkpoint_every=2, eval_generation_samples=4)
    settings = WorkerSettings("cpu:0", group, "/data/train", None, "/exp", torch_threads=1)
    assert settings.create_model_fn is _create
    sent = settings.with_model_fn(None)
    assert sent.create_model_fn is None and settings.create_model_fn is _create  # a copy; frozen
    assert sent.group == GroupSettings("SFT", None, 3, 7, 2, 4)
    assert pickle.loads(pickle.dumps(sent)) == sent  # plain and picklable without the function
    assert sent.with_model_fn(_create) == settings


def test_event_sinks_hand_each_worker_event_to_its_callback() -> None:
    got: list[tuple[Any, ...]] = []
    sinks = event_sinks(
        TrainingCallbacks(
            metric_sink=lambda *a: got.append(("metrics", *a)),
            notes=lambda text: got.append(("note", text)),
            on_final=lambda rid, path: got.append(("final", rid, path)),
            on_storage_error=lambda failure: got.append(("storage", failure.where, failure.reason)),
            on_eval_metrics=lambda names: got.append(("eval", names)),
        )
    )
    sinks["metrics"](1, 2, 8, {"loss": 1.0})
    sinks["note"]("hello")
    sinks["final"](1, "/runs/1/final")
    sinks["storage_error"]("/runs/1/checkpoint-2", "disk full")
    sinks["eval_metrics"](["eval_bleu"])
    assert got == [
        ("metrics", 1, 2, 8, {"loss": 1.0}),
        ("note", "hello"),
        ("final", 1, Path("/runs/1/final")),  # the worker's str, a Path here
        ("storage", "/runs/1/checkpoint-2", "disk full"),
        ("eval", ["eval_bleu"]),
    ]
