"""One run over a gang of devices: the worker process joins its gang; a run's model is sharded with FSDP2.

Each rank of a gang is one worker process holding only the gang's run. The device layer starts it with the
standard variables ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``
and ``RF_GANG_TIMEOUT_S`` (collective timeout, seconds; default 60, never gloo's 30 minutes), and on CUDA
``CUDA_VISIBLE_DEVICES`` (the rank trains on ``cuda:LOCAL_RANK``). :func:`join_gang` joins the process group once
per process (``WorkerHost`` calls it at start); a process without ``WORLD_SIZE`` >= 2 is not a rank and nothing
here changes for it.

The sharding is PyTorch's own FSDP2 (``torch.distributed.fsdp.fully_shard``), applied by :func:`shard_model` per
the run's :class:`~rapidfire_nb.spec.fsdp.ShardingPlan`: accelerate shards only on accelerators (on the CPU it
runs as ``MULTI_CPU`` and wraps the model in DDP), so it is called directly, one behaviour on every device.
accelerate still splits the trainer's dataloader across the ranks (data parallel) and gathers the logged losses;
:func:`skip_ddp_wrap` only stops it wrapping a sharded model in DDP. ``num_gpus=k`` without ``fsdp`` is left to
accelerate (DDP).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

from rapidfire_nb.errors import ConfigError
from rapidfire_nb.spec.fsdp import ShardingPlan, sharding_plan

__all__ = [
    "GANG_TIMEOUT_ENV",
    "Gang",
    "gang_env",
    "join_gang",
    "leave_gang",
    "local_parameter_bytes",
    "run_plan",
    "shard_model",
    "skip_ddp_wrap",
]

GANG_TIMEOUT_ENV = "RF_GANG_TIMEOUT_S"
"""Environment variable: a gang's collective timeout in seconds (default :data:`DEFAULT_TIMEOUT_S`)."""
DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Gang:
    """This process's place in its gang (read from the environment).

    Attributes:
        rank: ``RANK`` (0 writes the run's shared files and answers for the gang).
        world_size: ``WORLD_SIZE`` (the run's ``num_gpus``), >= 2.
        local_rank: ``LOCAL_RANK`` (on CUDA the rank trains on ``cuda:<local_rank>``).
        timeout_s: ``RF_GANG_TIMEOUT_S`` (seconds a collective waits for the other ranks).
    """

    rank: int
    world_size: int
    local_rank: int
    timeout_s: float


def gang_env() -> Gang | None:
    """This process's :class:`Gang` from the environment, or ``None`` (no ``WORLD_SIZE``, or 1).

    Raises:
        ConfigError: ``WORLD_SIZE`` >= 2 with ``RANK``, ``LOCAL_RANK`` or ``RF_GANG_TIMEOUT_S`` missing or bad.
    """
    world = os.environ.get("WORLD_SIZE")
    if world is None or world.strip() in ("", "1"):
        return None
    try:
        size, rank = int(world), int(os.environ["RANK"])
        local = int(os.environ.get("LOCAL_RANK", rank))
        timeout = float(os.environ.get(GANG_TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    except (KeyError, ValueError) as exc:
        raise ConfigError(
            f"a gang rank needs RANK, WORLD_SIZE, LOCAL_RANK and a numeric {GANG_TIMEOUT_ENV} in its environment "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    if not 0 <= rank < size or timeout <= 0:
        raise ConfigError(f"gang environment out of range: RANK={rank}, WORLD_SIZE={size}, timeout={timeout}")
    return Gang(rank=rank, world_size=size, local_rank=local, timeout_s=timeout)


def join_gang() -> Gang | None:
    """Join this process's gang once: ``init_process_group`` (NCCL on CUDA, gloo on the CPU) from the environment.

    Idempotent (a second call returns the same :class:`Gang`); a process that is not a rank (:func:`gang_env` is
    ``None``) joins nothing. Call it before anything builds a TRL config in the process (accelerate would
    otherwise create the group itself with its 30-minute timeout). On CUDA the rank's device becomes
    ``cuda:LOCAL_RANK``.

    Returns:
        The gang, or ``None`` for a process that is not a rank.

    Raises:
        ConfigError: a bad gang environment (:func:`gang_env`).
        RuntimeError / DistBackendError: the other ranks did not join within the timeout.
    """
    gang = gang_env()
    if gang is None:
        return None
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(gang.local_rank)
        dist.init_process_group(
            backend="nccl" if cuda else "gloo",
            rank=gang.rank,
            world_size=gang.world_size,
            timeout=datetime.timedelta(seconds=gang.timeout_s),
        )
    return gang


def leave_gang() -> None:
    """Destroy this process's process group, if it joined one (at the worker's close)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def run_plan(spec: Any) -> ShardingPlan:
    """The run's :class:`ShardingPlan`: its ``training`` fields and its ``num_gpus``.

    ``num_gpus`` is read from the spec (``LeafConfig.num_gpus``; ``None`` is one device); a spec type without the
    field counts this process's gang (``WORLD_SIZE``: a gang's worker holds only the gang's run), 1 elsewhere.

    Raises:
        ConfigError: a bad ``fsdp`` / ``fsdp_config`` / ``num_gpus`` (:func:`~rapidfire_nb.spec.fsdp.sharding_plan`),
            or ``num_gpus`` other than this process's gang size.
    """
    gang = gang_env()
    if hasattr(spec, "num_gpus"):
        num_gpus = spec.num_gpus  # None: one device (also in a process started under torchrun)
    else:
        num_gpus = gang.world_size if gang is not None else None
    plan = sharding_plan(spec.training, num_gpus)
    if plan.sharding is not None and (gang is None or gang.world_size != plan.num_gpus):
        raise ConfigError(
            f"num_gpus={plan.num_gpus}: the run must train in a gang of {plan.num_gpus} worker processes, but this "
            f"process is {'not a gang rank' if gang is None else f'a rank of a gang of {gang.world_size}'}"
        )
    return plan


def _units(model: Any, plan: ShardingPlan) -> list[Any]:
    """The modules that become FSDP units of their own before the root (outermost first never nested twice)."""
    if plan.wrap_policy == "NO_WRAP":
        return []
    names = set(plan.layer_classes)
    if not names:
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        names = set(getattr(inner, "_no_split_modules", None) or ())
    if not names:
        raise ConfigError(
            "training_args.fsdp_config: the model names no layer class to wrap (no _no_split_modules): set "
            "fsdp_config['transformer_layer_cls_to_wrap'] (e.g. ['LlamaDecoderLayer']) or auto_wrap_policy='NO_WRAP'"
        )
    units = [m for m in model.modules() if type(m).__name__ in names]
    if not units:
        found = sorted({type(m).__name__ for m in model.modules()})
        raise ConfigError(
            f"training_args.fsdp_config['transformer_layer_cls_to_wrap']={sorted(names)} matches no module of the "
            f"model; its module classes include {found[:12]}"
        )
    return units


def shard_model(model: Any, plan: ShardingPlan) -> Any:
    """Shard ``model``'s parameters over the gang with FSDP2, in place, before its optimizer exists.

    Each module whose class is in the plan's layer classes (or the model's ``_no_split_modules``) becomes an FSDP
    unit (``fully_shard``), then the transformers model (a ``PeftModel``'s base model: its ``forward`` and its
    ``generate``, which bypasses ``PeftModel.forward``, both enter there, so the root unit gathers the embeddings
    and head on either path): its parameters become ``DTensor``s sharded on dim 0 over a 1-D mesh of all ranks
    (each rank keeps about 1/k of the parameter bytes). ``offload_params`` uses FSDP2's ``CPUOffloadPolicy``
    (CUDA only). The root is marked FSDP-managed for transformers (``_is_fsdp_managed_module``, as its own FSDP2
    integration does), so ``generate`` runs with ``synced_gpus=True``: every rank runs the same number of forward
    passes (all-gathers) until all ranks' rows have ended, a rank done early discarding its extra forwards.

    Args:
        model: The run's model (a ``PeftModel`` with its adapter, or the full model), on the CPU.
        plan: Its plan (``sharding == "fsdp"``).

    Returns:
        ``model`` (FSDP2 changes the root's class in place).

    Raises:
        ConfigError: ``offload_params`` on the CPU; layer classes that match no module.
        RuntimeError: the process has not joined its gang (:func:`join_gang`).
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    cuda = torch.cuda.is_available()
    if plan.offload_params and not cuda:
        raise ConfigError(
            "training_args.fsdp_config offload_params (or fsdp 'offload') moves sharded parameters to the CPU, "
            "but this gang trains on the CPU already: remove offload_params / 'offload'"
        )
    if not dist.is_initialized():
        raise RuntimeError("shard_model needs the process group: call join_gang() first")
    mesh = init_device_mesh("cuda" if cuda else "cpu", (dist.get_world_size(),))
    offload = CPUOffloadPolicy() if plan.offload_params else OffloadPolicy()
    kwargs = {"mesh": mesh, "reshard_after_forward": plan.reshard_after_forward, "offload_policy": offload}
    for unit in _units(model, plan):
        fully_shard(unit, **kwargs)
    root = model.get_base_model() if hasattr(model, "get_base_model") else model
    fully_shard(root, **kwargs)
    # transformers' own FSDP2 integration (apply_fsdp2) marks its model so: generate() then defaults to
    # synced_gpus=True over the gang (every rank runs forwards until all ranks' rows have ended)
    root._is_fsdp_managed_module = True
    return model


def is_sharded(model: Any) -> bool:
    """Whether any parameter of ``model`` is a ``DTensor`` (sharded by FSDP2)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def skip_ddp_wrap(trainer: Any) -> None:
    """Stop the trainer's accelerator wrapping a sharded model in ``DistributedDataParallel``.

    accelerate on the CPU runs as ``MULTI_CPU`` and wraps every prepared model in DDP; a model sharded by
    FSDP2 already reduces its gradients (reduce-scatter). Its ``prepare_model`` registers such a model (so
    ``unwrap_model``, ``save`` and ``clip_grad_norm_`` see it) and returns it unwrapped; any other model is
    prepared as before.

    Args:
        trainer: a TRL trainer whose model is sharded (call before ``train()``).
    """
    acc = trainer.accelerator
    original = acc.prepare_model

    def prepare_model(model: Any, *args: Any, **kwargs: Any) -> Any:
        if is_sharded(model):
            if not any(m is model for m in acc._models):
                acc._models.append(model)
            return model
        return original(model, *args, **kwargs)

    acc.prepare_model = prepare_model


def local_parameter_bytes(model: Any) -> tuple[int, int]:
    """``(bytes this rank holds, bytes of the whole model)`` of ``model``'s parameters (a sharded parameter
    counts its local shard, resp. its global size)."""
    from torch.distributed.tensor import DTensor

    local = total = 0
    for p in model.parameters():
        size = p.element_size()
        total += p.numel() * size
        local += (p.to_local().numel() if isinstance(p, DTensor) else p.numel()) * size
    return local, total
