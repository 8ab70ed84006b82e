"""Launching a 2-process gang for the sharding tests (``python -m torch.distributed.run`` on a child script), and
what they compare with: shared by ``test_sharding*.py`` and ``tests/rapidfire_nb/devices/test_ray_gang.py``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

CHILD = Path(__file__).with_name("_gang_child.py")
WEIGHTS = {"lora": "adapter_model.safetensors", "full": "model.safetensors"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(
    mode: str, out: Path, gang: bool = True, rows: int = 32, child: Path = CHILD
) -> subprocess.CompletedProcess[str]:
    """Run ``child mode out`` as 2 ranks of a gang (``gang``) or as one plain process; ``rows`` training rows
    (``RF_TEST_GANG_ROWS``, read by ``_gang_child.py``)."""
    env = {**os.environ, "RF_GANG_TIMEOUT_S": "60", "OMP_NUM_THREADS": "1", "RF_TEST_GANG_ROWS": str(rows)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    launch = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1"]
    launch += ["--master_port", str(free_port())]
    cmd = [sys.executable, *(launch if gang else []), str(child), mode, str(out)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)


def check(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def max_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Max abs difference over two state dicts with the same keys (asserted, and not empty)."""
    assert set(a) == set(b) and a, (sorted(a)[:3], sorted(b)[:3])
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
