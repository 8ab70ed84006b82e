"""Ray actors as devices: ``run_fit(..., backend="ray")`` (torch-free here; Ray is an optional extra).

Each device is one actor hosting a :class:`~rapidfire_nb.training.host.WorkerHost` (the same worker-side object
a local worker process serves), placed on its own bundle of one placement group: ``{"GPU": 1, "CPU": threads}``
per GPU device, ``{"CPU": threads}`` per CPU device, strategy ``PACK`` (Ray puts the bundles on any nodes that
have room). Calls are actor method calls; the actor is threaded (``max_concurrency``), so a segment trains while
the kernel asks for another run's boundary or drains the actor's events. Events (metrics, notes, order tokens)
are pulled by one thread per actor in the kernel (``drain``, at most ~0.2 s apart while training), so the panel
lags the worker by a fraction of a second. An actor that dies (its node lost, killed, out of memory) is a lost
device: its segment's Future resolves with ``device_lost=True``, later calls raise
:class:`~rapidfire_nb.devices.errors.WorkerLost`.

``ray.init`` is the user's: an existing cluster (``ray.init(address="auto")``) or, when Ray is not initialised,
a local one started here with this machine's CPUs and GPUs. Every node needs rapidfire_nb and the user's imports
installed; the datasets and checkpoints are in the experiment folder, which every node must see at the same path
(a shared file system) — on one machine it always does.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from kernel_scheduler import RunStart, SegmentResult

from ..errors import ConfigError, StorageError
from .errors import WorkerLost
from .settings import WorkerSettings
from .shipping import ship

__all__ = ["RayWorkerExecutor", "placement_group_for"]

log = logging.getLogger(__name__)

_ACTOR_CONCURRENCY = 8  # a segment, a drain, an export and a few quick calls at once


class _Actor:
    """The actor's body (made a Ray actor class on first use, so that importing this module needs no Ray)."""

    def __init__(self, settings: WorkerSettings, fn_bytes: bytes) -> None:
        import dataclasses
        import queue

        import cloudpickle

        os.environ.update({k: v for k, v in settings.env.items() if k != "CUDA_VISIBLE_DEVICES" or v})
        import torch

        if settings.torch_threads:
            torch.set_num_threads(int(settings.torch_threads))
        from rapidfire_nb.training.host import WorkerHost

        self._events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        fn = cloudpickle.loads(fn_bytes)
        self._host = WorkerHost(dataclasses.replace(settings, create_model_fn=fn), self._events.put)

    def ready(self) -> int:
        return os.getpid()

    def call(self, method: str, payload: bytes) -> Any:
        import cloudpickle

        from rapidfire_nb.errors import ConfigError as _ConfigError
        from rapidfire_nb.errors import StorageError as _StorageError

        args = cloudpickle.loads(payload)
        try:
            return ("ok", getattr(self._host, method)(*args))
        except _ConfigError as exc:
            return ("config", str(exc))
        except _StorageError as exc:
            return ("storage", (exc.where, exc.reason))
        except Exception as exc:
            import traceback

            return ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())

    def segment(self, key: int, run_id: int, stop_step: int) -> None:
        """Train a segment; its result goes out as the event ``("segment", key, result)``, after every event
        the segment emitted (so the kernel has recorded its metrics when the scheduler sees the result)."""
        self._events.put(("segment", key, self.call("run_segment", _dumps((run_id, stop_step)))))

    def drain(self, wait_s: float) -> list[tuple[Any, ...]]:
        """The events emitted since the last drain (waits up to ``wait_s`` seconds for the first)."""
        import queue

        out = []
        try:
            out.append(self._events.get(timeout=wait_s))
            while True:
                out.append(self._events.get_nowait())
        except queue.Empty:
            pass
        return out

    def ordered(self, token: int) -> None:
        self._host.ordered(token)


def _dumps(value: Any) -> bytes:
    import cloudpickle

    return bytes(cloudpickle.dumps(value))


_ACTOR_CLASS: Any = None


def _actor_class() -> Any:
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        import ray

        _ACTOR_CLASS = ray.remote(max_concurrency=_ACTOR_CONCURRENCY)(_Actor)
    return _ACTOR_CLASS


def _ensure_ray() -> Any:
    try:
        import ray
    except ImportError as exc:  # checked by run_fit already; kept for direct use
        raise ConfigError('backend="ray" needs Ray: pip install "rapidfire_nb[ray]"') from exc
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    return ray


def placement_group_for(gpus: list[bool], threads: int, timeout_s: float = 120.0) -> Any:
    """One placement group with a bundle per device (``{"GPU": 1, "CPU": threads}`` or ``{"CPU": threads}``).

    Raises:
        ConfigError: the cluster cannot hold the bundles within ``timeout_s`` seconds (too few GPUs or CPUs).
    """
    ray = _ensure_ray()
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles = [{"GPU": 1, "CPU": threads} if gpu else {"CPU": threads} for gpu in gpus]
    group = placement_group(bundles, strategy="PACK")
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except Exception as exc:
        remove_placement_group(group)
        raise ConfigError(
            f"the Ray cluster cannot place {len(bundles)} device(s) of {bundles[0]} within {timeout_s:g} s "
            f"(it has {ray.cluster_resources()}); use fewer devices or fewer threads"
        ) from exc
    return group


class RayWorkerExecutor:
    """One device as a Ray actor; the same methods as :class:`~rapidfire_nb.devices.local.WorkerExecutor`.

    Args:
        settings: the device's worker settings (datasets already shared in the experiment folder).
        group, index: the placement group and this device's bundle index in it.
        metric_sink, notes, on_final, on_storage_error, in_record_order, on_eval_metrics: as ``TorchExecutor``'s
            (called on this device's drain thread).

    Raises:
        ConfigError: ``create_model_fn`` cannot be shipped.
    """

    def __init__(
        self,
        settings: WorkerSettings,
        group: Any,
        index: int,
        metric_sink: Callable[[int, int, int, dict[str, float]], None],
        notes: Callable[[str], None] | None = None,
        on_final: Callable[[int, Path], None] | None = None,
        on_storage_error: Callable[[StorageError], None] | None = None,
        in_record_order: Callable[[Callable[[], None]], None] | None = None,
        on_eval_metrics: Callable[[list[str]], None] | None = None,
    ) -> None:
        import dataclasses

        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        fn_bytes = ship(settings.create_model_fn, "create_model_fn")
        self.device = settings.device
        self._sinks: dict[str, Callable[..., None]] = {
            "metrics": metric_sink,
            "note": notes or (lambda text: None),
            "final": lambda rid, path: (on_final or (lambda r, p: None))(rid, Path(path)),
            "storage_error": lambda where, reason: (on_storage_error or log.error)(
                StorageError(where, reason)
            ),
            "eval_metrics": on_eval_metrics or (lambda names: None),
        }
        self._in_record_order = in_record_order or (lambda fn: fn())
        self._death: str | None = None
        self._closing = False
        self._positions: dict[int, tuple[int, int]] = {}
        self._segments: dict[int, tuple[Future[SegmentResult], int]] = {}  # key -> (Future, run id)
        self._next_key = 0
        self._lock = threading.Lock()
        env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        env.update({k: v for k, v in settings.env.items() if k != "CUDA_VISIBLE_DEVICES" or v})
        self._actor = (
            _actor_class()
            .options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=group, placement_group_bundle_index=index
                ),
                num_cpus=group.bundle_specs[index].get("CPU", 1),
                num_gpus=group.bundle_specs[index].get("GPU", 0),
                runtime_env={"env_vars": env},
                name=None,
            )
            .remote(dataclasses.replace(settings, create_model_fn=None), fn_bytes)
        )
        self._started = self._actor.ready.remote()
        self._drainer = threading.Thread(target=self._drain, name=f"rapidfire-ray-{self.device}", daemon=True)
        self._drainer.start()

    # ------------------------------------------------------------------ devices
    @property
    def devices(self) -> tuple[str, ...]:
        return (self.device,)

    def device_of(self, run_id: int) -> str:
        return self.device

    def alive(self, device: str | None = None) -> bool:
        return self._death is None

    # ------------------------------------------------------------------ calls
    def add_run(
        self, run_id: int, spec: Any, warm_from: int | None = None, resume_from: str | Path | None = None
    ) -> RunStart:
        args = (run_id, spec, warm_from, str(resume_from) if resume_from is not None else None)
        start: RunStart = self._call("add_run", ship(args, f"run {run_id}'s config"))
        with self._lock:
            self._positions[run_id] = (start.step, start.samples_seen)
        return start

    def run_segment(self, run_id: int, stop_step: int) -> Future[SegmentResult]:
        out: Future[SegmentResult] = Future()
        if self._death is not None:
            out.set_result(self._lost_segment(run_id, self._death))
            return out
        with self._lock:
            key = self._next_key = self._next_key + 1
            self._segments[key] = (out, run_id)
        ref = self._actor.segment.remote(key, run_id, stop_step)

        def died(fut: Future[Any]) -> None:
            exc = fut.exception()
            if exc is not None:  # the actor died (RayActorError): the result event will never come
                self._settle(key, None, self._died(exc))

        ref.future().add_done_callback(died)
        return out

    def _settle(self, key: int, reply: Any, death: str | None = None) -> None:
        with self._lock:
            entry = self._segments.pop(key, None)
        if entry is None:
            return
        out, run_id = entry
        if death is not None:
            out.set_result(self._lost_segment(run_id, death))
            return
        kind, *rest = reply
        if kind == "ok":
            res: SegmentResult = rest[0]
            with self._lock:
                self._positions[run_id] = (res.step, res.samples_seen)
            out.set_result(res)
        else:
            step, seen = self._positions.get(run_id, (0, 0))
            out.set_result(SegmentResult(step, seen, error=str(rest[0])))

    def has_run(self, run_id: int) -> bool:
        return bool(self._call("has_run", ship((run_id,), "has_run")))

    def has_boundary(self, run_id: int) -> bool:
        return bool(self._call("has_boundary", ship((run_id,), "has_boundary")))

    def on_status(self, run_id: int, status: str) -> None:
        self._call("on_status", ship((run_id, status), "on_status"))

    def flush(self) -> None:
        self._call("flush", ship((), "flush"))

    def checkpoint_dir(self, run_id: int) -> Path | None:
        found = self._call("checkpoint_dir", ship((run_id,), "checkpoint_dir"))
        return Path(found) if found is not None else None

    def final_dir(self, run_id: int) -> Path | None:
        found = self._call("final_dir", ship((run_id,), "final_dir"))
        return Path(found) if found is not None else None

    def save_final(self, run_id: int) -> Path:
        return Path(self._call("save_final", ship((run_id,), "save_final")))

    def export_boundary(self, run_id: int) -> Path:
        return Path(self._call("export_boundary", ship((run_id,), "export_boundary")))

    def drop_run(self, run_id: int) -> None:
        self._call("drop_run", ship((run_id,), "drop_run"))

    def close(self) -> None:
        """Close the host (queued checkpoints written), then end the actor. Never raises."""
        if self._closing:
            return
        self._closing = True
        import ray

        if self._death is None:
            try:
                self._call("close", ship((), "close"))
            except Exception as exc:
                log.warning("rapidfire_nb: closing Ray worker %s: %s", self.device, exc)
        self._death = self._death or f"Ray worker {self.device} was closed"
        try:
            ray.kill(self._actor)
        except Exception:
            pass
        self._drainer.join(5.0)

    # ------------------------------------------------------------------ internals
    def _call(self, method: str, payload: bytes) -> Any:
        import ray

        if self._death is not None:
            raise WorkerLost(self._death)
        try:
            ray.get(self._started)
            kind, *rest = ray.get(self._actor.call.remote(method, payload))
        except Exception as exc:
            raise WorkerLost(self._died(exc)) from exc
        if kind == "ok":
            return rest[0]
        if kind == "config":
            raise ConfigError(rest[0])
        if kind == "storage":
            raise StorageError(*rest[0])
        error = RuntimeError(f"in Ray worker {self.device}: {rest[0]}")
        error.add_note(f"worker traceback:\n{rest[1]}")
        raise error

    def _died(self, exc: BaseException) -> str:
        with self._lock:
            if self._death is None:
                self._death = (
                    f"Ray worker {self.device} died: {type(exc).__name__}: {str(exc).splitlines()[0]}"
                )
            return self._death

    def _lost_segment(self, run_id: int, text: str) -> SegmentResult:
        step, seen = self._positions.get(run_id, (0, 0))
        return SegmentResult(step, seen, error=text, device_lost=True)

    def _drain(self) -> None:
        import ray

        try:
            ray.get(self._started)
        except Exception as exc:
            self._died(exc)
            return
        while self._death is None:
            try:
                events = ray.get(self._actor.drain.remote(0.2))
            except Exception as exc:
                if not self._closing:
                    death = self._died(exc)
                    with self._lock:
                        keys = list(self._segments)
                    for key in keys:
                        self._settle(key, None, death)
                return
            for event in events:
                try:
                    if event[0] == "segment":
                        self._settle(event[1], event[2])
                    elif event[0] == "order":
                        self._in_record_order(lambda token=event[1]: self._answer(token))
                    else:
                        self._sinks[event[0]](*event[1:])
                except Exception:
                    log.exception("rapidfire_nb: Ray worker %s: handling %s failed", self.device, event[0])

    def _answer(self, token: int) -> None:
        if self._death is None:
            try:
                self._actor.ordered.remote(token)
            except Exception:
                pass
