"""The worker process' entry point: serves one :class:`~rapidfire_nb.training.host.WorkerHost` over a pipe.

Started by :class:`~rapidfire_nb.devices.local.WorkerExecutor` as a fresh interpreter
(``python -c "...; main()"``) with the pipe's end as an inherited file descriptor (``RAPIDFIRE_WORKER_FD``).
Protocol (pickled tuples, one per message):

* kernel -> worker: first ``("start", settings without create_model_fn, create_model_fn as shipped bytes)``,
  then ``(request id, method, shipped argument tuple)``; ``ordered`` (request id None) is handled at once, in
  arrival order, every other method on its own thread (a segment blocks for its length).
* worker -> kernel: ``("ready", pid)`` or ``("start_error", "config"|"lost", text)``; ``("event", tuple)``;
  ``("reply", id, value)`` or ``("error", id, kind, type name, message, traceback)``.

The process dies with the kernel: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` on Linux, and it exits when the pipe
reaches end of file.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import traceback
from typing import Any

__all__ = ["main"]

_PR_SET_PDEATHSIG = 1
_SIGKILL = 9


def _die_with_parent(parent_pid: int) -> None:
    """Linux: the kernel SIGKILLs this process when the thread that started it exits (or the whole parent)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
        except (
            OSError,
            AttributeError,
        ):  # pragma: no cover - no prctl: end of file on the pipe still ends us
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def main() -> None:
    """Run the worker until the kernel says ``close`` or the pipe ends; never returns (``os._exit``)."""
    from multiprocessing.connection import Connection

    _die_with_parent(int(os.environ["RAPIDFIRE_PARENT_PID"]))
    conn = Connection(int(os.environ.pop("RAPIDFIRE_WORKER_FD")))
    lock = threading.Lock()

    def send(msg: tuple[Any, ...]) -> None:
        try:
            data = pickle.dumps(msg)
        except Exception as exc:  # an unpicklable reply value: say so instead
            if msg[0] != "reply":
                raise
            data = pickle.dumps(
                ("error", msg[1], "other", type(exc).__name__, f"reply not picklable: {exc}", "")
            )
        with lock:
            conn.send_bytes(data)

    try:
        host = _start(conn, send)
        if host is not None:
            _serve(conn, host, send)
    except (EOFError, OSError):
        pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _start(conn: Any, send: Any) -> Any:
    import cloudpickle

    _, settings, fn_bytes = cloudpickle.loads(conn.recv_bytes())
    os.environ.update(settings.env)
    try:
        create_model_fn = cloudpickle.loads(fn_bytes)
    except Exception as exc:
        send(
            (
                "start_error",
                "config",
                _unloadable(f"create_model_fn could not be loaded in worker {settings.device}", exc),
            )
        )
        return None
    try:
        import torch

        if settings.torch_threads:
            torch.set_num_threads(int(settings.torch_threads))
        from rapidfire_nb.training.host import WorkerHost

        host = WorkerHost(settings.with_model_fn(create_model_fn), lambda ev: send(("event", ev)))
    except Exception:
        send(("start_error", "lost", f"worker {settings.device} failed to start:\n{traceback.format_exc()}"))
        return None
    from rapidfire_nb.training.openmp import release_thread_team

    release_thread_team()  # this thread's OpenMP team would throttle the device thread's (training/openmp.py)
    send(("ready", os.getpid()))
    return host


def _unloadable(what: str, exc: BaseException) -> str:
    return (
        f"{what}: {type(exc).__name__}: {exc}; define it in the notebook (or a module the worker can import: "
        "sys.path is the kernel's)"
    )


def _serve(conn: Any, host: Any, send: Any) -> None:
    import cloudpickle

    while True:
        req_id, method, payload = pickle.loads(conn.recv_bytes())
        try:
            args = cloudpickle.loads(payload)
        except Exception as exc:
            send(
                (
                    "error",
                    req_id,
                    "config",
                    "ConfigError",
                    _unloadable(f"{method}'s arguments could not be loaded", exc),
                    "",
                )
            )
            continue
        if method == "ordered":
            host.ordered(*args)
        elif method == "close":
            _answer(host, req_id, method, args, send)
            return
        else:
            threading.Thread(
                target=_answer,
                args=(host, req_id, method, args, send),
                name=f"rapidfire-{method}",
                daemon=True,
            ).start()


def _answer(host: Any, req_id: int, method: str, args: tuple[Any, ...], send: Any) -> None:
    from rapidfire_nb.errors import ConfigError, StorageError

    try:
        value = getattr(host, method)(*args)
    except ConfigError as exc:
        send(("error", req_id, "config", "ConfigError", str(exc), ""))
    except StorageError as exc:
        send(("error", req_id, "storage", exc.where, exc.reason, ""))
    except BaseException as exc:
        send(("error", req_id, "other", type(exc).__name__, str(exc), traceback.format_exc()))
    else:
        send(("reply", req_id, value))
