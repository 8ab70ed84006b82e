"""What ``run_fit`` is given, checked before anything is built, and its identity across kernels.

Torch-free. ``Experiment.run_fit`` packs its arguments into a :class:`FitArgs` (as given, unchecked);
:func:`check_fit_inputs` checks them and expands the config group into a :class:`FitInputs`, which holds everything
later steps need (nothing after it reads the raw arguments or recomputes from them). :func:`dataset_fingerprint`
and :func:`check_same_inputs` make sure a restarted kernel continues the runs with the inputs they started with.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any

from kernel_scheduler import EarlyStoppingPolicy

from .. import meta_keys, schema
from ..automl.early_stopping import check_early_stopping
from ..errors import ConfigError, ExperimentError
from ..schema.trainer_kinds import check_metric_choice, check_metric_name, is_trainer_metric
from ..spec.gangs import check_gangs, run_width, with_run_fit_width
from ..spec.packs import check_packing_option, packing_note, plan_packs, refuse_unpackable
from ..training.quantization import refuse_quantized_full_finetunes
from .resources import check_group_fits

__all__ = [
    "MAX_CHUNKS",
    "FitArgs",
    "FitInputs",
    "check_fit_inputs",
    "check_same_inputs",
    "column_names",
    "dataset_fingerprint",
]

MAX_CHUNKS = 10_000
"""The most chunks per epoch ``run_fit`` accepts (each chunk ends with an evaluation and a checkpoint)."""


@dataclass(frozen=True)
class FitArgs:
    """``Experiment.run_fit``'s arguments exactly as the user passed them (nothing checked yet).

    The fields are ``run_fit``'s parameters, with the same names, order, keyword-only part and defaults (a test
    keeps them in step); the annotations say what each should be, :func:`check_fit_inputs` (and, for
    ``background``, ``num_gpus`` and ``monte_carlo_simulations``, ``lifecycle.run_fit``) checks that it is.

    Attributes:
        param_config: the config group: ``RFGridSearch`` / ``RFRandomSearch`` / ``RFOptuna`` (anything with
            ``expand(seed)`` and ``trainer_type``).
        create_model_fn: ``create_model_fn(model_config: dict) -> (model, tokenizer)``.
        train_dataset: the training rows (a ``datasets.Dataset``, at least one row).
        eval_dataset: the evaluation rows, or None (no evaluation).
        num_chunks: chunks per epoch, 1 to :data:`MAX_CHUNKS` (each chunk ends with an evaluation and a
            checkpoint).
        seed: the experiment seed, 0 to ``schema.MAX_SEED``.
        num_gpus: devices per run (``rapidfireai``'s argument): None or an int >= 1 (``spec.gangs``).
        monte_carlo_simulations: ``rapidfireai``'s argument, no effect here: None or a positive int.
        background: train in a background thread (True), block until training ends (False), or None (True in a
            Jupyter kernel, False in a script).
        checkpoint_every: chunks between two resumable checkpoints of a run (>= 1).
        eval_generation_samples: eval rows to generate for, the same seeded sample for every run (rows, >= 1),
            or None (every eval row).
        early_stopping: an early-stopping policy (``rapidfire_nb.automl``), or None.
        devices: where the runs train: None (every visible GPU), a count of devices, or a list of device names.
        backend: ``"local"`` (worker processes on this machine), ``"ray"``, or None (``"local"``).
        num_shards: rapidfireai 0.16.2's name for ``num_chunks`` (chunks per epoch), or None.
        panel_metrics: 1 or 2 metric names for the panel's default plots, or None (the trainer kind's).
        best_by: the metric runs are ranked by (panel star, ``end()``, ``get_runs_info()``), or None (the kind's).
        batch_generation: batch the chunk-end generation eval of the runs on one shared base (True or False).
        packing: ``"auto"``, True or False: train the LoRA runs that see the same batches as packs
            (:mod:`rapidfire_nb.spec.packs`).
    """

    param_config: Any
    create_model_fn: Callable[[dict[str, Any]], Any]
    train_dataset: Any
    eval_dataset: Any = None
    num_chunks: int = 4
    seed: int = 42
    num_gpus: int | None = None
    monte_carlo_simulations: int | None = None
    _: KW_ONLY
    background: bool | None = None
    checkpoint_every: int = 1
    eval_generation_samples: int | None = None
    early_stopping: Any = None
    devices: Any = None
    backend: str | None = None
    num_shards: int | None = None
    panel_metrics: Sequence[str] | None = None
    best_by: str | None = None
    batch_generation: bool = True
    packing: bool | str = "auto"


@dataclass(frozen=True)
class FitInputs:
    """The checked arguments of one ``run_fit`` call, and what is derived from them once (the end of checking).

    Made by :func:`check_fit_inputs` only; later steps read it and never the raw :class:`FitArgs`.

    Attributes:
        specs: the expanded run specs, run ``i`` (1-based) is ``specs[i - 1]``.
        trainer_type: ``"SFT"``, ``"DPO"`` or ``"GRPO"``.
        fingerprint: JSON text identifying the config group (every spec's fingerprint, in order).
        columns: the hyperparameter columns worth showing: the ``hparams()`` keys whose values differ between the
            specs (:func:`column_names`).
        create_model_fn, train_dataset, eval_dataset: as given.
        train_data, eval_data: the datasets' :func:`dataset_fingerprint` (``{"rows": n, "sha256": ...}``; None for
            no eval dataset): what a restart is checked against (:func:`check_same_inputs`).
        num_chunks: chunks per epoch; seed: the experiment seed.
        checkpoint_every: write boundary checkpoints every this many chunks.
        eval_generation_samples: eval rows generated for by runs that evaluate by generating (None: all).
        early_stopping: the early-stopping policy (a fresh copy of the one given), or None.
        devices: where the runs train (:class:`~rapidfire_nb.devices.resolve.DevicePlan`); None: the kernel
            process, one device.
        panel_metrics, best_by: the checked metric choice (None: the trainer kind's), stored as meta
            ``panel_metrics`` (:mod:`rapidfire_nb.view.metrics_view` reads it).
        batch_generation: batched generation eval (``run_fit``'s, False when the early-stopping metric is a
            generated one: a rung needs each run's value at its own chunk end).
        packing: ``"auto"``, True or False (checked; with True some two runs share a pack).
        notes: lines for the user about the inputs (said once when training starts).
    """

    specs: tuple[Any, ...]
    trainer_type: str
    fingerprint: str
    columns: tuple[str, ...]
    create_model_fn: Callable[[dict[str, Any]], Any]
    train_dataset: Any
    eval_dataset: Any
    train_data: dict[str, Any] | None
    eval_data: dict[str, Any] | None
    num_chunks: int
    seed: int
    checkpoint_every: int = 1
    eval_generation_samples: int | None = None
    early_stopping: Any = None
    devices: Any = None
    panel_metrics: tuple[str, ...] | None = None
    best_by: str | None = None
    batch_generation: bool = True
    packing: bool | str = "auto"
    notes: tuple[str, ...] = ()

    def meta(self) -> dict[str, Any]:
        """The inputs the runs train with, as stored in the experiment's meta (what a restart is checked against:
        ``num_chunks``, ``seed``, ``train_data``, ``eval_data``, ``eval_generation_samples``)."""
        return {
            meta_keys.NUM_CHUNKS: self.num_chunks,
            meta_keys.SEED: self.seed,
            meta_keys.TRAIN_DATA: self.train_data,
            meta_keys.EVAL_DATA: self.eval_data,
            meta_keys.EVAL_GENERATION_SAMPLES: self.eval_generation_samples,
        }

    def panel_meta(self) -> dict[str, Any]:
        """Meta ``panel_metrics``: ``{"plots": [names] | None, "best_by": name | None}`` (None: the kind's)."""
        return {"plots": list(self.panel_metrics) if self.panel_metrics else None, "best_by": self.best_by}


def check_fit_inputs(args: FitArgs, exp_dir: Path | None = None) -> FitInputs:
    """Check ``run_fit``'s arguments and expand the config group (nothing is built or loaded).

    ``args.background``, ``args.num_gpus`` and ``args.monte_carlo_simulations`` are not read here: ``run_fit``
    checks them first, before it takes the experiment's writer lock.

    Args:
        args: the arguments as given.
        exp_dir: the experiment folder, where a search that prunes its own trials (``RFOptuna``) keeps its study;
            None: not bound to one.

    Returns:
        The checked inputs, with the specs, the group's fingerprint, its hyperparameter columns and the datasets'
        fingerprints computed once.

    Raises:
        ConfigError: a bad argument, naming it and what it should be: ``num_chunks`` not an int from 1 to
            :data:`MAX_CHUNKS`, ``checkpoint_every`` below 1, ``eval_generation_samples`` not a positive int or
            None, ``seed`` outside numpy's range, ``train_dataset`` None, empty or not a dataset, ``eval_dataset``
            not a dataset, ``create_model_fn`` not callable, ``param_config`` not a config group, bad
            ``devices`` / ``backend`` (:func:`check_devices`), a bad ``early_stopping``, ``early_stopping``
            given with a search that prunes its own trials, a group that expands to no run, or full fine-tuning
            of a base quantized through ``model_kwargs.quantization_config``, or runs that do not fit the disk of
            ``exp_dir`` or the device, or LoRA beyond full rank (:func:`~.resources.check_group_fits`), or
            ``panel_metrics`` / ``best_by`` naming a metric the trainer kind never logs
            (:func:`~rapidfire_nb.schema.trainer_kinds.check_metric_choice`), ``packing`` not ``"auto"``, True or
            False, or ``packing=True`` for a group where no two runs can share a pack
            (:func:`~rapidfire_nb.spec.packs.refuse_unpackable`, naming each run and why).
    """
    _check_numbers(args)
    _check_datasets(args.train_dataset, args.eval_dataset)
    param_config, eval_dataset = args.param_config, args.eval_dataset
    if not callable(args.create_model_fn):
        raise ConfigError("create_model_fn must be a function model_config -> (model, tokenizer)")
    if not hasattr(param_config, "expand") or not hasattr(param_config, "trainer_type"):
        raise ConfigError(
            f"param_config must be RFGridSearch(configs=..., trainer_type=...) or RFRandomSearch(...), got "
            f"{type(param_config).__name__}; wrap your RFModelConfig(s) in one"
        )
    plan = check_devices(args.devices, args.backend)
    policy = check_early_stopping(args.early_stopping, eval_dataset)
    if isinstance(param_config, EarlyStoppingPolicy):  # a search that also prunes (RFOptuna)
        if policy is not None:
            raise ConfigError(
                f"{type(param_config).__name__} prunes its own trials: leave early_stopping out (got "
                f"{args.early_stopping!r})"
            )
        policy = check_early_stopping(param_config, eval_dataset, copy=False)
        if exp_dir is not None and hasattr(param_config, "bind"):
            param_config.bind(exp_dir, args.num_chunks)  # its study lives in the experiment folder
    # names checked before a search asks its trials; an eval_<name> only with a compute_metrics, after the expansion
    check_metric_choice(param_config.trainer_type, args.panel_metrics, args.best_by)
    specs, plan, gang_notes = _expand(param_config, args, plan)
    user_metrics = any(getattr(spec, "compute_metrics", None) is not None for spec in specs)
    plots, best_by = check_metric_choice(
        param_config.trainer_type, args.panel_metrics, args.best_by, user_metrics
    )
    if policy is not None and isinstance(getattr(policy, "metric", None), str):
        check_metric_name(param_config.trainer_type, policy.metric, "early_stopping's metric", user_metrics)
    batch_generation, packing, notes = _generation_and_packing(
        args, param_config.trainer_type, policy, specs, plan
    )
    check_group_fits(specs, exp_dir, plan)  # the runs fit the disk and the device
    refuse_quantized_full_finetunes(specs)  # full fine-tuning of a quantized base: before anything loads
    return FitInputs(
        specs=specs,
        trainer_type=str(param_config.trainer_type).upper(),
        fingerprint=json.dumps([spec.fingerprint() for spec in specs]),
        columns=tuple(column_names(specs)),
        create_model_fn=args.create_model_fn,
        train_dataset=args.train_dataset,
        eval_dataset=eval_dataset,
        train_data=dataset_fingerprint(args.train_dataset),
        eval_data=dataset_fingerprint(eval_dataset),
        num_chunks=args.num_chunks,
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
        eval_generation_samples=args.eval_generation_samples,
        early_stopping=policy,
        devices=plan,
        panel_metrics=plots,
        best_by=best_by,
        batch_generation=batch_generation,
        packing=packing,
        notes=gang_notes + notes,
    )


def _expand(param_config: Any, args: FitArgs, plan: Any) -> tuple[tuple[Any, ...], Any, tuple[str, ...]]:
    """The group's specs (``run_fit``'s ``num_gpus`` written into those that leave it out), the device plan with
    the gangs they need (:attr:`~rapidfire_nb.devices.resolve.DevicePlan.widths`), and the lines about the gangs.

    Raises:
        ConfigError: the group expands to no run, or a run's gang cannot train (:func:`~..spec.gangs.check_gangs`).
    """
    specs = with_run_fit_width(param_config.expand(args.seed), args.num_gpus)
    if not specs:
        raise ConfigError("the config group expands to no run")
    notes = check_gangs(specs, plan.names, plan.workers, plan.backend)
    widths = tuple(sorted({run_width(s) for s in specs} - {1}))
    if widths:
        plan = dataclasses.replace(plan, widths=widths, singles=any(run_width(s) == 1 for s in specs))
    return specs, plan, notes


def _generation_and_packing(
    args: FitArgs, trainer_type: str, policy: Any, specs: tuple[Any, ...], plan: Any
) -> tuple[bool, bool | str, tuple[str, ...]]:
    """``run_fit``'s ``batch_generation`` and ``packing``, checked, and the lines said about them at the start."""
    batch_generation, notes = _batch_generation(args.batch_generation, trainer_type, policy, specs)
    packing, packing_notes = _packing(args.packing, specs, trainer_type, args.seed, len(plan.names))
    return batch_generation, packing, notes + packing_notes


def _batch_generation(
    given: object, trainer_type: object, policy: Any, specs: tuple[Any, ...]
) -> tuple[bool, tuple[str, ...]]:
    """``run_fit``'s ``batch_generation``, off (with a note) when the early-stopping metric is a generated one.

    Raises:
        ConfigError: ``batch_generation`` is not True or False.
    """
    if not isinstance(given, bool):
        raise ConfigError(
            f"batch_generation must be True (the runs on one base generate their eval answers in one batched "
            f"generate) or False (each run alone), got {given!r}"
        )
    metric = getattr(policy, "metric", None)
    generates = any(
        getattr(s, "compute_metrics", None) is not None and getattr(s, "generation_config", None) is not None
        for s in specs
    )
    if given and generates and isinstance(metric, str) and not is_trainer_metric(trainer_type, metric):
        note = (
            f"generation eval runs run by run: early_stopping's metric {metric!r} comes from compute_metrics, and "
            "a rung needs each run's value at its own chunk end (batch_generation is off)"
        )
        return False, (note,)
    return given, ()


def _packing(
    given: object, specs: tuple[Any, ...], trainer_type: str, seed: int, devices: int = 1
) -> tuple[bool | str, tuple[str, ...]]:
    """``run_fit``'s ``packing``, checked: ``"auto"``, True or False; with True, some two runs must share a pack.
    Also the line said when training starts: which runs pack, which train alone and why
    (:func:`~rapidfire_nb.spec.packs.packing_note`).

    Raises:
        ConfigError: another value (:func:`~rapidfire_nb.spec.packs.check_packing_option`), or True for a group
            where no two runs can share a pack (:func:`~rapidfire_nb.spec.packs.refuse_unpackable`).
    """
    packing = check_packing_option(given)
    runs = dict(enumerate(specs, start=1))
    if packing is True:
        refuse_unpackable(runs, trainer_type, seed)
    if packing is False:
        return packing, ()
    device = "cuda" if _cuda_count() else "cpu"
    note = packing_note(plan_packs(runs, trainer_type, seed), packing, device, trainer_type)
    if note and devices > 1 and note.startswith("packing:"):  # a pack lives on one device
        note += f"; over {devices} devices, only the runs one device trains together pack (worker processes do not report packs)"
    return packing, (note,) if note else ()


def _check_numbers(args: FitArgs) -> None:
    """``num_chunks``, ``checkpoint_every``, ``eval_generation_samples`` and ``seed``, in that order (ConfigError)."""
    num_chunks, seed, checkpoint_every = args.num_chunks, args.seed, args.checkpoint_every
    eval_generation_samples = args.eval_generation_samples
    if not isinstance(num_chunks, int) or isinstance(num_chunks, bool) or not 1 <= num_chunks <= MAX_CHUNKS:
        raise ConfigError(f"num_chunks must be an integer from 1 to {MAX_CHUNKS:,}, got {num_chunks!r}")
    if not isinstance(checkpoint_every, int) or isinstance(checkpoint_every, bool) or checkpoint_every < 1:
        raise ConfigError(
            f"checkpoint_every must be an integer >= 1 (chunks between two checkpoints), got {checkpoint_every!r}"
        )
    if eval_generation_samples is not None and (
        not isinstance(eval_generation_samples, int)
        or isinstance(eval_generation_samples, bool)
        or eval_generation_samples < 1
    ):
        raise ConfigError(
            "eval_generation_samples must be a positive integer (eval rows to generate for, the same seeded sample "
            f"for every run) or None (every eval row), got {eval_generation_samples!r}"
        )
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= schema.MAX_SEED:
        raise ConfigError(
            f"seed must be an integer from 0 to {schema.MAX_SEED:,} (numpy's range), got {seed!r}"
        )


def _check_datasets(train_dataset: Any, eval_dataset: Any) -> None:
    """``train_dataset`` a dataset with rows, ``eval_dataset`` None or a dataset (ConfigError)."""
    if train_dataset is None:
        raise ConfigError(
            "train_dataset is required, got None: pass a datasets.Dataset with at least one row"
        )
    _check_sized(train_dataset, "train_dataset")
    if len(train_dataset) == 0:
        raise ConfigError("train_dataset is empty: pass a datasets.Dataset with at least one row")
    if eval_dataset is not None:
        _check_sized(eval_dataset, "eval_dataset")


def _check_sized(dataset: Any, name: str) -> None:
    """A dataset must have a length (rows are counted and sampled for its fingerprint)."""
    if not hasattr(dataset, "__len__"):
        raise ConfigError(
            f"{name} must be a datasets.Dataset, got {type(dataset).__name__}; e.g. datasets.Dataset.from_list(rows)"
        )


def check_devices(devices: Any, backend: Any) -> Any:
    """``run_fit``'s ``devices`` and ``backend`` resolved against this machine (a ``DevicePlan``).

    Raises:
        ConfigError: a bad value (:func:`~rapidfire_nb.devices.resolve.resolve_devices`), or ``backend="ray"``
            without Ray installed (naming the extra).
    """
    import os

    from ..devices.resolve import resolve_devices

    plan = resolve_devices(devices, backend, _cuda_count(), len(os.sched_getaffinity(0)))
    if plan.workers:
        plan.transport.check_available()  # backend="ray" without Ray installed
    return plan


def _cuda_count() -> int:
    try:
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:  # no torch / a broken CUDA setup: no GPU to spread over
        return 0


def column_names(specs: Any) -> list[str]:
    """The hyperparameter columns worth showing: the ``hparams()`` keys whose values differ between specs."""
    values: dict[str, set[str]] = {}
    for spec in specs:
        for k, v in spec.hparams().items():
            values.setdefault(k, set()).add(json.dumps(v, sort_keys=True, default=str))
    return [k for k, vs in values.items() if len(vs) > 1]


def dataset_fingerprint(dataset: Any, samples: int = 32) -> dict[str, Any] | None:
    """A cheap identity of a dataset: ``{"rows": len, "sha256": hash of up to ``samples`` evenly spaced rows}``.

    Rows are hashed as JSON (keys sorted; values JSON cannot hold hashed by ``str``), so two datasets with the same
    rows in the same order match whatever object holds them. Differences outside the sampled rows go unnoticed.
    Returns None for None.
    """
    if dataset is None:
        return None
    n = len(dataset)
    idx = sorted({round(i * (n - 1) / max(1, samples - 1)) for i in range(min(samples, n))}) if n else []
    digest = hashlib.sha256()
    for i in idx:
        try:
            row = (
                dataset.iloc[int(i)].to_dict() if hasattr(dataset, "iloc") else dataset[int(i)]
            )  # pandas / HF
        except Exception:  # rows not addressable by position: the row count alone
            return {"rows": n, "sha256": None}
        digest.update(json.dumps(row, sort_keys=True, default=str).encode())
    return {"rows": n, "sha256": digest.hexdigest()[:16]}


def check_same_inputs(
    experiment_name: str, stored: Mapping[str, Any], given: Mapping[str, Any], unfinished: Sequence[int]
) -> None:
    """Continuing runs from their checkpoints needs the inputs they were started with.

    Args:
        experiment_name: for the message.
        stored: the experiment's stored meta (``num_chunks``, ``seed``, ``eval_generation_samples``,
            ``train_data``, ``eval_data``; a key that is missing, as in experiments stored before it was recorded,
            is not checked).
        given: the same keys for this ``run_fit`` (:meth:`FitInputs.meta`; the datasets as their
            :func:`dataset_fingerprint`).
        unfinished: the run ids that would continue (for the message).

    Raises:
        ExperimentError: ``num_chunks``, ``seed``, ``eval_generation_samples``, the train or the eval dataset
            differ from the stored ones (datasets compared by :func:`dataset_fingerprint`: row count plus a hash of
            sampled rows).
    """
    checks = [
        ("num_chunks", meta_keys.NUM_CHUNKS),
        ("seed", meta_keys.SEED),
        ("eval_generation_samples", meta_keys.EVAL_GENERATION_SAMPLES),
        ("train_dataset", meta_keys.TRAIN_DATA),
        ("eval_dataset", meta_keys.EVAL_DATA),
    ]
    for field, key in checks:
        if key not in stored or stored[key] == given.get(key):
            continue
        raise ExperimentError(
            f"experiment {experiment_name!r} has unfinished runs {list(unfinished)} to continue from their "
            f"checkpoints, and run_fit got {_difference(field, stored[key], given.get(key))}. Continuing needs the "
            "same num_chunks, seed, eval_generation_samples and datasets; pass those, or use a new experiment name "
            "(or Experiment(name, overwrite=True)) to start afresh"
        )


def _difference(field: str, stored: Any, given: Any) -> str:
    if field in ("num_chunks", "seed", "eval_generation_samples"):
        return f"{field}={given!r}, but it was started with {field}={stored!r}"
    if given is None or stored is None:
        return f"a different {field}: " + (
            f"none, but it was started with {stored['rows']} rows"
            if given is None
            else f"{given['rows']} rows, but it was started without one"
        )
    return (
        f"a different {field} than the one it was started with ({given['rows']} rows vs "
        f"{stored['rows']}, or other content)"
    )
