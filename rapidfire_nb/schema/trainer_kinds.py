"""What each supported TRL trainer kind is, in one table (torch-free: names and flags, no class imported).

Every layer above reads a kind's facts here: the schema (its TRL config class, :func:`rapidfire_nb.schema.
trainer_config_class`), the run spec (which model-level fields a kind takes: ``reward_funcs``,
``ref_model_name``/``ref_model_kwargs``), the generation-metric checks (``compute_metrics`` reaches the TRL
trainer only where it takes one) and the training kinds (``rapidfire_nb.training.kinds``: how a kind trains).

Adding a trainer kind (e.g. ORPO) starts with one line in ``TRAINER_KINDS`` below; the training adapter
(``rapidfire_nb/training/kinds/``) and the user's wrapper (``rapidfire_nb/automl/configs.py``) follow
(``tests/rapidfire_nb/schema/test_trainer_kinds.py`` checks the table against the installed TRL).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from rapidfire_nb.errors import ConfigError

__all__ = [
    "TRAINER_KINDS",
    "TRAINER_TYPES",
    "KindMetrics",
    "TrainerKindFacts",
    "check_metric_choice",
    "check_metric_name",
    "is_trainer_metric",
    "metric_mode",
    "trainer_kind",
]

#: What :class:`transformers.Trainer` itself logs for every kind (``eval_`` + these at evaluation).
TRAINER_METRICS = ("loss", "grad_norm", "learning_rate", "epoch", "runtime", "samples_per_second")


@dataclass(frozen=True)
class KindMetrics:
    """The metrics a kind's runs are shown and compared by: the panel's two default plots and best-run star, its
    table's metric columns, ``end()``'s summary, ``get_runs_info()`` and the static copy (``run_fit(...,
    panel_metrics=[...], best_by=...)`` overrides ``plots`` / ``best_by``).

    Names are TRL's logged names (read in the installed TRL's trainers: ``GRPOTrainer`` logs ``reward``,
    ``reward_std``, ``rewards/<func>/mean``..., ``DPOTrainer`` ``rewards/accuracies``, ``rewards/margins``...;
    ``eval_`` + the name at evaluation).

    Attributes:
        plots: per default plot, the names it shows, the first one logged (before anything is logged: the first).
        columns: the run table's metric columns, in order; one whose value is zero or absent for every run is not
            shown (GRPO's loss is 0 until the policy moves off the reference).
        best_by: the metrics runs are ranked by, the first with a value for some run ranks (a metric's direction:
            :func:`metric_mode`; losses lowest first, rewards and accuracies highest first).
        logged: the names the kind's TRL trainer logs besides :data:`TRAINER_METRICS` (``run_fit``'s choice is
            checked against them, :func:`check_metric_choice`).
    """

    plots: tuple[tuple[str, ...], tuple[str, ...]] = (("loss",), ("eval_loss",))
    columns: tuple[str, ...] = ("loss", "eval_loss")
    best_by: tuple[str, ...] = ("eval_loss", "loss")
    logged: tuple[str, ...] = ("entropy", "mean_token_accuracy", "num_tokens", "aux_loss")


_SFT_METRICS = KindMetrics()
_DPO_METRICS = KindMetrics(
    plots=(("loss",), ("eval_rewards/accuracies", "rewards/accuracies", "rewards/margins")),
    columns=("loss", "eval_loss", "rewards/accuracies", "eval_rewards/accuracies", "rewards/margins"),
    best_by=("eval_rewards/accuracies", "eval_rewards/margins", "rewards/accuracies", "rewards/margins"),
    logged=(
        "rewards/chosen",
        "rewards/rejected",
        "rewards/accuracies",
        "rewards/margins",
        "logps/chosen",
        "logps/rejected",
        "logits/chosen",
        "logits/rejected",
        "entropy",
        "mean_token_accuracy",
        "num_tokens",
        "aux_loss",
    ),
)
_GRPO_METRICS = KindMetrics(
    plots=(("reward",), ("eval_reward", "reward_std")),
    columns=("reward", "eval_reward", "loss", "eval_loss"),
    best_by=("eval_reward", "reward"),
    logged=(
        "reward",
        "reward_std",
        "frac_reward_zero_std",
        "kl",
        "entropy",
        "num_tokens",
        "policy_loss",
        "aux_loss",
        "completions/mean_length",
        "completions/min_length",
        "completions/max_length",
        "completions/clipped_ratio",
        "completions/mean_terminated_length",
        "completions/min_terminated_length",
        "completions/max_terminated_length",
        "clip_ratio/low_mean",
        "clip_ratio/low_min",
        "clip_ratio/high_mean",
        "clip_ratio/high_max",
        "clip_ratio/region_mean",
    ),
)


@dataclass(frozen=True)
class TrainerKindFacts:
    """One TRL trainer kind.

    Attributes:
        name: the trainer type as ``LeafConfig.trainer_type`` spells it (``"SFT"``).
        config_class_name: its TRL config class's name in ``trl`` (``"SFTConfig"``).
        trainer_class_name: its TRL trainer class's name in ``trl`` (``"SFTTrainer"``).
        takes_reward_funcs: the trainer takes ``reward_funcs`` (and needs at least one): a run spec of this
            kind must set them, one of any other kind must not.
        has_reference_model: the kind trains against a reference model (DPO's implicit reward; GRPO's KL term
            when ``beta > 0``): the run spec accepts ``ref_model_name``/``ref_model_kwargs`` (the GRPO kind then
            refuses them before training, naming why: its TRL trainer builds the reference model itself).
        takes_compute_metrics: the TRL trainer takes ``compute_metrics`` (GRPO's does not: it logs its rewards).
        metrics: what its runs are shown and compared by (:class:`KindMetrics`).
    """

    name: str
    config_class_name: str
    trainer_class_name: str
    takes_reward_funcs: bool = False
    has_reference_model: bool = False
    takes_compute_metrics: bool = True
    metrics: KindMetrics = _SFT_METRICS


_KINDS: tuple[TrainerKindFacts, ...] = (
    TrainerKindFacts("SFT", "SFTConfig", "SFTTrainer"),
    TrainerKindFacts("DPO", "DPOConfig", "DPOTrainer", has_reference_model=True, metrics=_DPO_METRICS),
    TrainerKindFacts(
        "GRPO",
        "GRPOConfig",
        "GRPOTrainer",
        takes_reward_funcs=True,
        has_reference_model=True,
        takes_compute_metrics=False,
        metrics=_GRPO_METRICS,
    ),
)

TRAINER_KINDS: Mapping[str, TrainerKindFacts] = {kind.name: kind for kind in _KINDS}
"""The supported trainer kinds by name, in the order messages list them (``"SFT"``, ``"DPO"``, ``"GRPO"``)."""

TRAINER_TYPES: tuple[str, ...] = tuple(TRAINER_KINDS)
"""The supported trainer types: ``("SFT", "DPO", "GRPO")``."""


def trainer_kind(trainer_type: object) -> TrainerKindFacts:
    """The facts of one trainer type.

    Args:
        trainer_type: ``"SFT"``, ``"DPO"`` or ``"GRPO"``, any case, surrounding spaces ignored.

    Returns:
        Its :class:`TrainerKindFacts`.

    Raises:
        ConfigError: anything else (the message lists the supported types).
    """
    if isinstance(trainer_type, str) and trainer_type.strip().upper() in TRAINER_KINDS:
        return TRAINER_KINDS[trainer_type.strip().upper()]
    names = ", ".join(repr(t) for t in TRAINER_TYPES)
    raise ConfigError(f"trainer_type must be one of {names}, got {trainer_type!r}")


_HIGHER = re.compile(r"acc|reward|margin|f1|bleu|rouge|precision|recall|score|auc|win")


def metric_mode(name: str) -> str:
    """``"max"`` for a metric that is better higher (rewards, accuracies, margins, scores), ``"min"`` otherwise
    (losses, perplexities, errors, anything unknown). ``metricDirection`` in ``widgets/curves.js`` is the same
    rule."""
    low = name.lower()
    if "loss" in low or "perplexity" in low or "error" in low:
        return "min"
    return "max" if _HIGHER.search(low) else "min"


def _known_metric(facts: TrainerKindFacts, name: str, user_metrics: bool) -> bool:
    """A name the kind's TRL trainer logs (``eval_`` + one too; GRPO's ``rewards/<func>/mean|std``), or, when some
    run of the group has a ``compute_metrics`` (``user_metrics``; the kind takes one), any ``eval_<name>``: the
    user's metrics are named by the user."""
    base = name[len("eval_") :] if name.startswith("eval_") else name
    if base in TRAINER_METRICS or base in facts.metrics.logged:
        return True
    if facts.takes_reward_funcs and re.fullmatch(r"rewards/[^/]+/(mean|std)", base):
        return True
    return (
        name.startswith("eval_") and len(name) > len("eval_") and facts.takes_compute_metrics and user_metrics
    )


def is_trainer_metric(trainer_type: object, name: str) -> bool:
    """True when ``name`` is a metric the kind's TRL trainer logs itself (``eval_loss``, GRPO's ``eval_reward``),
    False for one only a ``compute_metrics`` can log (``eval_rougeL``): a generated metric.

    Raises:
        ConfigError: an unknown trainer type.
    """
    return _known_metric(trainer_kind(trainer_type), name, user_metrics=False)


def check_metric_name(trainer_type: object, name: object, field: str, user_metrics: bool = True) -> None:
    """Refuse a metric name runs of ``trainer_type`` never log (see :func:`check_metric_choice`).

    Args:
        trainer_type: the group's trainer type.
        name: the metric name given (``panel_metrics``' entries, ``best_by``, an early-stopping policy's metric).
        field: what the user set, for the message.
        user_metrics: some run of the group has a ``compute_metrics``, so any ``eval_<name>`` may be one of its.

    Raises:
        ConfigError: not a string, or a name the kind never logs, naming ``field`` and examples.
    """
    facts = trainer_kind(trainer_type)
    if isinstance(name, str) and _known_metric(facts, name, user_metrics):
        return
    sample = ", ".join(repr(n) for n in dict.fromkeys((*facts.metrics.columns, *facts.metrics.logged[:4])))
    raise ConfigError(
        f"{field}: {name!r} is not a metric a {facts.name} run logs; e.g. {sample} (eval_ + a name at evaluation"
        + (", or one your compute_metrics returns)" if facts.takes_compute_metrics else ")")
    )


def check_metric_choice(
    trainer_type: object, panel_metrics: object, best_by: object, user_metrics: bool = True
) -> tuple[tuple[str, ...] | None, str | None]:
    """``run_fit``'s ``panel_metrics`` / ``best_by``, checked against what the kind's TRL trainer logs.

    Args:
        trainer_type: the group's trainer type.
        panel_metrics: None (the kind's defaults) or 1-2 metric names for the panel's default plots.
        best_by: None (the kind's default) or the metric runs are ranked by (direction: :func:`metric_mode`).
        user_metrics: some run of the group has a ``compute_metrics``, so any ``eval_<name>`` may be one of its.

    Returns:
        ``(plots, best_by)``: the plots as a tuple (None kept), ``best_by`` as given.

    Raises:
        ConfigError: a value of the wrong type or a name the kind never logs, naming the field and the choices.
    """
    trainer_kind(trainer_type)  # an unknown kind: its ConfigError first
    if panel_metrics is not None:
        if isinstance(panel_metrics, str) or not isinstance(panel_metrics, (list, tuple)):
            raise ConfigError(
                f"panel_metrics must be a list of 1 or 2 metric names (e.g. ['reward', 'eval_reward']), got "
                f"{panel_metrics!r}"
            )
        if not 1 <= len(panel_metrics) <= 2:
            raise ConfigError(
                f"panel_metrics takes 1 or 2 metric names (two plots), got {len(panel_metrics)}"
            )
    for field, names in (
        ("panel_metrics", panel_metrics or ()),
        ("best_by", () if best_by is None else (best_by,)),
    ):
        for name in names:
            check_metric_name(trainer_type, name, field, user_metrics)
    return (tuple(panel_metrics) if panel_metrics is not None else None), best_by  # type: ignore[return-value]
