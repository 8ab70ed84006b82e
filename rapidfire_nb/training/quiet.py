"""Silence the libraries' per-step progress bars and chatter while rapidfire_nb drives them."""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator

from .quantization import HUB_KERNEL_LINE

__all__ = ["quiet_libraries", "silence_globally"]


def silence_globally() -> None:
    """Turn off datasets/transformers progress bars and info logs for this process (idempotent)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import datasets
    import transformers

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    for name in ("trl", "peft", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # bitsandbytes (when installed) logs at import, on a CPU with AVX512-BF16 and no Hub access, that its optional
    # fused kernel could not be fetched: every script would print it. Its built-in kernels give the same results.
    hub = logging.getLogger("bitsandbytes.backends.cpu.ops")
    if not any(isinstance(f, _HubKernelLine) for f in hub.filters):
        hub.addFilter(_HubKernelLine())
    # transformers warns about its own internal call on every forward of a PEFT model during training
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)


class _HubKernelLine(logging.Filter):
    """Drops bitsandbytes' "Failed to load CPU gemm_4bit_forward from kernels-community" line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(HUB_KERNEL_LINE)


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Context in which building trainers prints nothing but real warnings."""
    silence_globally()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module="trl")
        warnings.filterwarnings("ignore", category=UserWarning, module="transformers")
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield
