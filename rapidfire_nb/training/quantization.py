"""Quantized shared bases: the seeds' 4-bit / 8-bit recipe (bitsandbytes through ``model_kwargs``), checked and noted.

The recipe is ``RFModelConfig(model_kwargs={"quantization_config": BitsAndBytesConfig(load_in_4bit=True, ...),
"device_map": "auto"})``: ``create_model_fn`` passes ``model_kwargs`` to ``from_pretrained``, which loads the base
with bitsandbytes' ``Linear4bit`` / ``Linear8bitLt`` layers. LoRA runs with equal ``model_name`` and
``model_kwargs`` share that one quantized base (:class:`~rapidfire_nb.training.models.BaseModels`), so N runs cost
one base's memory. What TRL 1.16 does for a quantized model happens per trainer exactly as in a plain run: it casts
the run's trainable (adapter) weights to bf16, and with gradient checkpointing calls ``enable_input_require_grads``
(``SFTTrainer.__init__``; the same in the DPO and GRPO trainers). TRL does not call PEFT's
``prepare_model_for_kbit_training``; a ``create_model_fn`` that does is called once per base, so every run on it
gets the same preparation.

Full fine-tuning of a quantized base is refused before anything is loaded: transformers' ``Trainer`` refuses it
("You cannot perform fine-tuning on purely quantized models"), and the 4-bit weights have no gradient.

Importing this module imports neither torch nor transformers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rapidfire_nb._quiet_logs import HUB_KERNEL_LINE
from rapidfire_nb.errors import ConfigError
from rapidfire_nb.spec import LeafConfig
from rapidfire_nb.spec.values import jsonable

__all__ = [
    "QUANTIZATION_FIELD",
    "cpu_note",
    "describe",
    "full_finetune_refusal",
    "input_grads_once",
    "is_quantized",
    "keep_adapter_dtypes_on_resume",
    "keep_cpu_weights_unpacked",
    "kwargs_key",
    "refuse_full_finetune",
    "refuse_quantized_full_finetunes",
    "revive_in_model_config",
    "revive_quantization_config",
]

QUANTIZATION_FIELD = "model_kwargs.quantization_config"
"""The field of ``RFModelConfig`` that holds a ``BitsAndBytesConfig`` (hparam name)."""


def describe(quantization: Any) -> str | None:
    """A short name of a quantization config (``"4-bit nf4"``, ``"8-bit"``, ``"gptq"``), or ``None`` when none.

    Args:
        quantization: a ``BitsAndBytesConfig`` (or another transformers quantization config), its ``to_dict()``
            form (what the store and the clone form hold), or ``None``.
    """
    if quantization is None:
        return None
    get = (
        quantization.get
        if isinstance(quantization, Mapping)
        else lambda k, d=None: getattr(quantization, k, d)
    )
    if get("load_in_4bit", False) or get("_load_in_4bit", False):
        return f"4-bit {get('bnb_4bit_quant_type', 'fp4')}"
    if get("load_in_8bit", False) or get("_load_in_8bit", False):
        return "8-bit"
    method = get("quant_method", None)
    method = getattr(method, "value", method)
    return str(method) if method else type(quantization).__name__


def full_finetune_refusal(spec: LeafConfig) -> str | None:
    """Why ``spec`` cannot train: full fine-tuning (no ``peft_config``) of a base quantized through ``model_kwargs``.

    Pure: reads the spec only (nothing is loaded).

    Args:
        spec: a run spec.

    Returns:
        The error message (names the field and the fix), or ``None`` when the run can train.
    """
    what = describe(spec.model_kwargs.get("quantization_config"))
    if spec.lora is not None or what is None:
        return None
    return (
        f"{QUANTIZATION_FIELD} loads {spec.model_name!r} {what}-quantized, and peft_config=None asks for full "
        "fine-tuning: quantized weights cannot be trained (transformers refuses 'fine-tuning on purely quantized "
        "models'). Set peft_config=RFLoraConfig(...) to train LoRA adapters on the quantized base (QLoRA), or drop "
        "quantization_config to fine-tune every weight"
    )


def is_quantized(model: Any) -> bool:
    """Whether ``model`` (or the base under a ``PeftModel``) was loaded quantized (bitsandbytes or another method)."""
    for name in ("is_loaded_in_4bit", "is_loaded_in_8bit", "is_quantized"):
        try:
            if getattr(model, name, False) is True:
                return True
        except Exception:  # noqa: BLE001 - a model's __getattr__ may raise anything for a missing name
            continue
    return False


def refuse_full_finetune(model: Any, spec: LeafConfig) -> None:
    """Refuse full fine-tuning of a model ``create_model_fn`` returned quantized without trainable adapters.

    Raises:
        ConfigError: ``model`` is quantized and every parameter is frozen or quantized (names the fix).
    """
    if not is_quantized(model):
        return
    from peft.tuners.tuners_utils import BaseTunerLayer

    if any(isinstance(m, BaseTunerLayer) for m in model.modules()):  # the user's own adapter: theirs to train
        return
    raise ConfigError(
        full_finetune_refusal(spec)
        or f"create_model_fn returned {spec.model_name!r} quantized ({QUANTIZATION_FIELD} or its own loading), "
        "and peft_config=None asks for full fine-tuning: quantized weights cannot be trained. Set "
        "peft_config=RFLoraConfig(...) to train LoRA adapters on it"
    )


def revive_quantization_config(model_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``model_kwargs`` with a stored ``quantization_config`` dict turned back into its transformers class.

    The store, the clone form and a clone's recorded changes hold a ``BitsAndBytesConfig`` as its ``to_dict()``
    plus ``"__class__"`` (:func:`rapidfire_nb.spec.values.jsonable`); ``from_pretrained`` gets the config object
    again, equal to the one the user wrote.

    Args:
        model_kwargs: ``from_pretrained`` keywords (changed in place and returned).

    Returns:
        ``model_kwargs``.
    """
    value = model_kwargs.get("quantization_config")
    if isinstance(value, Mapping) and "quant_method" in value:
        from transformers.quantizers.auto import AutoQuantizationConfig

        data = {k: v for k, v in value.items() if k != "__class__"}
        model_kwargs["quantization_config"] = AutoQuantizationConfig.from_dict(data)
    return model_kwargs


def revive_in_model_config(model_config: dict[str, Any]) -> dict[str, Any]:
    """:func:`revive_quantization_config` on a ``create_model_fn`` config's ``model_kwargs`` and ``ref_model_kwargs``
    (changed in place and returned)."""
    for name in ("model_kwargs", "ref_model_kwargs"):
        if isinstance(model_config.get(name), dict):
            revive_quantization_config(model_config[name])
    return model_config


def kwargs_key(model_kwargs: Mapping[str, Any]) -> str:
    """``model_kwargs`` as the shared-base key holds them: a quantization config as its JSON data, so a config
    object and its stored dict form (a clone's) name the same base; other values by ``repr``, as before."""
    items = [
        (k, json.dumps(jsonable(v), sort_keys=True) if k == "quantization_config" else v)
        for k, v in sorted(model_kwargs.items())
    ]
    return repr(items)


def cpu_note(model: Any) -> str | None:
    """What a user on a CPU should know once about a quantized base, or ``None`` (not quantized, or on a GPU).

    bitsandbytes 0.50 tries, on import on a CPU with AVX512-BF16, to fetch a fused 4-bit matrix-vector kernel from
    the Hugging Face Hub (``kernels-community/quantization-bitsandbytes``) and logs "Failed to load CPU
    gemm_4bit_forward ..." when it cannot (offline, or the repository not trusted). It then uses its own
    kernels: results are the same; only batch-1 generation loses the fused path.

    Args:
        model: the loaded base.
    """
    if not is_quantized(model):
        return None
    try:
        device = next(model.parameters()).device.type
    except (StopIteration, AttributeError):
        return None
    if device != "cpu":
        return None
    return (
        "the base is loaded quantized on the CPU: bitsandbytes dequantizes the weights at every forward, so a step "
        "is slower than in full precision here (benchmarks/quantized.py); the memory saving is what it is for, on "
        "a GPU. bitsandbytes' optional fused CPU kernel, fetched from the Hugging Face Hub, is not used offline "
        f"(its line '{HUB_KERNEL_LINE} ...' is hidden): its built-in kernels give the same results"
    )


def refuse_quantized_full_finetunes(specs: Any) -> None:
    """Refuse a config group with a full fine-tuning run on a quantized base, before anything is loaded.

    Args:
        specs: the group's run specs, in run order (run ids from 1).

    Raises:
        ConfigError: the first such run's :func:`full_finetune_refusal`, prefixed with its run number.
    """
    for i, spec in enumerate(specs, start=1):
        problem = full_finetune_refusal(spec)
        if problem is not None:
            raise ConfigError(f"config {i} of the group: {problem}")


def keep_adapter_dtypes_on_resume(trainer: Any) -> bool:
    """Make a resume on a quantized base keep the run's adapter in the dtype it trains in (bf16 after TRL's cast).

    TRL casts a QLoRA run's trainable weights to bf16 when it builds the trainer. Resuming from a checkpoint
    (a warm clone's start, a restart after a crash) goes through ``Trainer._load_from_checkpoint`` ->
    ``PeftModel.load_adapter``, whose ``autocast_adapter_dtype=True`` casts bf16 adapter weights up to float32
    (peft 0.21 ``_cast_adapter_dtype``): the resumed run would train on in float32, and no longer equal the same
    run trained without the interruption. Here the load is followed by a cast back of each trainable weight to the
    dtype it had before the load (bf16 -> float32 -> bf16 is exact). Installed only for a quantized model.

    Args:
        trainer: a LoRA run's trainer, right after it was built.

    Returns:
        Whether it was installed (the model is quantized and the trainer has ``_load_from_checkpoint``).
    """
    load = getattr(trainer, "_load_from_checkpoint", None)
    if load is None or not is_quantized(trainer.model):
        return False

    def load_keeping_dtypes(resume_from_checkpoint: str, model: Any = None) -> Any:
        target = trainer.model if model is None else model
        dtypes = {name: p.dtype for name, p in target.named_parameters() if p.requires_grad}
        out = load(resume_from_checkpoint, model)
        for name, p in target.named_parameters():
            if name in dtypes and p.dtype != dtypes[name]:
                p.data = p.data.to(dtypes[name])
        return out

    trainer._load_from_checkpoint = load_keeping_dtypes
    return True


def input_grads_once(model: Any) -> bool:
    """After a run's trainer is built: the input-gradient hook stays the one already on the model's embeddings.

    With gradient checkpointing TRL calls ``model.enable_input_require_grads()`` when it builds a trainer
    (``SFTTrainer.__init__``, the same in DPO/GRPO), and transformers' ``Trainer.train`` calls it again when it turns
    checkpointing on; each call registers one more forward hook on the input embeddings (making their output
    require grad). A plain run's model ends with 2 such hooks; a base shared by N runs would get 2 N. Once the
    model carries the hook, later calls do nothing (an instance attribute on the transformers model, which
    ``PeftModel`` forwards to): the base is prepared once, the same for every run on it, and nothing else changes
    (a hook that sets ``requires_grad`` acts the same once or many times).

    Args:
        model: the model the trainer was given (the shared ``PeftModel``, or a full fine-tuning run's copy).

    Returns:
        Whether the model carries the hook (and later calls were made no-ops).
    """
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(inner, "_require_grads_hooks", None):
        return False
    inner.enable_input_require_grads = _already_enabled
    return True


def _already_enabled() -> None:
    """``enable_input_require_grads`` on a model whose input embeddings carry the hook already: nothing to do."""


def keep_cpu_weights_unpacked(model: Any) -> int:
    """Keep a 4-bit base's weights in bitsandbytes' training layout on a CPU: no eval-time repacking.

    bitsandbytes 0.50, on a CPU with AVX512-BF16, repacks a ``Linear4bit`` weight into an inference layout at its
    first forward in eval mode (``Linear4bit.forward``: ``_convert_weight_packed_for_cpu``) and keeps it so: every
    later forward, in training too, goes through ``gemv_4bit``, which has no autograd kernel (PyTorch warns "an
    autograd kernel was not registered ... silently incorrect behavior"): no gradient flows back through the base
    layers to the adapters below them. On a shared base one run's chunk-end evaluation (or generation eval) would
    so change every run's training. Here the repacking is switched off on each ``Linear4bit`` (its
    ``support_avx512bf16_for_cpu`` set False), and a weight already repacked is converted back: evaluations leave
    the base as training needs it. On a GPU nothing changes.

    Args:
        model: the loaded base (a ``PreTrainedModel``; any ``nn.Module``).

    Returns:
        The number of ``Linear4bit`` layers switched.
    """
    switched = 0
    for module in model.modules():
        if not hasattr(module, "support_avx512bf16_for_cpu"):
            continue
        module.support_avx512bf16_for_cpu = False
        state = getattr(module.weight, "quant_state", None)
        if getattr(state, "packing_format_for_cpu", False):
            from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse

            module.weight.data, module.weight.quant_state = _convert_weight_packed_for_cpu_inverse(
                module.weight.data, state
            )
        switched += 1
    return switched
