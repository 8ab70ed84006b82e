"""Child process of ``test_sharding.py``: one rank of a 2-process gang (started by ``torch.distributed.run``), or
the one-process reference (started plainly).

Usage: ``python _gang_child.py <mode> <out_dir>``, modes:

* ``gang``: under torchrun. For a LoRA and a full fine-tuning run: a ``TorchExecutor`` trains the run with
  ``fsdp="full_shard auto_wrap"`` and ``num_gpus=2`` chunk by chunk (several ``run_segment`` calls) and saves its
  final folder (``<out>/<kind>/exp/runs/1/final``); then a plain TRL ``trainer.train()`` of the same config, sharded
  the same way (``shard_model`` + ``skip_ddp_wrap``), saves its gathered weights (``<out>/<kind>/plain``). Each
  rank writes ``<out>/<kind>/rank<r>.json``: its parameter bytes (local, whole), whether every parameter is a
  DTensor, the executor's and the plain run's logged losses. Then the LoRA run with ``num_gpus=2`` and no ``fsdp``
  (DDP) through the executor (``<out>/ddp``).
* ``plain``: under torchrun: the LoRA run's plain sharded TRL reference only (``<out>/lora/plain``).
* ``crash``: under torchrun, LoRA: train 2 of 4 chunks, wait for the boundary checkpoints, then SIGKILL itself.
* ``resume``: under torchrun: fresh processes resume the run from its latest checkpoint through ``WorkerHost`` and
  finish it.
* ``one``: no torchrun: both kinds trained by plain TRL in one process with the same global batch
  (``<out>/<kind>/one``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

CHUNKS = 4
ROWS = int(os.environ.get("RF_TEST_GANG_ROWS", "32"))  # test_sharding_fit.py trains on more
PER_DEVICE = 2  # x 2 ranks: a global batch of 4 (8 steps)


def spec(kind: str, gang: bool, fsdp: bool = True) -> Any:
    """The run's config: ``kind`` "lora" or "full"; over a gang of 2 (FSDP, or DDP without ``fsdp``) or not."""
    import dataclasses

    from rapidfire_nb.spec import LeafConfig

    training: dict[str, Any] = {
        "per_device_train_batch_size": PER_DEVICE if gang else 2 * PER_DEVICE,
        "num_train_epochs": 1,
        "learning_rate": 1e-3 if kind == "lora" else 1e-4,
        "logging_steps": 1,
        "seed": 3,
    }
    if gang and fsdp:
        training["fsdp"] = "full_shard auto_wrap"
        training["fsdp_config"] = {"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}
    lora = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0}
    width = {"num_gpus": 2} if gang and "num_gpus" in {f.name for f in dataclasses.fields(LeafConfig)} else {}
    return LeafConfig(
        trainer_type="SFT",
        model_name="tiny",
        lora=lora if kind == "lora" else None,
        training=training,
        **width,
    )


def executor(out: Path) -> Any:
    from rapidfire_nb.spec.bundles import GroupSettings, TrainingCallbacks
    from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset
    from rapidfire_nb.training.executor import TorchExecutor

    group = GroupSettings("SFT", tiny_create_model, num_chunks=CHUNKS, seed=0)
    return TorchExecutor(group, tiny_sft_dataset(ROWS), None, out / "exp", TrainingCallbacks())


def losses(trainer: Any) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def train_chunks(ex: Any, start: Any, stop_after: int | None = None) -> None:
    done = start.segments_done
    while done < start.plan.num_segments and (stop_after is None or done < stop_after):
        result = ex.run_segment(1, start.plan.boundary(done)).result(300)
        assert result.error is None, result.error
        done += 1


def gang_executor_run(kind: str, out: Path, fsdp: bool = True) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    from rapidfire_nb.training.sharding import local_parameter_bytes

    ex = executor(out)
    start = ex.add_run(1, spec(kind, gang=True, fsdp=fsdp))
    model = ex.runs[1].worker.trainer.model
    local, whole = local_parameter_bytes(model)
    train_chunks(ex, start)
    ex.on_status(1, "COMPLETED")  # saves the final folder (rank 0 writes it)
    ex.flush()
    record = {
        "local_bytes": local,
        "whole_bytes": whole,
        "all_dtensor": all(isinstance(p, DTensor) for p in model.parameters()),
        "any_dtensor": any(isinstance(p, DTensor) for p in model.parameters()),
        "segments": start.plan.num_segments,
        "executor_losses": losses(ex.runs[1].worker.trainer),
        "final_dir": str(ex.final_dir(1)),
    }
    ex.close()
    return record


def plain_run(kind: str, out: Path, gang: bool) -> list[float]:
    """Plain TRL ``trainer.train()`` of the run's config (sharded as the executor shards it under a gang)."""
    import torch.distributed as dist
    from peft import get_peft_model
    from transformers import set_seed
    from trl import SFTTrainer

    from rapidfire_nb.spec import build_lora_config, build_training_args
    from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset
    from rapidfire_nb.training.gang import training_spec
    from rapidfire_nb.training.sharding import run_plan, shard_model, skip_ddp_wrap

    leaf = spec(kind, gang)
    args, _ = build_training_args(training_spec(leaf), output_dir=str(out / "trainer"), default_seed=0)
    model, tok = tiny_create_model({"model_name": "tiny"})
    if kind == "lora":
        set_seed(args.seed)  # as TRL does before get_peft_model
        model = get_peft_model(model, build_lora_config(leaf))
    if gang:
        shard_model(model, run_plan(leaf))
    trainer = SFTTrainer(model=model, args=args, train_dataset=tiny_sft_dataset(ROWS), processing_class=tok)
    if gang:
        skip_ddp_wrap(trainer)
    trainer.train()
    if gang:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if dist.get_rank() == 0:
            model.save_pretrained(str(out / "plain"), state_dict=state)
    else:
        model.save_pretrained(str(out / "one"))
    return losses(trainer)


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    if mode == "one":
        for kind in ("lora", "full"):
            (out / kind).mkdir(parents=True, exist_ok=True)
            record = {"one_losses": plain_run(kind, out / kind, gang=False)}
            (out / kind / "one.json").write_text(json.dumps(record))
        return
    from rapidfire_nb.training.sharding import join_gang

    gang = join_gang()  # what WorkerHost does at start
    assert gang is not None
    rank = gang.rank
    if mode == "gang":
        for kind in ("lora", "full"):
            record = gang_executor_run(kind, out / kind)
            record["plain_losses"] = plain_run(kind, out / kind, gang=True)
            (out / kind / f"rank{rank}.json").write_text(json.dumps(record))
        record = gang_executor_run("lora", out / "ddp", fsdp=False)  # num_gpus=2 without fsdp: DDP
        (out / "ddp" / f"rank{rank}.json").write_text(json.dumps(record))
    elif mode == "plain":  # the LoRA reference alone (test_sharding_fit.py)
        (out / "lora").mkdir(parents=True, exist_ok=True)
        plain_run("lora", out / "lora", gang=True)
    elif mode == "crash":
        ex = executor(out)
        start = ex.add_run(1, spec("lora", gang=True))
        train_chunks(ex, start, stop_after=2)
        ex.flush()  # both boundary checkpoints on disk (rank 0's completes once rank 1's share is there)
        import torch.distributed as dist

        dist.barrier()
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "resume":
        resume_through_host(out, rank)


def resume_through_host(out: Path, rank: int) -> None:
    """Fresh ranks resume the killed run through ``WorkerHost`` (the worker process' object, which joined the gang
    at its start), as the device layer drives it: the same calls on every rank; rank 0's order tokens answered."""
    from rapidfire_nb.devices.settings import WorkerSettings
    from rapidfire_nb.run_folder import latest_checkpoint
    from rapidfire_nb.spec.bundles import GroupSettings
    from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset
    from rapidfire_nb.training.host import WorkerHost

    data = out / f"rows{rank}"
    tiny_sft_dataset(ROWS).save_to_disk(str(data))
    group = GroupSettings("SFT", tiny_create_model, num_chunks=CHUNKS, seed=0)
    settings = WorkerSettings(f"cpu:{rank}", group, str(data), None, str(out / "exp"))
    events: list[Any] = []
    holder: list[WorkerHost] = []

    def emit(event: tuple[Any, ...]) -> None:
        events.append(event[0])
        if event[0] == "order":
            holder[0].ordered(event[1])  # the kernel recorded what came before

    host = WorkerHost(settings, emit)
    holder.append(host)
    ckpt = latest_checkpoint(out / "exp" / "runs" / "1")
    assert ckpt is not None
    start = host.add_run(1, spec("lora", gang=True), resume_from=str(ckpt))
    done = start.segments_done
    while done < start.plan.num_segments:
        result = host.run_segment(1, start.plan.boundary(done))
        assert result.error is None, result.error
        done += 1
    host.on_status(1, "COMPLETED")
    exported = host.export_boundary(1)  # every rank answers (rank 1 without an order token)
    host.flush()
    record = {
        "resumed_from": ckpt.name,
        "segments_done": start.segments_done,
        "exported": exported.name,
        "final_events": events.count("final"),
        "orders": events.count("order"),
    }
    (out / f"resume{rank}.json").write_text(json.dumps(record))
    host.close()


if __name__ == "__main__":
    main()
