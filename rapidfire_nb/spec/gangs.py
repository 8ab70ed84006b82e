"""Runs over several devices (gangs): each run's width, its sharding, the composite devices, refusals (pure).

A run's width is ``RFModelConfig(num_gpus=k)``, else ``run_fit(num_gpus=k)``, else 1 (:func:`with_run_fit_width`
writes ``run_fit``'s into the specs that leave it out, so the spec is the one place for it). A run of width k > 1
trains on a gang of k devices: sharded with PyTorch FSDP2 when its training args set ``fsdp``, else data-parallel
(DDP) (:func:`sharding_of`). The devices are tiled into fixed composite devices per width, named by joining the
parts with ``+`` (:func:`gang_tiles`: 4 devices, width 2 -> ``cpu:0+cpu:1`` and ``cpu:2+cpu:3``), which the
scheduler never trains at once with a device they share (:mod:`kernel_scheduler.gangs`).

Refused before anything is built (:func:`check_gangs`), each naming the field and the fix: a gang wider than the
devices, a gang with a trainer other than SFT, DPO or GRPO, DPO with a reference model of its own (full
fine-tuning, ``ref_model_name``: that model is not sharded yet; DPO LoRA's reference is the base with the adapter
disabled), GRPO full fine-tuning (proved over a gang for LoRA only: TRL would build its ``beta`` reference model
unsharded), FSDP over a quantized base, and ``fsdp_config.offload_params`` on CPU devices. A GRPO gang's ranks
generate in step (``generate(synced_gpus=True)``, :func:`rapidfire_nb.training.sharding.shard_model`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import ConfigError
from .fsdp import sharding_plan

__all__ = [
    "check_clone_width",
    "check_gangs",
    "check_run_gang",
    "gang_tiles",
    "refuse_dpo_reference",
    "refuse_grpo_full",
    "run_width",
    "sharding_of",
    "with_run_fit_width",
]

#: trainer types a gang trains (the others refuse before training)
GANG_TRAINERS = ("SFT", "DPO", "GRPO")


def run_width(spec: Any) -> int:
    """The devices run ``spec`` trains on at once (``spec.num_gpus``, 1 when None)."""
    return int(getattr(spec, "num_gpus", None) or 1)


def sharding_of(spec: Any) -> str | None:
    """``"fsdp"`` (width > 1 and ``fsdp`` set in the training args), ``"ddp"`` (width > 1 without it) or None."""
    if run_width(spec) < 2:
        return None
    return "fsdp" if _fsdp_set(spec) else "ddp"


def with_run_fit_width(specs: Iterable[Any], num_gpus: int | None) -> tuple[Any, ...]:
    """The specs, each leaving ``num_gpus`` out given ``run_fit``'s (when above 1; ``num_gpus=1`` is the
    default anyway and keeps the specs' fingerprints as recorded before gangs existed)."""
    import dataclasses

    out = tuple(specs)
    if num_gpus is None or num_gpus < 2:
        return out
    return tuple(s if s.num_gpus is not None else dataclasses.replace(s, num_gpus=num_gpus) for s in out)


def gang_tiles(names: Sequence[str], widths: Iterable[int]) -> list[tuple[str, tuple[int, ...]]]:
    """The composite devices for the gang ``widths`` in use over devices ``names``: per width k > 1 (ascending),
    consecutive non-overlapping groups of k devices; a remainder of fewer than k devices forms no gang.

    Returns:
        ``[(composite name, indices into names)]``, e.g. ``[("cpu:0+cpu:1", (0, 1)), ("cpu:2+cpu:3", (2, 3))]``.
    """
    out: list[tuple[str, tuple[int, ...]]] = []
    for k in sorted({w for w in widths if w > 1}):
        for start in range(0, len(names) - k + 1, k):
            idx = tuple(range(start, start + k))
            out.append(("+".join(names[i] for i in idx), idx))
    return out


def check_gangs(specs: Sequence[Any], names: Sequence[str], workers: bool, backend: str) -> tuple[str, ...]:
    """Refuse what a gang cannot train, before anything is built; the lines to say about the gangs.

    Args:
        specs: the runs' specs (run i is ``specs[i - 1]``), ``num_gpus`` already resolved.
        names: the plan's device names (``("device",)`` for the kernel process).
        workers: True when the runs train in worker processes (a gang needs them).
        backend: ``"kernel"``, ``"local"`` or ``"ray"``.

    Returns:
        Each run's sharding notes (:func:`~rapidfire_nb.spec.fsdp.sharding_plan`: FSDP1 keys ignored, ``fsdp`` on
        one device), then which runs shard over which gangs.

    Raises:
        ConfigError: naming the run and the field: a bad ``fsdp`` / ``fsdp_config`` (:func:`~.fsdp.sharding_plan`),
            ``num_gpus`` above the devices there are (or with one device in the kernel process), a trainer
            other than SFT, DPO or GRPO, DPO full fine-tuning or ``ref_model_name`` / ``ref_model_kwargs``, GRPO
            full fine-tuning, FSDP over a ``quantization_config`` base, or ``fsdp_config["offload_params"]`` on CPU
            devices.
    """
    notes: list[str] = []
    for run_id, spec in enumerate(specs, start=1):
        notes += check_run_gang(f"run {run_id}", spec, names, workers)
    gangs = [(i, s) for i, s in enumerate(specs, start=1) if run_width(s) > 1]
    if gangs:
        tiles = ", ".join(name for name, _ in gang_tiles(names, (run_width(s) for _, s in gangs)))
        runs = ", ".join(f"{i} ({sharding_of(s)}, {run_width(s)} devices)" for i, s in gangs)
        notes.append(f"runs over several devices: {runs}; gangs on {tiles}")
    return tuple(notes)


def check_run_gang(label: str, spec: Any, names: Sequence[str], workers: bool) -> list[str]:
    """One run's part of :func:`check_gangs` (a ``run_fit``'s runs, a clone): its sharding notes, each starting
    with ``label`` (``"run 3"``, ``"the clone of run 2"``).

    Raises:
        ConfigError: as :func:`check_gangs`, the message starting with ``label``.
    """
    width = run_width(spec)
    notes: list[str] = []
    if width > 1 or _fsdp_set(spec):
        try:  # fsdp / fsdp_config checked now, before training, as each rank will read them
            plan = sharding_plan(getattr(spec, "training", None) or {}, width)
        except ConfigError as exc:
            raise ConfigError(f"{label}: {exc}") from None
        notes += [f"{label}: {note}" for note in plan.notes]
        if width > 1:
            _refuse(label, spec, width, len(names) if workers else 1, names)
        if width > 1 and plan.offload_params and any(name.startswith("cpu") for name in names):
            raise ConfigError(
                f"{label}: num_gpus={width} with CPU offload (fsdp 'offload' or fsdp_config[\"offload_params\"]): "
                "it moves the shards to CPU memory, and these devices are CPU workers already; drop 'offload' "
                "from fsdp and offload_params from fsdp_config"
            )
    return notes


def check_clone_width(
    label: str, spec: Any, names: Sequence[str], widths: Sequence[int], singles: bool
) -> None:
    """Refuse a clone whose ``num_gpus`` no device of this ``run_fit`` has, before it is applied.

    Args:
        label: ``"the clone of run 2"``. spec: the clone's spec. names: the plan's device names.
        widths: the plan's gang widths (``DevicePlan.widths``). singles: whether single-device workers exist.

    Raises:
        ConfigError: naming ``num_gpus`` and the widths there are.
    """
    width = run_width(spec)
    have = sorted({*widths, *([1] if singles else [])})
    if width in have or (width == 1 and not widths):
        return
    raise ConfigError(
        f"{label}: num_gpus={width}, but this run_fit trains runs on {' or '.join(map(str, have))} device(s) at "
        f"once ({', '.join(names)}{'; gangs: ' + ', '.join(n for n, _ in gang_tiles(names, widths)) if widths else ''}"
        f"); clone with num_gpus={' or '.join(map(str, have))}, or run_fit again with a config of num_gpus={width}"
    )


def _refuse(label: str, spec: Any, width: int, devices: int, names: Sequence[str]) -> None:
    where = f"{label}: num_gpus={width}"
    if width > devices:
        have = (
            "one device in the kernel process" if devices == 1 else f"{devices} devices ({', '.join(names)})"
        )
        raise ConfigError(
            f"{where} needs {width} devices but this run_fit trains on {have}; pass run_fit(devices={width}) or "
            f"more (GPUs, or CPU workers on a machine without one), or num_gpus={devices} or fewer"
        )
    trainer = str(getattr(spec, "trainer_type", "")).upper()
    if trainer not in GANG_TRAINERS:
        raise ConfigError(
            f"{where}: only SFT, DPO and GRPO runs train over several devices ({trainer} does not); leave num_gpus "
            "out for this config"
        )
    if trainer == "DPO":
        refuse_dpo_reference(where, spec)
    if trainer == "GRPO":
        refuse_grpo_full(where, spec)
    model_kwargs = getattr(spec, "model_kwargs", None) or {}
    if model_kwargs.get("quantization_config") is not None:
        raise ConfigError(
            f"{where} with model_kwargs.quantization_config: FSDP cannot shard a bitsandbytes-quantized base with "
            "the installed torch; drop quantization_config (sharding already divides the weights over the "
            "devices) or train it on one device"
        )


def refuse_dpo_reference(where: str, spec: Any) -> None:
    """DPO over a gang: LoRA only, its reference the base with the adapter disabled (sharded with the run).

    Raises:
        ConfigError: ``spec`` is full fine-tuning or sets ``ref_model_name`` / ``ref_model_kwargs`` (a reference
            model of its own, which is not sharded yet); the message starts with ``where``.
    """
    if getattr(spec, "lora", None) is None:
        raise ConfigError(
            f"{where}: DPO full fine-tuning over several devices: the reference model is not sharded yet; use LoRA "
            "(peft_config: the reference is then the sharded base with the adapter disabled) or leave num_gpus out"
        )
    if getattr(spec, "ref_model_name", None) is not None or getattr(spec, "ref_model_kwargs", None):
        raise ConfigError(
            f"{where} with ref_model_name / ref_model_kwargs: DPO's separate reference model is not sharded over "
            "several devices yet; leave them out (with LoRA the reference is the base with the adapter disabled) "
            "or leave num_gpus out"
        )


def refuse_grpo_full(where: str, spec: Any) -> None:
    """GRPO over a gang: LoRA only (proved exact; TRL would build full fine-tuning's ``beta`` reference unsharded).

    Raises:
        ConfigError: ``spec`` is full fine-tuning, or generates with vLLM or transformers' continuous batching
            (which ignores ``synced_gpus``: the ranks' uneven generation would hang in a collective); the
            message starts with ``where``.
    """
    if getattr(spec, "lora", None) is None:
        raise ConfigError(
            f"{where}: GRPO full fine-tuning over several devices is not built yet (its beta reference model would "
            "not be sharded); use LoRA (peft_config) or leave num_gpus out"
        )
    training = getattr(spec, "training", None) or {}
    for field in ("use_vllm", "use_transformers_continuous_batching"):
        if training.get(field):
            raise ConfigError(
                f"{where} with {field}=True: a gang generates with the sharded model's own generate (the ranks "
                f"kept in step); set {field}=False or leave num_gpus out"
            )


def _fsdp_set(spec: Any) -> bool:
    value = (getattr(spec, "training", None) or {}).get("fsdp")
    return bool(value) and value not in ("", [], False)
