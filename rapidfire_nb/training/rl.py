"""DPO and GRPO on the engine's shared base model: what the executor does around TRL's preference/RL trainers.

The executor calls these through one-line hooks (``precheck``, ``trainer_kwargs``, ``building``,
``after_build``, ``on_activate``); SFT runs pass through them unchanged.

What they solve, each measured on TRL 1.16 / PEFT 0.21:

* **The reference model of LoRA runs is the shared base with adapters disabled** — exactly what a plain
  ``DPOTrainer``/``GRPOTrainer`` given ``peft_config`` uses. Given an already-wrapped ``PeftModel`` instead
  (our case: one PeftModel holding one adapter ``run_<id>`` per run), both trainers look up the adapter named
  ``"default"`` (``KeyError`` with per-run names) and add a frozen ``"ref"`` copy of it, which would then be
  the reference (a second adapter, different from a plain run's reference). :func:`building` exposes the
  run's adapter as ``"default"`` while the trainer is built and skips the ``"ref"`` copy, so the trainer
  keeps ``ref_model=None`` and computes reference log-probs under ``disable_adapter()`` — no extra copy.
* **Per-run forward of the shared base.** Every TRL trainer patches the base model's ``forward`` with a
  fused LM head carrying its own settings (GRPO's ``temperature``, DPO's extra outputs for
  ``use_weighting``); on a shared base the last trainer built would win. :func:`after_build` records the
  forward each trainer installed and :func:`on_activate` puts the active run's back on every handover.
* **Full fine-tuning DPO** gets one frozen reference per distinct base (a copy of the pristine base, shared
  by the runs on it) instead of TRL loading one per run from the model's path;
  ``ref_model_name``/``ref_model_kwargs`` load another one through ``create_model_fn``.
* **Reward functions** are checked before training against TRL's keyword call
  (``prompts=, completions=, completion_ids=, trainer_state=, log_extra=, log_metric=`` and the dataset's
  extra columns) with ``inspect.signature(...).bind``; at run time each is wrapped so an exception names
  the function (the run fails, the others go on). The wrapper keeps the function's ``__name__``, so TRL's
  metric names (``rewards/<name>/mean``) are unchanged.
* **Exact resume past the first epoch** (crash recovery, warm clones). GRPO's ``RepeatSampler`` shuffles each
  epoch with its own generator, advanced once per epoch and never reseeded (no ``set_epoch``); a resumed
  trainer's fresh sampler would shuffle epoch ``e`` like epoch 0, so other prompts from the first step after
  the checkpoint (measured: loss 0.058 and adapter 0.04-0.05 off; plain TRL's own ``resume_from_checkpoint``
  is off the same way). :func:`resume_sampler_epochs` (installed by :func:`after_build`) replays the epochs
  already trained on the resumed trainer's sampler before its first batch.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import math
from collections.abc import Iterator
from typing import Any

from rapidfire_nb.errors import ConfigError

from .trainers import TrainerKind

__all__ = [
    "RewardFunctionError",
    "after_build",
    "building",
    "check_generation_batch",
    "check_reward_funcs",
    "on_activate",
    "precheck",
    "resume_sampler_epochs",
    "reward_call_names",
    "trainer_kwargs",
    "wrap_reward_funcs",
]

#: keyword arguments GRPOTrainer passes to every reward function besides the dataset's extra columns
REWARD_CALL_KEYWORDS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")
#: dataset columns GRPOTrainer does not forward to reward functions
_NOT_FORWARDED = ("prompt", "completion", "completion_ids")


class RewardFunctionError(RuntimeError):
    """A GRPO reward function raised during training (the message names it); fails only its run."""


# ---------------------------------------------------------------------------------------------- checks
def precheck(kind: TrainerKind, spec: Any, train_dataset: Any, eval_dataset: Any = None) -> None:
    """Checks before anything is built: GRPO's generation batch and reward functions.

    Raises:
        ConfigError: a generation batch not divisible by ``num_generations`` (both numbers named), or a
            reward function that cannot accept TRL's keyword call.
    """
    if kind.name != "GRPO":
        return
    if spec.ref_model_name is not None or spec.ref_model_kwargs:
        raise ConfigError(
            "ref_model_name/ref_model_kwargs are not supported for GRPO: TRL's GRPOTrainer takes no reference "
            "model (LoRA runs use the base with adapters disabled; full fine-tuning with beta > 0 reloads the "
            "policy's own weights); remove them")
    check_generation_batch(spec)
    from .data import prepare_dataset

    remove = bool(_training_value(spec, "remove_unused_columns"))
    for what, ds in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
        if ds is not None:  # TRL calls the reward functions on eval rows too (with the eval set's columns)
            rows = prepare_dataset(ds, spec.formatting_func, kind, what)
            check_reward_funcs(spec.reward_funcs, rows.column_names, remove_unused_columns=remove)


def _training_value(spec: Any, name: str) -> Any:
    from rapidfire_nb import schema as fields

    if name in spec.training:
        return spec.training[name]
    cls = fields.trainer_config_class(spec.trainer_type)
    return fields.field_default(cls, name) if name in fields.field_names(cls) else None


def check_generation_batch(spec: Any) -> None:
    """GRPO: each generation batch must hold whole groups of ``num_generations`` completions.

    Mirrors ``GRPOConfig.__post_init__`` (one process): the generation batch is ``generation_batch_size``
    when set, else ``per_device_train_batch_size x steps_per_generation`` (``steps_per_generation``
    defaults to ``gradient_accumulation_steps``).

    Raises:
        ConfigError: naming the generation batch, how it was derived, and ``num_generations``.
    """
    g = _training_value(spec, "num_generations")
    bs = _training_value(spec, "per_device_train_batch_size")
    if not isinstance(g, int) or not isinstance(bs, int) or g < 1 or bs < 1:
        return  # TRL reports malformed values itself
    gbs = spec.training.get("generation_batch_size")
    spg = spec.training.get("steps_per_generation")
    if gbs is not None and spg is not None:
        return  # TRL: "can not be both configured"
    if isinstance(gbs, int):
        derived = f"generation_batch_size={gbs}"
    else:
        if spg is None:
            spg = _training_value(spec, "gradient_accumulation_steps") or 1
            how = f"gradient_accumulation_steps={spg}, the default steps_per_generation"
        else:
            how = f"steps_per_generation={spg}"
        if not isinstance(spg, int):
            return
        gbs = bs * spg
        derived = f"per_device_train_batch_size={bs} x {how}"
    if gbs % g:
        multiple = g // math.gcd(g, bs)
        raise ConfigError(
            f"GRPO: the generation batch of {gbs} completions ({derived}) is not divisible by num_generations={g}: "
            f"every prompt needs all its {g} completions in one generation batch. Make the generation batch a "
            f"multiple of {g} (e.g. steps_per_generation a multiple of {multiple} with per_device_train_batch_size="
            f"{bs}), or change num_generations")


def reward_call_names(columns: list[str] | tuple[str, ...], remove_unused_columns: bool = False) -> list[str]:
    """The keyword names of TRL's reward call for a dataset with ``columns``."""
    extra = [] if remove_unused_columns else [c for c in columns if c not in _NOT_FORWARDED]
    return [*REWARD_CALL_KEYWORDS, *[c for c in extra if c not in REWARD_CALL_KEYWORDS]]


def _reward_name(fn: Any) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


def _is_module(fn: Any) -> bool:
    try:
        import torch

        return isinstance(fn, torch.nn.Module)
    except ImportError:  # pragma: no cover
        return False


def check_reward_funcs(reward_funcs: Any, columns: list[str] | tuple[str, ...],
                       remove_unused_columns: bool = False) -> None:
    """Every reward function must accept TRL's keyword call (checked with ``inspect.signature().bind``).

    Reward model ids (strings) and ``nn.Module`` reward models are called differently by TRL; not checked.

    Raises:
        ConfigError: no reward functions, or one whose signature cannot bind the call (the message names the
            function, the call and Python's reason).
    """
    if not reward_funcs:
        raise ConfigError("GRPO needs reward functions: set RFModelConfig(reward_funcs=[my_reward, ...]) "
                          "(each reward_func(prompts, completions, **kwargs) -> list[float])")
    names = reward_call_names(columns, remove_unused_columns)
    for fn in reward_funcs:
        if isinstance(fn, str) or _is_module(fn):
            continue
        if not callable(fn):
            raise ConfigError(f"reward function {fn!r} is not callable")
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            continue  # a builtin without a signature: TRL will find out
        try:
            sig.bind(**{n: None for n in names})
        except TypeError as exc:
            raise ConfigError(
                f"reward function {_reward_name(fn)!r}{sig} cannot accept TRL's call "
                f"{_reward_name(fn)}({', '.join(n + '=...' for n in names)}): {exc}. Accept the columns you need "
                "by name and the rest with **kwargs, e.g. def my_reward(completions, answer, **kwargs)"
            ) from None


# ---------------------------------------------------------------------------------------------- rewards
def wrap_reward_funcs(reward_funcs: Any) -> list[Any]:
    """Reward functions wrapped so that an exception names the function (``RewardFunctionError``).

    The wrapper keeps ``__name__`` (TRL's metric names ``rewards/<name>/mean`` use it) and is ``async`` when
    the function is; strings (reward model ids) and ``nn.Module`` reward models are passed through.
    """
    from trl.trainer.utils import is_async_callable

    out: list[Any] = []
    for fn in list(reward_funcs or []):
        if isinstance(fn, str) or _is_module(fn) or not callable(fn):
            out.append(fn)
            continue
        name = _reward_name(fn)

        def fail(exc: Exception, name: str = name) -> RewardFunctionError:
            return RewardFunctionError(f"reward function {name!r} raised {type(exc).__name__}: {exc}")

        if is_async_callable(fn):
            async def wrapper(*args: Any, _fn: Any = fn, _fail: Any = fail, **kwargs: Any) -> Any:
                try:
                    return await _fn(*args, **kwargs)
                except Exception as exc:
                    raise _fail(exc) from exc
        else:
            def wrapper(*args: Any, _fn: Any = fn, _fail: Any = fail, **kwargs: Any) -> Any:  # type: ignore[misc]
                try:
                    return _fn(*args, **kwargs)
                except Exception as exc:
                    raise _fail(exc) from exc
        wrapper.__name__ = name
        wrapper.__qualname__ = getattr(fn, "__qualname__", name)
        wrapper.__doc__ = getattr(fn, "__doc__", None)
        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
        out.append(wrapper)
    return out


# ---------------------------------------------------------------------------------------------- building
def trainer_kwargs(kind: TrainerKind, spec: Any, model: Any, args: Any, executor: Any) -> dict[str, Any]:
    """Extra keyword arguments for one run's TRL trainer: GRPO's (wrapped) reward functions, DPO's reference."""
    out: dict[str, Any] = {}
    if kind.name == "GRPO":
        out["reward_funcs"] = wrap_reward_funcs(spec.reward_funcs)
    if kind.name == "DPO":
        ref = _dpo_reference(spec, model, args, executor)
        if ref is not None:
            out["ref_model"] = ref
    return out


def _dpo_reference(spec: Any, model: Any, args: Any, executor: Any) -> Any:
    """A frozen reference model shared by the runs that use it, or ``None`` (LoRA: the base, adapters off).

    Cached on the executor: one per distinct ``(ref_model_name, ref_model_kwargs)`` (loaded with
    ``create_model_fn``), else, for full fine-tuning, one per base (a copy of the pristine base, which the
    runs never train: each trains its own copy).
    """
    cache: dict[Any, Any] = executor.__dict__.setdefault("_rl_reference_models", {})
    if spec.ref_model_name is not None or spec.ref_model_kwargs:
        name = spec.ref_model_name or spec.model_name
        kwargs = dict(spec.ref_model_kwargs if spec.ref_model_kwargs is not None else spec.model_kwargs or {})
        key = ("named", name, repr(sorted(kwargs.items())))
        if key not in cache:
            config = spec.model_config_dict()
            config.update(model_name=name, model_kwargs=kwargs, peft_config=None)
            ref, _tokenizer = executor._call_create_model(config)
            cache[key] = _frozen(ref)
        return cache[key]
    if hasattr(model, "peft_config"):
        return None
    base = executor._base_for(spec, args)
    key = ("base", base.key)
    if key not in cache:
        cache[key] = _frozen(copy.deepcopy(base.model))
    return cache[key]


def _frozen(model: Any) -> Any:
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@contextlib.contextmanager
def building(kind: TrainerKind, model: Any, adapter: str | None) -> Iterator[None]:
    """While a DPO/GRPO trainer is built on the shared PeftModel: its adapter is also ``"default"``, no ``"ref"``.

    DPOTrainer/GRPOTrainer given a PeftModel and no ``peft_config`` read ``model.peft_config["default"]`` and
    add a ``"ref"`` adapter copied from it (their reference). A plain run given ``peft_config`` has no
    ``"ref"`` adapter: its reference is the base with adapters disabled, and so is ours after this.
    """
    if kind.name not in ("DPO", "GRPO") or adapter is None or not hasattr(model, "peft_config"):
        yield
        return
    configs = model.peft_config
    aliased = "default" not in configs
    if aliased:
        configs["default"] = configs[adapter]
    original_add = model.__dict__.get("add_adapter")

    def add_adapter(adapter_name: str, *args: Any, **kwargs: Any) -> Any:
        if adapter_name == "ref":
            return None  # TRL's frozen copy of "default": not made; the reference is the base, adapters off
        return type(model).add_adapter(model, adapter_name, *args, **kwargs)

    model.add_adapter = add_adapter
    try:
        yield
    finally:
        if original_add is None:
            model.__dict__.pop("add_adapter", None)
        else:
            model.add_adapter = original_add
        if aliased and configs.get("default") is configs.get(adapter):
            configs.pop("default", None)
        model.set_adapter(adapter)


def _forward_owner(model: Any) -> Any:
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def after_build(trainer: Any) -> None:
    """Record the ``forward`` this trainer installed on its (possibly shared) base model; make resumes exact."""
    owner = _forward_owner(trainer.model)
    trainer._rapidfire_forward = (owner, owner.__dict__.get("forward"))
    resume_sampler_epochs(trainer)


def resume_sampler_epochs(trainer: Any) -> None:
    """On ``train(resume_from_checkpoint=...)``, put the training sampler where an uninterrupted run has it.

    GRPO's ``RepeatSampler`` shuffles with its own ``torch.Generator``, seeded once when the sampler is made
    and advanced by one permutation per epoch (each ``iter()``); it has no ``set_epoch``. A resumed trainer
    makes a fresh sampler, so epoch ``e > 0`` would be shuffled with epoch 0's permutation: other prompts
    from the first step after the checkpoint (crash resume, warm clones past the first epoch). transformers
    only fast-forwards the batches inside the resumed epoch (``skip_first_batches``); its own samplers are
    reseeded per epoch by ``set_epoch`` (SFT/DPO are exact without this).

    After transformers has read the checkpoint's position (``_init_training_state``: ``epochs_trained``) and
    before the first batch is drawn, a sampler without ``set_epoch`` is iterated once per epoch already
    trained, exactly as the uninterrupted run iterated it, so its generator is where that run's was. Samplers
    with ``set_epoch`` or without a generator of their own, and trainers that do not resume, are left alone.
    """
    if "_get_train_sampler" not in dir(trainer) or "_init_training_state" not in dir(trainer):
        return
    made: list[Any] = []
    make_sampler = trainer._get_train_sampler
    init_state = trainer._init_training_state

    def get_train_sampler(*args: Any, **kwargs: Any) -> Any:
        sampler = make_sampler(*args, **kwargs)
        made[:] = [sampler]
        return sampler

    signature = inspect.signature(init_state)

    def init_training_state(*args: Any, **kwargs: Any) -> Any:
        out = init_state(*args, **kwargs)
        resume_from_checkpoint = signature.bind(*args, **kwargs).arguments.get("resume_from_checkpoint")
        epochs_trained = int(out[0])
        sampler = made[0] if made else None
        if (resume_from_checkpoint is not None and epochs_trained > 0 and sampler is not None
                and not hasattr(sampler, "set_epoch") and getattr(sampler, "generator", None) is not None):
            for _ in range(epochs_trained):
                for _ in sampler:  # the whole epoch, as the uninterrupted run drew it
                    pass
        return out

    trainer._get_train_sampler = get_train_sampler
    trainer._init_training_state = init_training_state


def on_activate(trainer: Any) -> None:
    """Put back the ``forward`` the active run's trainer installed (its own fused-LM-head settings)."""
    owner, forward = getattr(trainer, "_rapidfire_forward", (None, None))
    if owner is not None and forward is not None and owner.__dict__.get("forward") is not forward:
        owner.forward = forward
