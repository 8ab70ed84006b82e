"""Resource bounds per op (issue 34 item 7): a clone or a run_fit whose runs cannot fit the disk or the device,
or whose LoRA rank is beyond full rank, is refused before it is accepted, with the estimated numbers.

Before: ``clone_modify(1, {"lora.r": 65536})`` on the tiny model was accepted (r is inside the schema's bound of
65,536) and wrote ~352 MB per checkpoint (337 MiB; gigabytes on a real model).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from rapidfire_nb import ConfigError, Experiment
from rapidfire_nb.automl import RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.experiment import resources
from rapidfire_nb.testing import tiny_create_model
from tests.helpers import qa_dataset, qa_to_chat

HUGE = {"lora.r": 65536}


def _group(r: int = 2, peft: bool = True) -> RFGridSearch:
    return RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(r=r, lora_alpha=4, target_modules=["q_proj", "v_proj"])
            if peft
            else None,
            training_args=RFSFTConfig(
                learning_rate=1e-3, per_device_train_batch_size=4, max_steps=2, max_length=32
            ),
            formatting_func=qa_to_chat,
        ),
        "SFT",
    )


class _Usage(NamedTuple):
    total: int
    used: int
    free: int


def _small_disk(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda path: _Usage(10**12, 10**12 - free, free))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Experiment]:
    exp = Experiment("bounds", experiment_path=str(tmp_path_factory.mktemp("bounds")))
    exp.quiet = True
    exp.run_fit(_group(), tiny_create_model, qa_dataset(8), num_chunks=2, seed=0, background=False)
    yield exp
    exp.end()


def _op_state(exp: Experiment, op_id: str, timeout: float = 10.0) -> tuple[str, str] | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ops = exp.ops()
        rows = ops[ops.op_id == op_id] if len(ops) else ops
        if len(rows):
            return rows.iloc[0]["state"], rows.iloc[0]["message"]
        time.sleep(0.05)
    return None


def test_a_clone_beyond_full_rank_is_refused_over_the_api_and_the_inbox(trained: Experiment) -> None:
    runs_before = [s.run_id for s in trained.run_snapshots()]
    expected = (
        r"the clone of run 1: lora.r=65,536 is more than the full rank of the layers it adapts \(v_proj: 32 wide "
        r"on 'tiny'\); LoRA beyond full rank adds parameters that can learn nothing more: ~352 MB per checkpoint "
        r"\(29,360,128 trainable parameters: weights 117 MB \+ optimizer state 235 MB\)\. Use lora.r <= 32, or "
        r"adapt wider layers \(lora.target_modules\)"
    )
    with pytest.raises(ConfigError, match=expected):
        trained.clone_modify(1, HUGE)
    # what the server's POST .../ops does: leave the op in the inbox for the kernel
    trained.store.post_inbox_op("posted-huge", "clone", 1, {"changes": HUGE, "warm_start": False})
    state = _op_state(trained, "posted-huge")
    assert state is not None and state[0] == "rejected", state
    assert "lora.r=65,536 is more than the full rank" in state[1] and "~352 MB per checkpoint" in state[1]
    assert [s.run_id for s in trained.run_snapshots()] == runs_before, "no run was made"


def test_a_clone_over_the_free_disk_is_refused_with_the_numbers(
    trained: Experiment, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs_before = [s.run_id for s in trained.run_snapshots()]
    _small_disk(monkeypatch, 50 * 10**6)
    with pytest.raises(
        ConfigError,
        match=r"the clone of run 1 does not fit the disk: lora.r=32 with lora.target_modules=\['q_proj', "
        r"'v_proj'\] on 'tiny' takes ~205 KB per checkpoint \(14,336 trainable parameters: weights 57 KB \+ "
        r"optimizer state 115 KB\); .* it needs ~503 KB, but .*'s disk has 50 MB free \(keeping 67 MB spare\)\. "
        r"Lower lora.r, or adapt fewer layers \(lora.target_modules\), or free disk space",
    ):
        trained.clone_modify(1, {"lora.r": 32})
    assert [s.run_id for s in trained.run_snapshots()] == runs_before


def test_a_clone_over_the_free_memory_is_refused(
    trained: Experiment, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resources, "free_memory", lambda devices: (200 * 10**6, "CPU RAM"))
    with pytest.raises(
        ConfigError,
        match=r"the clone of run 1 does not fit the memory of CPU RAM: lora.r=32 .* needs ~\d+ KB for its "
        r"trainable weights, their gradients and the optimizer state .* CPU RAM has 200 MB free \(keeping 268 MB "
        r"spare\)\. Lower lora.r",
    ):
        trained.clone_modify(1, {"lora.r": 32})


def test_a_clone_that_fits_is_accepted(trained: Experiment) -> None:
    runs_before = [s.run_id for s in trained.run_snapshots()]
    new_id = trained.clone_modify(1, {"lora.r": 32})  # the most the tiny model's v_proj takes
    assert new_id == max(runs_before) + 1
    assert [s.run_id for s in trained.run_snapshots()] == [*runs_before, new_id]


def test_run_fit_over_a_small_disk_is_refused_before_anything_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Any] = []

    def create(config: dict[str, Any]) -> Any:
        calls.append(config)
        return tiny_create_model(config)

    _small_disk(monkeypatch, 60 * 10**6)
    exp = Experiment("small-disk", experiment_path=str(tmp_path))
    exp.quiet = True
    with pytest.raises(
        ConfigError,
        match=r"run 1 does not fit the disk: full fine-tuning of 'tiny' \(peft_config=None\) takes ~1.7 MB per "
        r"checkpoint \(139,584 trainable parameters: weights 558 KB \+ optimizer state 1.1 MB\); .* needs ~4.0 MB, "
        r"but .* has 60 MB free \(keeping 68 MB spare\)\. Train a LoRA adapter instead",
    ):
        exp.run_fit(_group(peft=False), create, qa_dataset(8), num_chunks=2, seed=0, background=False)
    assert calls == [], "create_model_fn was never called"
    assert exp.get_runs_info().empty
    exp.end()


def test_run_fit_with_lora_beyond_full_rank_is_refused(tmp_path: Path) -> None:
    exp = Experiment("beyond-rank", experiment_path=str(tmp_path))
    exp.quiet = True
    with pytest.raises(ConfigError, match=r"run 1: lora.r=64 is more than the full rank .*Use lora.r <= 32"):
        exp.run_fit(_group(r=64), tiny_create_model, qa_dataset(8), num_chunks=2, seed=0, background=False)
    exp.end()


def _spec(model_name: str, lora: dict[str, Any] | None, **model_kwargs: Any) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(model_name=model_name, model_kwargs=model_kwargs, lora=lora, training={})


def test_a_base_is_sized_from_a_local_config_and_an_unknown_one_is_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import LlamaConfig

    folder = tmp_path / "my-llama"
    LlamaConfig(
        hidden_size=96,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        vocab_size=1000,
    ).save_pretrained(folder)
    shapes = resources.base_shapes(_spec(str(folder), None, dtype="bfloat16"))
    assert shapes is not None
    assert (shapes.hidden, shapes.layers, shapes.kv_heads * shapes.head_dim, shapes.dtype_bytes) == (
        96,
        3,
        32,
        2,
    )
    assert resources.base_shapes(_spec(str(tmp_path / "nowhere"), None)) is None
    _small_disk(monkeypatch, 1)
    store = type("Store", (), {"experiment_dir": tmp_path})()
    resources.check_clone_fits(_spec(str(tmp_path / "nowhere"), {"r": 65536}), store, None, 1)  # not sized
    with pytest.raises(ConfigError, match=r"lora.r=65,536 is more than the full rank .*\(v_proj: 32 wide"):
        resources.check_clone_fits(_spec(str(folder), {"r": 65536}), store, None, 1)


def test_free_memory_is_the_host_s_ram_or_not_measured_for_gpu_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    from rapidfire_nb.devices.resolve import DevicePlan

    gpu_workers = DevicePlan("local", ("cuda:0", "cuda:1"), (0, 1))
    assert resources.free_memory(gpu_workers) is None  # no CUDA context opened in the kernel
    cpu_workers = DevicePlan("local", ("cpu:0", "cpu:1"), (None, None))
    found = resources.free_memory(cpu_workers)
    assert found is not None and found[1] == "CPU RAM" and found[0] > 0
    monkeypatch.setitem(sys.modules, "psutil", None)  # not installed: /proc/meminfo's MemAvailable
    again = resources.free_memory(cpu_workers)
    assert again is not None and abs(again[0] - found[0]) < 0.2 * found[0]
