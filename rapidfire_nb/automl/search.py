"""RFGridSearch and RFRandomSearch: a config group and its expansion into runs (``LeafConfig``)."""

from __future__ import annotations

import dataclasses
import itertools
import numbers
import random
from collections.abc import Mapping
from typing import Any

from rapidfire_nb import schema
from rapidfire_nb.errors import ConfigError
from rapidfire_nb.spec import LeafConfig, deep_copy
from rapidfire_nb.spec.names import unique_names

from .configs import MODEL_FIELDS, TRAINER_CONFIG_CLASSES, RFLoraConfig, RFModelConfig, RFWrappedConfig
from .knobs import List, Range

__all__ = ["RFGridSearch", "RFRandomSearch", "make_leaf", "named_uniquely"]


def named_uniquely(leaves: list[LeafConfig]) -> list[LeafConfig]:
    """``leaves`` with unique names: runs sharing a name get the hyperparameters they differ in appended
    (:func:`rapidfire_nb.spec.names.unique_names`); unnamed runs unchanged."""
    names = unique_names([leaf.run_name for leaf in leaves], [leaf.hparams() for leaf in leaves])
    return [
        leaf if name == leaf.run_name else dataclasses.replace(leaf, run_name=name)
        for leaf, name in zip(leaves, names, strict=True)
    ]


def _normalize_configs(configs: Any) -> list[RFModelConfig]:
    if isinstance(configs, RFModelConfig):
        items: list[Any] = [configs]
    elif isinstance(configs, (List, list, tuple)):
        items = list(configs)
    else:
        raise ConfigError(
            "configs must be an RFModelConfig, a List of them or a list of them, "
            f"got {type(configs).__name__}"
        )
    if not items:
        raise ConfigError("configs is empty; give at least one RFModelConfig")
    for i, item in enumerate(items):
        if not isinstance(item, RFModelConfig):
            raise ConfigError(f"configs[{i}] must be an RFModelConfig, got {type(item).__name__}")
    return items


def _walk(value: Any, path: str) -> Any:
    """Yield ``(path, value)`` for every value inside knobs, wrappers, dicts, lists and tuples."""
    yield path, value
    if isinstance(value, List):
        for i, item in enumerate(value.values):
            yield from _walk(item, f"{path}[alternative {i}]")
    elif isinstance(value, RFWrappedConfig):
        for key, item in value.kwargs.items():
            yield from _walk(item, f"{path}.{key}")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _walk(item, f"{path}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _walk(item, f"{path}[{i}]")


def _has_knob(value: Any) -> bool:
    return any(isinstance(item, (List, Range)) for _, item in _walk(value, ""))


def _check_group(configs: list[RFModelConfig], trainer_type: str, allow_range: bool) -> None:
    expected = TRAINER_CONFIG_CLASSES[trainer_type]
    for i, config in enumerate(configs):
        for name in MODEL_FIELDS:
            for path, value in _walk(getattr(config, name), f"configs[{i}].{name}"):
                if isinstance(value, Range) and not allow_range:
                    raise ConfigError(
                        f"{path} is {value!r}: RFGridSearch enumerates List knobs only; "
                        "use RFRandomSearch(configs, trainer_type, num_runs=N) to sample ranges, "
                        "or List([...]) of the values to try"
                    )
                if (
                    name == "training_args"
                    and isinstance(value, RFWrappedConfig)
                    and type(value) in TRAINER_CONFIG_CLASSES.values()
                    and not isinstance(value, expected)
                ):
                    raise ConfigError(
                        f"{path} is {type(value).__name__} but trainer_type is {trainer_type!r}: "
                        f"use {expected.__name__}"
                    )


def _grid(value: Any, path: str) -> list[Any]:
    """All concrete values ``value`` stands for, in order (Cartesian product of the Lists inside)."""
    if isinstance(value, List):
        out: list[Any] = []
        for item in value.values:
            out.extend(_grid(item, path))
        return out
    if isinstance(value, Range):
        raise ConfigError(f"{path} is {value!r}: RFGridSearch enumerates List knobs only; use RFRandomSearch")
    if isinstance(value, RFWrappedConfig):
        return [type(value)._from_recorded(kw) for kw in _grid_dict(value.kwargs, path)]
    if not _has_knob(value):
        return [value]
    if isinstance(value, Mapping):
        return _grid_dict(value, path)
    if isinstance(value, (list, tuple)):
        options = [_grid(item, f"{path}[{i}]") for i, item in enumerate(value)]
        return [type(value)(combo) for combo in itertools.product(*options)]
    return [value]


def _grid_dict(data: Mapping[str, Any], path: str) -> list[dict[str, Any]]:
    keys = list(data)
    options = [_grid(data[key], f"{path}.{key}") for key in keys]
    return [dict(zip(keys, combo)) for combo in itertools.product(*options)]


def _sample(value: Any, rng: random.Random) -> Any:
    """One concrete draw of ``value``: ``List`` -> uniform choice, ``Range`` -> ``Range.sample``."""
    if isinstance(value, List):
        return _sample(value.sample(rng), rng)
    if isinstance(value, Range):
        return value.sample(rng)
    if isinstance(value, RFWrappedConfig):
        return type(value)._from_recorded({k: _sample(v, rng) for k, v in value.kwargs.items()})
    if not _has_knob(value):
        return value
    if isinstance(value, Mapping):
        return {k: _sample(v, rng) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_sample(item, rng) for item in value)
    return value


def _check_seed(seed: Any) -> int:
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        raise ConfigError(f"seed must be an int, got {seed!r}")
    return int(seed)


class _Search:
    def __init__(self, configs: Any, trainer_type: str) -> None:
        self.trainer_type: str = schema.normalize_trainer_type(trainer_type)
        self.configs: list[RFModelConfig] = _normalize_configs(configs)
        _check_group(self.configs, self.trainer_type, allow_range=not isinstance(self, RFGridSearch))

    def expand(self, seed: int = 42) -> list[LeafConfig]:  # pragma: no cover - overridden
        raise NotImplementedError


class RFGridSearch(_Search):
    """Every combination of the ``List`` knobs in a config group.

    Args:
        configs: An ``RFModelConfig``, a ``List`` of them, or a plain list of them.
        trainer_type: ``"SFT"``, ``"DPO"`` or ``"GRPO"`` (any case).

    Raises:
        ConfigError: Unknown trainer type, an empty group, a ``Range`` anywhere (grid search cannot
            enumerate it: use ``RFRandomSearch``), or ``training_args`` of another trainer type
            (e.g. ``RFDPOConfig`` with ``"SFT"``).

    Example:
        Two ``RFModelConfig`` (learning rates 1e-3 and 1e-4) sharing ``peft_config=List([lora_r8,
        lora_r32])`` expand to 4 runs: (1e-3, r8), (1e-3, r32), (1e-4, r8), (1e-4, r32).
    """

    def expand(self, seed: int = 42) -> list[LeafConfig]:
        """Expand into runs: outer configs first, then fields in declaration order, last field fastest.

        Within a wrapper config the arguments vary in the order they were written; within a ``List``,
        alternatives in order.

        Args:
            seed: Accepted for a uniform interface with ``RFRandomSearch``; a grid involves no chance.

        Returns:
            One ``LeafConfig`` per combination; names made unique (:func:`named_uniquely`).

        Raises:
            ConfigError: As for the constructor (the group may have been changed since), or a run that
                does not meet its trainer's needs (GRPO without ``reward_funcs``).
        """
        _check_seed(seed)
        _check_group(self.configs, self.trainer_type, allow_range=False)
        leaves: list[LeafConfig] = []
        for i, config in enumerate(self.configs):
            where = f"configs[{i}]"
            options = [_grid(getattr(config, name), f"{where}.{name}") for name in MODEL_FIELDS]
            for combo in itertools.product(*options):
                leaves.append(make_leaf(self.trainer_type, dict(zip(MODEL_FIELDS, combo)), where))
        return named_uniquely(leaves)

    def __repr__(self) -> str:
        return (
            f"RFGridSearch(configs=<{len(self.configs)} RFModelConfig>, trainer_type={self.trainer_type!r})"
        )


class RFRandomSearch(_Search):
    """``num_runs`` distinct random draws from a config group (``List`` -> choice, ``Range`` -> sample).

    Args:
        configs: An ``RFModelConfig``, a ``List`` of them, or a plain list of them.
        trainer_type: ``"SFT"``, ``"DPO"`` or ``"GRPO"`` (any case).
        num_runs: How many runs to draw (a positive int).
        num_samples: Same as ``num_runs`` (the name TRL's RapidFire AI page uses); give exactly one.
        seed: Fixes the draws regardless of the seed ``expand`` receives (``rapidfireai`` compatibility);
            ``None`` uses the seed passed to ``expand`` (the experiment's seed).

    Raises:
        ConfigError: Neither or both of ``num_runs``/``num_samples``, not a positive int, unknown trainer
            type, an empty group, or ``training_args`` of another trainer type.
    """

    def __init__(
        self,
        configs: Any,
        trainer_type: str,
        num_runs: int | None = None,
        num_samples: int | None = None,
        seed: int | None = None,
    ) -> None:
        if (num_runs is None) == (num_samples is None):
            raise ConfigError(
                "RFRandomSearch needs exactly one of num_runs or num_samples (the number of runs to draw), "
                f"got num_runs={num_runs!r}, num_samples={num_samples!r}"
            )
        count = num_runs if num_runs is not None else num_samples
        name = "num_runs" if num_runs is not None else "num_samples"
        if not isinstance(count, numbers.Integral) or isinstance(count, bool) or count <= 0:
            raise ConfigError(f"{name} must be a positive int, got {count!r}")
        super().__init__(configs, trainer_type)
        self.num_runs: int = int(count)
        self.seed: int | None = None if seed is None else _check_seed(seed)

    @property
    def num_samples(self) -> int:
        """Alias of ``num_runs``."""
        return self.num_runs

    def expand(self, seed: int = 42) -> list[LeafConfig]:
        """Draw ``num_runs`` distinct runs with ``random.Random(seed)``.

        Each draw picks a config uniformly, then resolves its fields in declaration order (inside wrapper
        configs, in the order the arguments were written). The same seed gives the same runs; a draw equal
        to an earlier one (same ``fingerprint``) is drawn again.

        Args:
            seed: Seed of the draws (ignored when the constructor got ``seed``).

        Returns:
            ``num_runs`` ``LeafConfig`` objects; names made unique (:func:`named_uniquely`).

        Raises:
            ConfigError: The space holds fewer than ``num_runs`` distinct configurations (checked by
                drawing), or a run that does not meet its trainer's needs.
        """
        seed = _check_seed(seed)
        _check_group(self.configs, self.trainer_type, allow_range=True)
        rng = random.Random(self.seed if self.seed is not None else seed)
        leaves: list[LeafConfig] = []
        seen: set[str] = set()
        attempts, max_attempts = 0, max(100, 20 * self.num_runs)
        while len(leaves) < self.num_runs and attempts < max_attempts:
            attempts += 1
            index = rng.randrange(len(self.configs))
            config = self.configs[index]
            resolved = {name: _sample(getattr(config, name), rng) for name in MODEL_FIELDS}
            leaf = make_leaf(self.trainer_type, resolved, f"configs[{index}]")
            key = leaf.fingerprint()
            if key not in seen:
                seen.add(key)
                leaves.append(leaf)
        if len(leaves) < self.num_runs:
            raise ConfigError(
                f"num_runs={self.num_runs}: only {len(leaves)} distinct configurations came out of "
                f"{attempts} draws; lower num_runs, widen the search space, or use RFGridSearch to run every "
                "combination"
            )
        return named_uniquely(leaves)

    def __repr__(self) -> str:
        return (
            f"RFRandomSearch(configs=<{len(self.configs)} RFModelConfig>, trainer_type={self.trainer_type!r}, "
            f"num_runs={self.num_runs})"
        )


def make_leaf(trainer_type: str, resolved: Mapping[str, Any], where: str = "config") -> LeafConfig:
    """Turn one knob-free assignment of ``RFModelConfig`` fields into a ``LeafConfig``.

    Args:
        trainer_type: ``"SFT"``, ``"DPO"`` or ``"GRPO"`` (already normalised).
        resolved: ``{field: value}`` for every ``RFModelConfig`` field, knobs already chosen;
            ``peft_config``/``training_args`` are wrapper instances or ``None``.
        where: Where the config sits in the user's group (for messages), e.g. ``"configs[1]"``.

    Returns:
        The leaf (values deep-copied, so leaves share no mutable state), its ``run_name`` template filled
        (``RFModelConfig.run_name`` or TRL's ``training_args.run_name``).

    Raises:
        ConfigError: ``training_args`` of the wrong trainer type, a trainer requirement not met, ``run_name`` set
            both on the model config and in ``training_args``, or a template field the run does not have.
    """
    training_args = resolved.get("training_args")
    expected = TRAINER_CONFIG_CLASSES[trainer_type]
    if training_args is not None and not isinstance(training_args, expected):
        raise ConfigError(
            f"{where}.training_args is {type(training_args).__name__} but trainer_type is {trainer_type!r}: "
            f"use {expected.__name__}"
        )
    peft_config = resolved.get("peft_config")
    if peft_config is not None and not isinstance(peft_config, RFLoraConfig):
        raise ConfigError(
            f"{where}.peft_config must be an RFLoraConfig or None, got {type(peft_config).__name__}"
        )
    try:
        leaf = LeafConfig(
            trainer_type=trainer_type,
            model_name=resolved["model_name"],
            tokenizer=resolved.get("tokenizer"),
            tokenizer_kwargs=deep_copy(resolved.get("tokenizer_kwargs")),
            formatting_func=resolved.get("formatting_func"),
            compute_metrics=resolved.get("compute_metrics"),
            lora=deep_copy(peft_config.kwargs) if peft_config is not None else None,
            training=deep_copy(training_args.kwargs) if training_args is not None else {},
            model_type=resolved.get("model_type") or "causal_lm",
            model_kwargs=deep_copy(resolved.get("model_kwargs")) or {},
            ref_model_name=resolved.get("ref_model_name"),
            ref_model_kwargs=deep_copy(resolved.get("ref_model_kwargs")),
            reward_funcs=resolved.get("reward_funcs"),
            generation_config=deep_copy(resolved.get("generation_config")),
            num_gpus=resolved.get("num_gpus"),
            run_name=resolved.get("run_name"),
            tags=tuple(resolved.get("tags") or ()),
        )
        named = leaf.filled_name(leaf.run_name)  # a template filled with this run's values
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return leaf if named == leaf.run_name else dataclasses.replace(leaf, run_name=named)
