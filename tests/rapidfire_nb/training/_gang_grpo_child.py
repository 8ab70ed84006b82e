"""Child process of ``test_sharding_grpo.py``: one rank of a 2-process gang training a GRPO LoRA run (started by
``torch.distributed.run``), or the one-process reference (started plainly).

Usage: ``python _gang_grpo_child.py <mode> <out_dir>``, modes:

* ``gang``: under torchrun. A ``TorchExecutor`` trains the GRPO LoRA run with ``fsdp="full_shard auto_wrap"`` and
  ``num_gpus=2`` chunk by chunk (4 ``run_segment`` calls) and saves its final folder (``<out>/exp/runs/1/final``);
  then a plain TRL ``GRPOTrainer(..., peft_config=...).train()`` of the same config, sharded the same way
  (``shard_model`` + ``skip_ddp_wrap`` after the trainer is built, before ``train()``), saves its gathered adapter
  (``<out>/plain``); then each rank calls the sharded model's ``generate`` greedily for a different number of new
  tokens (rank r: 2 + 4r), counting its forward passes. Each rank writes ``<out>/rank<r>.json``: its parameter
  bytes, whether every parameter is a DTensor, both runs' logged metrics, and the probe's counts.
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
PROMPTS = 8
PER_DEVICE = 2  # x 2 ranks: a generation batch of 4 completions, one prompt's group (8 steps)
LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0}
METRICS = ("loss", "reward", "reward_std", "kl", "completions/mean_length")


def spec(gang: bool) -> Any:
    """The GRPO LoRA run's config: over a gang of 2 with FSDP, or one process with the same global batch."""
    from rapidfire_nb.spec import LeafConfig
    from rapidfire_nb.testing import length_reward

    training: dict[str, Any] = {
        "per_device_train_batch_size": PER_DEVICE if gang else 2 * PER_DEVICE,
        "num_generations": 4,
        "steps_per_generation": 1,
        "max_completion_length": 6,
        "num_train_epochs": 1,
        "learning_rate": 1e-2,
        "beta": 0.04,
        "logging_steps": 1,
        "seed": 3,
    }
    if gang:
        training["fsdp"] = "full_shard auto_wrap"
        training["fsdp_config"] = {"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}
    return LeafConfig(
        trainer_type="GRPO",
        model_name="tiny",
        lora=dict(LORA),
        training=training,
        reward_funcs=[length_reward],
        num_gpus=2 if gang else None,
    )


def logged(trainer: Any) -> dict[str, list[float]]:
    return {k: [h[k] for h in trainer.state.log_history if k in h] for k in METRICS}


def gang_executor_run(out: Path) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    from rapidfire_nb.spec.bundles import GroupSettings, TrainingCallbacks
    from rapidfire_nb.testing import tiny_create_model, tiny_grpo_dataset
    from rapidfire_nb.training.executor import TorchExecutor
    from rapidfire_nb.training.sharding import local_parameter_bytes

    group = GroupSettings("GRPO", tiny_create_model, num_chunks=CHUNKS, seed=0)
    ex = TorchExecutor(group, tiny_grpo_dataset(PROMPTS), None, out / "exp", TrainingCallbacks())
    start = ex.add_run(1, spec(gang=True))
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
        "executor": logged(trainer),
        "final_dir": str(ex.final_dir(1)),
    }
    ex.close()
    return record


def plain_run(out: Path, gang: bool) -> tuple[Any, dict[str, list[float]]]:
    """Plain TRL ``GRPOTrainer(..., peft_config=...).train()`` (sharded as the executor shards it under a gang)."""
    import torch.distributed as dist
    from trl import GRPOTrainer

    from rapidfire_nb.spec import build_lora_config, build_training_args
    from rapidfire_nb.testing import tiny_create_model, tiny_grpo_dataset
    from rapidfire_nb.training.gang import training_spec
    from rapidfire_nb.training.sharding import run_plan, shard_model, skip_ddp_wrap

    leaf = spec(gang)
    args, _ = build_training_args(training_spec(leaf), output_dir=str(out / "trainer"), default_seed=0)
    model, tok = tiny_create_model({"model_name": "tiny"})
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=list(leaf.reward_funcs),
        args=args,
        train_dataset=tiny_grpo_dataset(PROMPTS),
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
    return trainer, logged(trainer)


def uneven_generate(trainer: Any, rank: int) -> dict[str, int]:
    """Greedy ``generate`` on the sharded model, rank r asking for 2 + 4r new tokens: the forwards each rank ran
    and the new tokens it got (unsynced, rank 0 would stop after 2 forwards and leave rank 1's all-gathers
    unanswered)."""
    import torch

    model = trainer.model
    inner = model.get_base_model()
    calls = [0]
    handle = inner.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    ids = torch.tensor([[5, 6, 7, 8]])
    want = 2 + 4 * rank
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=want, do_sample=False
        )
    handle.remove()
    return {"forwards": calls[0], "new_tokens": int(out.shape[1] - ids.shape[1]), "asked": want}


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    if mode == "one":
        (out / "one.json").write_text(json.dumps(plain_run(out, gang=False)[1]))
        return
    from rapidfire_nb.training.sharding import join_gang

    gang = join_gang()  # what WorkerHost does at start
    assert gang is not None and mode == "gang"
    record = gang_executor_run(out)
    trainer, record["plain"] = plain_run(out, gang=True)
    record["uneven_generate"] = uneven_generate(trainer, gang.rank)
    (out / f"rank{gang.rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
