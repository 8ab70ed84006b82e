"""A warm clone of a gang run that is no longer in this process is refused, naming why (issue 36): its state on
disk is each rank's share, and rank 0's folder alone would read as a half-size adapter."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_a_sharded_parent_on_disk_is_refused(tmp_path: Path) -> None:
    _checkpoint(tmp_path / "runs" / "1", gang=True)
    with pytest.raises(ConfigError, match=r"run 1 trained over several devices \(num_gpus > 1\)"):
        warm_start_from_disk(
            1, tmp_path / "runs" / "1", object(), "default", object(), tmp_path / "runs" / "2"
        )


def test_a_one_device_parent_gets_past_that_check(tmp_path: Path) -> None:
    _checkpoint(tmp_path / "runs" / "1", gang=False)

    class Plan:
        total_steps = (
            2  # below the parent's step: refused by the next check, so the gang check let it through
        )

    with pytest.raises(ConfigError, match="must exceed the parent's position"):
        warm_start_from_disk(1, tmp_path / "runs" / "1", object(), "default", Plan(), tmp_path / "runs" / "2")
