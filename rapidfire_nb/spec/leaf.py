"""LeafConfig: the run spec, one fully resolved run configuration (no knobs left), as the expansion produces it.

Below ``automl`` (which expands config groups into leaves) and ``training`` (which trains them); imports only
``errors``, ``redact``, ``schema`` and the rest of ``rapidfire_nb.spec``.

Secrets (``hub_token``, ``model_kwargs.token``, any secret-like key: :mod:`rapidfire_nb.redact`) are kept in the
fields, in memory, and given to TRL and ``create_model_fn`` as they are; every view meant to be stored or shown
(:meth:`LeafConfig.to_json`, :meth:`~LeafConfig.hparams`, ``repr``) holds ``"<redacted>"`` instead, and
:meth:`~LeafConfig.fingerprint` leaves them out.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

from rapidfire_nb import schema
from rapidfire_nb.errors import ConfigError, closest_name
from rapidfire_nb.redact import REDACTED, first_secret_key, omit_secrets, redact
from rapidfire_nb.schema.trainer_kinds import TRAINER_KINDS, trainer_kind

from .build import build_lora_config, build_training_args
from .fsdp import FSDP_TRAINING_FIELDS, sharding_plan
from .names import check_run_name, check_tags, clone_name, fill_run_name
from .values import check_model_field, deep_copy, find_knob, jsonable

__all__ = ["FUNCTION_KEYS", "REF_MODEL_TRAINERS", "REWARD_FUNCS_TRAINERS", "LeafConfig"]

FUNCTION_KEYS: tuple[str, ...] = ("formatting_func", "compute_metrics", "reward_funcs")
"""``with_changes`` keys whose values are functions (accepted only with ``allow_functions=True``)."""

REWARD_FUNCS_TRAINERS: tuple[str, ...] = tuple(k.name for k in TRAINER_KINDS.values() if k.takes_reward_funcs)
"""Trainer types that take ``reward_funcs`` (and need at least one): ``("GRPO",)``, read from the kind table."""

REF_MODEL_TRAINERS: tuple[str, ...] = tuple(k.name for k in TRAINER_KINDS.values() if k.has_reference_model)
"""Trainer types for which ``ref_model_name``/``ref_model_kwargs`` may be set: ``("DPO", "GRPO")``, read from the
kind table (GRPO then fails in its precheck)."""

_MODEL_LEVEL_KEYS: tuple[str, ...] = (
    "model_name",
    "tokenizer",
    "formatting_func",
    "compute_metrics",
    "model_type",
    "ref_model_name",
    "reward_funcs",
    "generation_config",
    "num_gpus",
)
_LABELS: tuple[str, ...] = ("run_name", "tags")
"""Fields that label a run (not hyperparameters, not in the fingerprint); ``with_changes`` takes them as keys."""
# Prefixed hparam keys -> LeafConfig attribute holding the dict.
_DICT_PREFIXES: dict[str, str] = {
    "lora.": "lora",
    "model_kwargs.": "model_kwargs",
    "ref_model_kwargs.": "ref_model_kwargs",
    "tokenizer_kwargs.": "tokenizer_kwargs",
    "generation_config.": "generation_config",
}


@dataclasses.dataclass(frozen=True)
class LeafConfig:
    """One run's resolved configuration, as produced by ``RFGridSearch.expand``/``RFRandomSearch.expand``.

    Frozen; the dicts inside must not be mutated (use ``with_changes``). Equality compares fields;
    ``fingerprint()`` compares configurations across processes. Secret-like values are real here and redacted in
    ``to_json()``, ``hparams()`` and ``repr``.

    Attributes:
        trainer_type: ``"SFT"``, ``"DPO"`` or ``"GRPO"``.
        model_name: Model id or path.
        tokenizer: Tokenizer id or path, or ``None``.
        tokenizer_kwargs: Tokenizer loading keywords, or ``None``.
        formatting_func: Row formatting function, or ``None``.
        compute_metrics: Trainer ``compute_metrics``, or ``None``.
        lora: ``peft.LoraConfig`` keyword arguments as the user set them, or ``None`` (full fine-tuning).
        training: Trainer-config keyword arguments as the user set them (after renamed names are mapped);
            TRL's defaults fill the rest when ``rapidfire_nb.spec.build`` builds the real config.
        model_type: ``"causal_lm"``.
        model_kwargs: ``from_pretrained`` keywords (``{}`` when none).
        ref_model_name: Reference model id (DPO/GRPO), or ``None``.
        ref_model_kwargs: Reference model ``from_pretrained`` keywords, or ``None``.
        reward_funcs: GRPO reward functions (or reward model ids), or ``None``.
        generation_config: Generation settings, or ``None``.
        num_gpus: Devices the run trains on at once (a gang, ``rapidfire_nb.spec.gangs``), or ``None``: as
            ``run_fit(num_gpus=...)`` or one device. Left out of :meth:`to_json` and :meth:`fingerprint` when None
            (an experiment recorded before the field existed reopens with the same fingerprints).
        run_name: The run's name, a label shown next to its id (panel, page, ``get_runs_info()``, TensorBoard,
            trackers), or ``None``; ``training["run_name"]`` (TRL's field) is moved here. Not part of
            :meth:`fingerprint` and not a hyperparameter (:mod:`rapidfire_nb.spec.names`).
        tags: Free labels of the run (a tuple of str; the trackers' tags); not part of :meth:`fingerprint`.
        trl_run_name: ``training["run_name"]`` as written, when the name was given there (set when it is moved):
            what :meth:`legacy_fingerprint` needs; in no view.

    Raises:
        ConfigError: At construction, when a knob is left, the trainer type is unknown, GRPO has no
            ``reward_funcs``, a field is used by a trainer that ignores it, or ``run_name``/``tags`` are not
            valid labels (:func:`~rapidfire_nb.spec.names.check_run_name`, :func:`~.names.check_tags`).
    """

    trainer_type: str
    model_name: str
    tokenizer: str | None = None
    tokenizer_kwargs: dict[str, Any] | None = None
    formatting_func: Callable[..., Any] | None = None
    compute_metrics: Callable[..., Any] | None = None
    lora: dict[str, Any] | None = None
    training: dict[str, Any] = dataclasses.field(default_factory=dict)
    model_type: str = "causal_lm"
    model_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    ref_model_name: str | None = None
    ref_model_kwargs: dict[str, Any] | None = None
    reward_funcs: tuple[Any, ...] | None = None
    generation_config: Any = None
    num_gpus: int | None = None
    run_name: str | None = None
    tags: tuple[str, ...] = ()
    trl_run_name: str | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "trainer_type", schema.normalize_trainer_type(self.trainer_type))
        self._take_labels()
        if self.model_kwargs is None:
            object.__setattr__(self, "model_kwargs", {})
        if self.reward_funcs is not None and not isinstance(self.reward_funcs, tuple):
            object.__setattr__(self, "reward_funcs", tuple(self.reward_funcs))
        for f in dataclasses.fields(self):
            found = find_knob(getattr(self, f.name), f.name)
            if found:
                raise ConfigError(f"{found} is still a List/Range: a LeafConfig holds concrete values only")
        self._check_trainer_fields()

    def _take_labels(self) -> None:
        """Check ``run_name``/``tags``; TRL's ``training["run_name"]`` becomes ``run_name`` (one place for it)."""
        if self.training and "run_name" in self.training:
            training = dict(self.training)
            given = training.pop("run_name")
            object.__setattr__(self, "training", training)
            if given is not None and self.run_name is not None and given != self.run_name:
                raise ConfigError(
                    f"run_name is set twice ({self.run_name!r} on RFModelConfig, {given!r} in training_args); "
                    "keep one"
                )
            if self.run_name is None:
                object.__setattr__(self, "run_name", given)
            object.__setattr__(self, "trl_run_name", given)
        object.__setattr__(self, "run_name", check_run_name(self.run_name))
        object.__setattr__(self, "tags", check_tags(self.tags))

    def _check_trainer_fields(self) -> None:
        """Model-level fields only some trainer types use (the kind table's ``takes_reward_funcs``,
        ``has_reference_model``)."""
        kind = self.trainer_type
        facts = trainer_kind(kind)
        if facts.takes_reward_funcs and not self.reward_funcs:
            raise ConfigError(
                f"{kind} needs reward functions: set RFModelConfig(reward_funcs=[my_reward, ...]) "
                "(each reward_func(prompts, completions, **kwargs) -> list[float])"
            )
        if not facts.takes_reward_funcs and self.reward_funcs:
            raise ConfigError(
                f"reward_funcs is used only by {' and '.join(REWARD_FUNCS_TRAINERS)}, but trainer_type is "
                f"{kind!r}; remove it"
            )
        if not facts.has_reference_model and (self.ref_model_name is not None or self.ref_model_kwargs):
            raise ConfigError(
                f"ref_model_name/ref_model_kwargs are used only by {' and '.join(REF_MODEL_TRAINERS)}; "
                f"remove them for {kind}"
            )

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{f.name}={redact(getattr(self, f.name))!r}" for f in dataclasses.fields(self) if f.repr
        )
        return f"LeafConfig({fields})"

    # ------------------------------------------------------------------ views
    def _plain(self) -> dict[str, Any]:
        return {
            f.name: jsonable(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if f.repr and not (f.name == "num_gpus" and self.num_gpus is None)
        }

    def to_json(self) -> dict[str, Any]:
        """Every field as JSON data (functions as ``"module.qualname"``; secret-like values as ``"<redacted>"``).

        Returns:
            A dict with one key per field.
        """
        return redact(self._plain())  # type: ignore[no-any-return]

    def fingerprint(self) -> str:
        """A stable text identifying this configuration: canonical JSON of ``to_json()`` without the secrets.

        Two expansions of the same config group give equal fingerprints, in any process, as long as the
        functions keep their module and qualified name (a function's body is not part of it). Secret-like keys
        (``hub_token``, ``model_kwargs.token``, ...) are left out, key and value: the fingerprint is stored, a
        hash of a password would be open to guessing, and a rotated token trains the same config (a restart
        with a new token continues the experiment).

        The run's name and tags are left out too: they are labels (a renamed run trains the same config, and an
        experiment recorded before runs had names reopens with the same fingerprints).

        Returns:
            Compact JSON with sorted keys.
        """
        plain = {k: v for k, v in self._plain().items() if k not in _LABELS}
        return json.dumps(omit_secrets(plain), sort_keys=True, separators=(",", ":"))

    def legacy_fingerprint(self) -> str:
        """The fingerprint recorded before runs had names: TRL's ``training_args.run_name`` was then a training
        argument like any other (as written, template unfilled). Equal to :meth:`fingerprint` unless the name was
        given there; ``run_fit`` accepts an experiment recorded with either."""
        if self.trl_run_name is None:
            return self.fingerprint()
        plain = {k: v for k, v in self._plain().items() if k not in _LABELS}
        plain["training"] = {**plain["training"], "run_name": self.trl_run_name}
        return json.dumps(omit_secrets(plain), sort_keys=True, separators=(",", ":"))

    def hparams(self) -> dict[str, Any]:
        """Flat hyperparameters, in the one naming scheme used by the panel, the store and ``with_changes``.

        Keys: ``model_name``; trainer fields bare (``learning_rate``), only those the user set; LoRA fields
        ``lora.<field>``; ``model_kwargs.<key>``; and, when set, ``tokenizer``, ``tokenizer_kwargs.<key>``,
        ``formatting_func``, ``compute_metrics``, ``model_type``, ``ref_model_name``,
        ``ref_model_kwargs.<key>``, ``reward_funcs`` and ``generation_config.<key>``.

        Returns:
            ``{key: JSON value}``; functions appear as ``"module.qualname"``, secret-like values as
            ``"<redacted>"``.
        """
        out: dict[str, Any] = {"model_name": self.model_name}
        out.update({k: jsonable(v) for k, v in self.training.items()})
        for attr, prefix in (("lora", "lora."), ("model_kwargs", "model_kwargs.")):
            out.update({prefix + k: jsonable(v) for k, v in (getattr(self, attr) or {}).items()})
        for key in (
            "tokenizer",
            "formatting_func",
            "compute_metrics",
            "model_type",
            "ref_model_name",
            "reward_funcs",
            "num_gpus",
        ):
            value = getattr(self, key)
            if value is not None:
                out[key] = jsonable(value)
        for attr in ("tokenizer_kwargs", "ref_model_kwargs"):
            out.update({f"{attr}.{k}": jsonable(v) for k, v in (getattr(self, attr) or {}).items()})
        if isinstance(self.generation_config, Mapping):
            out.update({f"generation_config.{k}": jsonable(v) for k, v in self.generation_config.items()})
        elif self.generation_config is not None:
            out["generation_config"] = jsonable(self.generation_config)
        return redact(out)  # type: ignore[no-any-return]

    def model_config_dict(self) -> dict[str, Any]:
        """What ``create_model_fn(model_config)`` receives, as in ``rapidfireai``.

        Returns:
            A fresh dict with keys ``model_name``, ``model_kwargs`` (a copy), ``tokenizer``,
            ``tokenizer_kwargs``, ``model_type``, ``peft_config`` (the LoRA kwargs dict or ``None``),
            ``training_args`` (the trainer kwargs dict), ``ref_model_name``, ``ref_model_kwargs``,
            ``formatting_func``, ``compute_metrics``, ``reward_funcs`` (a list or ``None``) and
            ``generation_config``.
        """
        return {
            "model_name": self.model_name,
            "model_kwargs": deep_copy(self.model_kwargs),
            "tokenizer": self.tokenizer,
            "tokenizer_kwargs": deep_copy(self.tokenizer_kwargs),
            "model_type": self.model_type,
            "peft_config": deep_copy(self.lora),
            "training_args": deep_copy(self.training),
            "ref_model_name": self.ref_model_name,
            "ref_model_kwargs": deep_copy(self.ref_model_kwargs),
            "formatting_func": self.formatting_func,
            "compute_metrics": self.compute_metrics,
            "reward_funcs": list(self.reward_funcs) if self.reward_funcs is not None else None,
            "generation_config": deep_copy(self.generation_config),
        }

    # ------------------------------------------------------------------ checks and changes
    def validate(self) -> list[str]:
        """Build the real TRL config and ``peft.LoraConfig`` for this machine, to surface invalid values.

        Imports torch/trl/peft (through ``rapidfire_nb.spec.build``). Nothing is written to disk.

        Returns:
            The adaptation notes ``build_training_args`` gives (e.g. fp16 switched off on CPU).

        Raises:
            ConfigError: TRL or PEFT rejects a value (the message names the field and quotes the library), or
                ``fsdp`` / ``fsdp_config`` / ``num_gpus`` do not make a sharding plan
                (:func:`~rapidfire_nb.spec.fsdp.sharding_plan`, checked first).
        """
        if self.num_gpus is not None or any(f in self.training for f in FSDP_TRAINING_FIELDS):
            sharding_plan(self.training, self.num_gpus)  # ours first: transformers' advice is FSDP1's
        _, notes = build_training_args(
            self, output_dir=os.path.join(tempfile.gettempdir(), "rapidfire_nb-validate"), default_seed=0
        )
        build_lora_config(self)
        return notes

    def with_changes(self, changes: Mapping[str, Any], *, allow_functions: bool = False) -> LeafConfig:
        """A copy with some hyperparameters changed (clone-modify), checked by building the real configs.

        Args:
            changes: ``{key: concrete value}`` in the ``hparams()`` naming scheme: trainer fields bare
                (``learning_rate``; renamed old names are mapped with a ``FutureWarning``), ``lora.<field>``,
                ``model_kwargs.<key>``, ``ref_model_kwargs.<key>``, ``tokenizer_kwargs.<key>``,
                ``generation_config.<key>``, and ``model_name``, ``tokenizer``, ``model_type``,
                ``ref_model_name``, ``generation_config``, ``formatting_func``, ``compute_metrics``,
                ``reward_funcs``, ``num_gpus``. The labels ``run_name`` (a name or a template filled with the new run's values)
                and ``tags`` may be given too; without ``run_name`` the copy is named ``"<this run's name>
                (clone)"`` (unnamed when this run has no name), without ``tags`` it keeps this run's.
            allow_functions: Accept the function-valued keys (``formatting_func``, ``compute_metrics``,
                ``reward_funcs``); they cannot come from the panel or the REST API.

        Returns:
            A new ``LeafConfig``; ``self`` is unchanged.

        Raises:
            ConfigError: Unknown key (with the closest valid one), a secret-like key (``hub_token``,
                ``model_kwargs.token``, ...), a function-valued key without ``allow_functions``, a ``List``/``Range`` value, ``lora.*`` on a run without LoRA, or a value
                TRL/PEFT rejects (the message names the field and quotes the library).
        """
        if not isinstance(changes, Mapping):
            raise ConfigError(f"changes must be a dict of {{name: value}}, got {type(changes).__name__}")
        labels = {k: changes[k] for k in _LABELS if k in changes}
        changes = {k: v for k, v in changes.items() if k not in _LABELS}
        trainer_cls = schema.trainer_config_class(self.trainer_type)
        updates: dict[str, Any] = {}
        dicts: dict[str, dict[str, Any] | None] = {
            attr: (dict(getattr(self, attr)) if isinstance(getattr(self, attr), Mapping) else None)
            for attr in set(_DICT_PREFIXES.values())
        }
        dicts["training"] = dict(self.training)
        touched: set[str] = set()
        for key, value in changes.items():
            if not isinstance(key, str):
                raise ConfigError(f"change keys must be strings, got {key!r}")
            secret = first_secret_key(value, key)
            if secret:
                raise ConfigError(
                    f"{secret} is a secret: it is kept in memory only (stored and shown as {REDACTED}), so a clone "
                    "cannot change it (a restarted kernel could not rebuild that clone). Set it in the config "
                    "group instead"
                )
            found = find_knob(value, key)
            if found:
                raise ConfigError(f"{found}: with_changes takes concrete values, not List/Range knobs")
            if key in _MODEL_LEVEL_KEYS:
                if key in FUNCTION_KEYS and not allow_functions:
                    raise ConfigError(
                        f"{key} holds a function and cannot be changed from the panel or the REST API; "
                        "clone from code with allow_functions=True"
                    )
                updates[key] = check_model_field(key, value)
                continue
            prefix = next((p for p in _DICT_PREFIXES if key.startswith(p)), None)
            if prefix is not None:
                attr, sub = _DICT_PREFIXES[prefix], key[len(prefix) :]
                self._change_dict_entry(attr, sub, value, dicts)
                touched.add(attr)
                continue
            name, value = self._trainer_field(trainer_cls, key, value)
            problem = schema.check_value(trainer_cls, name, value)
            if problem:
                raise ConfigError(problem)
            dicts["training"][name] = value  # type: ignore[index]
            touched.add("training")
        for attr in touched:
            if attr in updates:
                raise ConfigError(f"`{attr}` and `{attr}.<key>` both given; change one or the other")
            updates[attr] = dicts[attr]
        new = self._labelled(dataclasses.replace(self, **updates), labels)
        new.validate()
        return new

    def _labelled(self, child: LeafConfig, labels: Mapping[str, Any]) -> LeafConfig:
        """``child`` (a clone of this run) with its name and tags: those given (a name template filled with the
        child's values), else ``"<this run's name> (clone)"`` and this run's tags."""
        tags = check_tags(labels["tags"]) if "tags" in labels else self.tags
        if "run_name" in labels:
            name = child.filled_name(check_run_name(labels["run_name"]))
        else:
            name = clone_name(self.run_name)
        return dataclasses.replace(child, run_name=name, tags=tags)

    def filled_name(self, name: str | None, where: str = "run_name") -> str | None:
        """``name`` with its template fields filled from this run (:func:`~rapidfire_nb.spec.names.fill_run_name`):
        its ``hparams()`` and ``trainer_type``, TRL's / PEFT's default for a trainer or ``lora.`` field it does not
        set (``{learning_rate}`` -> ``5e-05``).

        Raises:
            ConfigError: a field that is not a hyperparameter of this run, or a format spec that does not fit.
        """
        values = {"trainer_type": self.trainer_type, **self.hparams()}
        return fill_run_name(name, values, self._default_value, where)

    def _default_value(self, key: str) -> Any:
        """The library default of trainer field ``key`` or LoRA field ``lora.<field>``; KeyError for any other."""
        trainer_cls = schema.trainer_config_class(self.trainer_type)
        if key in schema.field_names(trainer_cls):
            return jsonable(schema.field_default(trainer_cls, key))
        lora_cls = schema.lora_config_class()
        if key.startswith("lora.") and self.lora is not None and key[5:] in schema.field_names(lora_cls):
            return jsonable(schema.field_default(lora_cls, key[5:]))
        raise KeyError(key)

    def _trainer_field(self, trainer_cls: type, key: str, value: Any) -> tuple[str, Any]:
        if key in schema.field_names(trainer_cls):
            return key, value
        rename = schema.find_rename(trainer_cls, key)
        if rename is not None:
            if rename.convert is not None:
                value = rename.convert(value)
            schema.warn_user(rename.message(value))
            return rename.new, value
        candidates = list(schema.field_names(trainer_cls)) + list(_MODEL_LEVEL_KEYS)
        if self.lora is not None:
            candidates += ["lora." + n for n in schema.field_names(schema.lora_config_class())]
        candidates += ["model_kwargs." + k for k in self.model_kwargs]
        hint = closest_name(key, candidates)
        raise ConfigError(
            f"unknown hyperparameter `{key}` for a {self.trainer_type} run"
            + (f"; did you mean `{hint}`?" if hint else "")
            + " (trainer fields are bare, e.g. learning_rate; LoRA fields lora.<field>; model kwargs model_kwargs.<key>)"
        )

    def _change_dict_entry(
        self, attr: str, sub: str, value: Any, dicts: dict[str, dict[str, Any] | None]
    ) -> None:
        if not sub:
            raise ConfigError(f"`{attr}.` needs a key after the dot, e.g. {attr}.name")
        if attr == "lora":
            lora = dicts["lora"]
            if lora is None:
                raise ConfigError(
                    f"lora.{sub}: this run trains without LoRA (peft_config=None); nothing to change"
                )
            lora_cls = schema.lora_config_class()
            if sub not in schema.field_names(lora_cls):
                hint = closest_name(sub, schema.field_names(lora_cls))
                raise ConfigError(
                    f"unknown LoRA field `lora.{sub}`" + (f"; did you mean `lora.{hint}`?" if hint else "")
                )
            problem = schema.check_value(lora_cls, sub, value)
            if problem:
                raise ConfigError(problem.replace(f"{lora_cls.__name__}.{sub}", f"lora.{sub}", 1))
            lora[sub] = value
            return
        if (
            attr == "generation_config"
            and self.generation_config is not None
            and not isinstance(self.generation_config, Mapping)
        ):
            raise ConfigError(
                "generation_config.<key>: this run's generation_config is not a dict; set generation_config"
            )
        if attr in ("model_kwargs", "ref_model_kwargs"):
            rename = schema.find_model_kwargs_rename(sub)
            if rename is not None:
                schema.warn_user(f"{attr}: " + rename.message(value))
                sub = rename.new
        data = dicts[attr]
        if data is None:
            data = {}
        data[sub] = value
        dicts[attr] = data
