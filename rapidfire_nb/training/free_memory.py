"""Free memory of the device runs train on in this process, for sizing a run before it is built.

The one place the kernel asks how much memory is free: the accelerator's (``torch.cuda.mem_get_info``) and the
host's (psutil, else ``/proc/meminfo``; no torch). Read by the resource checks (``rapidfire_nb.experiment.resources``)
and the batched generation's KV-cache cap (``rapidfire_nb.training.generation_batch``).
"""

from __future__ import annotations

__all__ = ["available_ram", "free_cuda_bytes"]


def free_cuda_bytes() -> tuple[int, str] | None:
    """``(free bytes, "cuda:<i>")`` of the current CUDA device, or None without CUDA.

    Source: ``torch.cuda.mem_get_info()`` (the driver's ``cudaMemGetInfo``: free memory of the whole device, other
    processes' use included). It creates this process's CUDA context when there is none yet; call it only where
    this process trains on CUDA anyway (runs trained in the kernel process).
    """
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        index = torch.cuda.current_device()
        free, _total = torch.cuda.mem_get_info(index)
        return int(free), f"cuda:{index}"
    except Exception:  # a broken CUDA setup: nothing measured, nothing refused
        return None


def available_ram() -> int | None:
    """Bytes of host memory available to new allocations (psutil's ``available``, else ``MemAvailable`` of
    ``/proc/meminfo``), or None when neither can be read."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
