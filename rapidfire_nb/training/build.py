"""Build the real TRL config and ``peft.LoraConfig`` of one run, adapted to this machine.

The user's arguments (``LeafConfig.training``/``.lora``) are kept as written; what rapidfire_nb must
override to run them here (precision on a CPU-only machine, its own checkpointing and tracking) is applied
on top and reported as human-readable notes, never silently.
"""

from __future__ import annotations

import numbers
import re
from typing import TYPE_CHECKING, Any

from rapidfire_nb.errors import ConfigError, closest_name

from . import fields

if TYPE_CHECKING:  # pragma: no cover
    from rapidfire_nb.automl.leaf import LeafConfig

__all__ = ["build_lora_config", "build_training_args", "detect_bf16", "detect_cuda"]

_NOT_REPORTING = (None, "none", [], ["none"], ("none",))
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
    names = fields.field_names(cls)
    for name, value in values.items():
        if name not in names:
            hint = closest_name(name, names)
            raise ConfigError(
                f"{prefix}{name} is not a field of {cls.__name__}"
                + (f"; did you mean `{prefix}{hint}`?" if hint else "")
            )
        problem = fields.check_value(cls, name, value)
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


def build_training_args(
    leaf: LeafConfig,
    output_dir: str,
    default_seed: int,
    *,
    cuda_available: bool | None = None,
    bf16_supported: bool | None = None,
) -> tuple[Any, list[str]]:
    """Build the run's real ``trl.SFTConfig``/``DPOConfig``/``GRPOConfig``, adapted to this machine.

    Rules, applied on top of the user's arguments (``leaf.training``):

    * ``seed``: the user's if set, else ``default_seed``.
    * No CUDA (or the user set ``use_cpu=True``): ``use_cpu=True``, ``fp16=False``, ``bf16=False`` (and the
      ``*_full_eval``/``tf32`` flags off); each flag the user had turned on gets a note. TRL's default
      gradient checkpointing is switched off (it only slows CPU training) unless the user set it; noted.
    * CUDA without bf16 support: ``bf16`` off (the user's or TRL's default), with a note.
    * Always: ``report_to="none"`` (rapidfire_nb tracks metrics itself), ``save_strategy="no"`` and
      ``load_best_model_at_end=False`` (rapidfire_nb writes its own checkpoints), ``push_to_hub=False``,
      ``disable_tqdm=True``, ``output_dir=output_dir``; overriding a value the user set is noted.
      ``dataloader_num_workers=0`` and ``logging_steps=1`` (live curves) unless the user set them.

    Args:
        leaf: The run's resolved config.
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
    cls = fields.trainer_config_class(leaf.trainer_type)
    names = fields.field_names(cls)
    user = dict(leaf.training)
    _check_user_values(cls, user)
    kwargs: dict[str, Any] = dict(user)
    notes: list[str] = []

    def set_field(name: str, value: Any) -> None:
        if name in names:
            kwargs[name] = value

    kwargs["seed"] = user["seed"] if "seed" in user else int(default_seed)

    if cuda_available is None:
        cuda_available = detect_cuda()
    on_cpu = not cuda_available or user.get("use_cpu") is True
    if on_cpu:
        reason = "no CUDA GPU" if not cuda_available else "use_cpu=True"
        for flag, what in (
            ("fp16", "training"),
            ("bf16", "training"),
            ("fp16_full_eval", "evaluating"),
            ("bf16_full_eval", "evaluating"),
        ):
            if _is_true(user.get(flag)):
                notes.append(f"{flag}=True requested but {reason}: {what} in fp32 ({flag} switched off)")
            if flag in ("fp16", "bf16") or flag in user:
                set_field(flag, False)
        if _is_true(user.get("tf32")):
            notes.append(f"tf32=True requested but {reason}: tf32 switched off")
            set_field("tf32", False)
        set_field("use_cpu", True)
        if "gradient_checkpointing" not in user and "activation_checkpointing" not in user:
            default = (
                fields.field_default(cls, "gradient_checkpointing")
                if "gradient_checkpointing" in names
                else None
            )
            set_field("gradient_checkpointing", False)
            set_field("activation_checkpointing", False)
            if default:
                notes.append(
                    "gradient_checkpointing switched off on CPU (TRL turns it on by default; on CPU it only slows "
                    "training); set gradient_checkpointing=True to keep it"
                )
    else:
        if bf16_supported is None:
            bf16_supported = detect_bf16()
        if not bf16_supported:
            if _is_true(user.get("bf16")):
                notes.append(
                    "bf16=True requested but this GPU does not support bf16: training in fp32 (bf16 switched off)"
                )
            elif (
                "bf16" not in user
                and not _is_true(user.get("fp16"))
                and fields.field_default(cls, "bf16") in (None, True)
            ):
                notes.append(
                    "TRL's default bf16=True is not supported by this GPU: training in fp32 (bf16 switched off)"
                )
            set_field("bf16", False)
            if _is_true(user.get("bf16_full_eval")):
                notes.append(
                    "bf16_full_eval=True requested but this GPU does not support bf16: bf16_full_eval switched off"
                )
                set_field("bf16_full_eval", False)

    for old, new in _CHECKPOINTING_ALIASES:
        if old in names and new in names and kwargs.get(new) is None:
            value = kwargs[old] if old in kwargs else fields.field_default(cls, old)
            if value is not None:
                kwargs[new] = kwargs[old] = value

    report_to = user.get("report_to")
    if report_to not in _NOT_REPORTING:
        notes.append(f"report_to={report_to!r} replaced by 'none': rapidfire_nb records the metrics itself")
    set_field("report_to", "none")
    save_strategy = getattr(user.get("save_strategy"), "value", user.get("save_strategy"))
    if save_strategy not in (None, "no"):
        notes.append(
            f"save_strategy={save_strategy!r} replaced by 'no': rapidfire_nb checkpoints every run at chunk boundaries"
        )
    set_field("save_strategy", "no")
    if _is_true(user.get("load_best_model_at_end")):
        notes.append(
            "load_best_model_at_end=True switched off: rapidfire_nb saves the checkpoints, not the Trainer"
        )
        set_field("load_best_model_at_end", False)
    if _is_true(user.get("push_to_hub")):
        notes.append("push_to_hub=True switched off: push a finished run's saved adapter yourself")
        set_field("push_to_hub", False)
    if user.get("output_dir") not in (None, output_dir):
        notes.append(f"output_dir={user['output_dir']!r} replaced by the run's own folder {output_dir!r}")
    set_field("output_dir", output_dir)
    set_field("disable_tqdm", True)
    if "dataloader_num_workers" not in user:
        set_field("dataloader_num_workers", 0)
    if "logging_steps" not in user:
        set_field("logging_steps", 1)
    if "accelerator_config" not in user and _accelerate_state_configured():
        # Building TrainingArguments otherwise resets accelerate's process-wide state, which breaks the parked
        # trainers of runs that are training in this process (one device per process: they share it).
        set_field("accelerator_config", {"use_configured_state": True})

    try:
        config = cls(**kwargs)
    except Exception as exc:
        raise _rejected(cls, kwargs, user, exc) from exc
    return config, notes


def build_lora_config(leaf: LeafConfig) -> Any:
    """Build the run's ``peft.LoraConfig`` (``None`` for full fine-tuning).

    Args:
        leaf: The run's resolved config; ``leaf.lora`` holds the user's LoRA arguments.

    Returns:
        A ``peft.LoraConfig`` with ``task_type="CAUSAL_LM"`` unless the user set one (or the model type is
        not ``"causal_lm"``), or ``None`` when ``leaf.lora`` is ``None``.

    Raises:
        ConfigError: A value of the wrong type or range (e.g. ``r <= 0``), or PEFT rejects the arguments;
            the message names the field (``lora.<field>``) and quotes PEFT's message.
    """
    if leaf.lora is None:
        return None
    cls = fields.lora_config_class()
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
