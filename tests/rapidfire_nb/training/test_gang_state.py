"""A gang run's state on disk (issue 36): a warm clone of a gang run no longer in this process starts from it on
a gang of the same width, each rank copying its own share (rank 0's folder alone would read as a half-size
adapter), and is refused, saying why, at another width; its gathered final state holds a tied weight once."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rapidfire_nb.errors import ConfigError
from rapidfire_nb.training.warm_start import warm_start_from_disk


def _checkpoint(run_dir: Path, gang: bool) -> None:
    ckpt = run_dir / "checkpoint-4"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 4, "train_batch_size": 2}))
    for name in ("adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "COMPLETE"):
        (ckpt / name).write_bytes(b"x")
    if gang:
        (ckpt / "gang.json").write_text(json.dumps({"world_size": 2, "step": 4}))


class _Plan:
    total_steps = 8


def _clone(world_size: int | None, rank: int = 0, rows: int = 2) -> Any:
    """A clone's trainer as ``warm_start_from_disk`` reads it: its model (one LoRA matrix of ``rows`` x 2 local
    rows, adapter ``default``, its own config), its gang (``world_size`` None: one device), its batch size 2."""
    import torch

    from rapidfire_nb.training.sharding import Gang

    class Config:
        def save_pretrained(self, folder: str) -> None:
            (Path(folder) / "adapter_config.json").write_text(json.dumps({"own": True}))

    model = torch.nn.Module()
    model.q = torch.nn.Module()
    model.q.lora_A = torch.nn.ModuleDict({"default": torch.nn.Linear(2, rows, bias=False)})
    model.peft_config = {"default": Config()}
    if world_size is not None:
        object.__setattr__(model, "_rapidfire_gang", (Gang(rank, world_size, rank, 5.0), None))
    return SimpleNamespace(model=model, args=SimpleNamespace(train_batch_size=2))


def _gang_parent(run_dir: Path, rows: int = 2) -> None:
    """Run ``run_dir``'s final state at step 4, sharded over 2 ranks: each share's own weights, optimizer, RNG."""
    import torch
    from safetensors.torch import save_file

    for rank in (0, 1):
        share = run_dir / "checkpoint-4" if rank == 0 else run_dir / "gang-rank1" / "checkpoint-4"
        share.mkdir(parents=True)
        save_file(
            {"q.lora_A.weight": torch.full((rows, 2), float(rank))}, str(share / "adapter_model.safetensors")
        )
        for name in ("optimizer.pt", f"rng_state_{rank}.pth", "COMPLETE"):
            (share / name).write_bytes(f"{name} of rank {rank}".encode())
    shared = run_dir / "checkpoint-4"
    (shared / "trainer_state.json").write_text(json.dumps({"global_step": 4, "train_batch_size": 2}))
    (shared / "scheduler.pt").write_bytes(b"s")
    (shared / "adapter_config.json").write_text(json.dumps({"own": False}))
    (shared / "gang.json").write_text(json.dumps({"world_size": 2, "step": 4}))


def test_each_rank_of_a_clone_as_wide_copies_its_own_share(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    parent, clone = tmp_path / "runs" / "1", tmp_path / "runs" / "2"
    _gang_parent(parent)
    got = [warm_start_from_disk(1, parent, _clone(2, rank), "default", _Plan(), clone) for rank in (1, 0)]
    warm = clone / "warm-start-from-run-1-step-4"
    assert got == [(warm, 4), (warm, 4)]  # rank 0 completed its folder after rank 1's copy
    rank1 = clone / "gang-rank1" / "warm-start-from-run-1-step-4"
    assert sorted(p.name for p in rank1.iterdir()) == [
        "COMPLETE",
        "adapter_model.safetensors",
        "optimizer.pt",
        "rng_state_1.pth",
    ]
    assert (rank1 / "optimizer.pt").read_bytes() == b"optimizer.pt of rank 1"
    assert float(load_file(str(rank1 / "adapter_model.safetensors"))["q.lora_A.weight"].max()) == 1.0
    assert float(load_file(str(warm / "adapter_model.safetensors"))["q.lora_A.weight"].max()) == 0.0
    assert (warm / "rng_state_0.pth").is_file() and not (warm / "rng_state_1.pth").exists()
    assert json.loads((warm / "gang.json").read_text()) == {"world_size": 2, "step": 4}
    assert json.loads((warm / "adapter_config.json").read_text()) == {"own": True}  # the clone's own settings
    assert (warm / "COMPLETE").is_file() and (warm / "scheduler.pt").read_bytes() == b"s"


@pytest.mark.parametrize("width", [None, 3])
def test_a_sharded_parent_on_disk_is_refused_at_another_width(tmp_path: Path, width: int | None) -> None:
    _gang_parent(tmp_path / "runs" / "1")
    given = 1 if width is None else width
    with pytest.raises(
        ConfigError,
        match=rf"run 1 trained over 2 devices \(num_gpus=2\) .* \(this one: num_gpus={given}\); clone it cold, or "
        r"with num_gpus=2",
    ):
        warm_start_from_disk(
            1, tmp_path / "runs" / "1", _clone(width), "default", _Plan(), tmp_path / "runs" / "2"
        )
    assert not (tmp_path / "runs" / "2").exists()


def test_a_one_device_parent_on_disk_is_refused_by_a_gang_clone(tmp_path: Path) -> None:
    _checkpoint(tmp_path / "runs" / "1", gang=False)
    with pytest.raises(
        ConfigError, match=r"run 1 trained on one device: .*clone it cold, or with num_gpus=1"
    ):
        warm_start_from_disk(
            1, tmp_path / "runs" / "1", _clone(2), "default", _Plan(), tmp_path / "runs" / "2"
        )


def test_a_missing_share_or_one_sharded_otherwise_is_refused(tmp_path: Path) -> None:
    import shutil

    parent, clone = tmp_path / "runs" / "1", tmp_path / "runs" / "2"
    _gang_parent(parent, rows=4)  # e.g. DDP's whole replicas, and the clone shards them (2 local rows)
    with pytest.raises(
        ConfigError, match=r"does not fit the clone's model \(q.lora_A.weight: saved \(4, 2\), "
    ):
        warm_start_from_disk(1, parent, _clone(2, 1), "default", _Plan(), clone)
    assert not list(clone.rglob("warm-start-*"))
    shutil.rmtree(parent / "gang-rank1")
    with pytest.raises(ConfigError, match=r"lacks rank 1's share"):
        warm_start_from_disk(1, parent, _clone(2, 0), "default", _Plan(), clone)


def test_a_one_device_parent_gets_past_that_check(tmp_path: Path) -> None:
    _checkpoint(tmp_path / "runs" / "1", gang=False)

    class Plan:
        total_steps = (
            2  # below the parent's step: refused by the next check, so the gang check let it through
        )

    with pytest.raises(ConfigError, match="must exceed the parent's position"):
        warm_start_from_disk(
            1, tmp_path / "runs" / "1", _clone(None), "default", Plan(), tmp_path / "runs" / "2"
        )


def test_a_gathered_full_state_leaves_out_the_second_name_of_a_tied_weight() -> None:
    """A gang's final folder: the gathered state holds a tied weight twice (lm_head and the input embeddings of
    a model with tied embeddings, as SmolLM2); save_pretrained would write it twice (+113 MB on SmolLM2)."""
    import torch

    from rapidfire_nb.training.gang import _tied_copies

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(5, 3)
            self.other = torch.nn.Linear(3, 3)
            self.lm_head = torch.nn.Linear(3, 5, bias=False)
            self.lm_head.weight = self.embed.weight

    assert _tied_copies(Tied()) == {"lm_head.weight"}
    assert _tied_copies(torch.nn.Linear(2, 2)) == set()
