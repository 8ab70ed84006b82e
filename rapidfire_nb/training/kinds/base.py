"""TrainerKind: what the engine needs to know about one TRL trainer type (after TRL's config/trainer pairs).

The executor trains every kind the same way and asks its kind at six points: ``precheck`` (before anything is
built), ``trainer_kwargs`` and ``building`` (while the trainer is built), ``after_build``, ``on_activate``
(every handover) and ``step_geometry``/``plan_chunks`` (where its chunks end). :meth:`TrainerKind.build_trainer`
and :meth:`TrainerKind.plan_run` are the executor's calls that use them in that order. Kinds never see the executor:
they get models through a :class:`~rapidfire_nb.training.models.ModelProvider`.

Importing this module does not import torch, transformers, trl or peft.
"""

from __future__ import annotations

import abc
import contextlib
import math
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar

from kernel_scheduler import ChunkPlan, ChunkPlanError, plan_chunks
from rapidfire_nb import schema
from rapidfire_nb.errors import ConfigError
from rapidfire_nb.spec import LeafConfig

from ..formats import TEXT_OR_CHAT, RowFormat
from ..models import ModelProvider
from ..quantization import input_grads_once
from . import hooks

__all__ = ["COMMON_WARM_FORBIDDEN", "StepGeometry", "TrainerKind", "training_value"]

COMMON_WARM_FORBIDDEN: tuple[str, ...] = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "seed",
    "max_length",
    "max_prompt_length",
    "lora.r",
    "lora.target_modules",
    "model_name",
    "dataloader_drop_last",
    "group_by_length",
    "data_seed",
    "num_train_epochs",
    "num_gpus",
    "fsdp",
    "fsdp_config",
)
"""Fields no warm clone of any kind may change: they change how data is batched or sampled, or the adapter's
shape (``max_prompt_length``/``group_by_length`` are in no TRL 1.16 config but in older ones), or how the run's
state is sharded over its devices (``num_gpus``, ``fsdp``, ``fsdp_config``: a gang's boundary is each rank's
share)."""


@dataclass(frozen=True)
class StepGeometry:
    """How a run walks through its data, in TRL's own terms.

    Attributes:
        rows_per_epoch: rows (prompts for GRPO) one epoch consumes.
        rows_per_step: rows one optimizer step consumes (GRPO: rounded down, at least 1).
        steps_per_epoch: optimizer steps per epoch (transformers' ``num_update_steps_per_epoch``).
        total_steps: the run's optimizer steps (``max_steps`` or ``ceil(num_train_epochs * steps_per_epoch)``);
            equal to the trainer's ``state.max_steps`` once it trains.
        step_multiple: chunk boundaries must be multiples of this many global steps (1 unless a kind needs it).
    """

    rows_per_epoch: int
    rows_per_step: int
    steps_per_epoch: int
    total_steps: int
    step_multiple: int = 1


def training_value(spec: LeafConfig, name: str) -> Any:
    """A trainer field's value for a run before its TRL config is built: the user's, else TRL's declared default.

    Args:
        spec: The run spec.
        name: A field of the run's TRL config class.

    Returns:
        The value, or ``None`` when the installed TRL config has no such field (imports trl).
    """
    if name in spec.training:
        return spec.training[name]
    cls = schema.trainer_config_class(spec.trainer_type)
    return schema.field_default(cls, name) if name in schema.field_names(cls) else None


def _dataloader_batches(n_rows: int, batch_size: int, drop_last: bool) -> int:
    return n_rows // batch_size if drop_last else math.ceil(n_rows / batch_size)


class TrainerKind(abc.ABC):
    """One trainer type. Instances are stateless (per-executor state lives in the ``ModelProvider``).

    Subclasses set ``name``, ``trainer_class_name`` and ``required_columns`` (class attributes), and override
    the hooks they need; every hook has a default that is right for SFT.
    """

    #: whether rows keep the columns ``formatting_func`` did not produce (GRPO passes them to reward functions)
    keep_extra_columns: ClassVar[bool] = False
    #: fields a warm clone may not change (hparam names: trainer fields bare, ``lora.<field>``)
    warm_forbidden: ClassVar[tuple[str, ...]] = COMMON_WARM_FORBIDDEN
    #: hparam-name prefixes a warm clone may not change (the base model's loading keywords)
    warm_forbidden_prefixes: ClassVar[tuple[str, ...]] = ("model_kwargs.",)

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """The trainer type, as ``LeafConfig.trainer_type`` spells it (``"SFT"``)."""

    @property
    @abc.abstractmethod
    def trainer_class_name(self) -> str:
        """The TRL trainer class's name in ``trl`` (``"SFTTrainer"``)."""

    @property
    @abc.abstractmethod
    def required_columns(self) -> tuple[tuple[str, ...], ...]:
        """Column sets after ``formatting_func``; the rows must hold at least one of them."""

    def row_formats(self, spec: LeafConfig | None = None) -> tuple[RowFormat, ...]:
        """The row formats the trainer accepts, in the order it tries them (after ``formatting_func``).

        By default one per ``required_columns`` set, each column a string or a list of role/content messages
        (all alike); kinds whose config names columns (SFT's ``dataset_text_field``) override it.

        Args:
            spec: The run spec (its config), or ``None`` for TRL's defaults.

        Returns:
            The formats; a row is checked against the first whose first column it has.
        """
        return tuple(RowFormat(cols, TEXT_OR_CHAT) for cols in self.required_columns)

    # ------------------------------------------------------------------ TRL's pair
    def trainer_class(self) -> type:
        """TRL's trainer class (imports trl)."""
        import trl

        return getattr(trl, self.trainer_class_name)  # type: ignore[no-any-return]

    def config_class(self) -> type:
        """TRL's config class (imports trl)."""
        return schema.trainer_config_class(self.name)

    # ------------------------------------------------------------------ warm starts
    def warm_start_violations(self, changes: Mapping[str, Any]) -> list[str]:
        """The changed hparams a warm clone of this kind may not change, in the order given.

        Args:
            changes: ``{hparam name: value}`` of a clone.

        Returns:
            The names in ``warm_forbidden`` or starting with one of ``warm_forbidden_prefixes``.
        """
        return [k for k in changes if k in self.warm_forbidden or k.startswith(self.warm_forbidden_prefixes)]

    # ------------------------------------------------------------------ hooks (defaults: nothing special)
    def precheck(self, spec: LeafConfig, train_dataset: Any, eval_dataset: Any = None) -> None:  # noqa: B027
        # a hook with a default (nothing to check), not an abstract method
        """Checks before anything is built (no model loaded, nothing trained).

        Args:
            spec: The run spec.
            train_dataset: The experiment's training rows (before ``formatting_func``).
            eval_dataset: Its eval rows, or ``None``.

        Raises:
            ConfigError: The run cannot train as configured.
        """

    def trainer_kwargs(
        self, spec: LeafConfig, model: Any, args: Any, models: ModelProvider
    ) -> dict[str, Any]:
        """Extra keyword arguments for the TRL trainer (``reward_funcs``, ``ref_model``, ...).

        Args:
            spec: The run spec.
            model: The model the run trains (the shared ``PeftModel`` or its own copy).
            args: Its built TRL config.
            models: Where to load or share extra models.

        Returns:
            Keyword arguments added to ``model, args, train_dataset, eval_dataset, processing_class``.
        """
        return {}

    def building(self, model: Any, adapter: str | None) -> AbstractContextManager[None]:
        """A context held while the run's trainer is constructed (e.g. adapter aliases on the shared model).

        Args:
            model: The model the trainer is given.
            adapter: The run's adapter name, or ``None`` for full fine-tuning.
        """
        return contextlib.nullcontext()

    def after_build(self, trainer: Any) -> None:
        """Right after the trainer is built: remember the ``forward`` it patched, make resumes exact.

        Args:
            trainer: The run's TRL trainer.
        """
        hooks.record_forward(trainer)
        hooks.resume_sampler_epochs(trainer)

    def eval_metric_names(self, trainer: Any) -> list[str]:
        """Eval metrics of this kind worth a column in ``get_runs_info`` (besides ``eval_loss``).

        Args:
            trainer: The run's TRL trainer (built with an eval set).

        Returns:
            TRL's names as logged (``eval_<name>``); none by default.
        """
        return []

    def on_activate(self, trainer: Any) -> None:
        """On every handover to the run (in its worker thread, after its adapter is set).

        Args:
            trainer: The run's TRL trainer.
        """
        hooks.restore_forward(trainer)

    def build_trainer(
        self,
        spec: LeafConfig,
        model: Any,
        adapter: str | None,
        tokenizer: Any,
        args: Any,
        datasets: tuple[Any, Any],
        models: ModelProvider,
    ) -> Any:
        """Construct the run's TRL trainer (on the device thread, its adapter active), as a plain run would.

        ``compute_metrics`` goes to the trainer only when the run does not evaluate by generating (with
        ``generation_config`` it scores generations instead: :mod:`~rapidfire_nb.training.generation_eval`);
        TRL's printer and progress callbacks are removed (rapidfire_nb prints one line per chunk).

        Args:
            spec: the run spec.
            model: the model the run trains (the shared ``PeftModel`` or its own copy).
            adapter: the run's adapter name, or ``None`` for full fine-tuning.
            tokenizer: the base's tokenizer or processor (``processing_class``).
            args: the run's built TRL config.
            datasets: ``(train rows, eval rows or None)`` after ``formatting_func``.
            models: where :meth:`trainer_kwargs` loads or shares extra models (a DPO reference).

        Raises:
            ConfigError: the trainer rejected the config or data (its ``ValueError``/``KeyError``/``TypeError``).
        """
        from ..generation_spec import generation_enabled

        with self.building(model, adapter):  # e.g. DPO/GRPO on a shared PeftModel (reference = base)
            cls = self.trainer_class()
            kwargs: dict[str, Any] = {
                "model": model,
                "args": args,
                "train_dataset": datasets[0],
                "eval_dataset": datasets[1],
                "processing_class": tokenizer,
            }
            if (
                spec.compute_metrics is not None
                and not generation_enabled(spec.compute_metrics, spec.generation_config)
            ):  # alone it goes to the TRL trainer (as in rapidfireai); with generation_config it scores generations
                kwargs["compute_metrics"] = spec.compute_metrics
            kwargs.update(self.trainer_kwargs(spec, model, args, models))  # reward_funcs, DPO ref_model
            try:
                trainer = cls(**kwargs)
            except ConfigError:
                raise
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(
                    f"{cls.__name__} rejected the config or data: {type(exc).__name__}: {exc}"
                ) from exc
            from transformers.trainer_callback import PrinterCallback, ProgressCallback

            # gradient checkpointing: one input-gradient hook per base, not one per run
            input_grads_once(model)
            trainer.remove_callback(PrinterCallback)  # rapidfire_nb prints one line per chunk instead
            trainer.remove_callback(ProgressCallback)
        self.after_build(trainer)  # remember the forward this trainer patched in (per-run settings)
        return trainer

    # ------------------------------------------------------------------ chunks
    def plan_run(self, trainer: Any, num_chunks: int, run_id: int) -> ChunkPlan:
        """A built trainer's chunk plan (:meth:`step_geometry`, then :meth:`plan_chunks`), its step count checked.

        Args:
            trainer: the run's TRL trainer.
            num_chunks: chunks per epoch.
            run_id: the run's id (named in the messages).

        Raises:
            ConfigError: more optimizer steps than ``schema.MAX_STEPS`` (epochs x steps per epoch), none at all,
                or ``num_chunks`` larger than the steps per epoch.
        """
        geo = self.step_geometry(trainer)
        args = trainer.args
        if (
            geo.total_steps > schema.MAX_STEPS
        ):  # max_steps is bounded by the schema; epochs x data is known here
            raise ConfigError(
                f"num_train_epochs={args.num_train_epochs:g} x {geo.steps_per_epoch} optimizer steps per "
                f"epoch = {geo.total_steps:,} steps (run {run_id}), more than the {schema.MAX_STEPS:,} rapidfire_nb "
                "accepts; lower num_train_epochs or set max_steps"
            )
        if geo.total_steps < 1:  # num_train_epochs=0 (or < one step's worth) with max_steps=-1
            raise ConfigError(
                f"run {run_id} would train 0 optimizer steps: num_train_epochs={args.num_train_epochs:g} "
                f"with max_steps={args.max_steps}; set num_train_epochs >= 1 or max_steps >= 1"
            )
        try:
            return self.plan_chunks(geo, num_chunks)  # GRPO: boundaries on generation rounds
        except ChunkPlanError as exc:
            raise ConfigError(f"num_chunks: {exc} (run {run_id})") from exc

    def step_geometry(self, trainer: Any) -> StepGeometry:
        """A built trainer's step geometry, exactly as ``Trainer.set_initial_training_values`` computes it.

        Nothing is built or iterated (no dataloader is created).

        Args:
            trainer: The run's TRL trainer.

        Returns:
            Rows and optimizer steps per epoch, rows per step and total steps.
        """
        args = trainer.args
        n_rows = len(trainer.train_dataset)
        world = max(1, int(getattr(args, "world_size", 1) or 1))
        bs = args.per_device_train_batch_size * world
        ga = args.gradient_accumulation_steps
        len_dl = _dataloader_batches(n_rows, bs, args.dataloader_drop_last)
        spe = max(len_dl // ga + int(len_dl % ga > 0), 1)
        total = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * spe)
        rows_per_epoch = len_dl * bs if args.dataloader_drop_last else n_rows
        return StepGeometry(rows_per_epoch, bs * ga, spe, total)

    def plan_chunks(self, geo: StepGeometry, num_chunks: int) -> ChunkPlan:
        """The run's chunk plan (``kernel_scheduler.plan_chunks``: fair by rows consumed).

        Args:
            geo: The run's ``step_geometry``.
            num_chunks: Chunks per epoch.

        Returns:
            Its boundaries in optimizer steps.

        Raises:
            ChunkPlanError: ``num_chunks`` larger than the steps per epoch (the message says the largest).
        """
        return plan_chunks(
            geo.rows_per_epoch,
            num_chunks,
            geo.rows_per_step,
            geo.total_steps,
            steps_per_epoch=geo.steps_per_epoch,
            step_multiple=geo.step_multiple,
        )
