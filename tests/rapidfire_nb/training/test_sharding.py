"""A run over a gang of 2 CPU processes (gloo) sharded with FSDP2, trained chunk by chunk through ``TorchExecutor``.

Each gang is started with ``python -m torch.distributed.run --nproc_per_node 2`` on ``_gang_child.py`` (the env
of a gang rank: ``RANK``, ``WORLD_SIZE``, ``MASTER_*``, ``RF_GANG_TIMEOUT_S``). What is proved:

* the parameters are DTensors on each rank holding half the parameter bytes;
* a LoRA run and a full fine-tuning run trained in 4 chunks end bit-identical (0.0) to a plain TRL
  ``trainer.train()`` sharded the same way, with identical losses, and within float tolerance of one process with
  the same global batch (measured: LoRA 2.2e-8, full 1.2e-7 max abs);
* ``num_gpus=2`` without ``fsdp`` trains DDP replicas, within float tolerance of one process;
* both ranks killed (SIGKILL) after 2 chunks, fresh processes resume from the boundary checkpoint and end equal to
  the undisturbed run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.rapidfire_nb.training._gang_launch import WEIGHTS
from tests.rapidfire_nb.training._gang_launch import check as _check
from tests.rapidfire_nb.training._gang_launch import max_diff as _max_diff
from tests.rapidfire_nb.training._gang_launch import spawn as _spawn


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gang")
    _check(_spawn("gang", out))
    _check(_spawn("one", out, gang=False))
    return out


def _ranks(out: Path, kind: str) -> list[dict[str, Any]]:
    return [json.loads((out / kind / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_parameters_are_sharded_over_the_two_ranks(trained: Path, kind: str) -> None:
    for record in _ranks(trained, kind):
        assert record["all_dtensor"]
        assert record["segments"] == 4  # trained in 4 run_segment calls
        assert record["local_bytes"] == pytest.approx(record["whole_bytes"] / 2, rel=0.02)


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_chunked_gang_run_equals_plain_sharded_trl_and_one_process(trained: Path, kind: str) -> None:
    from safetensors.torch import load_file

    r0, r1 = _ranks(trained, kind)
    assert r0["executor_losses"] == r0["plain_losses"] == r1["executor_losses"]  # equal on both ranks
    assert len(r0["executor_losses"]) == 8
    final = Path(r0["final_dir"])
    assert (final / "COMPLETE").is_file() and (final / "tokenizer.json").is_file()
    ours = load_file(str(final / WEIGHTS[kind]))
    assert _max_diff(ours, load_file(str(trained / kind / "plain" / WEIGHTS[kind]))) == 0.0
    one = load_file(str(trained / kind / "one" / WEIGHTS[kind]))
    assert (
        _max_diff(ours, one) < 1e-5
    )  # data parallel vs one process, same global batch (float sums reordered)
    one_losses = json.loads((trained / kind / "one.json").read_text())["one_losses"]
    assert r0["executor_losses"] == pytest.approx(one_losses, abs=1e-5)


def test_num_gpus_without_fsdp_trains_data_parallel(trained: Path) -> None:
    from safetensors.torch import load_file

    r0, r1 = (json.loads((trained / "ddp" / f"rank{r}.json").read_text()) for r in (0, 1))
    assert not r0["any_dtensor"] and r0["local_bytes"] == r0["whole_bytes"]  # a full replica per rank
    assert r0["executor_losses"] == r1["executor_losses"]
    ours = load_file(str(Path(r0["final_dir"]) / WEIGHTS["lora"]))
    assert _max_diff(ours, load_file(str(trained / "lora" / "one" / WEIGHTS["lora"]))) < 1e-5


def test_final_adapter_loads_without_fsdp(trained: Path) -> None:
    from rapidfire_nb.spec import LeafConfig
    from rapidfire_nb.testing import tiny_create_model
    from rapidfire_nb.training.models import BaseModels, load_final_weights

    r0, _ = _ranks(trained, "lora")
    spec = LeafConfig(
        trainer_type="SFT", model_name="tiny", lora={"r": 4, "target_modules": ["q_proj", "v_proj"]}
    )
    model, _tok = load_final_weights(BaseModels(tiny_create_model, print), spec, Path(r0["final_dir"]))
    lora = {n: p for n, p in model.named_parameters() if "lora_B" in n}
    assert lora and all(float(p.abs().max()) > 0 for p in lora.values())  # trained (lora_B starts at zero)


def test_killed_gang_resumes_from_its_boundary_checkpoint_exactly(trained: Path, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    crashed = _spawn("crash", tmp_path)
    assert crashed.returncode != 0  # both ranks SIGKILLed after 2 of 4 chunks
    run_dir = tmp_path / "exp" / "runs" / "1"
    assert (run_dir / "checkpoint-4" / "COMPLETE").is_file()
    assert (run_dir / "gang-rank1" / "checkpoint-4" / "COMPLETE").is_file()
    assert not (run_dir / "final").exists()
    _check(_spawn("resume", tmp_path))
    r0, r1 = (json.loads((tmp_path / f"resume{rank}.json").read_text()) for rank in (0, 1))
    for record in (r0, r1):
        assert record["resumed_from"] == "checkpoint-4" and record["segments_done"] == 2
        assert record["exported"] == "checkpoint-8" and record["final_events"] == 1
    assert r0["orders"] >= 3 and r1["orders"] == 0  # only rank 0 waits for the kernel before writing
    resumed = load_file(str(run_dir / "final" / WEIGHTS["lora"]))
    undisturbed = load_file(str(Path(_ranks(trained, "lora")[0]["final_dir"]) / WEIGHTS["lora"]))
    assert _max_diff(resumed, undisturbed) == 0.0
    shares = [load_file(str(run_dir / sub / "checkpoint-8" / WEIGHTS["lora"])) for sub in (".", "gang-rank1")]
    for share in shares:  # each rank's half of every adapter tensor (dim 0), under PEFT's names
        assert set(share) == set(resumed)
        assert all(share[k].shape[0] * 2 == resumed[k].shape[0] for k in share)
    halves = {k: torch.cat([shares[0][k], shares[1][k]]) for k in resumed}
    assert _max_diff(halves, resumed) == 0.0
