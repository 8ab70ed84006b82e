"""Resource bounds per op: a run that cannot fit the disk or the device is refused before it is accepted.

Before a clone is queued (``clone_modify``, a POSTed clone, the panel's clone form: all go through
``FitSession.submit``) and before ``run_fit`` builds anything (every config of the group), each run's size is
estimated from its base's shapes (:mod:`rapidfire_nb.spec.footprint`, the one estimator) and checked:

* **rank**: ``lora.r`` above the smaller side of a layer it adapts is LoRA beyond full rank (``A: r x in``,
  ``B: out x r`` can never have rank above ``min(in, out)``): parameters that can learn nothing more.
* **disk**: the checkpoints and final weights must fit the free space of the experiment folder's disk
  (``shutil.disk_usage``, through ``errors.free_bytes``) less :data:`DISK_MARGIN_BYTES` and a tenth of the need.
  A run holds one boundary checkpoint, two while the next one is written (the older is removed after), and its
  final weights; ``run_fit`` counts every run of the group, less what the experiment's ``runs/`` folder holds
  already (checkpoints that are replaced, not added to).
* **device memory**: a run's trainable weights, gradients and optimizer state (beside the shared base) must fit
  the free memory of where it trains, less :data:`MEMORY_MARGIN_BYTES`: the host RAM for CPU runs
  (``psutil.virtual_memory().available``, else ``MemAvailable`` of ``/proc/meminfo``), the CUDA device's free
  memory for runs trained in the kernel process on a GPU (``torch.cuda.mem_get_info``). Runs in worker
  processes on GPUs are not measured from the kernel (that would open a CUDA context in it). LoRA runs stay on
  the device between chunks; a parked full fine-tuning run moves to the host, so on a GPU ``run_fit`` counts
  every LoRA run and the largest full fine-tuning run.

A base whose shapes are unknown (a model type the estimator does not cover, or a ``model_name`` that is neither
a tiny test model nor a config found locally by ``transformers.AutoConfig``) is not estimated and not refused.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, free_bytes
from ..spec.footprint import BaseShapes, Footprint, estimate, format_bytes, smallest_rank_target
from ..spec.gangs import check_clone_width, check_run_gang, run_width, sharding_of

__all__ = [
    "DISK_MARGIN_BYTES",
    "MEMORY_MARGIN_BYTES",
    "base_shapes",
    "check_clone_fits",
    "check_group_fits",
    "free_memory",
]

DISK_MARGIN_BYTES = 64 * 2**20
"""Disk kept free beyond the estimated need (the store, TensorBoard events and logs grow too), plus 10 % of it."""

MEMORY_MARGIN_BYTES = 256 * 2**20
"""Device memory kept free beyond a run's weights, gradients and optimizer state (activations, allocator slack)."""


def check_clone_fits(spec: Any, store: Any, devices: Any, parent_id: int) -> None:
    """Refuse a clone of run ``parent_id`` (child spec ``spec``) that cannot fit (see the module docstring).

    Args:
        spec: the clone's run spec (``LeafConfig``).
        store: the experiment's store (the disk of its folder holds the checkpoints), or None (disk not checked).
        devices: the session's ``DevicePlan`` (None: the kernel process).
        parent_id: for the message.

    Raises:
        ConfigError: a ``num_gpus`` no device of this run_fit has, or what a gang refuses
            (:func:`~rapidfire_nb.spec.gangs.check_run_gang`); LoRA beyond full rank, or the run's checkpoints (two while one is replaced, and its final
            weights) do not fit the free disk, or its training state does not fit the device; the message gives
            the numbers, names the field and the fix.
    """
    what = f"the clone of run {parent_id}"
    if devices is not None:  # its num_gpus: a device of that width here, and what a gang refuses
        check_run_gang(what, spec, devices.names, devices.workers)
        check_clone_width(what, spec, devices.names, devices.widths, devices.singles)
    found = _estimate(spec)
    if found is None:
        return
    shapes, fp = found
    _check_rank(spec, shapes, fp, what)
    exp_dir = getattr(store, "experiment_dir", None)
    if exp_dir is not None:
        _check_disk(Path(exp_dir), 2 * fp.checkpoint_bytes + fp.final_bytes, [(spec, fp)], what, credit=0)
    _check_memory(free_memory(devices), fp.memory_bytes, [(spec, fp)], what)


def check_group_fits(specs: Sequence[Any], exp_dir: Path | None, devices: Any) -> None:
    """Refuse a ``run_fit`` group whose runs cannot fit, before anything is built (see the module docstring).

    Raises:
        ConfigError: a run with LoRA beyond full rank; the group's checkpoints and final weights over the free
            disk of ``exp_dir`` (less what its ``runs/`` folder holds); the runs' training state over the free
            device memory. The message names the run, the field, the numbers and the fix.
    """
    sized: list[tuple[Any, Footprint]] = []
    for i, spec in enumerate(specs, start=1):
        found = _estimate(spec)
        if found is None:
            continue
        shapes, fp = found
        _check_rank(spec, shapes, fp, f"run {i}")
        sized.append((spec, fp))
    if not sized:
        return
    what = "this run_fit" if len(specs) > 1 else "run 1"
    if exp_dir is not None:
        need = sum(fp.checkpoint_bytes + fp.final_bytes for _, fp in sized)
        need += max(fp.checkpoint_bytes for _, fp in sized)  # one checkpoint is replaced at a time
        _check_disk(exp_dir, need, sized, what, credit=_folder_bytes(Path(exp_dir) / "runs"))
    found = free_memory(devices)
    on_gpu = found is not None and found[1].startswith("cuda")
    lora = [_per_device(spec, fp) for spec, fp in sized if spec.lora is not None]
    full = [_per_device(spec, fp) for spec, fp in sized if spec.lora is None]
    memory = sum(lora) + (max(full, default=0) if on_gpu else sum(full))
    _check_memory(found, memory, sized, what)


def _per_device(spec: Any, fp: Footprint) -> int:
    """A run's training state on each of its devices (bytes): FSDP over a gang of k devices holds 1/k of it per
    device (weights, gradients and optimizer state sharded; activations are a run's own in the estimate too, a
    slight undercount), DDP and one device all of it."""
    return fp.memory_bytes // run_width(spec) if sharding_of(spec) == "fsdp" else fp.memory_bytes


def _estimate(spec: Any) -> tuple[BaseShapes, Footprint] | None:
    shapes = base_shapes(spec)
    if shapes is None:
        return None
    optim = (spec.training or {}).get("optim")
    return shapes, estimate(shapes, spec.lora, None if optim is None else str(optim))


def base_shapes(spec: Any) -> BaseShapes | None:
    """The shapes of ``spec``'s base: a tiny test model by name, else the config ``transformers.AutoConfig`` finds
    locally for ``model_name`` (the cache a loaded model leaves, or a folder), loaded in ``model_kwargs``' dtype;
    None when unknown."""
    kwargs = spec.model_kwargs or {}
    dtype = kwargs.get("dtype", kwargs.get("torch_dtype"))
    config = _config(
        str(spec.model_name), str(kwargs.get("revision") or ""), str(kwargs.get("subfolder") or "")
    )
    return None if config is None else BaseShapes.from_config(config, dtype=dtype)


@functools.lru_cache(maxsize=64)
def _config(model_name: str, revision: str, subfolder: str) -> dict[str, Any] | None:
    from ..testing.models import TINY_MODEL_NAMES, tiny_model_config

    if model_name in TINY_MODEL_NAMES:
        return tiny_model_config(model_name)
    try:
        from transformers import AutoConfig

        extra = {k: v for k, v in (("revision", revision), ("subfolder", subfolder)) if v}
        config = AutoConfig.from_pretrained(
            model_name, local_files_only=True, trust_remote_code=False, **extra
        )
        return dict(config.to_dict())
    except Exception:  # not found locally, a custom architecture, no transformers: not estimated
        return None


def _check_rank(spec: Any, shapes: BaseShapes, fp: Footprint, what: str) -> None:
    lora = spec.lora
    if lora is None or lora.get("rank_pattern") or fp.min_rank_dim is None:
        return
    r = int(lora.get("r", 8))
    if r <= fp.min_rank_dim:
        return
    layers = ", ".join(smallest_rank_target(shapes, lora))
    raise ConfigError(
        f"{what}: lora.r={r:,} is more than the full rank of the layers it adapts ({layers}: {fp.min_rank_dim} "
        f"wide on {spec.model_name!r}); LoRA beyond full rank adds parameters that can learn nothing more: "
        f"~{format_bytes(fp.checkpoint_bytes)} per checkpoint ({_parts(fp)}). Use lora.r <= {fp.min_rank_dim}, "
        "or adapt wider layers (lora.target_modules)"
    )


def _check_disk(
    exp_dir: Path, need: int, sized: Sequence[tuple[Any, Footprint]], what: str, credit: int
) -> None:
    free = free_bytes(str(exp_dir))
    if free is None:
        return
    margin = DISK_MARGIN_BYTES + need // 10
    if need + margin <= free + credit:
        return
    spec, fp = max(sized, key=lambda item: item[1].checkpoint_bytes)
    reused = f" plus {format_bytes(credit)} its runs/ folder holds already" if credit else ""
    raise ConfigError(
        f"{what} does not fit the disk: {_who(spec)} takes ~{format_bytes(fp.checkpoint_bytes)} per checkpoint "
        f"({_parts(fp)}); with the final weights (and the next checkpoint written before the last is removed) "
        f"it needs ~{format_bytes(need)}, but {exp_dir}'s disk has {format_bytes(free)} free{reused} (keeping "
        f"{format_bytes(margin)} spare). {_fix(spec)}, or free disk space (or use an experiment_path on a larger "
        "disk)"
    )


def _check_memory(
    found: tuple[int, str] | None, need: int, sized: Sequence[tuple[Any, Footprint]], what: str
) -> None:
    if found is None:
        return
    free, where = found
    if need + MEMORY_MARGIN_BYTES <= free:
        return
    spec, fp = max(sized, key=lambda item: item[1].memory_bytes)
    raise ConfigError(
        f"{what} does not fit the memory of {where}: {_who(spec)} needs ~{format_bytes(fp.memory_bytes)} "
        f"for its trainable weights, their gradients and the optimizer state ({_parts(fp)}"
        f"{_shared(spec, fp)}); in all on one device "
        f"~{format_bytes(need)}, but {where} has {format_bytes(free)} free (keeping "
        f"{format_bytes(MEMORY_MARGIN_BYTES)} spare). {_fix(spec)}, or free memory (stop or delete other runs)"
    )


def _shared(spec: Any, fp: Footprint) -> str:
    """``", sharded over 2 devices: ~1.1 MB on each"`` for an FSDP run, else ``""``."""
    if sharding_of(spec) != "fsdp":
        return ""
    return f", sharded over {run_width(spec)} devices: ~{format_bytes(_per_device(spec, fp))} on each"


def _who(spec: Any) -> str:
    lora = spec.lora
    if lora is None:
        return f"full fine-tuning of {spec.model_name!r} (peft_config=None)"
    targets = lora.get("target_modules")
    shown = targets if isinstance(targets, str) else list(targets) if targets else "its default"
    return f"lora.r={int(lora.get('r', 8)):,} with lora.target_modules={shown!r} on {spec.model_name!r}"


def _fix(spec: Any) -> str:
    if spec.lora is None:
        return "Train a LoRA adapter instead (peft_config=RFLoraConfig(...))"
    return "Lower lora.r, or adapt fewer layers (lora.target_modules)"


def _parts(fp: Footprint) -> str:
    return (
        f"{fp.trainable_params:,} trainable parameters: weights {format_bytes(fp.weights_bytes)} + optimizer "
        f"state {format_bytes(fp.optimizer_bytes)}"
    )


def free_memory(devices: Any) -> tuple[int, str] | None:
    """``(free bytes, where)`` of the memory runs train in: ``"cuda:<i>"`` for runs in the kernel process on a GPU,
    ``"CPU RAM"`` for CPU runs; None when not measured (runs in worker processes on GPUs, or nothing readable).

    Args:
        devices: the ``DevicePlan`` (``names`` like ``"cuda:0"`` / ``"cpu:1"``, ``workers``), or None (the kernel).
    """
    if devices is not None and getattr(devices, "workers", False):
        if any(str(n).startswith("cuda") for n in getattr(devices, "names", ())):
            return None
    else:
        from ..training.free_memory import free_cuda_bytes

        cuda = free_cuda_bytes()
        if cuda is not None:
            return cuda
    from ..training.free_memory import available_ram

    ram = available_ram()
    return None if ram is None else (ram, "CPU RAM")


def _folder_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder`` (0 when it does not exist)."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total
