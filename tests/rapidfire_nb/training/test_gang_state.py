"""A gang run's state on disk (issue 36): a warm clone of a gang run no longer in this process is refused (its
state on disk is each rank's share; rank 0's folder alone would read as a half-size adapter), and its gathered
final state holds a tied weight once."""

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
