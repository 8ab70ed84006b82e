"""Parked full fine-tuning runs keep their weights and optimizer state off the accelerator.

A full fine-tuning run owns a whole copy of its model and an AdamW state twice its size; parked between chunks
on a GPU, four such runs of a 1B model hold ~48 GB they do not use. At the boundary, once its snapshot is taken,
:func:`park` moves the run's model (parameters and buffers, in place: the optimizer's parameter references stay
valid) and every optimizer state tensor that lives on the accelerator to host memory; :func:`unpark` moves them
back before the run trains again. Copies between devices are bit-exact, so the run trains as if it had stayed.
Tensors that were on the host already (AdamW's ``step`` counters when ``capturable=False``) are not touched. LoRA
runs are not moved: their base is shared with the other runs and their adapters are small. On a CPU-only
machine both are no-ops.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Parked", "park", "unpark"]


@dataclass
class Parked:
    """What :func:`park` moved: the device to move back to, the optimizer state keys moved, bytes moved."""

    device: torch.device
    state_keys: list[tuple[int, str]] = field(
        default_factory=list
    )  # (index of the param in optimizer.state, key)
    bytes_moved: int = 0


def _device_of(model: Any) -> torch.device | None:
    for p in model.parameters():
        return p.device
    return None


def _inner(optimizer: Any) -> Any:
    return getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps the real one


def park(model: Any, optimizer: Any, host: str = "cpu") -> Parked | None:
    """Move ``model`` and the accelerator-resident optimizer state to ``host``; None when already on the host.

    Args:
        model: the run's own model (full fine-tuning).
        optimizer: its optimizer (or None before the first step).
        host: where parked tensors go (``"cpu"``).

    Returns:
        What to move back with :func:`unpark`, or None (nothing moved).
    """
    device = _device_of(model)
    target = torch.device(host)
    if device is None or device.type == target.type:
        return None
    parked = Parked(device)
    parked.bytes_moved = sum(t.numel() * t.element_size() for t in model.parameters())
    model.to(target)
    if optimizer is not None:
        for index, state in enumerate(_inner(optimizer).state.values()):
            for key, value in list(state.items()):
                if torch.is_tensor(value) and value.device.type == device.type:
                    state[key] = value.to(target)
                    parked.state_keys.append((index, key))
                    parked.bytes_moved += value.numel() * value.element_size()
    return parked


def unpark(model: Any, optimizer: Any, parked: Parked | None) -> None:
    """Move back what :func:`park` moved (no-op for None)."""
    if parked is None:
        return
    model.to(parked.device)
    if optimizer is not None and parked.state_keys:
        states = list(_inner(optimizer).state.values())
        for index, key in parked.state_keys:
            states[index][key] = states[index][key].to(parked.device)
