"""run_fit's ``devices=`` / ``backend=`` resolved against a machine (pure: GPU count and cores given)."""

from __future__ import annotations

import pytest

from rapidfire_nb.devices.resolve import resolve_devices
from rapidfire_nb.errors import ConfigError


def test_default_every_gpu_one_worker_each_and_one_or_none_in_the_kernel() -> None:
    plan = resolve_devices(None, None, cuda_count=4, cores=16)
    assert (plan.backend, plan.names, plan.gpus, plan.threads) == (
        "local",
        ("cuda:0", "cuda:1", "cuda:2", "cuda:3"),
        (0, 1, 2, 3),
        4,
    )
    assert plan.env(2) == {"OMP_NUM_THREADS": "4", "CUDA_VISIBLE_DEVICES": "2"}
    for gpus in (0, 1):
        kernel = resolve_devices(None, None, cuda_count=gpus, cores=2)
        assert kernel.backend == "kernel" and not kernel.workers


def test_cpu_workers_share_the_cores() -> None:
    plan = resolve_devices(2, "local", cuda_count=0, cores=2)
    assert plan.names == ("cpu:0", "cpu:1") and plan.threads == 1 and plan.workers
    assert plan.env(0) == {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    assert resolve_devices(["cpu", "cpu"], None, 0, 4).threads == 2
    assert not resolve_devices(1, None, 0, 2).workers  # one device: the kernel process, as before


def test_lists_of_gpus_and_ray() -> None:
    plan = resolve_devices(["cuda:0", 3], None, cuda_count=4, cores=8)
    assert plan.names == ("cuda:0", "cuda:3") and plan.gpus == (0, 3) and plan.threads == 4
    assert resolve_devices(None, "ray", 0, 2).names == ("cpu:0",)  # ray always uses workers
    assert resolve_devices(1, "ray", 1, 2).names == ("cuda:0",)


@pytest.mark.parametrize(
    ("devices", "backend", "cuda", "cores", "says"),
    [
        (0, None, 0, 2, "devices must be >= 1"),
        (3.5, None, 0, 2, "devices must be None, a number of workers, or a list"),
        (True, None, 0, 2, "devices must be None"),
        ("cpu", None, 0, 2, "devices must be None"),
        ([], None, 0, 2, "devices must be None"),
        (5, None, 4, 8, "devices=5 but 4 CUDA GPU(s) are visible"),
        (["cuda:0"], None, 0, 2, "no CUDA GPU is visible"),
        (["cuda:1", "cuda:1"], None, 2, 2, "GPU listed twice"),
        (["cpu", "cuda:0"], None, 1, 2, "mix of GPUs and CPU workers"),
        (["tpu:0"], None, 0, 2, 'neither "cuda:<index>" nor "cpu"'),
        (64, None, 0, 2, "devices=64 CPU workers on a machine where this process may use 2 core(s)"),
        (2, "rayy", 0, 2, "backend must be one of 'local', 'ray'"),
    ],
)
def test_bad_values_are_refused_naming_the_fix(
    devices: object, backend: object, cuda: int, cores: int, says: str
) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_devices(devices, backend, cuda, cores)
    assert says in str(info.value)
