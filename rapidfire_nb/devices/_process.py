"""The worker process itself: started as a fresh interpreter, its exit explained, ended (no torch)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import Pipe
from multiprocessing.connection import Connection

__all__ = ["end_process", "exit_reason", "start_process"]

_BOOT = "import sys; sys.path[:0] = {path!r}; from rapidfire_nb.devices._child import main; main()"


_SPAWNER: ThreadPoolExecutor | None = None
_SPAWNER_LOCK = threading.Lock()


def start_process(env: Mapping[str, str]) -> tuple[subprocess.Popen[bytes], Connection]:
    """Start ``python -c <boot>`` running :func:`rapidfire_nb.devices._child.main` with this process' ``sys.path``
    and ``env`` on top of its environment; the kernel's end of the pipe (the other end is the child's only
    inherited descriptor besides stdin/stdout/stderr).

    Not ``multiprocessing``'s spawn: that re-runs a script's ``__main__`` module in the child. The child is
    started from one long-lived thread of this process (``rapidfire-spawner``): Linux delivers the child's
    ``PR_SET_PDEATHSIG`` when the *thread* that started it exits, so a ``run_fit`` called from a short-lived thread
    must not take its workers down when that thread ends."""
    global _SPAWNER
    with _SPAWNER_LOCK:
        if _SPAWNER is None:
            _SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rapidfire-spawner")
    return _SPAWNER.submit(_start, dict(env)).result()


def _start(env: Mapping[str, str]) -> tuple[subprocess.Popen[bytes], Connection]:
    ours, theirs = Pipe()
    full = {**os.environ, **env, "RAPIDFIRE_PARENT_PID": str(os.getpid())}
    full["RAPIDFIRE_WORKER_FD"] = str(theirs.fileno())
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT.format(path=[p for p in sys.path if p])],
            pass_fds=(theirs.fileno(),),
            env=full,
            close_fds=True,
        )
    finally:
        theirs.close()
    return proc, ours


def exit_reason(proc: subprocess.Popen[bytes], wait_s: float = 5.0) -> str:
    """How the process ended, for messages: ``"killed by signal 9 (SIGKILL; ...)"``, ``"exited with status 1"``
    (waits up to ``wait_s`` seconds for it to exit; one that does not is killed)."""
    try:
        code = proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        end_process(proc)
        return "closed its connection (killed)"
    if code < 0:
        sig = -code
        name = signal.Signals(sig).name if sig in signal.valid_signals() else "?"
        hint = "; out of memory, or killed by hand" if sig == signal.SIGKILL else ""
        return f"killed by signal {sig} ({name}{hint})"
    return f"exited with status {code}"


def end_process(proc: subprocess.Popen[bytes], grace_s: float = 0.0) -> None:
    """End the process (and reap it): wait ``grace_s`` seconds, then SIGTERM, then SIGKILL, 5 s after each."""
    for step in (None, proc.terminate, proc.kill):
        if step is not None:
            try:
                step()
            except OSError:
                pass
        try:
            proc.wait(grace_s if step is None else 5.0)
            return
        except subprocess.TimeoutExpired:
            continue
