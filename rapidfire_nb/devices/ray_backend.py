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

``ray.init`` is the user's: an existing cluster (``ray.init(address="auto")``), a local one
(``ray.init(num_cpus=2)``) or, when Ray is not initialised, a local one started here with this machine's CPUs and
GPUs, its workers' output kept out of the notebook (``log_to_driver=False``: the actors' logs stay in Ray's
session folder, ``/tmp/ray/session_latest/logs``) and Ray's own log lines below WARNING dropped. A Ray started
here stays up after ``end()`` (the next ``run_fit`` reuses it; ``ray.shutdown()`` ends it, as does the
interpreter's exit). With a Ray of your own, pass ``log_to_driver=False`` too, or the workers' TRL and torch output
lands in the cell.

Every node needs rapidfire_nb and the user's imports installed (the actors get the kernel's ``sys.path`` as
``PYTHONPATH``); functions defined in the notebook travel by value (:func:`~rapidfire_nb.devices.shipping.ship`).
The datasets and checkpoints are in the experiment folder, which every node must see at the same path (a shared
file system) — on one machine it always does. Each bundle has as many CPUs as the device's torch threads, at most
the cluster's CPUs divided among the devices (:func:`fit_threads`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from kernel_scheduler import SegmentResult

from ..errors import ConfigError
from ..spec.bundles import TrainingCallbacks
from ._remote import RemoteDevice
from ._replies import event_sinks, remote_error
from .errors import WorkerLost
from .settings import WorkerSettings
from .shipping import ship

__all__ = [
    "RayWorkerExecutor",
    "actor_env",
    "check_room",
    "fit_threads",
    "placement_group_for",
    "remove_placement_group",
]

log = logging.getLogger(__name__)

_ACTOR_CONCURRENCY = 8  # a segment, a drain, an export and a few quick calls at once
_DRAIN_WAIT_S = 0.2  # the longest a drain waits in the actor for a first event


_ACTOR_CLASS: Any = None


def _actor_class() -> Any:
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        import ray

        # max_restarts=0 (Ray's default): a dead actor stays dead, its runs continue on the other devices
        remote: Any = ray.remote
        from ._ray_actor import Actor

        _ACTOR_CLASS = remote(max_concurrency=_ACTOR_CONCURRENCY)(Actor)
    return _ACTOR_CLASS


def _ensure_ray() -> Any:
    """The ``ray`` module, initialised: the user's Ray, or a local one started here (quiet: see the module).

    Raises:
        ConfigError: Ray is not installed.
    """
    try:
        import ray
    except ImportError as exc:  # checked by run_fit already; kept for direct use
        raise ConfigError('backend="ray" needs Ray: pip install "rapidfire_nb[ray]"') from exc
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    return ray


def fit_threads(devices: int, threads: int) -> int:
    """Torch threads (= CPUs of each device's bundle) for ``devices`` actors: ``threads``, at most the Ray
    cluster's CPUs divided among the devices (e.g. ``ray.init(num_cpus=2)``, 2 devices: 1 each).

    Raises:
        ConfigError: the cluster has fewer CPUs than ``devices`` (each actor needs one).
    """
    ray = _ensure_ray()
    cpus = int(ray.cluster_resources().get("CPU", 0))
    if cpus < devices:
        raise ConfigError(
            f"the Ray cluster has {cpus} CPU(s), too few for {devices} device(s) (one CPU each at least); use "
            f"devices={max(1, cpus)} or fewer, or a Ray with more CPUs (ray.init(num_cpus=...))"
        )
    return max(1, min(int(threads), cpus // devices))


def _bundles(gpus: list[bool] | tuple[bool, ...], threads: int) -> list[dict[str, float]]:
    return [{"GPU": 1, "CPU": threads} if gpu else {"CPU": threads} for gpu in gpus]


def check_room(gpus: list[bool] | tuple[bool, ...], threads: int) -> None:
    """Refuse devices the whole Ray cluster could never hold (reserves nothing).

    Args:
        gpus: one entry per device, True for a GPU device. threads: CPUs per device.

    Raises:
        ConfigError: the cluster has fewer GPUs or CPUs in all than the devices' bundles ask for.
    """
    ray = _ensure_ray()
    bundles = _bundles(gpus, threads)
    have = ray.cluster_resources()
    wanted = {"GPU": float(sum(gpus)), "CPU": float(threads * len(gpus))}
    short = [k for k, v in wanted.items() if v > float(have.get(k, 0))]
    if short:
        raise ConfigError(
            f"the Ray cluster cannot hold {len(bundles)} device(s) of {bundles[0]}: it has "
            f"{', '.join(f'{float(have.get(k, 0)):g} {k}' for k in short)}; use fewer devices"
        )


def placement_group_for(
    gpus: list[bool], threads: int, timeout_s: float = 120.0, strategy: str = "PACK"
) -> Any:
    """One placement group with a bundle per device (``{"GPU": 1, "CPU": threads}`` or ``{"CPU": threads}``),
    ready (its resources reserved) when returned. Remove it with :func:`remove_placement_group`.

    Args:
        gpus: one entry per device, True for a GPU device.
        threads: CPUs per bundle (the device's torch threads: :func:`fit_threads`).
        timeout_s: seconds to wait for the cluster to reserve the bundles.
        strategy: Ray's placement strategy: ``"PACK"`` (the single devices: any nodes with room) or
            ``"STRICT_PACK"`` (a gang: every bundle on one node).

    Raises:
        ConfigError: the cluster has fewer GPUs than asked for, or cannot reserve the bundles within
            ``timeout_s`` seconds (other jobs hold the resources, or no node holds a STRICT_PACK group); the
            group is removed again.
    """
    check_room(gpus, threads)
    ray = _ensure_ray()
    from ray.util.placement_group import placement_group

    bundles = _bundles(gpus, threads)
    group = placement_group(bundles, strategy=strategy)
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except Exception as exc:
        remove_placement_group(group)
        raise ConfigError(
            f"the Ray cluster could not reserve {len(bundles)} device(s) of {bundles[0]} ({strategy}) within "
            f"{timeout_s:g} s "
            f"(available now: {ray.available_resources()}); use fewer devices or free the cluster"
        ) from exc
    return group


def remove_placement_group(group: Any) -> None:
    """Remove ``group`` (its bundles' resources go back to the cluster). Never raises (logs a warning)."""
    try:
        from ray.util.placement_group import remove_placement_group as remove

        remove(group)
    except Exception as exc:
        log.warning("rapidfire_nb: removing the Ray placement group: %s", exc)


def actor_env(settings: WorkerSettings, gpu: bool) -> dict[str, str]:
    """The environment of a device's actor: the kernel's ``sys.path`` as ``PYTHONPATH`` and the device's
    settings, except ``CUDA_VISIBLE_DEVICES`` of a GPU device (Ray sets it to the GPU of the bundle: the kernel's
    index means nothing on another node); ``""`` on a CPU device, so that it never touches a GPU."""
    env = {k: v for k, v in settings.env.items() if k != "CUDA_VISIBLE_DEVICES"}
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


class RayWorkerExecutor(RemoteDevice):
    """One device as a Ray actor; the same methods as :class:`~rapidfire_nb.devices.local.WorkerExecutor`.

    Args:
        settings: the device's worker settings (datasets already shared in the experiment folder).
        placement_group, bundle_index: the placement group made by :func:`placement_group_for` and this device's
            bundle in it.
        callbacks: the kernel's :class:`~rapidfire_nb.spec.bundles.TrainingCallbacks`, called on this device's
            drain thread (``rapidfire-ray-<device>``).
        start_timeout_s: seconds the actor may take to start (a Ray worker process, torch and TRL imported, the
            datasets opened) before the first call gives up (WorkerLost).
        call_timeout_s: seconds :meth:`close` waits for the actor to write its queued checkpoints.
        on_closed: called once after :meth:`close` killed the actor (a gang's rank: the last one removes the
            gang's placement group, :mod:`~rapidfire_nb.devices.ray_gangs`); None: nothing.

    Raises:
        ConfigError: ``create_model_fn`` cannot be shipped.
    """

    def __init__(
        self,
        settings: WorkerSettings,
        placement_group: Any,
        bundle_index: int,
        callbacks: TrainingCallbacks,
        start_timeout_s: float = 300.0,
        call_timeout_s: float = 60.0,
        on_closed: Callable[[], None] | None = None,
    ) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        fn_bytes = ship(settings.create_model_fn, "create_model_fn")
        self.device = settings.device
        self._sinks = event_sinks(callbacks)
        self._in_record_order = callbacks.in_record_order
        self._start_timeout_s = start_timeout_s
        self._call_timeout_s = call_timeout_s
        self._death: str | None = None
        self._closing = False
        self._on_closed = on_closed
        self._stop = threading.Event()
        self._positions: dict[int, tuple[int, int]] = {}
        self._segments: dict[int, tuple[Future[SegmentResult], int]] = {}  # key -> (Future, run id)
        self._outstanding: set[int] = set()  # order tokens not answered yet
        self._next_key = 0
        self._lock = threading.Lock()
        self._ready: Future[int] = Future()
        bundle: Mapping[str, float] = placement_group.bundle_specs[bundle_index]
        env = actor_env(settings, gpu=bool(bundle.get("GPU", 0)))
        self._actor = (
            _actor_class()
            .options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=placement_group, placement_group_bundle_index=bundle_index
                ),
                num_cpus=bundle.get("CPU", 1),
                num_gpus=bundle.get("GPU", 0),
                runtime_env={"env_vars": env},
            )
            .remote(dataclasses.replace(settings.with_model_fn(None), env=env), fn_bytes)
        )
        self._started = self._actor.ready.remote()
        self._drainer = threading.Thread(target=self._drain, name=f"rapidfire-ray-{self.device}", daemon=True)
        self._drainer.start()

    # ------------------------------------------------------------------ devices
    @property
    def actor(self) -> Any:
        """The Ray actor handle (tests: ``ray.kill(executor.actor)`` is a lost device)."""
        return self._actor

    @property
    def pid(self) -> int:
        """The actor's worker process id (waits for the actor to start; WorkerLost if it did not)."""
        return self.wait_ready()

    def kill(self) -> None:
        """Kill the actor now (``ray.kill``): a gang's other ranks when one died
        (:class:`~rapidfire_nb.devices.gang.GangExecutor`). Its pending calls then resolve as for any death."""
        self._kill()

    def wait_ready(self) -> int:
        """Block until the actor started; its worker process' pid.

        Raises:
            ConfigError: ``create_model_fn`` could not be loaded in the actor.
            WorkerLost: the actor failed to start (the message holds its traceback), died, or took longer than
                ``start_timeout_s`` seconds (it is killed then).
        """
        try:  # the drain thread resolves it within start_timeout_s (this wait is a backstop)
            return self._ready.result(self._start_timeout_s + 30.0)
        except TimeoutError:
            text = f"Ray worker {self.device} did not start within {self._start_timeout_s:g} s"
            self._died_with(text)
            self._kill()
            raise WorkerLost(text) from None

    # ------------------------------------------------------------------ calls

    def run_segment(self, run_id: int, stop_step: int) -> Future[SegmentResult]:
        """Train until global step ``stop_step``; the Future resolves at the boundary, after the segment's events
        were handed to the callbacks (never with an exception: a death gives ``device_lost=True``)."""
        out: Future[SegmentResult] = Future()
        try:
            self.wait_ready()
        except (WorkerLost, ConfigError) as exc:
            out.set_result(self._lost_segment(run_id, str(exc)))
            return out
        with self._lock:
            death = self._death
            if death is None:
                key = self._next_key = self._next_key + 1
                self._segments[key] = (out, run_id)
        if death is not None:  # resolved outside the lock: the Future's callbacks may call back in
            out.set_result(self._lost_segment(run_id, death))
            return out
        ref = self._actor.segment.remote(key, run_id, stop_step)

        def died(fut: Future[Any]) -> None:
            exc = fut.exception()
            if exc is not None:  # the actor died (RayActorError): the result event will never come
                # not on Ray's callback thread: what the Future's callbacks do (a gang kills its other ranks with
                # ray.kill) would wait for that very thread
                threading.Thread(
                    target=lambda: self._settle(key, None, self._died(exc)),
                    name=f"rapidfire-ray-lost-{self.device}",
                    daemon=True,
                ).start()

        ref.future().add_done_callback(died)
        return out

    def close(self) -> None:
        """Close the host (queued checkpoints written; waits up to ``call_timeout_s`` seconds), hand its last
        events to the callbacks, then kill the actor, then call ``on_closed`` (the bundle stays: the pool's owner
        removes a single device's group; a gang's group goes with its last rank).

        Waits up to 10 s first for order tokens the kernel has not answered (their checkpoints are written only
        once answered). Never raises; a second call does nothing.
        """
        if self._closing:
            return
        import ray

        deadline = time.monotonic() + 10.0
        while self._outstanding and self._death is None and time.monotonic() < deadline:
            time.sleep(0.02)
        self._closing = True
        self._stop.set()
        started = self._ready.done() and self._ready.exception() is None
        if self._death is None and started:
            try:
                self._invoke("close", ship((), "close"), timeout_s=self._call_timeout_s)
            except Exception as exc:
                log.warning("rapidfire_nb: closing Ray worker %s: %s", self.device, exc)
            self._drainer.join(self._call_timeout_s)  # its last drain waits at most _DRAIN_WAIT_S
            if self._death is None:
                try:  # what the host emitted while closing (a failed checkpoint write...)
                    self._handle(ray.get(self._actor.drain.remote(0.0), timeout=self._call_timeout_s))
                except Exception as exc:
                    log.debug("rapidfire_nb: last drain of Ray worker %s: %s", self.device, exc)
        self._died_with(f"Ray worker {self.device} was closed")
        self._kill()  # a drain thread still waiting for the start sees the actor die and ends
        self._drainer.join(10.0)
        hook, self._on_closed = self._on_closed, None
        if hook is not None:
            hook()

    # ------------------------------------------------------------------ internals
    def _invoke(self, method: str, payload: bytes, timeout_s: float | None = None) -> Any:
        import ray

        self.wait_ready()
        if self._death is not None:
            raise WorkerLost(self._death)
        try:
            kind, *rest = ray.get(self._actor.call.remote(method, payload), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            raise WorkerLost(f"Ray worker {self.device}: {method} took longer than {timeout_s:g} s") from exc
        except Exception as exc:
            raise WorkerLost(self._died(exc)) from exc
        if kind == "ok":
            return rest[0]
        raise remote_error(f"{self.device} (Ray)", *rest)

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
        else:  # a refused segment (finished or unknown run): reported, not raised
            step, seen = self._positions.get(run_id, (0, 0))
            out.set_result(SegmentResult(step, seen, error=str(remote_error(f"{self.device} (Ray)", *rest))))

    def _died(self, exc: BaseException) -> str:
        first = (str(exc).strip().splitlines() or [""])[0]
        return self._died_with(f"Ray worker {self.device} died: {type(exc).__name__}: {first}")

    def _died_with(self, text: str) -> str:
        """Record the death (the first reason wins), resolve every segment in flight as lost; the reason."""
        with self._lock:
            if self._death is None:
                self._death = text
            death = self._death
            keys = list(self._segments)
        if not self._ready.done():
            self._ready.set_exception(WorkerLost(death))
        for key in keys:
            self._settle(key, None, death)
        return death

    def _kill(self) -> None:
        import ray

        try:
            ray.kill(self._actor, no_restart=True)
        except Exception as exc:  # already gone, or Ray shut down meanwhile
            log.debug("rapidfire_nb: killing Ray worker %s: %s", self.device, exc)

    def _drain(self) -> None:
        """The drain thread: wait for the actor, then pull its events until closed or dead."""
        import ray

        try:
            kind, value = ray.get(self._started, timeout=self._start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self._died_with(f"Ray worker {self.device} did not start within {self._start_timeout_s:g} s")
            self._kill()
            return
        except Exception as exc:  # the actor died while starting (its process killed, its node lost)
            self._died(exc)
            return
        if (
            kind != "ok"
        ):  # the host could not start: ConfigError (create_model_fn) or WorkerLost for every call
            text = str(value)
            if not self._ready.done():
                self._ready.set_exception(ConfigError(text) if kind == "config" else WorkerLost(text))
            self._died_with(text)
            self._kill()
            return
        if not self._ready.done():  # not given up on meanwhile (wait_ready's backstop)
            self._ready.set_result(int(value))
        while not self._stop.is_set() and self._death is None:
            try:
                events = ray.get(self._actor.drain.remote(_DRAIN_WAIT_S))
            except Exception as exc:
                if not self._closing:
                    self._died(exc)
                return
            self._handle(events)

    def _handle(self, events: list[tuple[Any, ...]]) -> None:
        for event in events:
            try:
                if event[0] == "segment":
                    self._settle(event[1], event[2])
                elif event[0] == "order":
                    self._outstanding.add(event[1])
                    self._in_record_order(functools.partial(self._answer, event[1]))
                else:
                    self._sinks[event[0]](*event[1:])
            except Exception:  # a failing callback never stops the drain
                log.exception("rapidfire_nb: Ray worker %s: handling %s failed", self.device, event[0])

    def _answer(self, token: int) -> None:
        """The kernel recorded what came before order ``token``: tell the actor."""
        self._outstanding.discard(token)
        if self._death is None:
            try:
                self._actor.ordered.remote(token)
            except Exception as exc:
                log.debug("rapidfire_nb: Ray worker %s: ordered(%s): %s", self.device, token, exc)
