"""bitsandbytes' import-time line about its optional Hub kernel is hidden once rapidfire_nb quiets the libraries.

A fresh-user pass: with bitsandbytes installed (the ``quantization`` extra), every training script printed "Failed to
load CPU gemm_4bit_forward from kernels-community ..." although no quantized model was used. It is logged, on a CPU
with AVX512-BF16 and no Hub access, when bitsandbytes is first imported (``import peft`` does it).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from rapidfire_nb._quiet_logs import HUB_KERNEL_LINE

CODE = """
import sys
if sys.argv[1] == "quiet":
    from rapidfire_nb.training.quiet import silence_globally
    silence_globally()
if sys.argv[1] == "imported":  # the kernel's first line, or a worker process's start: nothing else called
    import rapidfire_nb
import bitsandbytes
"""


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes is not installed")
def test_the_hub_kernel_line_is_hidden() -> None:
    def stderr(mode: str) -> str:
        proc = subprocess.run([sys.executable, "-c", CODE, mode], capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stderr

    if HUB_KERNEL_LINE not in stderr("plain"):
        pytest.skip("this CPU or this bitsandbytes logs no Hub-kernel line")
    assert HUB_KERNEL_LINE not in stderr("quiet")
    assert HUB_KERNEL_LINE not in stderr("imported")  # every worker imports rapidfire_nb before peft
