"""The one library log line rapidfire_nb hides from the moment it is imported (standard library only).

bitsandbytes (0.50, the ``quantization`` extra) logs at import, on a CPU with AVX512-BF16 and no Hugging Face Hub
access, that its optional fused kernel (``kernels-community/quantization-bitsandbytes``) could not be fetched. It
then uses its built-in kernels, with the same results. ``import peft`` imports it, so every kernel and every worker
process printed the line although no quantized model was used. The filter goes on before anything imports
bitsandbytes: ``import rapidfire_nb`` (any of its modules, a worker's included) installs it.
"""

from __future__ import annotations

import logging

__all__ = ["HUB_KERNEL_LINE", "hide_hub_kernel_line"]

HUB_KERNEL_LINE = "Failed to load CPU gemm_4bit_forward from kernels-community"
"""The start of the line bitsandbytes (0.50) logs on a CPU when its optional Hub kernel cannot be loaded."""

_LOGGER = "bitsandbytes.backends.cpu.ops"  # the logger bitsandbytes 0.50 writes it to


class _HubKernelLine(logging.Filter):
    """Drops bitsandbytes' "Failed to load CPU gemm_4bit_forward from kernels-community" line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(HUB_KERNEL_LINE)


def hide_hub_kernel_line() -> None:
    """Put the filter on bitsandbytes' logger (idempotent; the logger need not exist yet)."""
    logger = logging.getLogger(_LOGGER)
    if not any(isinstance(f, _HubKernelLine) for f in logger.filters):
        logger.addFilter(_HubKernelLine())
