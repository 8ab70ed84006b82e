"""Making the executor of a ``run_fit`` that trains on worker processes or Ray actors (torch-free)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..spec.bundles import GroupSettings, TrainingCallbacks
from ._remote import RemoteDevice
from .backends import Placement, Transport
from .datasets import share_datasets
from .gang import GangExecutor, free_port, rank_env
from .pool import DevicePool, ModelLoader
from .resolve import DevicePlan
from .settings import WorkerSettings

__all__ = ["make_pool"]


def make_pool(
    plan: DevicePlan,
    group: GroupSettings,
    datasets: tuple[Any, Any],
    exp_dir: Path,
    callbacks: TrainingCallbacks,
    load_final_model: Callable[[Any, Any, Path], tuple[Any, Any]],
    say: Callable[[str], None],
) -> DevicePool:
    """One worker per device of ``plan``, behind a :class:`~rapidfire_nb.devices.pool.DevicePool`.

    The datasets are written once into ``<exp_dir>/datasets/`` (Arrow; the workers memory-map them), and
    ``create_model_fn`` is shipped to every worker with cloudpickle. The workers start in parallel (each imports
    torch and TRL: seconds); the first call to one waits for it.

    Args:
        plan: the devices (``run_fit(devices=..., backend=...)`` resolved).
        group: the config group's settings (every worker gets them; ``create_model_fn`` shipped apart).
        datasets: ``(train_dataset, eval_dataset or None)``, ``datasets.Dataset`` rows before formatting.
        exp_dir: the experiment folder.
        callbacks: the kernel's callbacks (as ``TorchExecutor`` takes them); a note every worker says reaches
            ``callbacks.notes`` once.
        load_final_model: ``(create_model_fn, spec, final_dir) -> (model, tokenizer)`` in the kernel process.
        say: a line for the user (which devices train).

    The plan's transport (:mod:`~rapidfire_nb.devices.backends`) reserves room for the workers and starts them:
    with ``backend="ray"`` the devices are actors on one placement group (one bundle per device, as many CPUs as
    torch threads: ``plan.threads``, at most the cluster's CPUs divided among the devices); the pool removes the
    group when it closed the actors (``DevicePool(on_closed=...)``).

    Raises:
        ConfigError: ``create_model_fn`` or a dataset cannot be sent to a worker (before anything trains), or the
            Ray cluster cannot hold the devices.
    """
    callbacks = dataclasses.replace(callbacks, notes=_once(callbacks.notes))  # every worker says the same
    train_path, eval_path = share_datasets(exp_dir, *datasets)
    transport = plan.transport
    placement = transport.place(plan.gpus, plan.threads)
    plan = dataclasses.replace(plan, threads=placement.threads)
    shared = WorkerSettings(
        device="",
        group=group,
        train_path=str(train_path),
        eval_path=str(eval_path) if eval_path is not None else None,
        exp_dir=str(exp_dir),
        torch_threads=plan.threads,
    )
    members = _members(plan, transport, shared, callbacks, placement)
    create = group.create_model_fn

    def load(spec: Any, final_dir: Path) -> tuple[Any, Any]:
        return load_final_model(create, spec, final_dir)

    loader: ModelLoader = load
    gangs = f"; gangs: {', '.join(name for name, _ in plan.gangs)}" if plan.gangs else ""
    say(
        f"training on {len(plan.names)} devices ({', '.join(plan.names)}; {plan.backend} workers, "
        f"{plan.threads} torch thread(s) each{gangs})"
    )
    return DevicePool(members, exp_dir, loader, placement.on_closed)


def _once(notes: Callable[[str], None]) -> Callable[[str], None]:
    """``notes``, saying each distinct text once (every worker says the same CPU adaptations)."""
    said: set[str] = set()

    def note_once(text: str) -> None:
        if text not in said:
            said.add(text)
            notes(text)

    return note_once


def _rank_starter(
    plan: DevicePlan,
    transport: Transport,
    shared: WorkerSettings,
    callbacks: TrainingCallbacks,
    placement: Placement,
    indices: tuple[int, ...],
) -> Callable[[], list[RemoteDevice]]:
    """What starts the ranks of the gang over devices ``indices`` (now, and again when it is revived): one worker
    each, with a fresh rendezvous port; rank 0 reports to ``callbacks``, the others to nobody (their metrics
    are rank 0's numbers: TRL gathers them)."""
    name = "+".join(plan.names[i] for i in indices)
    gpus = tuple(plan.gpus[i] if i < len(plan.gpus) else None for i in indices)

    def start() -> list[RemoteDevice]:
        port = free_port()
        ranks: list[tuple[WorkerSettings, TrainingCallbacks]] = []
        for rank, index in enumerate(indices):
            env = {**plan.env(index), **rank_env(rank, len(indices), port, gpus)}
            settings = dataclasses.replace(shared, device=f"{name} rank {rank}", env=env)
            ranks.append((settings, callbacks if rank == 0 else TrainingCallbacks()))
        return transport.start_gang(indices, ranks, placement)  # Ray: a placement group of its own

    return start


def _members(
    plan: DevicePlan,
    transport: Transport,
    shared: WorkerSettings,
    callbacks: TrainingCallbacks,
    placement: Placement,
) -> dict[str, RemoteDevice]:
    """One started worker per device (``shared`` with its name and environment; none when every run is a gang's)
    and a :class:`~.gang.GangExecutor` per composite device of :attr:`DevicePlan.gangs`; on a failure the ones
    started are closed (and the placement undone) before it is raised."""
    members: dict[str, Any] = {}
    try:
        for index, name in enumerate(plan.names if plan.singles else ()):
            settings = dataclasses.replace(shared, device=name, env=plan.env(index))
            members[name] = transport.start(index, settings, callbacks, placement)
        for name, indices in plan.gangs:
            members[name] = GangExecutor(
                name, _rank_starter(plan, transport, shared, callbacks, placement, indices)
            )
    except BaseException:
        for member in members.values():
            member.close()
        if placement.on_closed is not None:
            placement.on_closed()
        raise
    return members
