"""Build the real TRL config and ``peft.LoraConfig`` of one run spec, adapted to this machine.

Part of the spec layer because ``LeafConfig.validate``/``with_changes`` check a spec by building them; the
training layer builds its trainers' configs here too, so a validated spec is exactly what trains. trl, peft,
torch and accelerate are imported inside the functions, never at module level.

The user's arguments (``LeafConfig.training``/``.lora``) are kept as written; what rapidfire_nb must
override to run them here (precision on a CPU-only machine, its own checkpointing and tracking) is applied
on top and reported as human-readable notes, never silently.
"""

from __future__ import annotations

import copy
import dataclasses
import numbers
import re
from collections.abc import Mapping
from typing import Any, Protocol

from rapidfire_nb import schema
from rapidfire_nb.errors import ConfigError, closest_name

__all__ = ["TrainerSettings", "build_lora_config", "build_training_args", "detect_bf16", "detect_cuda"]


class TrainerSettings(Protocol):
    """What building the real configs reads from a run spec (``rapidfire_nb.spec.LeafConfig`` has it all).

    Typed as a protocol so that this module need not import ``LeafConfig`` (whose ``validate`` calls it).
    """

    @property
    def trainer_type(self) -> str: ...  # "SFT" | "DPO" | "GRPO"

    @property
    def training(self) -> Mapping[str, Any]: ...  # trainer-config keyword arguments as the user set them

    @property
    def lora(
        self,
    ) -> Mapping[str, Any] | None: ...  # peft.LoraConfig keyword arguments, None: full fine-tuning

    @property
    def model_type(self) -> str: ...  # "causal_lm"


_NOT_REPORTING: tuple[Any, ...] = (None, "none", [], ["none"], ("none",))
# Checkpointing names: transformers 5 calls it activation_checkpointing; TRL still documents (and defaults)
# gradient_checkpointing, a deprecated alias there. We pass both, equal, so transformers does not warn.
_CHECKPOINTING_ALIASES = (
    ("gradient_checkpointing", "activation_checkpointing"),
    ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
)


def detect_cuda() -> bool:
    """Whether torch sees a CUDA device."""
    import torch

    return bool(torch.cuda.is_available())


def detect_bf16() -> bool:
    """Whether the current CUDA device supports bf16 (``False`` without CUDA)."""
    import torch

    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False))
    except (RuntimeError, AssertionError):  # pragma: no cover - driver trouble: unsupported
        return False


def _check_user_values(cls: type, values: dict[str, Any], prefix: str = "") -> None:
    names = schema.field_names(cls)
    for name, value in values.items():
        if name not in names:
            hint = closest_name(name, names)
            raise ConfigError(
                f"{prefix}{name} is not a field of {cls.__name__}"
                + (f"; did you mean `{prefix}{hint}`?" if hint else "")
            )
        problem = schema.check_value(cls, name, value)
        if problem:
            raise ConfigError(problem)


def _rejected(
    cls: type, kwargs: dict[str, Any], user: dict[str, Any], exc: Exception, prefix: str = ""
) -> ConfigError:
    """A ConfigError naming the fields the library's message is about (by name, else by value)."""
    text = str(exc)
    mentioned = [k for k in kwargs if re.search(rf"(?<![\w.]){re.escape(k)}(?!\w)", text)]
    if not mentioned:
        mentioned = [
            k
            for k, v in user.items()
            if isinstance(v, str) and len(v) >= 2 and re.search(rf"\b{re.escape(v)}\b", text)
        ]
    mentioned.sort(key=lambda k: k not in user)  # the user's own fields first
    named = ", ".join(prefix + k for k in mentioned) or "the arguments " + ", ".join(prefix + k for k in user)
    return ConfigError(f"{cls.__name__} rejected {named}: {type(exc).__name__}: {text}")


def _is_true(value: Any) -> bool:
    return value is True or (value is not None and not isinstance(value, str) and bool(value))


def _accelerate_state_configured() -> bool:
    from accelerate.state import AcceleratorState, PartialState

    return bool(PartialState._shared_state) and bool(AcceleratorState._shared_state)


@dataclasses.dataclass
class _Args:
    """The keyword arguments of one TRL config being assembled, with the notes about what was changed."""

    cls: type
    user: dict[str, Any]
    kwargs: dict[str, Any]
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def names(self) -> frozenset[str]:
        return schema.field_names(self.cls)

    def set(self, name: str, value: Any) -> None:
        """Set ``name`` when the installed TRL config has that field (names differ across versions)."""
        if name in self.names:
            self.kwargs[name] = value


def build_training_args(
    leaf: TrainerSettings,
    output_dir: str,
    default_seed: int,
    *,
    cuda_available: bool | None = None,
    bf16_supported: bool | None = None,
) -> tuple[Any, list[str]]:
    """Build the run's real ``trl.SFTConfig``/``DPOConfig``/``GRPOConfig``, adapted to this machine.

    Rules, applied on top of the user's arguments (``leaf.training``):

    * ``seed``: the user's if set, else ``default_seed``.
    * A ``None`` the installed library no longer reads becomes what it meant (``schema.none_means``:
      ``max_grad_norm=None`` -> ``0.0``, no clipping), with a note.
    * No CUDA (or the user set ``use_cpu=True``): ``use_cpu=True``, ``fp16=False``, ``bf16=False`` (and the
      ``*_full_eval``/``tf32`` flags off); each flag the user had turned on gets a note. TRL's default
      gradient checkpointing is switched off (it only slows CPU training) unless the user set it; noted.
    * CUDA without bf16 support: ``bf16`` off (the user's or TRL's default), with a note.
    * Always: ``report_to="none"`` (rapidfire_nb tracks metrics itself: ``Experiment(tracking=[...])``; the user's
      ``report_to`` gets a note, so no transformers callback makes a second run), ``save_strategy="no"`` and
      ``load_best_model_at_end=False`` (rapidfire_nb writes its own checkpoints), ``push_to_hub=False``,
      ``disable_tqdm=True``, ``output_dir=output_dir``; overriding a value the user set is noted.
      ``dataloader_num_workers=0`` and ``logging_steps=1`` (live curves) unless the user set them.
    * ``run_name``: the run's name (``leaf.run_name``, where the spec layer keeps TRL's field), when it has one.

    Args:
        leaf: The run's resolved config (a ``LeafConfig``).
        output_dir: The trainer's output directory (not created here).
        default_seed: The experiment's seed, used when the run sets none.
        cuda_available: Whether a CUDA GPU is usable; detected with torch when ``None``.
        bf16_supported: Whether that GPU supports bf16; detected when ``None``.

    Returns:
        ``(config, notes)``: the TRL config object and the adaptation notes (human-readable sentences,
        e.g. ``"fp16=True requested but no CUDA GPU: training in fp32 (fp16 switched off)"``).

    Raises:
        ConfigError: A value of the wrong type, or TRL rejects the arguments; the message names the
            field(s) and quotes TRL's message.
    """
    if not isinstance(default_seed, numbers.Integral) or isinstance(default_seed, bool):
        raise ConfigError(f"default_seed must be an int, got {default_seed!r}")
    cls = schema.trainer_config_class(leaf.trainer_type)
    user = dict(leaf.training)
    _check_user_values(cls, user)
    # containers copied: transformers fills a dict it is given in place (fsdp_config gains xla, min_num_params,
    # ...), which would change the frozen spec and its fingerprint
    a = _Args(cls, user, {k: copy.deepcopy(v) if isinstance(v, (dict, list)) else v for k, v in user.items()})
    a.kwargs["seed"] = user["seed"] if "seed" in user else int(default_seed)
    _none_meanings(a)
    if cuda_available is None:
        cuda_available = detect_cuda()
    if not cuda_available or user.get("use_cpu") is True:
        _cpu_rules(a, "no CUDA GPU" if not cuda_available else "use_cpu=True")
    else:
        _gpu_rules(a, detect_bf16() if bf16_supported is None else bf16_supported)
    _checkpointing_aliases(a)
    _owned_by_rapidfire(a, output_dir)
    name = getattr(leaf, "run_name", None)  # the run's name (LeafConfig.run_name) in TRL's own field
    if name:
        a.set("run_name", name)
    try:
        config = cls(**a.kwargs)
    except Exception as exc:
        raise _rejected(cls, a.kwargs, user, exc) from exc
    return config, a.notes


def _none_meanings(a: _Args) -> None:
    """A ``None`` the installed library no longer reads (``max_grad_norm=None``) becomes what it meant, noted."""
    for name, value in a.user.items():
        meaning = schema.none_means(a.cls, name) if value is None else None
        if meaning is not None:
            a.kwargs[name] = meaning[0]
            a.notes.append(f"{name}=None read as {name}={meaning[0]!r} ({meaning[1]})")


def _cpu_rules(a: _Args, reason: str) -> None:
    """No CUDA (or ``use_cpu=True``): fp32 on the CPU; TRL's default gradient checkpointing off."""
    user = a.user
    for flag, what in (
        ("fp16", "training"),
        ("bf16", "training"),
        ("fp16_full_eval", "evaluating"),
        ("bf16_full_eval", "evaluating"),
    ):
        if _is_true(user.get(flag)):
            a.notes.append(f"{flag}=True requested but {reason}: {what} in fp32 ({flag} switched off)")
        if flag in ("fp16", "bf16") or flag in user:
            a.set(flag, False)
    if _is_true(user.get("tf32")):
        a.notes.append(f"tf32=True requested but {reason}: tf32 switched off")
        a.set("tf32", False)
    a.set("use_cpu", True)
    if "gradient_checkpointing" not in user and "activation_checkpointing" not in user:
        default = (
            schema.field_default(a.cls, "gradient_checkpointing")
            if "gradient_checkpointing" in a.names
            else None
        )
        a.set("gradient_checkpointing", False)
        a.set("activation_checkpointing", False)
        if default:
            a.notes.append(
                "gradient_checkpointing switched off on CPU (TRL turns it on by default; on CPU it only slows "
                "training); set gradient_checkpointing=True to keep it"
            )


def _gpu_rules(a: _Args, bf16_supported: bool) -> None:
    """CUDA: bf16 off (with a note) where the GPU does not support it."""
    if bf16_supported:
        return
    user = a.user
    if _is_true(user.get("bf16")):
        a.notes.append(
            "bf16=True requested but this GPU does not support bf16: training in fp32 (bf16 switched off)"
        )
    elif (
        "bf16" not in user
        and not _is_true(user.get("fp16"))
        and schema.field_default(a.cls, "bf16") in (None, True)
    ):
        a.notes.append(
            "TRL's default bf16=True is not supported by this GPU: training in fp32 (bf16 switched off)"
        )
    a.set("bf16", False)
    if _is_true(user.get("bf16_full_eval")):
        a.notes.append(
            "bf16_full_eval=True requested but this GPU does not support bf16: bf16_full_eval switched off"
        )
        a.set("bf16_full_eval", False)


def _checkpointing_aliases(a: _Args) -> None:
    """Pass both checkpointing names, equal, so transformers does not warn about the deprecated one."""
    for old, new in _CHECKPOINTING_ALIASES:
        if old in a.names and new in a.names and a.kwargs.get(new) is None:
            value = a.kwargs[old] if old in a.kwargs else schema.field_default(a.cls, old)
            if value is not None:
                a.kwargs[new] = a.kwargs[old] = value


def _owned_by_rapidfire(a: _Args, output_dir: str) -> None:
    """Fields rapidfire_nb decides itself (tracking, checkpoints, output folder, logging cadence)."""
    user = a.user
    report_to = user.get("report_to")
    if report_to not in _NOT_REPORTING:
        a.notes.append(
            f"report_to={report_to!r} replaced by 'none': rapidfire_nb records the metrics itself (transformers' "
            "callbacks hold one run per process); for MLflow, Trackio or W&B use "
            "Experiment(name, tracking=['mlflow', 'trackio', 'wandb'])"
        )
    a.set("report_to", "none")
    save_strategy = getattr(user.get("save_strategy"), "value", user.get("save_strategy"))
    if save_strategy not in (None, "no"):
        a.notes.append(
            f"save_strategy={save_strategy!r} replaced by 'no': rapidfire_nb checkpoints every run at chunk boundaries"
        )
    a.set("save_strategy", "no")
    if _is_true(user.get("load_best_model_at_end")):
        a.notes.append(
            "load_best_model_at_end=True switched off: rapidfire_nb saves the checkpoints, not the Trainer"
        )
        a.set("load_best_model_at_end", False)
    if _is_true(user.get("push_to_hub")):
        a.notes.append("push_to_hub=True switched off: push a finished run's saved adapter yourself")
        a.set("push_to_hub", False)
    if user.get("output_dir") not in (None, output_dir):
        a.notes.append(f"output_dir={user['output_dir']!r} replaced by the run's own folder {output_dir!r}")
    a.set("output_dir", output_dir)
    a.set("disable_tqdm", True)
    if "dataloader_num_workers" not in user:
        a.set("dataloader_num_workers", 0)
    if "logging_steps" not in user:
        a.set("logging_steps", 1)
    if "accelerator_config" not in user and _accelerate_state_configured():
        # Building TrainingArguments otherwise resets accelerate's process-wide state, which breaks the parked
        # trainers of runs that are training in this process (one device per process: they share it).
        a.set("accelerator_config", {"use_configured_state": True})


def build_lora_config(leaf: TrainerSettings) -> Any:
    """Build the run's ``peft.LoraConfig`` (``None`` for full fine-tuning).

    Args:
        leaf: The run's resolved config (a ``LeafConfig``); ``leaf.lora`` holds the user's LoRA arguments.

    Returns:
        A ``peft.LoraConfig`` with ``task_type="CAUSAL_LM"`` unless the user set one (or the model type is
        not ``"causal_lm"``), or ``None`` when ``leaf.lora`` is ``None``.

    Raises:
        ConfigError: A value of the wrong type or range (e.g. ``r <= 0``), or PEFT rejects the arguments;
            the message names the field (``lora.<field>``) and quotes PEFT's message.
    """
    if leaf.lora is None:
        return None
    cls = schema.lora_config_class()
    user = dict(leaf.lora)
    try:
        _check_user_values(cls, user, prefix="lora.")
    except ConfigError as exc:
        raise ConfigError(str(exc).replace(f"{cls.__name__}.", "lora.", 1)) from None
    kwargs = dict(user)
    if "task_type" not in kwargs and leaf.model_type == "causal_lm":
        kwargs["task_type"] = "CAUSAL_LM"
    try:
        return cls(**kwargs)
    except Exception as exc:
        raise _rejected(cls, kwargs, user, exc, prefix="lora.") from exc
