"""One run over a gang of devices: the user's ``fsdp`` / ``fsdp_config`` and ``num_gpus`` read into a frozen plan.

Pure (standard library only): the kernel checks a config with it before any training, and each rank of a gang
builds its sharding from the same plan (``rapidfire_nb.training.sharding``). The fields are Hugging Face
``TrainingArguments``' own (``fsdp="full_shard auto_wrap"``, ``fsdp_config={"auto_wrap_policy":
"TRANSFORMER_BASED_WRAP", "transformer_layer_cls_to_wrap": [...], ...}``, transformers 5.x
``TrainingArguments._process_fsdp_args``); the sharding is PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``),
so only what FSDP2 does is accepted: FSDP1-only strategies (``hybrid_shard``, ``no_shard``) and size-based wrapping
are refused, each naming the field and the fix; the FSDP1 tuning keys of the seeds' recipe (prefetching,
``use_orig_params``, ``sync_module_states``, ``limit_all_gathers``) are accepted and named in a note.

``num_gpus=k`` (k >= 2) without ``fsdp`` trains with DDP (every rank a full copy, gradients all-reduced).
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from rapidfire_nb.errors import ConfigError, closest_name

__all__ = [
    "FSDP_CONFIG_KEYS",
    "FSDP_OPTIONS",
    "FSDP_TRAINING_FIELDS",
    "ShardingPlan",
    "sharding_plan",
    "without_fsdp_fields",
]

FSDP_TRAINING_FIELDS: tuple[str, ...] = ("fsdp", "fsdp_config")
"""The training-args fields read here; the trainer's own config is built without them (rapidfire_nb shards, not
accelerate)."""

FSDP_OPTIONS: tuple[str, ...] = ("full_shard", "shard_grad_op", "auto_wrap", "offload")
"""The words ``fsdp`` may hold (a space-separated string or a list), as ``transformers.trainer_utils.FSDPOption``
minus the FSDP1-only strategies."""

_FSDP1_ONLY_OPTIONS = ("hybrid_shard", "hybrid_shard_zero2", "no_shard")

FSDP_CONFIG_KEYS: tuple[str, ...] = (
    "sharding_strategy",
    "auto_wrap_policy",
    "transformer_layer_cls_to_wrap",
    "reshard_after_forward",
    "offload_params",
    "cpu_offload",
    "cpu_ram_efficient_loading",
    "version",
    "min_num_params",
    "state_dict_type",
    "activation_checkpointing",
)
"""The ``fsdp_config`` keys accepted (an ``fsdp_`` prefix, as accelerate's YAML writes them, is dropped first)."""

_FSDP1_ONLY_KEYS = (
    "backward_prefetch",
    "forward_prefetch",
    "use_orig_params",
    "sync_module_states",
    "limit_all_gathers",
)
_XLA_KEYS = ("xla", "xla_fsdp_v2", "xla_fsdp_grad_ckpt", "xla_fsdp_settings")
"""Keys transformers' ``TrainingArguments`` writes into the ``fsdp_config`` dict it was given (in place, ``False`` /
absent): accepted off, refused on (TPU only)."""
_STRATEGIES = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}  # strategy -> reshard_after_forward (FSDP2)
_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "NO_WRAP")
_STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")


@dataclasses.dataclass(frozen=True)
class ShardingPlan:
    """How one run trains over its devices.

    Attributes:
        sharding: ``"fsdp"`` (FSDP2 parameter sharding), ``"ddp"`` (replicas, gradients all-reduced) or ``None``
            (one device).
        num_gpus: Devices (ranks) the run trains on, >= 1.
        wrap_policy: ``"TRANSFORMER_BASED_WRAP"`` (each module whose class is named in ``layer_classes`` becomes
            its own FSDP unit, then the whole model) or ``"NO_WRAP"`` (the whole model is one unit).
        layer_classes: Class names wrapped as units (``transformer_layer_cls_to_wrap``); empty: the model's own
            ``_no_split_modules`` (its decoder layer), as accelerate does.
        reshard_after_forward: Free the gathered parameters after each unit's forward (``FULL_SHARD``: True) or
            keep them until the backward (``SHARD_GRAD_OP``: False).
        offload_params: Sharded parameters, gradients and optimizer state live in host memory (CUDA only).
        cpu_ram_efficient_loading: Accepted for compatibility; every rank builds the model with
            ``create_model_fn`` and keeps its shard (see ``notes``).
        notes: Sentences for the user about settings read differently than accelerate would.
    """

    sharding: str | None
    num_gpus: int = 1
    wrap_policy: str = "TRANSFORMER_BASED_WRAP"
    layer_classes: tuple[str, ...] = ()
    reshard_after_forward: bool = True
    offload_params: bool = False
    cpu_ram_efficient_loading: bool = False
    notes: tuple[str, ...] = ()


def without_fsdp_fields(training: Mapping[str, Any]) -> dict[str, Any]:
    """``training`` without :data:`FSDP_TRAINING_FIELDS` (a new dict; ``training`` is left as it is)."""
    return {k: v for k, v in training.items() if k not in FSDP_TRAINING_FIELDS}


def sharding_plan(training: Mapping[str, Any], num_gpus: Any = None) -> ShardingPlan:
    """Read a run's ``fsdp`` / ``fsdp_config`` training args and its ``num_gpus`` into a :class:`ShardingPlan`.

    Args:
        training: The run's training-args keyword arguments as the user set them (``LeafConfig.training``).
        num_gpus: Devices per run (``RFModelConfig(num_gpus=)`` / ``run_fit(num_gpus=)``); ``None`` means 1.

    Returns:
        The plan: ``sharding=None`` for one device (``fsdp`` set then is checked, and named in a note: the run
        trains unsharded), ``"ddp"`` for ``num_gpus >= 2`` without ``fsdp``, ``"fsdp"`` with it.

    Raises:
        ConfigError: ``num_gpus`` not a positive int; an ``fsdp`` option that is
            unknown or FSDP1-only (``hybrid_shard``); ``fsdp_config`` not a dict, with an unknown key (the
            FSDP1-only keys of the seeds' recipe, ``backward_prefetch``, ``forward_prefetch``, ``use_orig_params``,
            ``sync_module_states``, ``limit_all_gathers``, are accepted and named in a note), size-based wrapping, ``version`` other than 2, activation checkpointing, or a value of the wrong
            type. Each message names the field and the fix.
    """
    k = _check_num_gpus(num_gpus)
    options = _fsdp_options(training.get("fsdp"))
    raw = training.get("fsdp_config")
    if options is None:
        if raw:
            raise ConfigError(
                "training_args.fsdp_config is set but fsdp is not: set fsdp='full_shard auto_wrap' (or "
                "fsdp=True) to shard the run, or remove fsdp_config"
            )
        return ShardingPlan(sharding="ddp" if k > 1 else None, num_gpus=k)
    config, ignored = _fsdp_config(raw)
    plan = _plan(options, config, k)  # checked with one device too: a typo is named either way
    if ignored:
        plan = dataclasses.replace(plan, notes=(*plan.notes, _fsdp1_note(ignored)))
    if k < 2:
        note = (
            f"training_args.fsdp={training.get('fsdp')!r} applies with num_gpus > 1 (RFModelConfig(num_gpus=k) or "
            "run_fit(num_gpus=k)): this run trains on one device, unsharded"
        )
        return ShardingPlan(sharding=None, num_gpus=1, notes=(note,))
    return plan


def _check_num_gpus(num_gpus: Any) -> int:
    if num_gpus is None:
        return 1
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, numbers.Integral) or int(num_gpus) < 1:
        raise ConfigError(
            f"num_gpus must be a positive int (the devices one run trains on), got {num_gpus!r}; "
            "leave it out for one device"
        )
    return int(num_gpus)


def _fsdp_options(value: Any) -> frozenset[str] | None:
    """The ``fsdp`` words, lower case; ``None`` when FSDP is off (``None``, ``False``, ``""``, ``[]``)."""
    if value is None or value is False or value == "" or value == []:
        return None
    if value is True:
        return frozenset({"full_shard", "auto_wrap"})
    if isinstance(value, str):
        words = value.split()
    elif isinstance(value, (list, tuple)) and all(isinstance(w, str) for w in value):
        words = list(value)
    else:
        raise ConfigError(
            f"training_args.fsdp must be True, a string such as 'full_shard auto_wrap' or a list of such words, "
            f"got {type(value).__name__} {value!r}"
        )
    options = frozenset(w.lower() for w in words)
    for word in sorted(options):
        if word in _FSDP1_ONLY_OPTIONS:
            raise ConfigError(
                f"training_args.fsdp option {word!r} exists only in FSDP1 (deprecated, not used here): use "
                "'full_shard' or 'shard_grad_op'"
                + (
                    "; for plain data parallelism set num_gpus without fsdp (DDP)"
                    if word == "no_shard"
                    else ""
                )
            )
        if word not in FSDP_OPTIONS:
            hint = closest_name(word, FSDP_OPTIONS)
            raise ConfigError(
                f"training_args.fsdp option {word!r} is unknown; the options are {list(FSDP_OPTIONS)}"
                + (f" (did you mean {hint!r}?)" if hint else "")
            )
    if {"full_shard", "shard_grad_op"} <= options:
        raise ConfigError("training_args.fsdp names both 'full_shard' and 'shard_grad_op': keep one")
    return options


def _fsdp1_note(keys: Sequence[str]) -> str:
    return (
        f"training_args.fsdp_config {', '.join(keys)}: FSDP1 settings, ignored by FSDP2 (which shards here: it "
        "prefetches the next unit's all-gather and limits them on its own, keeps the parameters as they are, and "
        "every rank builds the same weights)"
    )


def _fsdp_config(raw: Any) -> tuple[dict[str, Any], list[str]]:
    """``fsdp_config`` as a dict of known keys (``fsdp_`` prefixes dropped), and the FSDP1-only keys it held
    (accepted, as the seeds' recipe writes them, and named in a note: FSDP2 has no such settings)."""
    if raw is None:
        return {}, []
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"training_args.fsdp_config must be a dict, got {type(raw).__name__} {raw!r}; a JSON file path is "
            "not read here: pass json.load(open(path)) instead"
        )
    config: dict[str, Any] = {}
    ignored: list[str] = []
    for key, value in raw.items():
        name = key[5:] if isinstance(key, str) and key.startswith("fsdp_") else key
        if name in _FSDP1_ONLY_KEYS:
            ignored.append(str(key))
            continue
        if name in _XLA_KEYS:
            if value:
                raise ConfigError(
                    f"training_args.fsdp_config[{key!r}]={value!r}: XLA (TPU) FSDP is not supported here; remove it"
                )
            continue
        if name not in FSDP_CONFIG_KEYS:
            hint = closest_name(str(name), FSDP_CONFIG_KEYS)
            raise ConfigError(
                f"training_args.fsdp_config[{key!r}] is not a known FSDP2 setting; the keys are "
                f"{list(FSDP_CONFIG_KEYS)}" + (f" (did you mean {hint!r}?)" if hint else "")
            )
        config[name] = value
    return config, ignored


def _flag(config: Mapping[str, Any], name: str, default: bool) -> bool:
    """A boolean ``fsdp_config`` value (``True``/``False`` or ``"true"``/``"false"``, as accelerate writes them)."""
    value = config.get(name, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ConfigError(f"training_args.fsdp_config[{name!r}] must be True or False, got {value!r}")


def _plan(options: frozenset[str], config: Mapping[str, Any], k: int) -> ShardingPlan:
    notes: list[str] = []
    version = config.get("version", 2)
    if version not in (2, "2"):
        raise ConfigError(
            f"training_args.fsdp_config['version']={version!r}: only FSDP2 is used here; set version=2 or remove it"
        )
    if _flag(config, "activation_checkpointing", False):
        raise ConfigError(
            "training_args.fsdp_config['activation_checkpointing']=True is not applied here: set "
            "training_args.gradient_checkpointing=True instead and remove it from fsdp_config"
        )
    reshard = _reshard(options, config)
    policy = _wrap_policy(config)
    layers = _layer_classes(config, policy)
    offload = (
        "offload" in options or _flag(config, "offload_params", False) or _flag(config, "cpu_offload", False)
    )
    state_dict_type = str(config.get("state_dict_type", "FULL_STATE_DICT")).upper()
    if state_dict_type not in _STATE_DICT_TYPES:
        raise ConfigError(
            f"training_args.fsdp_config['state_dict_type']={config['state_dict_type']!r}: use one of "
            f"{list(_STATE_DICT_TYPES)} or remove it"
        )
    efficient = _flag(config, "cpu_ram_efficient_loading", False)
    if efficient:
        notes.append(
            "fsdp_config cpu_ram_efficient_loading=True has no effect here yet: each rank builds the whole model "
            "with create_model_fn on the CPU (nothing is broadcast from rank 0) and keeps only its shard on its "
            "device, so host memory peaks at one whole model per rank"
        )
    return ShardingPlan(
        sharding="fsdp",
        num_gpus=k,
        wrap_policy=policy,
        layer_classes=layers,
        reshard_after_forward=reshard,
        offload_params=offload,
        cpu_ram_efficient_loading=efficient,
        notes=tuple(notes),
    )


def _reshard(options: frozenset[str], config: Mapping[str, Any]) -> bool:
    """``reshard_after_forward``: the explicit key, else the strategy (``sharding_strategy`` or the ``fsdp`` word)."""
    strategy = config.get("sharding_strategy")
    from_options = "SHARD_GRAD_OP" if "shard_grad_op" in options else "FULL_SHARD"
    if strategy is not None:
        if not isinstance(strategy, str) or strategy.upper() not in _STRATEGIES:
            raise ConfigError(
                f"training_args.fsdp_config['sharding_strategy']={strategy!r}: FSDP2 supports "
                f"{list(_STRATEGIES)} (HYBRID_SHARD and NO_SHARD are FSDP1-only; for plain data parallelism set "
                "num_gpus without fsdp)"
            )
        if {"full_shard", "shard_grad_op"} & options and strategy.upper() != from_options:
            raise ConfigError(
                f"training_args.fsdp says {from_options.lower()!r} but fsdp_config['sharding_strategy'] is "
                f"{strategy!r}: make them agree"
            )
        from_options = strategy.upper()
    if "reshard_after_forward" in config:
        return _flag(config, "reshard_after_forward", True)
    return _STRATEGIES[from_options]


def _wrap_policy(config: Mapping[str, Any]) -> str:
    policy = config.get("auto_wrap_policy", "TRANSFORMER_BASED_WRAP")
    if isinstance(policy, str) and policy.upper() == "SIZE_BASED_WRAP":
        raise ConfigError(
            "training_args.fsdp_config['auto_wrap_policy']='SIZE_BASED_WRAP' is not supported (FSDP2 shards per "
            "module): use 'TRANSFORMER_BASED_WRAP' (each decoder layer one unit) and remove min_num_params"
        )
    if not isinstance(policy, str) or policy.upper() not in _WRAP_POLICIES:
        raise ConfigError(
            f"training_args.fsdp_config['auto_wrap_policy']={policy!r}: use one of {list(_WRAP_POLICIES)}"
        )
    if config.get("min_num_params", 0) not in (0, None):
        raise ConfigError(
            "training_args.fsdp_config['min_num_params'] is read only by SIZE_BASED_WRAP, which is not "
            "supported: remove it"
        )
    return policy.upper()


def _layer_classes(config: Mapping[str, Any], policy: str) -> tuple[str, ...]:
    raw = config.get("transformer_layer_cls_to_wrap")
    if raw is None:
        return ()
    if policy != "TRANSFORMER_BASED_WRAP":
        raise ConfigError(
            "training_args.fsdp_config['transformer_layer_cls_to_wrap'] is read only with auto_wrap_policy="
            "'TRANSFORMER_BASED_WRAP': remove it or change the policy"
        )
    names = [raw] if isinstance(raw, str) else raw
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(
            "training_args.fsdp_config['transformer_layer_cls_to_wrap'] must be a class name or a list of them "
            f"(e.g. ['LlamaDecoderLayer']), got {raw!r}"
        )
    return tuple(names)
