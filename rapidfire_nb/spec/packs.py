"""Packs: which LoRA runs may train as one pack (one forward/backward over the shared base per step), and why not.

A pack's runs each keep their own TRL trainer (optimizer, schedule, loss, adapter, logging); only the forward and
backward over the shared base are fused, each adapter applied to its own run's rows. So two runs may share a pack
only when they feed the base the same micro-batches through the same model: their whole resolved config is equal
except the fields that act on the run's own optimizer, schedule, loss or adapter (:data:`OWN_FIELDS`,
:data:`OWN_LORA_FIELDS`) and pure bookkeeping (:data:`LABEL_FIELDS`). Any other field, known or not, must be equal:
a field this module does not know splits packs (conservative). :func:`pack_key` is that comparison;
:func:`why_not_packed` says why a run cannot pack at all; :func:`plan_packs` groups a run_fit's runs;
:func:`packing_note` is the line said when training starts; :func:`check_packing_option` and
:func:`refuse_unpackable` are ``run_fit(packing=...)``'s checks.

The executor also needs the same shared base object and the same training position; that is its business.

Pure: standard library, :mod:`rapidfire_nb.schema` (TRL/PEFT declared defaults: a field set to its default equals
a field left out; imports trl/peft on first use) and the rest of ``rapidfire_nb.spec``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rapidfire_nb import schema
from rapidfire_nb.errors import ConfigError
from rapidfire_nb.redact import is_secret_key

from .leaf import LeafConfig
from .values import jsonable

__all__ = [
    "LABEL_FIELDS",
    "OWN_FIELDS",
    "OWN_LORA_FIELDS",
    "PACKING_CHOICES",
    "PackPlan",
    "check_packing_option",
    "ids_text",
    "pack_fields",
    "pack_key",
    "packing_applies",
    "packing_note",
    "plan_packs",
    "refuse_unpackable",
    "why_not_packed",
]

PACKING_CHOICES: tuple[bool | str, ...] = ("auto", True, False)
"""``run_fit(packing=...)``'s values."""

OWN_FIELDS: frozenset[str] = frozenset(
    """
    learning_rate lr_scheduler_type lr_scheduler_kwargs warmup_ratio warmup_steps weight_decay
    max_grad_norm adam_beta1 adam_beta2 adam_epsilon optim optim_args beta loss_type label_smoothing
    label_smoothing_factor rpo_alpha ld_alpha loss_weights f_divergence_type f_alpha_divergence_coef
    discopop_tau use_weighting temperature top_p top_k min_p repetition_penalty generation_kwargs
    """.split()
)
"""Trainer fields that act only on the run's own optimizer, schedule or loss, or (GRPO) on how its own completions
are sampled (runs whose sampling differs generate one by one inside their pack): they do not split a pack."""

LABEL_FIELDS: frozenset[str] = frozenset(
    """
    run_name output_dir overwrite_output_dir logging_dir logging_steps logging_strategy
    logging_first_step logging_nan_inf_filter log_level log_level_replica log_on_each_node disable_tqdm
    report_to project trackio_space_id trackio_bucket_id trackio_static_space_id
    include_num_input_tokens_seen include_tokens_per_second skip_memory_metrics eval_steps eval_strategy
    evaluation_strategy eval_delay eval_on_start eval_accumulation_steps eval_do_concat_batches
    eval_use_gather_object eval_packing per_device_eval_batch_size prediction_loss_only
    batch_eval_metrics include_for_metrics metric_for_best_model greater_is_better
    load_best_model_at_end do_train do_eval do_predict save_steps save_strategy save_total_limit
    save_only_model save_on_each_node save_safetensors push_to_hub hub_model_id hub_strategy hub_token
    hub_private_repo hub_always_push hub_revision resume_from_checkpoint
    restore_callback_states_from_checkpoint
    """.split()
)
"""Bookkeeping trainer fields (names, folders, logging, evaluation and saving cadence): they do not split a pack.
The run's evaluation is its own trainer's, outside the fused step."""

OWN_LORA_FIELDS: frozenset[str] = frozenset(
    {"r", "lora_alpha", "lora_dropout", "target_modules", "use_rslora", "init_lora_weights"}
)
"""LoRA fields of the run's own adapter (each adapter is computed on its own rows: no rank padding): they do not
split a pack. ``init_lora_weights`` only as ``True``, ``False`` or ``"gaussian"`` (the others change the base or
need data: :func:`why_not_packed`)."""

_MODEL_FIELDS = ("model_name", "tokenizer", "formatting_func", "model_type", "ref_model_name")
_DICT_FIELDS = ("model_kwargs", "tokenizer_kwargs", "ref_model_kwargs")
_SEED_FROM_RUN_FIT = "<run_fit's seed>"
# Trainer fields compared as written, never read as their default when equal to it: building the real config
# (rapidfire_nb.spec.build) reads whether the user set them (TRL's default gradient checkpointing is switched off on
# CPU unless set; seed defaults to run_fit's).
_AS_WRITTEN = frozenset(
    """
    seed gradient_checkpointing activation_checkpointing gradient_checkpointing_kwargs
    activation_checkpointing_kwargs dataloader_num_workers accelerator_config
    """.split()
)
_NOT_SET = object()


def _set(value: Any) -> bool:
    """A field the user turned on: not None, False, 0 or empty."""
    return (
        value is not None
        and value is not False
        and value != 0
        and value != ""
        and value != []
        and value != {}
    )


# LoRA fields whose non-default value makes a per-row adapter impossible (or unknown to the packed layer).
_LORA_REFUSALS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("use_dora", _set, "DoRA"),
    ("modules_to_save", _set, "modules_to_save (whole modules trained)"),
    ("bias", lambda v: v not in (None, "none"), "LoRA bias training (trains the base's biases)"),
    ("lora_bias", _set, "lora_bias"),
    ("trainable_token_indices", _set, "trainable_token_indices"),
    ("target_parameters", _set, "LoRA on parameters (target_parameters)"),
    ("layer_replication", _set, "layer_replication (changes the base)"),
    ("use_qalora", _set, "QA-LoRA"),
    ("alora_invocation_tokens", _set, "aLoRA"),
    ("use_bdlora", _set, "a LoRA variant (use_bdlora)"),
    ("velora_config", _set, "a LoRA variant (velora_config)"),
    ("monteclora_config", _set, "a LoRA variant (monteclora_config)"),
    ("arrow_config", _set, "a LoRA variant (arrow_config)"),
    ("kasa_config", _set, "a LoRA variant (kasa_config)"),
    ("megatron_config", _set, "Megatron LoRA"),
)
# Trainer fields whose value makes a per-row adapter impossible (row boundaries inside a batch, the base's forward
# drawing noise or computing the loss itself, a batch size that changes by itself).
_TRAINING_REFUSALS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("packing", _set, "SFT packing=True (rows packed into one sequence)"),
    ("padding_free", _set, "padding_free (rows concatenated into one sequence)"),
    ("neftune_noise_alpha", _set, "NEFTune noise in the shared embedding"),
    ("use_liger_kernel", _set, "Liger kernel (the loss inside the model's forward)"),
    ("auto_find_batch_size", _set, "auto_find_batch_size (its batch size may change by itself)"),
)


def why_not_packed(spec: LeafConfig, trainer_type: str) -> str | None:
    """Why run ``spec`` cannot train in a pack at all, as a short phrase; None when it can (with a run whose
    :func:`pack_key` is equal).

    Args:
        spec: the run's resolved config.
        trainer_type: ``"SFT"``, ``"DPO"`` or ``"GRPO"`` (any case).

    Returns:
        e.g. ``"full fine-tuning"``, ``"DoRA"``,
        ``"SFT packing=True (rows packed into one sequence)"``; None when the run may pack.
    """
    if (spec.num_gpus or 1) > 1:
        return f"num_gpus={spec.num_gpus} (one run over several devices)"
    if spec.lora is None:
        return "full fine-tuning"
    for name, refused, phrase in _LORA_REFUSALS:
        if refused(spec.lora.get(name)):
            return phrase
    init = spec.lora.get("init_lora_weights", True)
    if not isinstance(init, bool) and init != "gaussian":
        return f"init_lora_weights={init!r} (changes the base or needs data)"
    for name, refused, phrase in _TRAINING_REFUSALS:
        if refused(spec.training.get(name)):
            return phrase
    return None


def pack_fields(spec: LeafConfig, trainer_type: str, default_seed: int | None = None) -> dict[str, Any]:
    """What two runs of one pack must have equal, flat, in the ``hparams()`` naming (trainer fields bare,
    ``lora.<field>``, ``model_kwargs.<key>``), as JSON values.

    Every field of the run's config except :data:`OWN_FIELDS`, :data:`LABEL_FIELDS` and
    :data:`OWN_LORA_FIELDS`, the run's name and tags, its evaluation-only ``compute_metrics`` /
    ``generation_config``, and secret-like keys (a token trains the same rows). A trainer or LoRA field set to its
    library default reads as left out, except the few whose presence the real config's build reads
    (``gradient_checkpointing``, ``dataloader_num_workers``...: compared as written). ``seed`` left out reads as ``default_seed`` (run_fit's seed) when given,
    else as "run_fit's seed" (equal only to another run that leaves it out).

    Args:
        spec: the run's resolved config.
        trainer_type: ``"SFT"``, ``"DPO"`` or ``"GRPO"``.
        default_seed: run_fit's seed, or None (unknown).
    """
    kind = str(trainer_type).upper()
    out: dict[str, Any] = {"trainer_type": kind}
    out.update({name: _value(getattr(spec, name)) for name in _MODEL_FIELDS})
    for attr in _DICT_FIELDS:
        values = getattr(spec, attr) or {}
        out.update({f"{attr}.{k}": _value(v) for k, v in values.items() if not is_secret_key(str(k))})
    skip = OWN_FIELDS | LABEL_FIELDS
    defaults = _defaults(lambda: schema.trainer_config_class(kind))
    for name, value in spec.training.items():
        if (
            name not in skip
            and not is_secret_key(name)
            and (name in _AS_WRITTEN or not defaults(name, value))
        ):
            out[name] = _value(value)
    if "seed" not in spec.training:
        out["seed"] = default_seed if default_seed is not None else _SEED_FROM_RUN_FIT
    lora_defaults = _defaults(schema.lora_config_class)
    for name, value in (spec.lora or {}).items():
        if name not in OWN_LORA_FIELDS and not lora_defaults(name, value):
            out[f"lora.{name}"] = _value(value)
    return out


def _value(value: Any) -> Any:
    """``value`` as JSON; a function also by identity (two lambdas of one module share a qualified name, and a
    different ``formatting_func`` makes different rows)."""
    if callable(value) and not isinstance(value, type):
        return [jsonable(value), f"id {id(value)}"]
    return jsonable(value)


def _defaults(cls: Callable[[], type]) -> Callable[[str, Any], bool]:
    """``is_default(name, value)`` for the config class ``cls()`` returns (False when it cannot be read)."""
    try:
        config_cls = cls()
        names = schema.field_names(config_cls)
    except (ImportError, ConfigError, TypeError):
        return lambda name, value: False

    def is_default(name: str, value: Any) -> bool:
        if name not in names:
            return False
        default = schema.field_default(config_cls, name)
        return bool(jsonable(default) == jsonable(value))

    return is_default


def pack_key(spec: LeafConfig, trainer_type: str, default_seed: int | None = None) -> tuple[Any, ...] | None:
    """The run's pack key: two LoRA runs may share a pack iff their keys are equal (hashable).

    Args:
        spec: the run's resolved config.
        trainer_type: ``"SFT"``, ``"DPO"`` or ``"GRPO"``.
        default_seed: run_fit's seed (a run without its own ``seed`` trains with it), or None.

    Returns:
        ``(trainer_type, canonical JSON of pack_fields(...))``, or None when the run cannot pack at all
        (:func:`why_not_packed`).
    """
    if why_not_packed(spec, trainer_type) is not None:
        return None
    fields = pack_fields(spec, trainer_type, default_seed)
    return (str(trainer_type).upper(), json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str))


def check_packing_option(value: object) -> bool | str:
    """``run_fit``'s ``packing``: ``"auto"``, True or False.

    Returns:
        The value itself.

    Raises:
        ConfigError: anything else, naming ``packing`` and its three values.
    """
    if isinstance(value, bool) or (isinstance(value, str) and value == "auto"):
        return value
    raise ConfigError(
        "packing must be 'auto' (pack the LoRA runs that see the same batches, on devices where packing pays: "
        "CUDA), True (pack them on any device; a group where no two runs can share a pack is refused) or False "
        f"(every run time-sliced), got {value!r}"
    )


def packing_applies(packing: bool | str, device: str, trainer_type: str = "") -> bool:
    """Whether packs form on ``device`` (``"cpu"``, ``"cuda:0"``...) for runs of ``trainer_type``: True forces
    them, False never, ``"auto"`` where they pay: on CUDA, and for GRPO anywhere (its rollouts are sampled in one
    batched ``generate``: 2.65x faster on this CPU, ``benchmarks/packed_grpo.py``); not for SFT or DPO on a CPU
    (a fused step measured no gain: the CPU's GEMMs are compute-bound already)."""
    if packing == "auto":
        return device.split(":")[0] == "cuda" or str(trainer_type).upper() == "GRPO"
    return packing is True


@dataclass(frozen=True)
class PackPlan:
    """How a group's runs pack.

    Attributes:
        packs: the packs, each its run ids ascending (at least two), ordered by their smallest id (the pack's id).
        alone: run id -> why it trains alone (time-sliced): :func:`why_not_packed`'s phrase, ``"differs from run
            2 in seed, max_length"`` or ``"no other run to pack with"``.
    """

    packs: tuple[tuple[int, ...], ...] = ()
    alone: Mapping[int, str] = field(default_factory=dict)

    def pack_of(self, run_id: int) -> int | None:
        """The id of the pack run ``run_id`` belongs to (its smallest run id), or None."""
        return next((p[0] for p in self.packs if run_id in p), None)


def plan_packs(
    runs: Mapping[int, LeafConfig], trainer_type: str, default_seed: int | None = None
) -> PackPlan:
    """Group runs by :func:`pack_key`: runs with equal keys form a pack; the others train alone, with the reason.

    Args:
        runs: run id -> its resolved config.
        trainer_type: ``"SFT"``, ``"DPO"`` or ``"GRPO"``.
        default_seed: run_fit's seed, or None.
    """
    alone: dict[int, str] = {}
    groups: dict[tuple[Any, ...], list[int]] = {}
    fields: dict[int, dict[str, Any]] = {}
    for run_id in sorted(runs):
        reason = why_not_packed(runs[run_id], trainer_type)
        if reason is not None:
            alone[run_id] = reason
            continue
        fields[run_id] = pack_fields(runs[run_id], trainer_type, default_seed)
        key = pack_key(runs[run_id], trainer_type, default_seed)
        assert key is not None
        groups.setdefault(key, []).append(run_id)
    packs = tuple(tuple(ids) for ids in groups.values() if len(ids) > 1)
    for ids in groups.values():
        if len(ids) == 1:
            alone[ids[0]] = _nearest_difference(ids[0], fields)
    return PackPlan(packs=tuple(sorted(packs)), alone=dict(sorted(alone.items())))


def _nearest_difference(run_id: int, fields: Mapping[int, Mapping[str, Any]]) -> str:
    """``"differs from run j in a, b"``: the other packable run with the fewest differing fields (ties: lowest
    id), or ``"no other run to pack with"``."""
    mine = fields[run_id]
    best: tuple[int, int, list[str]] | None = None
    for other, theirs in fields.items():
        if other == run_id:
            continue
        names = sorted(k for k in {*mine, *theirs} if mine.get(k, _NOT_SET) != theirs.get(k, _NOT_SET))
        if best is None or (len(names), other) < (best[0], best[1]):
            best = (len(names), other, names)
    if best is None:
        return "no other run to pack with"
    return f"differs from run {best[1]} in {', '.join(best[2])}"


def ids_text(ids: Sequence[int]) -> str:
    """``"run 3"``, ``"runs 1-4"``, ``"runs 1-3, 5 and 7"`` (ids ascending, runs of three or more as a range)."""
    ids = sorted(ids)
    parts: list[str] = []
    start = prev = ids[0]
    for i in [*ids[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts += [f"{start}-{prev}"] if prev - start >= 2 else [str(n) for n in range(start, prev + 1)]
        if i is not None:
            start = prev = i
    text = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
    return ("run " if len(ids) == 1 else "runs ") + text


def _alone_text(plan: PackPlan) -> str:
    """The runs alone, grouped by reason: ``"run 5 alone (full fine-tuning); runs 6, 7 alone (DoRA)"``."""
    by_reason: dict[str, list[int]] = {}
    for run_id, reason in plan.alone.items():
        by_reason.setdefault(reason, []).append(run_id)
    return "; ".join(f"{ids_text(ids)} alone ({reason})" for reason, ids in by_reason.items())


def packing_note(plan: PackPlan, packing: bool | str, device: str, trainer_type: str = "") -> str | None:
    """The one line said when training starts (without the ``[rapidfire] `` prefix the reporter adds).

    Args:
        plan: the group's packs (:func:`plan_packs`).
        trainer_type: the group's trainer (``"auto"`` packs GRPO on any device: :func:`packing_applies`).
        packing: ``run_fit``'s ``packing``.
        device: where the runs train (``"cpu"``, ``"cuda:0"``...).

    Returns:
        ``"packing: runs 1-4 train as one pack (one forward/backward per step); run 5 alone (full
        fine-tuning)"``; with ``"auto"`` off CUDA and a pack possible: ``"packing='auto': not on this device (cpu:
        measured no gain; packing=True forces it)"``; None when there is nothing to say (``packing=False``, or
        ``"auto"`` and no two runs can pack).
    """
    if packing is False or (packing == "auto" and not plan.packs):
        return None
    if not packing_applies(packing, device, trainer_type):
        kind = device.split(":")[0] or "this device"
        why = "measured no gain" if kind == "cpu" else "not measured"
        return f"packing='auto': not on this device ({kind}: {why}; packing=True forces it)"
    if not plan.packs:
        return "packing: no two runs can share a pack; " + _alone_text(plan)
    if len(plan.packs) == 1:
        packed = f"{ids_text(plan.packs[0])} train as one pack (one forward/backward per step)"
    else:
        each = " and ".join(ids_text(p) for p in plan.packs)
        packed = f"{each} train as {len(plan.packs)} packs (one forward/backward per pack and step)"
    return "packing: " + packed + ("; " + _alone_text(plan) if plan.alone else "")


def refuse_unpackable(
    runs: Mapping[int, LeafConfig], trainer_type: str, default_seed: int | None = None
) -> None:
    """``packing=True``'s check before training: some two runs must share a pack.

    Raises:
        ConfigError: no two runs share a :func:`pack_key`, naming each run and why (``"packing=True: no two runs
            can share a pack: run 1 full fine-tuning, runs 2 and 3 differ in per_device_train_batch_size; ..."``)
            and the fix.
    """
    plan = plan_packs(runs, trainer_type, default_seed)
    if plan.packs:
        return
    said: set[int] = set()
    parts: list[str] = []
    for run_id, reason in plan.alone.items():
        if run_id in said:
            continue
        said.add(run_id)
        other = _pair(run_id, reason, plan.alone)
        if other is not None:
            said.add(other)
            parts.append(f"runs {run_id} and {other} differ in {reason.partition(' in ')[2]}")
        else:
            parts.append(f"run {run_id} {reason}")
    raise ConfigError(
        "packing=True: no two runs can share a pack: "
        + ", ".join(parts)
        + ". Packed runs need LoRA and equal configs apart from their optimizer, schedule, loss and adapter "
        "settings; use packing='auto' or packing=False to train these runs time-sliced"
    )


def _pair(run_id: int, reason: str, alone: Mapping[int, str]) -> int | None:
    """The run whose nearest difference is run ``run_id`` in the same fields (said once, as a pair), or None."""
    prefix = "differs from run "
    if not reason.startswith(prefix):
        return None
    other_text, _, names = reason[len(prefix) :].partition(" in ")
    other = int(other_text)
    return other if alone.get(other) == f"{prefix}{run_id} in {names}" else None
