"""Silence the libraries' per-step progress bars and chatter while rapidfire_nb drives them."""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator

from rapidfire_nb._quiet_logs import hide_hub_kernel_line

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
    hide_hub_kernel_line()  # also done by ``import rapidfire_nb`` (rapidfire_nb/_quiet_logs.py)
    # transformers warns about its own internal call on every forward of a PEFT model during training
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Context in which building trainers prints nothing but real warnings."""
    silence_globally()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module="trl")
        warnings.filterwarnings("ignore", category=UserWarning, module="transformers")
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield
