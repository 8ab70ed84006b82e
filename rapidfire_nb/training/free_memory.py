"""Free memory of the device runs train on in this process, for sizing a run before it is built.

The one place the kernel asks torch how much accelerator memory is free (``torch.cuda.mem_get_info``); the CPU
case (host RAM) needs no torch and lives with the check (``rapidfire_nb.experiment.resources``).
"""

from __future__ import annotations

__all__ = ["free_cuda_bytes"]


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
