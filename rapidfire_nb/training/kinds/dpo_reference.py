"""DPO's reference log-probabilities computed once per micro-batch and shared by every run that trains on it.

Measured in TRL 1.16 (``DPOTrainer._compute_loss``): without ``precompute_ref_log_probs``, every training (and
evaluation) step runs the policy forward, then the reference forward on the **same** padded batch
``[chosen; rejected]``: ``model(**inputs - {completion_mask, ref_*}, use_cache=False, labels=input_ids masked by
completion_mask, fused_lm_head=True)`` under ``torch.no_grad()`` and ``disable_gradient_checkpointing``, through
the PeftModel with its adapters disabled (LoRA runs, no ``"ref"`` adapter) or through ``ref_model`` (full
fine-tuning); the per-token log-probs of the completion are summed per row (or, with ``ld_alpha``, the shared
part plus ``ld_alpha`` times the tail) and split into chosen/rejected. The forward runs in the policy's
train/eval mode and in the caller's autocast; nothing else of the trainer enters it.

So LoRA runs on one shared base (or full fine-tuning runs on one shared frozen reference, ``dpo.reference_model``)
that see the same micro-batches (same seed, batch size and max length: the time-sliced runs of one config group
differing in ``beta`` or ``loss_type``) compute the same reference k times. :func:`install` wraps the trainer's
``_compute_loss``: the reference of a micro-batch is looked up in a :class:`ReferenceCache` (one per model provider,
beside the shared bases; used on the device thread only), computed there with TRL's own calls on a miss, and handed
to TRL's ``_compute_loss`` through its own precomputed path (``ref_chosen_logps``/``ref_rejected_logps`` in the
batch): the loss code is TRL's, the numbers are the ones it would have computed (0.0 difference).

A value is shared only when provably the same: the key holds every input tensor's dtype, shape and bytes, the
reference module's identity, the versions of its weights (``Tensor._version``: an in-place change misses), its
train/eval mode, the autocast state, the device, ``ld_alpha`` and the fused LM head's outputs (``use_weighting``);
a hit also compares these bytes in full. A computation that would draw random numbers is never shared (skipping
it would move the run's random stream): a reachable dropout with ``p > 0`` in train mode, a ``*dropout*`` value
of the model config, or NEFTune noise are refused before; and every computation compares the torch random
states (CPU and CUDA) before and after, and on a change puts them back, drops the value and lets TRL compute
in its own order. Each refusal is said once in a note. ``RAPIDFIRE_DPO_SHARED_REFERENCE=0`` switches sharing off
(benchmarks compare both).

A run over several devices (a gang rank, ``accelerator.num_processes > 1``) never uses the cache: each rank sees only
its own rows, and its reference forward through the sharded model is a collective every rank must join (a hit on
one rank and a miss on another would pair different all-gathers). Its process holds no other run to share with, so
nothing is lost: each rank computes its reference as plain TRL under ``torchrun`` does.

No torch import at module level.
"""

from __future__ import annotations

import hashlib
import os
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_MAX_BYTES", "SWITCH", "ReferenceCache", "cache_of", "install", "sharing_enabled"]

SWITCH = "RAPIDFIRE_DPO_SHARED_REFERENCE"
"""Environment variable: ``0``/``false``/``off`` computes the reference per run, as a plain ``DPOTrainer``."""

DEFAULT_MAX_BYTES = 256 * 2**20
"""Bytes a cache holds (the stored inputs, for the full comparison, plus the log-probs): far more than one
chunk's micro-batches (SmolLM2, batch 8, 512 tokens: ~0.2 MB each); the least recently used go first."""

_NON_MODEL_KEYS = frozenset({"completion_mask", "ref_chosen_logps", "ref_rejected_logps"})  # as TRL's
_ADAPTER_PARTS = ("lora_", "modules_to_save", "trainable_tokens", "token_adapter")  # PEFT: off when disabled


def sharing_enabled() -> bool:
    """Whether runs share the reference (the default); ``RAPIDFIRE_DPO_SHARED_REFERENCE=0`` turns it off."""
    return os.environ.get(SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


@dataclass
class _Entry:
    content: bytes
    module: weakref.ref[Any]  # the reference module: an id reused by another module never hits
    chosen: Any  # torch.Tensor, (batch,)
    rejected: Any
    nbytes: int


class ReferenceCache:
    """Reference log-probs of micro-batches, keyed by their exact inputs and every setting that changes them.

    One per model provider (:func:`cache_of`), used by the device thread only (not thread-safe). Bounded in bytes:
    runs train chunk ``c`` one after the other, so it needs one chunk's micro-batches at a time.

    Args:
        max_bytes: Most bytes held (stored inputs + log-probs); an entry larger alone is not stored.
        note: Receives one line per reason a reference was not shared (each reason once).

    Attributes:
        computed: References computed here and stored (one per distinct micro-batch and setting).
        hits: References handed out without a forward.
        unshared: Steps left to TRL's own computation (a reason was noted).
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, note: Callable[[str], None] | None = None) -> None:
        self.max_bytes = max_bytes
        self._note = note
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._unsafe: dict[bytes, str] = {}  # settings digest -> why computing it drew random numbers
        self._noted: set[str] = set()
        self.nbytes = 0
        self.computed = 0
        self.hits = 0
        self.unshared = 0

    def __len__(self) -> int:
        return len(self._entries)

    def note_once(self, reason: str) -> None:
        """Count one unshared step; tell the user ``reason`` the first time it comes."""
        self.unshared += 1
        if reason not in self._noted:
            self._noted.add(reason)
            if self._note is not None:
                self._note(f"DPO reference log-probabilities not shared between runs: {reason}")

    def reference(self, trainer: Any, inputs: Any) -> tuple[Any, Any] | None:
        """The reference ``(chosen, rejected)`` log-probs of one micro-batch, or ``None``: let TRL compute it.

        Args:
            trainer: The run's ``DPOTrainer`` (its reference is the shared base or a shared ``ref_model``).
            inputs: The collated micro-batch TRL's ``_compute_loss`` receives (``input_ids``, ``attention_mask``,
                ``completion_mask``, ...: tensors of shape ``(2 * batch, length)``).

        Returns:
            Two tensors of shape ``(batch,)``, bit-identical to TRL's own reference computation, or ``None``.
        """
        module = reference_module(trainer)
        weights, dropout = _walk(module)
        reason = _draw_reason(trainer, module, dropout)
        if reason is not None:
            self.note_once(reason)
            return None
        settings = _settings(trainer, module, weights)
        family = hashlib.blake2b(settings, digest_size=16).digest()
        if family in self._unsafe:
            self.note_once(self._unsafe[family])
            return None
        content = settings + _input_bytes(inputs)
        key = hashlib.blake2b(content, digest_size=32).digest()
        entry = self._entries.get(key)
        if entry is not None and entry.content == content and entry.module() is module:
            self._entries.move_to_end(key)
            self.hits += 1
            return entry.chosen, entry.rejected
        return self._compute(trainer, inputs, module, (key, content, family))

    def _compute(self, trainer: Any, inputs: Any, module: Any, keys: tuple[bytes, bytes, bytes]) -> Any:
        key, content, family = keys
        before = _random_states()
        chosen, rejected = reference_logps(trainer, inputs)
        if not _same_states(before, _random_states()):
            _restore_states(before)  # as if never run: TRL computes it in its own place in the step
            self._unsafe[family] = (
                "the reference forward drew random numbers (a computation skipped by sharing would change the "
                "runs' random streams); each run computes its own, as plain TRL"
            )
            self.note_once(self._unsafe[family])
            return None
        self.computed += 1
        size = len(content) + chosen.element_size() * (chosen.numel() + rejected.numel())
        stale = self._entries.pop(key, None)  # its module is gone (an id reused)
        self.nbytes -= stale.nbytes if stale is not None else 0
        if size <= self.max_bytes:
            self._entries[key] = _Entry(content, weakref.ref(module), chosen, rejected, size)
            self.nbytes += size
            while self.nbytes > self.max_bytes:
                _, old = self._entries.popitem(last=False)
                self.nbytes -= old.nbytes
        return chosen, rejected

    def clear(self) -> None:
        """Drop every stored reference (counters kept)."""
        self._entries.clear()
        self.nbytes = 0


def cache_of(models: Any) -> ReferenceCache:
    """The reference cache of a model provider (made on first use, kept beside its shared models).

    Args:
        models: The executor's :class:`~rapidfire_nb.training.models.ModelProvider`; its ``note`` attribute, if
            any, receives the cache's notes.
    """
    return models.shared(("dpo-reference-cache",), lambda: ReferenceCache(note=getattr(models, "note", None)))


def install(trainer: Any, models: Any) -> bool:
    """Make a built ``DPOTrainer`` take its reference log-probs from the provider's shared cache.

    Nothing is installed when sharing is switched off, when TRL precomputes them itself
    (``precompute_ref_log_probs``), for a run over several devices (each rank computes its own), or when the
    reference is not a frozen model shared as such
    (``sync_ref_model``, a ``"ref"`` adapter): then the run computes its own, as plain TRL (with a note).

    Args:
        trainer: The run's ``DPOTrainer``, right after it was built.
        models: The executor's model provider (holds the cache).

    Returns:
        Whether the trainer now uses the shared cache.
    """
    args = trainer.args
    if not sharing_enabled() or getattr(args, "precompute_ref_log_probs", False):
        return False
    if int(getattr(trainer.accelerator, "num_processes", 1)) > 1:
        return False  # a gang rank: its own rows, a collective forward, no other run here (module docstring)
    cache = cache_of(models)
    reason = _build_reason(trainer)
    if reason is not None:
        cache.note_once(reason)
        return False
    original = trainer._compute_loss

    def _compute_loss(model: Any, inputs: Any, return_outputs: bool) -> Any:
        ref = cache.reference(trainer, inputs)
        if ref is None:
            return original(model, inputs, return_outputs)
        batch = dict(inputs)
        batch["ref_chosen_logps"], batch["ref_rejected_logps"] = ref
        trainer.precompute_ref_logps = True  # TRL's own path for reference log-probs given in the batch
        try:
            return original(model, batch, return_outputs)
        finally:
            trainer.precompute_ref_logps = False

    trainer._compute_loss = _compute_loss
    trainer._rapidfire_reference_cache = cache
    return True


def _build_reason(trainer: Any) -> str | None:
    if getattr(trainer.args, "sync_ref_model", False):
        return "sync_ref_model=True updates each run's reference during training"
    if trainer.ref_model is None:
        peft_config = getattr(trainer.accelerator.unwrap_model(trainer.model), "peft_config", None)
        if peft_config is None:
            return "the run has no frozen reference model"
        if "ref" in peft_config:
            return "the reference is a 'ref' adapter of the run's own"
    return None


def reference_module(trainer: Any) -> Any:
    """The module whose forward gives the reference: the (unwrapped) PeftModel, adapters off, or ``ref_model``."""
    if trainer.ref_model is None:
        return trainer.accelerator.unwrap_model(trainer.model)
    return trainer.ref_model


def reference_logps(trainer: Any, inputs: Any) -> tuple[Any, Any]:
    """The reference log-probs of one micro-batch, computed with the calls and ops of TRL 1.16's ``_compute_loss``.

    Args:
        trainer: The run's ``DPOTrainer``.
        inputs: The collated micro-batch (``(2 * batch, length)`` tensors, chosen rows first).

    Returns:
        ``(chosen, rejected)``, each of shape ``(batch,)`` (summed log-probs of the completion tokens).
    """
    import torch
    from trl.models.utils import disable_gradient_checkpointing
    from trl.trainer.utils import use_adapter

    kwargs = {k: v for k, v in inputs.items() if k not in _NON_MODEL_KEYS}
    kwargs["use_cache"] = False
    completion_mask = inputs["completion_mask"]
    shift_completion_mask = completion_mask[..., 1:]
    labels = inputs["input_ids"].masked_fill(completion_mask == 0, -100)
    seq_len = shift_completion_mask.size(1)
    with (
        torch.no_grad(),
        disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs),
    ):
        if trainer.ref_model is None:
            with use_adapter(reference_module(trainer), adapter_name=None):
                outputs = trainer.model(**kwargs, labels=labels, fused_lm_head=True)
        else:
            outputs = trainer.ref_model(**kwargs, labels=labels, fused_lm_head=True)
    per_token = outputs.log_probs[:, -seq_len:]
    if trainer.ld_alpha is None:
        logps = per_token.sum(dim=1)
    else:  # the same masks and ops as TRL's policy side
        comp_pos = shift_completion_mask.cumsum(dim=1)
        comp_lens = shift_completion_mask.sum(dim=1).long()
        chosen_lens, rejected_lens = comp_lens.chunk(2, dim=0)
        shared_lens = torch.minimum(chosen_lens, rejected_lens)
        shared_lens = torch.cat([shared_lens, shared_lens], dim=0).to(trainer.accelerator.device)
        shared_mask = (comp_pos > 0) & (comp_pos <= shared_lens.unsqueeze(1))
        tail_mask = comp_pos > shared_lens.unsqueeze(1)
        logps = (per_token * shared_mask).sum(dim=1) + trainer.ld_alpha * (per_token * tail_mask).sum(dim=1)
    chosen, rejected = logps.chunk(2, dim=0)
    return chosen, rejected


def random_draw_reason(trainer: Any, module: Any) -> str | None:
    """Why the reference forward may draw random numbers (then it is not shared), or ``None``.

    Checked: every ``nn.Dropout`` the disabled-adapter forward reaches (LoRA's own dropout is not reached) in train
    mode with ``p > 0``; numeric ``*dropout*`` values of the model config (attention dropout is read from the
    config, not a module) while training; NEFTune (``neftune_noise_alpha``: noise on the input embeddings).
    """
    return _draw_reason(trainer, module, _walk(module)[1])


def _draw_reason(trainer: Any, module: Any, dropout: str | None) -> str | None:
    if not module.training:
        return None
    if getattr(trainer.args, "neftune_noise_alpha", None) is not None:
        return "neftune_noise_alpha adds random noise to the reference forward's embeddings"
    if dropout is not None:
        return dropout
    config = getattr(module, "config", None)
    for attr, value in sorted(vars(config).items() if config is not None else ()):
        if (
            "dropout" in attr
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
            and value > 0
        ):
            return f"the model config's {attr}={value} draws random numbers in the reference forward"
    return None


def _walk(module: Any) -> tuple[tuple[int, int, int], str | None]:
    """One pass over the modules the reference forward reaches (PEFT's adapter modules skipped).

    Returns:
        ``(number of weights, sum of their in-place versions, hash of their ids)``: any in-place change of a
        weight raises the sum (versions only grow), a replaced weight changes the ids; and the first dropout
        drawing random numbers (``p > 0`` in train mode), or ``None``.
    """
    import torch

    count = versions = 0
    ids: list[int] = []
    reason = None
    stack = [("", module)]
    while stack:
        name, sub = stack.pop()
        for p in sub._parameters.values():
            if p is not None:
                count, versions = count + 1, versions + p._version
                ids.append(id(p))
        if reason is None and isinstance(sub, torch.nn.Dropout) and sub.p > 0 and sub.training:
            reason = f"dropout p={sub.p} at {name or type(sub).__name__} draws random numbers in the reference forward"
        for child_name, child in sub._modules.items():
            if child is not None and not child_name.startswith(_ADAPTER_PARTS):
                stack.append((f"{name}.{child_name}" if name else child_name, child))
    return (count, versions, hash(tuple(ids))), reason


def _settings(trainer: Any, module: Any, weights: tuple[int, int, int]) -> bytes:
    """Bytes of everything besides the inputs that changes the reference result (see the module docstring)."""
    import torch

    autocast = [(d, torch.is_autocast_enabled(d), str(torch.get_autocast_dtype(d))) for d in ("cpu", "cuda")]
    fields = (
        "adapters-off" if trainer.ref_model is None else "ref_model",
        id(module),
        weights,
        bool(module.training),
        autocast,
        str(trainer.accelerator.device),
        repr(trainer.ld_alpha),
        bool(getattr(trainer, "use_weighting", False)),
    )
    return repr(fields).encode() + b"|"


def _input_bytes(inputs: Any) -> bytes:
    """Every input's name, dtype, shape and bytes (tensors, moved to the host), or ``repr`` (anything else)."""
    import torch

    parts: list[bytes] = []
    for name in sorted(k for k in inputs if k not in ("ref_chosen_logps", "ref_rejected_logps")):
        value = inputs[name]
        if isinstance(value, torch.Tensor):
            flat = value.detach().contiguous().reshape(-1).view(torch.uint8).cpu()
            parts.append(f"{name}:{value.dtype}:{tuple(value.shape)}:".encode() + flat.numpy().tobytes())
        else:
            parts.append(f"{name}={value!r}".encode())
    return b"|".join(parts)


def _random_states() -> list[Any]:
    import torch

    states = [torch.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states.extend(torch.cuda.get_rng_state_all())
    return states


def _same_states(a: list[Any], b: list[Any]) -> bool:
    import torch

    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _restore_states(states: list[Any]) -> None:
    import torch

    torch.set_rng_state(states[0])
    if len(states) > 1:
        torch.cuda.set_rng_state_all(states[1:])
