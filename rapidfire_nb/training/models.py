"""The model provider: where the training layer gets its models (the user's ``create_model_fn``, shared bases).

Trainer kinds (``rapidfire_nb.training.kinds``) receive a :class:`ModelProvider` instead of the executor, so
they load and share models without reaching into executor internals. :class:`BaseModels` is the one
implementation; each ``TorchExecutor`` owns one (``executor.models``). Importing this module does not import
torch (it is imported by the calls that need it).
"""

from __future__ import annotations

import abc
import copy
import json
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rapidfire_nb.errors import ConfigError
from rapidfire_nb.spec import LeafConfig

from . import quantization as quant
from .own_params import OwnParameters, skip_redundant_train

__all__ = [
    "SHARED_MODEL_FIELDS",
    "BaseModels",
    "ModelProvider",
    "SharedBase",
    "adapter_layer_names",
    "count_flos_alone",
    "install_lora_extras",
    "load_final_weights",
    "load_trained_weights",
    "own_base_reason",
    "save_final_weights",
]

SHARED_MODEL_FIELDS: tuple[str, ...] = (
    "gradient_checkpointing",
    "neftune_noise_alpha",
    "disable_dropout",
    "use_liger_kernel",
    "torch_compile",
    "cast_lm_head_to_fp32",  # GRPO's cast replaces the shared lm_head
    "gradient_checkpointing_kwargs",  # Trainer enables checkpointing on the whole model with them
)
"""TrainingArguments fields that act on the shared model itself: runs on one base must agree on them."""


@dataclass
class SharedBase:
    """One loaded base model, shared by the LoRA runs whose base settings are equal.

    Attributes:
        key: Canonical JSON of what makes bases equal (``model_name``, ``model_kwargs``, ``tokenizer`` and the
            ``SHARED_MODEL_FIELDS`` values).
        model: The user's model; a ``peft.PeftModel`` holding one adapter per run once the first LoRA run
            was added.
        tokenizer: The tokenizer ``create_model_fn`` returned with it.
        peft: Whether ``model`` has been wrapped into a ``PeftModel``.
        adapters: The adapter names on it (``run_<id>``), in the order they were added.
    """

    key: str
    model: Any
    tokenizer: Any
    peft: bool = False
    adapters: list[str] = field(default_factory=list)


def own_base_reason(spec: LeafConfig) -> str | None:
    """Why a LoRA run cannot share its base model with other runs, or ``None``.

    ``lora.bias`` other than ``"none"`` trains bias terms of the model itself, and PEFT allows only one adapter
    with bias per model ("LoraModel supports only 1 adapter with bias"). ``lora.trainable_token_indices`` wraps the
    model's embedding in a token adapter that every adapter added later shares: PEFT's
    ``get_peft_model_state_dict`` then fails for them (``KeyError: 'token_adapter.trainable_tokens_delta.<name>'``,
    peft 0.21; found by a fresh-user pass, where it took ``run_fit`` down before training).

    Args:
        spec: The run's spec.

    Returns:
        A sentence for the user's note, or ``None`` when the run can share its base.
    """
    bias = (spec.lora or {}).get("bias", "none")
    if spec.lora is not None and bias not in (None, "none"):
        return (
            f"lora.bias={bias!r} trains bias terms of the base model itself (PEFT allows one adapter with bias "
            "per model)"
        )
    tokens = (spec.lora or {}).get("trainable_token_indices")
    if spec.lora is not None and tokens:
        return (
            "lora.trainable_token_indices trains rows of the base model's embedding through a token adapter that "
            "PEFT shares with every other adapter on the model"
        )
    return None


class ModelProvider(abc.ABC):
    """How trainer kinds and the executor get models. One per executor; called from its (one) calling thread."""

    @abc.abstractmethod
    def create(self, model_config: dict[str, Any]) -> tuple[Any, Any]:
        """Call the user's ``create_model_fn`` on a deep copy of ``model_config``.

        Args:
            model_config: ``LeafConfig.model_config_dict()``, possibly with ``model_name``/``model_kwargs``
                replaced (e.g. a DPO reference model).

        Returns:
            ``(model, tokenizer)``: a ``torch.nn.Module`` and a callable tokenizer.

        Raises:
            ConfigError: ``create_model_fn`` raised, or returned something else.
        """

    @abc.abstractmethod
    def base_for(self, spec: LeafConfig, args: Any, run_id: int | None = None) -> SharedBase:
        """The shared base of a run (created with ``create`` on first use).

        Args:
            spec: The run's spec.
            args: Its built TRL config (the ``SHARED_MODEL_FIELDS`` are read from it).
            run_id: The run's id; a run whose LoRA settings act on the whole model (``own_base_reason``) gets a
                base of its own, keyed by it.

        Returns:
            The base shared by every run with equal model settings.
        """

    @abc.abstractmethod
    def shared(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """A model made once per ``key`` and shared by the runs that ask for it (e.g. a frozen reference).

        Args:
            key: Identifies the model among this provider's shared models.
            make: Builds it; called only when ``key`` is new.

        Returns:
            The model made for ``key``.
        """


class BaseModels(ModelProvider):
    """The executor's models: ``create_model_fn`` is called once per distinct base (and per shared model).

    Args:
        create_model_fn: ``create_model_fn(model_config: dict) -> (model, tokenizer)``.
        note: Receives user-facing notes (one string each), e.g. that bases were split.
    """

    def __init__(self, create_model_fn: Callable[[dict[str, Any]], Any], note: Callable[[str], None]) -> None:
        self.create_model_fn = create_model_fn
        self.note = note  # public: kinds tell the user why a shared computation is skipped
        self._bases: dict[str, SharedBase] = {}
        self._settings: dict[str, dict[str, Any]] = {}  # shared base key -> its SHARED_MODEL_FIELDS values
        self._shared: dict[Hashable, Any] = {}

    def create(self, model_config: dict[str, Any]) -> tuple[Any, Any]:
        import torch

        model_config = quant.revive_in_model_config(
            copy.deepcopy(model_config)
        )  # a stored BitsAndBytesConfig
        try:
            out = self.create_model_fn(model_config)
        except Exception as exc:
            raise ConfigError(f"create_model_fn raised {type(exc).__name__}: {exc}") from exc
        if not (
            isinstance(out, tuple)
            and len(out) == 2
            and isinstance(out[0], torch.nn.Module)
            and out[1] is not None
            and callable(out[1])
        ):
            raise ConfigError(
                "create_model_fn must return a (model, tokenizer) tuple, e.g. "
                "`return AutoModelForCausalLM.from_pretrained(...), AutoTokenizer.from_pretrained(...)`; "
                f"got {type(out).__name__}"
            )
        return out

    def existing(self, spec: LeafConfig, args: Any, run_id: int | None = None) -> SharedBase | None:
        """The base :meth:`base_for` gives, if created already (never creates one; any thread)."""
        return self._bases.get(self._key(spec, args, run_id))

    def base_for(self, spec: LeafConfig, args: Any, run_id: int | None = None) -> SharedBase:
        shared = {f: getattr(args, f, None) for f in SHARED_MODEL_FIELDS}
        own = own_base_reason(spec)
        key = self._key(spec, args, run_id)
        base = self._bases.get(key)
        if base is None:
            model, tok = self.create(spec.model_config_dict())
            base = SharedBase(key=key, model=model, tokenizer=tok)
            self._bases[key] = base
            quantized = quant.cpu_note(model)
            if quantized is not None:  # a 4-bit base trained on the CPU: evaluations must not repack it
                quant.keep_cpu_weights_unpacked(model)
                self.note(quantized)
            if own is not None:
                self.note(f"{own}: such runs get their own base copy (create_model_fn is called for each)")
            else:
                self._note_disagreement(key, shared, run_id)
                self._settings[key] = shared
        return base

    def _key(self, spec: LeafConfig, args: Any, run_id: int | None) -> str:
        """The key of the base a run with ``spec`` and built config ``args`` shares (see :meth:`base_for`)."""
        key = {
            "full": spec.lora is None,  # full fine-tuning copies an unwrapped base, never the LoRA runs' one
            "model_name": spec.model_name,
            "model_kwargs": quant.kwargs_key(spec.model_kwargs),
            "tokenizer": repr(spec.tokenizer),
            "shared": repr({f: getattr(args, f, None) for f in SHARED_MODEL_FIELDS}),
            "zown": None if own_base_reason(spec) is None else run_id,  # "z": after "shared" (split below)
        }
        return json.dumps(key, sort_keys=True)

    def _note_disagreement(self, key: str, shared: dict[str, Any], run_id: int | None) -> None:
        """A note naming the settings in which a new shared base differs from one of the same model already loaded."""
        same_model = key.split('"shared"')[0]
        for other, theirs in self._settings.items():
            if other.split('"shared"')[0] != same_model:
                continue
            differ = [
                f"{f}={shared[f]!r} (loaded base: {theirs[f]!r})" for f in shared if shared[f] != theirs[f]
            ]
            if not differ:  # the same settings: another tokenizer made it a base of its own
                continue
            who = f"run {run_id}" if run_id is not None else "a run"
            self.note(
                f"{who} differs from a base of its model already loaded in settings that act on the shared model: "
                f"{', '.join(differ)}; it gets its own base copy (create_model_fn is called again)"
            )
            return

    def shared(self, key: Hashable, make: Callable[[], Any]) -> Any:
        if key not in self._shared:
            self._shared[key] = make()
        return self._shared[key]


def attach_run_model(
    base: SharedBase, run_id: int, spec: LeafConfig, lora: Any, seed: int
) -> tuple[Any, str | None]:
    """The model one run trains: its own LoRA adapter on the shared base, or its own copy of the base.

    Args:
        base: The run's shared base.
        run_id: The run's id (its adapter is named ``run_<id>``).
        spec: The run's spec (for messages).
        lora: Its ``peft.LoraConfig``, or ``None`` for full fine-tuning.
        seed: The run's training seed: ``set_seed(seed)`` right before the adapter is created, as TRL does
            before ``get_peft_model``, so its initial weights match a plain run's.

    Returns:
        ``(model, adapter)``: the shared ``PeftModel`` with ``run_<id>`` active and ``"run_<id>"``, or
        ``(deep copy of the base, None)``.

    Raises:
        ConfigError: ``lora.target_modules`` does not fit the model (no half-registered adapter is left), or
            a full fine-tuning run given a base that already carries LoRA adapters.
    """
    if lora is None:
        quant.refuse_full_finetune(base.model, spec)  # before the copy: quantized weights cannot be trained
        if base.peft:  # BaseModels keeps full fine-tuning runs off the LoRA runs' base (its key says "full")
            raise ConfigError("a full fine-tuning run cannot copy a base that carries LoRA adapters")
        if not any(p.requires_grad for p in base.model.parameters()):
            raise ConfigError(
                f"create_model_fn returned a model with no trainable parameters for {spec.model_name!r} (every "
                "parameter has requires_grad=False, e.g. a peft.PeftModel loaded with PeftModel.from_pretrained(..., "
                "is_trainable=False), the default), and RFModelConfig has no peft_config: load the adapter with "
                "is_trainable=True, or return the base model and set peft_config to train a new LoRA adapter"
            )
        return copy.deepcopy(base.model), None  # full fine-tuning: each run its own copy
    from peft import PeftModel, get_peft_model
    from transformers import set_seed

    if not base.peft:
        _refuse_users_adapter(base.model, spec)

    adapter = f"run_{run_id}"
    if isinstance(base.model, PeftModel) and adapter in base.model.peft_config:  # a run that left this device
        base.model.delete_adapter(adapter)  # and came back (its weights come from its checkpoint)
        if adapter in base.adapters:
            base.adapters.remove(adapter)
    set_seed(seed)  # what TRL does right before get_peft_model: initial adapter weights match
    try:
        if not isinstance(base.model, PeftModel):
            base.model = get_peft_model(base.model, lora, adapter_name=adapter)
            base.peft = True
        else:
            base.model.add_adapter(adapter, lora)
    except ValueError as exc:
        if isinstance(base.model, PeftModel) and adapter in base.model.peft_config:
            base.model.delete_adapter(adapter)  # leave no half-registered adapter on the shared base
        raise ConfigError(
            f"lora.target_modules={lora.target_modules!r} does not fit the model {spec.model_name!r}: {exc}"
        ) from exc
    base.model.set_adapter(adapter)
    base.adapters.append(adapter)
    return base.model, adapter


def count_flos_alone(trainer: Any, adapter: str) -> None:
    """Make ``trainer.floating_point_ops`` count the run's own model: the shared base and its own adapter only.

    TRL adds ``Trainer.floating_point_ops(inputs)`` = 6 x ``input_ids.numel()`` x ``model.num_parameters(
    exclude_embeddings=True)`` to ``state.total_flos`` every step (transformers' ``Trainer`` and
    ``PreTrainedModel.floating_point_ops``: the 6 N D estimate of Kaplan et al. 2020, section 2.1). On a shared base
    ``num_parameters`` also counts the other runs' adapters, so ``total_flos`` (and the ``trainer_state.json`` a
    checkpoint keeps) would differ from a plain run's. Here the count is taken once, at the run's first step, as
    ``num_parameters`` minus the parameters of every other adapter on the base (PEFT names them
    ``...lora_A.<adapter>.weight``), and reused: the run's own parameter count never changes while it trains, and
    no walk over every module of every adapter is left in the step. A trainer whose class overrides
    ``floating_point_ops`` keeps its own.

    Args:
        trainer: The run's trainer (its ``model`` is the shared ``PeftModel``).
        adapter: The run's adapter name on that base (``run_<id>``).
    """
    from transformers import Trainer

    if type(trainer).floating_point_ops is not Trainer.floating_point_ops:
        return
    counted: list[int] = []

    def floating_point_ops(inputs: dict[str, Any]) -> int:
        model = trainer.model
        main_input = getattr(model, "main_input_name", "input_ids")
        if main_input not in inputs or not hasattr(model, "num_parameters"):
            return 0
        if not counted:
            others = set(getattr(model, "peft_config", {})) - {adapter}
            theirs = sum(
                p.numel() for name, p in model.named_parameters() if others.intersection(name.split("."))
            )
            counted.append(int(model.num_parameters(exclude_embeddings=True)) - theirs)
        return 6 * inputs[main_input].numel() * counted[0]

    trainer.floating_point_ops = floating_point_ops


def adapter_layer_names(model: Any) -> list[str]:
    """The modules of ``model`` that are PEFT adapter layers (a ``PeftModel``'s, or injected in place)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [name for name, module in model.named_modules() if isinstance(module, BaseTunerLayer)]


def _refuse_users_adapter(model: Any, spec: LeafConfig) -> None:
    """``create_model_fn``'s model already carries an adapter and the run has ``peft_config``: refuse, say both."""
    from peft import PeftModel

    layers = adapter_layer_names(model)
    if not isinstance(model, PeftModel) and not layers:
        return
    what = (
        f"a peft.PeftModel (adapters {sorted(model.peft_config)})"
        if isinstance(model, PeftModel)
        else f"a model with LoRA layers injected in place ({len(layers)} layers, e.g. {layers[0]!r})"
    )
    raise ConfigError(
        f"create_model_fn returned {what} for {spec.model_name!r}, and RFModelConfig.peft_config is set too: the "
        "run would add its own LoRA adapter, and the one create_model_fn made would stay in the model, never "
        "trained and never used. Either return the plain base model from create_model_fn (e.g. "
        "model.get_base_model(), or merge_and_unload() to keep its weights) so that peft_config's adapter trains, "
        "or set peft_config=None to train the adapter create_model_fn made"
    )


def load_trained_weights(model: Any, folder: Path) -> Any:
    """Load a full fine-tuning run's saved weights into ``model`` as ``create_model_fn`` built it.

    A model carrying adapter layers cannot be rebuilt by ``from_pretrained`` of the saved folder (it would drop
    the LoRA layers and re-initialise the modules they wrap): the saved tensors are loaded into the structure
    ``create_model_fn`` returns instead, every key checked. Other models reload with ``from_pretrained``.

    Args:
        model: a fresh model from ``create_model_fn`` for the run's spec.
        folder: the run's ``final`` folder (``save_pretrained`` output).

    Returns:
        The model with the trained weights (``model`` itself, or a reloaded one).

    Raises:
        ConfigError: the saved weights do not fit the model (keys missing or left over, named).
    """
    from peft import PeftModel, set_peft_model_state_dict
    from safetensors.torch import load_file

    if not isinstance(model, PeftModel) and not adapter_layer_names(model):
        return type(model).from_pretrained(str(folder))
    if isinstance(model, PeftModel):  # a PeftModel saves its adapter only
        state = load_file(str(Path(folder) / "adapter_model.safetensors"))
        result = set_peft_model_state_dict(model, state, adapter_name=model.active_adapter)
        _check_keys(folder, list(result.unexpected_keys), [])
        return model
    state = {}
    for file in sorted(Path(folder).glob("model*.safetensors")):
        state.update(load_file(str(file)))
    own = model.state_dict()
    model.load_state_dict(state, strict=False)
    loaded = {own[k].data_ptr() for k in state if k in own}
    missing = [
        k for k in own if k not in state and own[k].data_ptr() not in loaded
    ]  # tied weights are loaded
    _check_keys(folder, sorted(set(state) - set(own)), missing)
    return model


def _check_keys(folder: Path, unexpected: list[str], missing: list[str]) -> None:
    if unexpected or missing:
        raise ConfigError(
            f"the weights saved in {folder} do not fit the model create_model_fn returns now (left over: "
            f"{unexpected[:3]}, missing: {missing[:3]}); load them yourself with safetensors"
        )


def install_lora_extras(trainer: Any, adapter: str) -> OwnParameters:
    """Fit a LoRA run's trainer to the shared base: it counts and walks its own parameters only.

    ``total_flos`` counts the base and this adapter as a plain run's would (:func:`count_flos_alone`); gradient
    clipping and ``zero_grad`` walk the run's own parameters instead of every adapter's
    (:class:`~rapidfire_nb.training.own_params.OwnParameters`, installed here; the executor calls its
    ``activate`` at every handover); the step's ``model.train()`` returns at once when no module's mode changes
    (:func:`~rapidfire_nb.training.own_params.skip_redundant_train`); on a quantized base a resume keeps the
    adapter's dtype (:func:`~rapidfire_nb.training.quantization.keep_adapter_dtypes_on_resume`). Call it on the
    device thread, right after
    the trainer is built.

    Args:
        trainer: the run's TRL trainer (its ``model`` is the shared ``PeftModel``).
        adapter: the run's adapter name on that base (``run_<id>``).

    Returns:
        The run's installed ``OwnParameters``.
    """
    count_flos_alone(trainer, adapter)
    quant.keep_adapter_dtypes_on_resume(trainer)  # a quantized base: a resume keeps the adapter in bf16
    own = OwnParameters(trainer)
    own.install()
    skip_redundant_train(trainer.model)
    return own


def save_final_weights(model: Any, tokenizer: Any, adapter: str | None, target: Path) -> None:
    """Save a run's weights and tokenizer with ``save_pretrained`` into ``target``, atomically (a complete folder
    or none).

    Args:
        model: the run's model (the shared ``PeftModel`` for a LoRA run).
        tokenizer: its tokenizer or processor.
        adapter: the run's adapter name (only that adapter is saved, flat in ``target`` as a plain PEFT run's),
            or None for full fine-tuning (every weight saved).
        target: the folder (``runs/<id>/final``); replaced if it exists.

    Raises:
        OSError: the write failed (the previous folder, if any, stays).
    """
    import shutil

    from rapidfire_nb._atomic import atomic_dir

    with atomic_dir(target) as tmp:
        if adapter is not None:
            model.save_pretrained(str(tmp), selected_adapters=[adapter])
            sub = Path(tmp) / adapter
            if sub.is_dir():  # PEFT saves non-"default" adapters in a subfolder: flatten it
                for p in sub.iterdir():
                    shutil.move(str(p), str(Path(tmp) / p.name))
                sub.rmdir()
        else:
            model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))


def load_final_weights(models: ModelProvider, spec: LeafConfig, final_dir: Path) -> tuple[Any, Any]:
    """A fresh ``(model, tokenizer)`` from ``create_model_fn`` carrying a run's saved final weights, in eval mode.

    Args:
        models: where the fresh model comes from (``models.create``).
        spec: the run's spec (its model config; ``lora`` set: the folder holds its adapter).
        final_dir: the run's ``final`` folder (:func:`save_final_weights`).

    Raises:
        ConfigError: ``create_model_fn`` failed, or the saved weights do not fit the model.
    """
    model, tok = models.create(spec.model_config_dict())
    if spec.lora is not None:  # the run's own adapter on a fresh base
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(final_dir))
    else:  # full fine-tuning, also of a model carrying the user's own adapter layers
        model = load_trained_weights(model, Path(final_dir))
    model.eval()
    return model, tok
