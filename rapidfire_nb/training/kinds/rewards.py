"""GRPO's reward functions: checked against TRL's keyword call before training, wrapped to name themselves.

Reward functions are checked before training against TRL's keyword call (``prompts=, completions=,
completion_ids=, trainer_state=, log_extra=, log_metric=`` and the dataset's extra columns) with
``inspect.signature(...).bind``; at run time each is wrapped so an exception names the function (the run
fails, the others go on). The wrapper keeps the function's ``__name__``, so TRL's metric names
(``rewards/<name>/mean``) are unchanged. No torch import at module level.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from rapidfire_nb.errors import ConfigError

__all__ = [
    "REWARD_CALL_KEYWORDS",
    "RewardFunctionError",
    "check_reward_funcs",
    "reward_call_names",
    "wrap_reward_funcs",
]

#: keyword arguments GRPOTrainer passes to every reward function besides the dataset's extra columns
REWARD_CALL_KEYWORDS = (
    "prompts",
    "completions",
    "completion_ids",
    "trainer_state",
    "log_extra",
    "log_metric",
)
#: dataset columns GRPOTrainer does not forward to reward functions
_NOT_FORWARDED = ("prompt", "completion", "completion_ids")


class RewardFunctionError(RuntimeError):
    """A GRPO reward function raised during training (the message names it); fails only its run."""


def reward_call_names(columns: list[str] | tuple[str, ...], remove_unused_columns: bool = False) -> list[str]:
    """The keyword names of TRL's reward call for a dataset with ``columns``.

    Args:
        columns: The dataset's columns after ``formatting_func``.
        remove_unused_columns: The run's ``remove_unused_columns`` (TRL then forwards no extra column).

    Returns:
        ``REWARD_CALL_KEYWORDS`` followed by the forwarded extra columns.
    """
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


def check_reward_funcs(
    reward_funcs: Any, columns: list[str] | tuple[str, ...], remove_unused_columns: bool = False
) -> None:
    """Every reward function must accept TRL's keyword call (checked with ``inspect.signature().bind``).

    Reward model ids (strings) and ``nn.Module`` reward models are called differently by TRL; not checked.

    Args:
        reward_funcs: The run's reward functions (``LeafConfig.reward_funcs``).
        columns: The dataset's columns after ``formatting_func``.
        remove_unused_columns: The run's ``remove_unused_columns``.

    Raises:
        ConfigError: no reward functions, or one whose signature cannot bind the call (the message names the
            function, the call and Python's reason).
    """
    if not reward_funcs:
        raise ConfigError(
            "GRPO needs reward functions: set RFModelConfig(reward_funcs=[my_reward, ...]) "
            "(each reward_func(prompts, completions, **kwargs) -> list[float])"
        )
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

    Args:
        reward_funcs: The run's reward functions, or ``None``.

    Returns:
        One entry per reward function, in order (imports trl).
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
