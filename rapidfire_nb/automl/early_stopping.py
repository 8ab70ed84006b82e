"""Early stopping for ``run_fit(..., early_stopping=...)``: the kernel_scheduler policies, with bad arguments
reported as :class:`~rapidfire_nb.errors.ConfigError` (before anything trains).

The policies themselves (rungs, ranking, reasons) live in :mod:`kernel_scheduler.early_stopping` and run on the
scheduler thread at chunk boundaries; see there for the rules.
"""

from __future__ import annotations

import copy as copy_module
from typing import Any

from kernel_scheduler import EarlyStoppingPolicy
from kernel_scheduler import MedianStopping as _MedianStopping
from kernel_scheduler import SuccessiveHalving as _SuccessiveHalving

from ..errors import ConfigError

__all__ = ["EarlyStoppingPolicy", "MedianStopping", "SuccessiveHalving", "check_early_stopping"]


class SuccessiveHalving(_SuccessiveHalving):
    """Successive halving on chunk rungs: rungs at ``grace_chunks · reduction_factor^k`` chunks; at each rung
    only the best ``1/reduction_factor`` of the runs recorded there go on (ties with the cutoff all go on; a NaN
    value is the worst). A run reaching a rung after it was decided (a clone, a resumed run) is judged on arrival
    against the values recorded there. The rungs survive a restart of the kernel: what the policy recorded and
    decided is kept in the experiment's store and handed back to the same policy by the next ``run_fit``, so a
    kill at any point of a decision gives the decisions of a kernel never killed.

    Args:
        metric: a metric every run logs at its chunk ends (``eval_loss``, DPO ``eval_rewards/margins``, a
            ``compute_metrics`` value as ``eval_<name>``, ...).
        mode: ``"min"`` (lower is better) or ``"max"``.
        reduction_factor: ``η``, an integer >= 2.
        grace_chunks: chunks every run trains before the first rung, an integer >= 1.

    Raises:
        ConfigError: a bad argument (named in the message).
    """

    def __init__(
        self, metric: str = "eval_loss", mode: str = "min", reduction_factor: int = 2, grace_chunks: int = 1
    ) -> None:
        try:
            super().__init__(metric, mode, reduction_factor, grace_chunks)
        except ValueError as exc:
            raise ConfigError(f"SuccessiveHalving: {exc}") from None


class MedianStopping(_MedianStopping):
    """Median stopping: from chunk ``grace_chunks`` on, a run worse than the median of the other runs' values at
    the same chunk stops (compared only where at least ``min_runs`` runs have a value; NaN is the worst). What it
    recorded and decided survives a restart of the kernel, as for :class:`SuccessiveHalving`.

    Args:
        metric: a metric every run logs at its chunk ends (e.g. ``eval_loss``).
        mode: ``"min"`` (lower is better) or ``"max"``.
        grace_chunks: chunks every run trains before it can be stopped (warm-up), an integer >= 1.
        min_runs: runs with a value at a chunk needed to compare there, an integer >= 2.

    Raises:
        ConfigError: a bad argument (named in the message).
    """

    def __init__(
        self, metric: str = "eval_loss", mode: str = "min", grace_chunks: int = 1, min_runs: int = 3
    ) -> None:
        try:
            super().__init__(metric, mode, grace_chunks, min_runs)
        except ValueError as exc:
            raise ConfigError(f"MedianStopping: {exc}") from None


def check_early_stopping(policy: Any, eval_dataset: Any, copy: bool = True) -> EarlyStoppingPolicy | None:
    """``run_fit``'s ``early_stopping`` argument, checked before anything is built.

    Args:
        policy: the argument.
        eval_dataset: run_fit's eval dataset (an eval metric needs one).
        copy: return a fresh copy (a policy keeps the values it recorded: one object may serve several
            ``run_fit`` calls); False for a search that is its own policy (RFOptuna keeps its study).

    Returns:
        The policy to use, or None.

    Raises:
        ConfigError: not a policy, or it compares an eval metric and there is no ``eval_dataset``.
    """
    if policy is None:
        return None
    if not isinstance(policy, EarlyStoppingPolicy):
        raise ConfigError(
            f"early_stopping must be a policy such as SuccessiveHalving(metric='eval_loss', mode='min') or "
            f"MedianStopping(...) from rapidfire_nb.automl, got {type(policy).__name__}"
        )
    metric = getattr(policy, "metric", None)
    if eval_dataset is None and isinstance(metric, str) and metric.startswith("eval_"):
        raise ConfigError(
            f"early_stopping compares {metric!r}, an evaluation metric, but run_fit has no eval_dataset: pass "
            "eval_dataset=... (every run is evaluated at the end of each chunk), or compare a training metric "
            "such as metric='loss'"
        )
    return copy_module.deepcopy(policy) if copy else policy
