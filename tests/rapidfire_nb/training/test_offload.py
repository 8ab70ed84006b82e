"""Parking a full fine-tuning run off the accelerator: a no-op on the CPU, exact round trips elsewhere."""

from __future__ import annotations

import torch

from rapidfire_nb.training.offload import park, unpark


def _model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    return model, opt


def test_on_the_cpu_nothing_moves() -> None:
    model, opt = _model_and_optimizer()
    before = [p.data_ptr() for p in model.parameters()]
    assert park(model, opt) is None
    unpark(model, opt, None)
    assert [p.data_ptr() for p in model.parameters()] == before


def test_a_round_trip_keeps_every_value_and_the_optimizer_references() -> None:
    """GPU -> host -> GPU: every value the same, the parameters the same objects, the GPU memory freed meanwhile."""
    if not torch.cuda.is_available():  # the real round trip needs an accelerator (benchmarks/gpu_check.py)
        import pytest

        pytest.skip("no CUDA device: the accelerator round trip is checked by benchmarks/gpu_check.py")
    model, opt = _model_and_optimizer()
    model.cuda()
    for state in opt.state.values():
        for k, v in list(state.items()):
            if torch.is_tensor(v) and k != "step":
                state[k] = v.cuda()
    values = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    params = list(model.parameters())
    parked = park(model, opt)
    assert parked is not None and all(p.device.type == "cpu" for p in model.parameters())
    assert torch.cuda.memory_allocated() < parked.bytes_moved
    unpark(model, opt, parked)
    assert list(model.parameters()) == params  # the optimizer's references still point at the model
    assert all(torch.equal(v.cpu(), values[k]) for k, v in model.state_dict().items())
    assert all(p.device.type == "cuda" for p in model.parameters())
