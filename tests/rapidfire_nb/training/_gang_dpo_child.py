"""Child process of ``test_sharding_dpo.py``: one rank of a 2-process gang training a DPO LoRA run (started by
``torch.distributed.run``), or the one-process reference (started plainly).

Usage: ``python _gang_dpo_child.py <mode> <out_dir>``, modes:

* ``gang``: under torchrun. A ``TorchExecutor`` trains the DPO LoRA run with ``fsdp="full_shard auto_wrap"`` and
  ``num_gpus=2`` chunk by chunk (4 ``run_segment`` calls) and saves its final folder (``<out>/exp/runs/1/final``);
  then a plain TRL ``DPOTrainer(..., peft_config=...).train()`` of the same config, sharded the same way
  (``shard_model`` + ``skip_ddp_wrap`` after the trainer is built, before ``train()``), saves its gathered adapter
  (``<out>/plain``). Each rank writes ``<out>/rank<r>.json``: its parameter bytes (local, whole), whether every
  parameter is a DTensor, both runs' logged losses and rewards, and whether the executor's trainer took its
  reference log-probs from the shared cache (it must not: each rank has only its own rows). Then the run with
  ``num_gpus=2`` and no ``fsdp`` (DDP) through the executor (``<out>/ddp``).
* ``one``: no torchrun: the plain TRL run in one process with the same global batch (``<out>/one``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

CHUNKS = 4
ROWS = 32
PER_DEVICE = 2  # x 2 ranks: a global batch of 4 (8 steps)
LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0}


def spec(gang: bool, fsdp: bool = True) -> Any:
    """The DPO LoRA run's config: over a gang of 2 (FSDP, or DDP without ``fsdp``), or one process with the same
    global batch."""
    from rapidfire_nb.spec import LeafConfig

    training: dict[str, Any] = {
        "per_device_train_batch_size": PER_DEVICE if gang else 2 * PER_DEVICE,
        "num_train_epochs": 1,
        "learning_rate": 1e-3,
        "beta": 0.1,
        "logging_steps": 1,
        "seed": 3,
    }
    if gang and fsdp:
        training["fsdp"] = "full_shard auto_wrap"
        training["fsdp_config"] = {"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}
    return LeafConfig(
        trainer_type="DPO",
        model_name="tiny",
        lora=dict(LORA),
        training=training,
        num_gpus=2 if gang else None,
    )


def logged(trainer: Any, key: str) -> list[float]:
    return [h[key] for h in trainer.state.log_history if key in h]


def gang_executor_run(out: Path, fsdp: bool = True) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    from rapidfire_nb.spec.bundles import GroupSettings, TrainingCallbacks
    from rapidfire_nb.testing import tiny_create_model, tiny_dpo_dataset
    from rapidfire_nb.training.executor import TorchExecutor
    from rapidfire_nb.training.sharding import local_parameter_bytes

    group = GroupSettings("DPO", tiny_create_model, num_chunks=CHUNKS, seed=0)
    ex = TorchExecutor(group, tiny_dpo_dataset(ROWS), None, out / "exp", TrainingCallbacks())
    start = ex.add_run(1, spec(gang=True, fsdp=fsdp))
    trainer = ex.runs[1].worker.trainer
    local, whole = local_parameter_bytes(trainer.model)
    done = start.segments_done
    while done < start.plan.num_segments:
        result = ex.run_segment(1, start.plan.boundary(done)).result(300)
        assert result.error is None, result.error
        done += 1
    ex.on_status(1, "COMPLETED")  # saves the final folder (rank 0 writes it)
    ex.flush()
    record = {
        "local_bytes": local,
        "whole_bytes": whole,
        "all_dtensor": all(isinstance(p, DTensor) for p in trainer.model.parameters()),
        "segments": start.plan.num_segments,
        "shared_cache": hasattr(trainer, "_rapidfire_reference_cache"),
        "executor_losses": logged(trainer, "loss"),
        "executor_margins": logged(trainer, "rewards/margins"),
        "final_dir": str(ex.final_dir(1)),
    }
    ex.close()
    return record


def plain_run(out: Path, gang: bool) -> dict[str, list[float]]:
    """Plain TRL ``DPOTrainer(..., peft_config=...).train()`` (sharded as the executor shards it under a gang):
    its reference is the base with the adapter disabled, as TRL does for PEFT."""
    import torch.distributed as dist
    from trl import DPOTrainer

    from rapidfire_nb.spec import build_lora_config, build_training_args
    from rapidfire_nb.testing import tiny_create_model, tiny_dpo_dataset
    from rapidfire_nb.training.gang import training_spec
    from rapidfire_nb.training.sharding import run_plan, shard_model, skip_ddp_wrap

    leaf = spec(gang)
    args, _ = build_training_args(training_spec(leaf), output_dir=str(out / "trainer"), default_seed=0)
    model, tok = tiny_create_model({"model_name": "tiny"})
    trainer = DPOTrainer(
        model=model,
        args=args,
        train_dataset=tiny_dpo_dataset(ROWS),
        processing_class=tok,
        peft_config=build_lora_config(leaf),
    )
    if gang:  # before train() makes the optimizer, as torchrun + FSDP2 would
        shard_model(trainer.model, run_plan(leaf))
        skip_ddp_wrap(trainer)
    trainer.train()
    if gang:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(trainer.model, options=options)
        if dist.get_rank() == 0:
            trainer.model.save_pretrained(str(out / "plain"), state_dict=state)
    else:
        trainer.model.save_pretrained(str(out / "one"))
    return {"losses": logged(trainer, "loss"), "margins": logged(trainer, "rewards/margins")}


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    if mode == "one":
        (out / "one.json").write_text(json.dumps(plain_run(out, gang=False)))
        return
    from rapidfire_nb.training.sharding import join_gang

    gang = join_gang()  # what WorkerHost does at start
    assert gang is not None and mode == "gang"
    record = gang_executor_run(out)
    plain = plain_run(out, gang=True)
    record["plain_losses"], record["plain_margins"] = plain["losses"], plain["margins"]
    (out / f"rank{gang.rank}.json").write_text(json.dumps(record))
    ddp = gang_executor_run(out / "ddp", fsdp=False)  # num_gpus=2 without fsdp: DDP replicas
    (out / "ddp" / f"rank{gang.rank}.json").write_text(json.dumps(ddp))


if __name__ == "__main__":
    main()
