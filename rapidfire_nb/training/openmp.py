"""Keep the device thread's OpenMP team at full speed: release the other threads' libgomp teams (Linux only).

Why: libgomp (the OpenMP runtime of PyTorch's CPU wheels) gives every OS thread that starts a parallel region a
team of its own and keeps it for the thread's lifetime. Its idle team threads spin at full speed only while the
process's OpenMP threads do not outnumber the CPUs (``gomp_managed_threads > gomp_available_cpus`` switches every
team to a throttled spin of about 1,000 iterations, then a futex sleep; libgomp's ``config/linux/wait.h``). In a
notebook the kernel's main thread has run torch code before ``run_fit`` (a cell that loaded or inspected a model,
one matrix product is enough), so its team lives on beside the device thread's, and every step of every run
waited on futex wake-ups. Measured on 2 cores (tiny model, 4 LoRA configs x 32 steps): one 512x512 product on
the main thread before ``run_fit`` made training 1.35-1.55x slower; plain TRL in a thread after the same product
took 2.5x as long per step as on the main thread.

The fix is the runtime's own call, OpenMP 5.0's ``omp_pause_resource_all(omp_pause_soft)``: in libgomp it frees
the *calling* thread's team (``gomp_pause_host``: its threads exit and ``gomp_managed_threads`` drops) and
touches no other thread's; the next parallel region on that thread builds a new team (a thread start, about
0.1 ms). ``run_fit``, ``wait()``, the experiment's status reads that a polling loop calls (``training``,
``run_snapshots()``, ``get_runs_info()``, ``get_results()``) and, in IPython, the end of every execution while an
experiment trains call :func:`release_thread_team` on the calling thread. The device thread itself is exempt
(:func:`keep_team_on_this_thread`). Other runtimes (LLVM's ``libomp``, Intel's ``libiomp5``) are left alone:
untested here, and their pause is not specified as per-thread.

Standard library only (ctypes); no torch import.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading

__all__ = ["OMP_PAUSE_SOFT", "keep_team_on_this_thread", "loaded_libgomp", "release_thread_team"]

log = logging.getLogger(__name__)

OMP_PAUSE_SOFT = 1
"""``omp_pause_soft`` of OpenMP 5.0's ``omp_pause_resource_t`` (``omp.h``)."""

_MAPS = "/proc/self/maps"
_lock = threading.Lock()
_pause_fns: dict[str, object] = {}  # path -> the omp_pause_resource_all of that mapped copy (None: not found)
_kept: set[int] = set()  # idents of threads whose team stays (the device threads)
_scan: list[object] = [-1, []]  # [len(sys.modules) at the last /proc/self/maps scan, the libgomp paths found]


def keep_team_on_this_thread(keep: bool = True) -> None:
    """Exempt the calling thread from :func:`release_thread_team` (a device thread: its team is the one to keep).

    Args:
        keep: False ends the exemption (the thread is about to exit; its ident may be reused).
    """
    with _lock:
        (_kept.add if keep else _kept.discard)(threading.get_ident())


def _libgomp_paths() -> list[str]:
    """:func:`loaded_libgomp`, scanned again only after an import (a new module may map another copy)."""
    modules = len(sys.modules)
    with _lock:
        if _scan[0] == modules:
            return list(_scan[1])  # type: ignore[call-overload]
    paths = loaded_libgomp()
    with _lock:
        _scan[0], _scan[1] = modules, paths
    return paths


def loaded_libgomp(maps_text: str | None = None) -> list[str]:
    """Paths of the libgomp copies mapped into this process (several wheels may each bundle one).

    Args:
        maps_text: the text of ``/proc/self/maps`` (read when None; tests pass their own).

    Returns:
        Distinct paths, in the order they first appear; empty off Linux or when none is loaded.
    """
    if maps_text is None:
        try:
            with open(_MAPS, encoding="utf-8", errors="replace") as fh:
                maps_text = fh.read()
        except OSError:
            return []
    paths: list[str] = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5].strip()
        name = os.path.basename(path)
        if name.startswith("libgomp") and ".so" in name and path not in paths:
            paths.append(path)
    return paths


def _pause_fn(path: str) -> object:
    with _lock:
        if path not in _pause_fns:
            fn = None
            try:
                fn = ctypes.CDLL(path).omp_pause_resource_all  # the loaded copy: dlopen returns its handle
                fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
            except (OSError, AttributeError):  # an old libgomp (< GCC 9) has no pause routine
                fn = None
            _pause_fns[path] = fn
        return _pause_fns[path]


def release_thread_team() -> int:
    """Free the calling thread's libgomp team(s), so that the device thread's team spins unthrottled.

    Safe to call at any time outside a parallel region (Python code never runs inside one): a thread without a
    team is left as it is, and its next torch op on CPU builds a new team. A thread marked with
    :func:`keep_team_on_this_thread` is left alone. Cost: a few microseconds once the libgomp copies are known
    (``/proc/self/maps`` is read again only after new imports, about 1 ms).

    Returns:
        How many libgomp copies accepted the call (0 off Linux, without libgomp, on a kept thread, or when every
        call failed).
    """
    if not sys.platform.startswith("linux") or threading.get_ident() in _kept:
        return 0
    done = 0
    for path in _libgomp_paths():
        fn = _pause_fn(path)
        if fn is None:
            continue
        try:
            rc = fn(OMP_PAUSE_SOFT)  # type: ignore[operator]
        except Exception:  # noqa: BLE001 - a runtime that misbehaves is left alone
            log.debug("omp_pause_resource_all failed in %s", path, exc_info=True)
            continue
        done += rc == 0
    return done
