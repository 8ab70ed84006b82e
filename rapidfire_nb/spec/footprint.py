"""What one run costs before anything is built: trainable parameters, adapter, optimizer state, checkpoint bytes.

Torch-free: everything is computed from the base model's config (a ``transformers.PretrainedConfig`` or a plain
dict with ``model_type``, ``hidden_size``, ``intermediate_size``, ``num_hidden_layers``, ``num_attention_heads``,
``num_key_value_heads``, ``head_dim``, ``vocab_size``, ``tie_word_embeddings``, ``attention_bias``, ``mlp_bias``,
``torch_dtype``/``dtype``) and the run's LoRA keywords. It is the one estimator of a run's size: the IC Ops and
``run_fit`` check a config against the free disk and device memory with it (``rapidfire_nb.experiment.resources``),
and packing runs onto one device sizes its packs with it.

Formulas (bytes; ``b`` = bytes per element of a tensor's dtype):

* LoRA on a linear layer ``in -> out`` (PEFT ``peft/tuners/lora/layer.py``, ``LoraLayer.update_layer``):
  ``lora_A: nn.Linear(in, r)`` (weight ``r x in``) and ``lora_B: nn.Linear(r, out)`` (weight ``out x r``), so
  ``r * (in + out)`` parameters; DoRA adds ``lora_magnitude_vector`` (``out``). ``r`` is ``rank_pattern``'s value
  for the layer when a key matches it, else ``lora.r``. The adapter is float32 (PEFT's
  ``autocast_adapter_dtype=True`` upcasts bf16/fp16 adapters; a float32 base gives float32 anyway).
* Which layers: ``target_modules`` as PEFT matches it (``check_target_module_exists``): a string is a regex
  that must match the full module name; a list matches a name equal to an entry or ending in ``.entry``;
  ``"all-linear"`` is every linear layer except the output layer (``lm_head``); None is PEFT's default for the
  model type (``q_proj``, ``v_proj`` for the families below). ``exclude_modules`` and ``layers_to_transform``
  narrow it the same way.
* ``modules_to_save`` (PEFT's ``ModulesToSaveWrapper``): a trainable copy of each matching module (name ending
  in the entry), in the base's dtype. ``bias="all"`` / ``"lora_only"`` trains the base's biases (all of them /
  those of the targeted layers).
* Full fine-tuning (no LoRA): every parameter of the base is trainable, in the base's dtype.
* Gradients: one per trainable parameter, in its dtype (autograd's ``.grad``).
* Optimizer state: ``torch.optim.AdamW`` keeps ``exp_avg`` and ``exp_avg_sq`` (``zeros_like(param)``: the
  parameter's dtype) and a float32 ``step`` scalar per parameter tensor (``torch/optim/adamw.py``,
  ``_init_group``); :data:`OPTIMIZER_STATES` lists the states of the other ``optim`` names transformers offers.
* A checkpoint (``rapidfire_nb.training.checkpoint``): the trainable weights (``adapter_model.safetensors`` or
  ``model.safetensors``) + ``optimizer.pt`` + :data:`CHECKPOINT_REST_BYTES` (``scheduler.pt``,
  ``rng_state.pth``, ``trainer_state.json``, ``training_args.bin``, configs) + a per-tensor overhead
  (:data:`TENSOR_OVERHEAD_BYTES`: the safetensors header entry, and each tensor's pickle entry and zip record in
  ``optimizer.pt``). Measured against the writer on the tiny models (within 1 %: see the tests).
* Device memory per run: trainable weights + gradients + optimizer state (the shared base is loaded once and
  not counted; activations depend on the batch and are not estimated).

Supported layouts: the decoder families whose layers are ``self_attn.{q,k,v,o}_proj`` and
``mlp.{gate,up,down}_proj`` (:data:`FAMILIES`: Llama/SmolLM2, Mistral, Qwen2, Qwen3); for any other model type
:meth:`BaseShapes.from_config` returns None (nothing is estimated, nothing refused).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "activation_bytes",
    "CHECKPOINT_REST_BYTES",
    "FAMILIES",
    "OPTIMIZER_STATES",
    "TENSOR_OVERHEAD_BYTES",
    "BaseShapes",
    "Footprint",
    "Layer",
    "estimate",
    "format_bytes",
]

FAMILIES: tuple[str, ...] = ("llama", "mistral", "qwen2", "qwen3")
"""Model types whose module layout :class:`BaseShapes` knows (PEFT's default targets: ``q_proj``, ``v_proj``)."""

_DEFAULT_TARGETS: tuple[str, ...] = ("q_proj", "v_proj")  # peft.utils.constants, the same for all FAMILIES

OPTIMIZER_STATES: dict[str, float] = {
    "adamw": 2.0,  # adamw_torch, adamw_torch_fused, adamw_hf, adamw_apex_fused, ...: exp_avg, exp_avg_sq
    "adam": 2.0,
    "8bit": 0.5,  # bitsandbytes 8-bit Adam: 2 states of 1 byte (as a share of a float32 parameter's 4 bytes)
    "lion": 1.0,  # exp_avg only
    "sgd": 0.0,  # transformers builds torch.optim.SGD without momentum: no state
    "adafactor": 0.0,  # factored second moments: O(rows + columns), left out
}
"""Optimizer state per trainable parameter, in parameter-sized units, by a substring of ``training.optim``
(first match in this order wins after ``8bit``; an unknown optimizer counts as AdamW: 2)."""

TENSOR_OVERHEAD_BYTES = 920
"""Bytes a checkpoint spends per trainable tensor beyond its data: its safetensors header entry (~126) and, in
``optimizer.pt``, the pickle entries and zip records of its ``exp_avg``, ``exp_avg_sq`` and ``step`` (~790;
measured with torch 2.x on the tiny models' checkpoints with 4 to 28 tensors)."""

CHECKPOINT_REST_BYTES = 26_000
"""The rest of a checkpoint folder: ``rng_state.pth`` (~14 KB), ``training_args.bin`` (~6 KB),
``trainer_state.json``, ``scheduler.pt``, ``adapter_config.json``/``config.json``, counters, ``optimizer.pt``'s
own header (~1.4 KB); measured ~26 KB."""

_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float64": 8, "double": 8}


@dataclass(frozen=True)
class Layer:
    """One parameterised module of the base: its full name (as in ``model.named_modules()``), kind
    (``"linear"``, ``"embedding"``, ``"norm"``), input and output sizes, and whether it has a bias."""

    name: str
    kind: str
    inputs: int
    outputs: int
    bias: bool = False

    @property
    def params(self) -> int:
        """Parameters of the module itself (weight, plus a bias of ``outputs``)."""
        if self.kind == "norm":
            return self.outputs
        return self.inputs * self.outputs + (self.outputs if self.bias else 0)


@dataclass(frozen=True)
class BaseShapes:
    """The sizes of a decoder-only base that fix its parameter shapes (see the module docstring).

    Attributes:
        model_type: one of :data:`FAMILIES`.
        hidden, intermediate, layers, heads, kv_heads, head_dim, vocab: the config's sizes (elements).
        tied: the output layer shares the input embedding's weight (``tie_word_embeddings``).
        qkv_bias / o_bias / mlp_bias: which linear layers carry a bias.
        qk_norm: per-head RMSNorms on queries and keys (Qwen3).
        dtype_bytes: bytes per element of the base's weights (the config's dtype; 4 when unset).
    """

    model_type: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    dtype_bytes: int = 4

    @classmethod
    def from_config(cls, config: Any, dtype: Any = None) -> BaseShapes | None:
        """Shapes from a ``transformers.PretrainedConfig`` or a dict of its fields; None for an unknown layout.

        Args:
            config: the base's config (``model.config``, ``AutoConfig.from_pretrained(...)``, or its ``to_dict()``).
            dtype: the dtype the base is loaded in (``model_kwargs["dtype"]``: a name or a ``torch.dtype``),
                overriding the config's; None or ``"auto"``: the config's.
        """
        c: Mapping[str, Any] = config if isinstance(config, Mapping) else config.to_dict()
        kind = str(c.get("model_type") or "")
        if kind not in FAMILIES:
            return None
        try:
            hidden, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
            kv = int(c.get("num_key_value_heads") or heads)
            head_dim = int(c.get("head_dim") or hidden // heads)
            attention_bias = bool(c.get("attention_bias", False))
            return cls(
                model_type=kind,
                hidden=hidden,
                intermediate=int(c["intermediate_size"]),
                layers=int(c["num_hidden_layers"]),
                heads=heads,
                kv_heads=kv,
                head_dim=head_dim,
                vocab=int(c["vocab_size"]),
                tied=bool(c.get("tie_word_embeddings", False)),  # the default of these families
                qkv_bias=kind == "qwen2" or attention_bias,
                o_bias=attention_bias,
                mlp_bias=bool(c.get("mlp_bias", False)),
                qk_norm=kind == "qwen3",
                dtype_bytes=dtype_bytes(dtype if dtype not in (None, "auto") else _config_dtype(c)),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def modules(self) -> list[Layer]:
        """Every parameterised module, named as in ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` & co."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        out = [Layer("model.embed_tokens", "embedding", self.vocab, h)]
        for i in range(self.layers):
            p = f"model.layers.{i}"
            out += [
                Layer(f"{p}.self_attn.q_proj", "linear", h, q, self.qkv_bias),
                Layer(f"{p}.self_attn.k_proj", "linear", h, kv, self.qkv_bias),
                Layer(f"{p}.self_attn.v_proj", "linear", h, kv, self.qkv_bias),
                Layer(f"{p}.self_attn.o_proj", "linear", q, h, self.o_bias),
                Layer(f"{p}.mlp.gate_proj", "linear", h, self.intermediate, self.mlp_bias),
                Layer(f"{p}.mlp.up_proj", "linear", h, self.intermediate, self.mlp_bias),
                Layer(f"{p}.mlp.down_proj", "linear", self.intermediate, h, self.mlp_bias),
                Layer(f"{p}.input_layernorm", "norm", h, h),
                Layer(f"{p}.post_attention_layernorm", "norm", h, h),
            ]
            if self.qk_norm:
                out += [
                    Layer(f"{p}.self_attn.q_norm", "norm", self.head_dim, self.head_dim),
                    Layer(f"{p}.self_attn.k_norm", "norm", self.head_dim, self.head_dim),
                ]
        out.append(Layer("model.norm", "norm", h, h))
        out.append(Layer("lm_head", "linear", h, self.vocab))  # its weight is the embedding's when tied
        return out

    def total_params(self) -> int:
        """``sum(p.numel() for p in model.parameters())`` (a tied output layer counted once)."""
        return sum(m.params for m in self.modules() if not (self.tied and m.name == "lm_head"))

    def tensors(self) -> int:
        """The number of parameter tensors (weights and biases; a tied output layer counted once)."""
        return sum(
            1 + (m.kind == "linear" and m.bias)
            for m in self.modules()
            if not (self.tied and m.name == "lm_head")
        )


@dataclass(frozen=True)
class Footprint:
    """One run's estimated size (bytes unless named otherwise).

    Attributes:
        trainable_params: ``sum(p.numel() for p in model.parameters() if p.requires_grad)``.
        trainable_tensors: how many tensors hold them.
        weights_bytes: the trainable weights (the adapter, or the whole model for full fine-tuning).
        optimizer_bytes: the optimizer's state for them (``optimizer.pt``'s tensors).
        checkpoint_bytes: one boundary checkpoint folder on disk (weights + optimizer + the rest).
        final_bytes: the run's final weights folder (``final``: the trainable weights, configs and the tokenizer,
            taken as 50 bytes per vocabulary entry: SmolLM2's ``tokenizer.json`` is 2.1 MB for 49,152).
        memory_bytes: device memory of the run beside the shared base: weights + gradients + optimizer state.
        min_rank_dim: the smallest input or output size among the LoRA-targeted layers (LoRA's full rank there),
            or None (no LoRA layer).
        targeted: how many linear layers get a LoRA adapter.
    """

    trainable_params: int
    trainable_tensors: int
    weights_bytes: int
    optimizer_bytes: int
    checkpoint_bytes: int
    final_bytes: int
    memory_bytes: int
    min_rank_dim: int | None = None
    targeted: int = 0


def activation_bytes(shapes: BaseShapes, tokens: int, dtype_bytes: int = 4) -> int:
    """Activations one training micro-batch of ``tokens`` tokens (rows x padded length) holds for its backward,
    estimated (bytes): what a pack adds per run beside time-slicing, where one run's are alive at a time.

    Per token and decoder layer (a Llama-style layer, what autograd saves for the backward): the two RMSNorms'
    inputs and outputs and the attention input and output (``8 x hidden``), keys and values
    (``2 x kv_heads x head_dim``), and the MLP's gate, up, activation, product and down input
    (``5 x intermediate``); plus the logits once per token (``vocab``; TRL's fused LM head keeps less). LoRA's own
    tensors (rank-sized) are left out. An upper estimate for SDPA attention, which keeps no ``T x T`` matrix.

    Args:
        shapes: the base's shapes.
        tokens: rows x padded length of the micro-batch (tokens).
        dtype_bytes: bytes per activation element (4: fp32; 2: bf16/fp16 autocast).

    Returns:
        The estimate, in bytes.
    """
    per_layer = 8 * shapes.hidden + 2 * shapes.kv_heads * shapes.head_dim + 5 * shapes.intermediate
    return int(tokens) * (shapes.layers * per_layer + shapes.vocab) * int(dtype_bytes)


def estimate(shapes: BaseShapes, lora: Mapping[str, Any] | None, optim: str | None = None) -> Footprint:
    """One run's :class:`Footprint` on base ``shapes`` with LoRA keywords ``lora`` (None: full fine-tuning).

    Args:
        shapes: the base's :class:`BaseShapes`.
        lora: the run's ``peft.LoraConfig`` keywords (``r``, ``target_modules``, ``modules_to_save``, ``bias``,
            ``use_dora``, ``rank_pattern``, ``exclude_modules``, ``layers_to_transform``; PEFT's defaults for
            the missing ones), or None for full fine-tuning.
        optim: the trainer's ``optim`` (``"adamw_torch"`` when None).

    Returns:
        The estimate; formulas and sources in the module docstring.
    """
    if lora is None:
        params, tensors = shapes.total_params(), shapes.tensors()
        weights = params * shapes.dtype_bytes
        targeted, min_dim = 0, None
    else:
        params, weights, tensors, targeted, min_dim = _lora_trainable(shapes, lora)
    per_param = _optimizer_share(optim)
    optimizer = int(weights * per_param) + (tensors * 4 if per_param else 0)  # + AdamW's float32 `step`s
    overhead = tensors * TENSOR_OVERHEAD_BYTES
    return Footprint(
        trainable_params=params,
        trainable_tensors=tensors,
        weights_bytes=weights,
        optimizer_bytes=optimizer,
        checkpoint_bytes=weights + optimizer + overhead + CHECKPOINT_REST_BYTES,
        final_bytes=weights + tensors * 128 + shapes.vocab * 50 + 8_000,  # + tokenizer files, configs
        memory_bytes=2 * weights + optimizer,
        min_rank_dim=min_dim,
        targeted=targeted,
    )


def _lora_trainable(shapes: BaseShapes, lora: Mapping[str, Any]) -> tuple[int, int, int, int, int | None]:
    """``(params, bytes, tensors, targeted layers, smallest targeted dim)`` a LoRA config trains."""
    r = int(lora.get("r", 8))
    dora = bool(lora.get("use_dora", False))
    ranks: Mapping[str, Any] = lora.get("rank_pattern") or {}
    bias = str(lora.get("bias", "none"))
    save = _names(lora.get("modules_to_save"))
    modules = shapes.modules()
    linears = [m for m in modules if m.kind == "linear"]
    targets = [m for m in linears if _is_target(m.name, lora, shapes)]
    params = tensors = 0
    for m in targets:
        rank = _pattern_value(ranks, m.name, r)
        params += rank * (m.inputs + m.outputs) + (m.outputs if dora else 0)
        tensors += 2 + dora
    weights = params * 4  # float32 adapters
    saved = [m for m in modules if any(m.name.endswith(s) for s in save)]
    for m in saved:  # a trainable copy in the base's dtype
        params += m.params
        weights += m.params * shapes.dtype_bytes
        tensors += 1 + (m.kind == "linear" and m.bias)
    for m in linears:  # the base's own biases, trained in place
        if m.bias and m not in saved and (bias == "all" or (bias == "lora_only" and m in targets)):
            params += m.outputs
            weights += m.outputs * shapes.dtype_bytes
            tensors += 1
    min_dim = min((min(m.inputs, m.outputs) for m in targets), default=None)
    return params, weights, tensors, len(targets), min_dim


def _is_target(name: str, lora: Mapping[str, Any], shapes: BaseShapes) -> bool:
    """PEFT's ``check_target_module_exists`` for the config's ``target_modules``, ``exclude_modules`` and
    ``layers_to_transform`` (``lm_head`` is never an ``"all-linear"`` target)."""
    target = lora.get("target_modules")
    if target is None:
        target = list(_DEFAULT_TARGETS)
    if isinstance(target, str) and target == "all-linear":
        if name == "lm_head":
            return False
        target = [m.name.rsplit(".", 1)[-1] for m in shapes.modules() if m.kind == "linear"]
    if not _matches(name, target):
        return False
    exclude = lora.get("exclude_modules")
    if exclude and _matches(name, exclude):
        return False
    layers = lora.get("layers_to_transform")
    if layers is not None:
        wanted = {int(layers)} if isinstance(layers, int) else {int(x) for x in layers}
        found = re.search(r"\.layers\.(\d+)\.", name)
        return found is not None and int(found.group(1)) in wanted
    return True


def _matches(name: str, pattern: Any) -> bool:
    if isinstance(pattern, str):
        return re.fullmatch(pattern, name) is not None
    return any(name == p or name.endswith("." + str(p)) for p in pattern)


def _pattern_value(pattern: Mapping[str, Any], name: str, default: int) -> int:
    """``rank_pattern``'s value for module ``name`` (PEFT's ``get_pattern_key``: a key matching the name's end)."""
    for key, value in pattern.items():
        if re.match(rf"(.*\.)?({key})$", name):
            return int(value)
    return default


def _names(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _optimizer_share(optim: str | None) -> float:
    name = (optim or "adamw_torch").lower()
    if "8bit" in name:
        return OPTIMIZER_STATES["8bit"]
    for key, share in OPTIMIZER_STATES.items():
        if key in name:
            return share
    return OPTIMIZER_STATES["adamw"]


def _config_dtype(config: Mapping[str, Any]) -> Any:
    return config.get("dtype") or config.get("torch_dtype")


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of a dtype given as a name (``"bfloat16"``), a ``torch.dtype`` or None (float32)."""
    if dtype is None:
        return 4
    name = str(dtype).rsplit(".", 1)[-1]
    return _DTYPE_BYTES.get(name, 4)


def format_bytes(n: float) -> str:
    """``n`` bytes for a message: ``"337 MB"``, ``"1.2 GB"`` (decimal units, as disks are sold)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            value = n / size
            return f"{value:.1f} {unit}" if value < 10 else f"{value:,.0f} {unit}"
    return f"{int(n)} bytes"


def smallest_rank_target(shapes: BaseShapes, lora: Mapping[str, Any]) -> Sequence[str]:
    """Names of the targeted layers whose smaller side is the config's full rank (for messages)."""
    targets = [m for m in shapes.modules() if m.kind == "linear" and _is_target(m.name, lora, shapes)]
    low = min((min(m.inputs, m.outputs) for m in targets), default=0)
    return sorted({m.name.rsplit(".", 1)[-1] for m in targets if min(m.inputs, m.outputs) == low})
