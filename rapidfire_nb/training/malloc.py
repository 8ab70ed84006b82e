"""glibc malloc settings for one process that trains many runs in turns, each in its own thread (Linux only).

Measured on the tiny model, 8 LoRA runs x 8 chunks x 3 epochs with an eval set (``benchmarks/memory.py``):

* Per-thread arenas: each run's worker thread would keep its own pool at its peak size (SmolLM2: 4 runs +771 MB
  over 1 run; +368 MB with 2 arenas) — capped at 2 arenas.
* glibc's *dynamic* mmap threshold: once a large block (an eval's logits, a batch of activations) that was
  mmapped is freed, the threshold rises to its size (up to 32 MB), so later blocks of that size come from the
  arenas' heaps; each run's thread frees them in its own pattern, the heaps fragment and keep the freed pages
  (``mallinfo2``'s free-but-kept bytes grew 17 -> 38 MB, RSS +6.7 MB over 23 rounds after the eval dataloaders
  were released). A fixed threshold of 1 MB (and trimming above 2 MB of free top) kept RSS flat (+0.4 MB over
  28 rounds, free-but-kept ~4 MB).

A setting the user gave through the environment (``MALLOC_ARENA_MAX``, ``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_``, ``GLIBC_TUNABLES``) is left alone.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["ARENA_MAX", "MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune_malloc"]

ARENA_MAX = 2
MMAP_THRESHOLD = 1 << 20
"""Blocks of at least this many bytes are mmapped, and unmapped when freed (fixed: no dynamic threshold)."""
TRIM_THRESHOLD = 2 << 20
"""Free bytes at the top of a heap above which glibc returns them to the system."""

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
_done = False


def tune_malloc() -> None:
    """Apply the settings above once per process (no-op off glibc, or where the user set them)."""
    global _done
    if _done or not sys.platform.startswith("linux"):
        return
    _done = True
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    for env, tunable, option, value in (
        ("MALLOC_ARENA_MAX", "glibc.malloc.arena_max", _M_ARENA_MAX, ARENA_MAX),
        ("MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold", _M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        ("MALLOC_TRIM_THRESHOLD_", "glibc.malloc.trim_threshold", _M_TRIM_THRESHOLD, TRIM_THRESHOLD),
    ):
        if env in os.environ or tunable in tunables:
            continue
        try:
            libc.mallopt(option, value)
        except AttributeError:  # not glibc
            return
