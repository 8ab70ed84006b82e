"""Generation-based evaluation, the pure part: settings, eval examples, the sample, the metric check.

A run whose ``RFModelConfig`` sets both ``compute_metrics`` and ``generation_config`` is judged by what it
generates, as in ``rapidfireai`` (its ``GenerationMetricsCallback``): at each evaluation the run generates a
completion for every eval example (or a fixed, seeded sample of them) and ``compute_metrics((predictions,
references))`` receives the decoded strings and returns ``{name: float}``, logged as ``eval_<name>``. With only
``compute_metrics`` it goes to the TRL trainer, as in rapidfireai. The generation itself (torch) is in
:mod:`~rapidfire_nb.training.generation_eval`.

Defaults are rapidfireai's: ``max_new_tokens=128, do_sample=True, temperature=0.7, top_p=0.9`` with the
tokenizer's pad/eos ids, batches of ``per_device_eval_batch_size``, left padding, prompts truncated on the left to
``max_input_length`` (default: the tokenizer's ``model_max_length`` minus ``max_new_tokens``, 4096 when unset, at
least 64), ``add_generation_prompt=True``. The three control keys ``max_input_length``, ``add_generation_prompt``
and ``truncation_side`` may sit in ``generation_config``; they are not passed to ``generate``. Where rapidfireai
uses its defaults only when no ``generation_config`` is given, here each missing key gets its default (a dict
that sets ``do_sample=False`` gets no sampling defaults).

Imports only the standard library and ``rapidfire_nb.errors`` at module level (``transformers`` inside
:func:`check_generation_config`).
"""

from __future__ import annotations

import numbers
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rapidfire_nb.errors import ConfigError, closest_name
from rapidfire_nb.schema.trainer_kinds import trainer_kind

__all__ = [
    "CONTROL_KEYS",
    "DEFAULT_GENERATION",
    "RESERVED_METRICS",
    "EvalExample",
    "GenerationMetricsError",
    "GenerationSettings",
    "check_generation_config",
    "check_generation_eval",
    "check_metrics",
    "eval_examples",
    "function_name",
    "generation_enabled",
    "resolve_settings",
    "sample_indices",
]

DEFAULT_GENERATION: Mapping[str, Any] = {
    "max_new_tokens": 128,
    "do_sample": True,
    "temperature": 0.7,
    "top_p": 0.9,
}
"""rapidfireai's generation defaults (``rapidfireai/fit/ml/callbacks.py``); pad/eos ids come from the tokenizer."""

_SAMPLING_DEFAULTS = ("temperature", "top_p")  # only meaningful when sampling

CONTROL_KEYS: Mapping[str, Any] = {
    "max_input_length": None,
    "add_generation_prompt": True,
    "truncation_side": "left",
}
"""Keys of ``generation_config`` that steer prompt preparation, not ``generate`` (with rapidfireai's defaults)."""

DEFAULT_MODEL_MAX_LENGTH = 4096
"""Prompt budget (tokens) assumed when the tokenizer has no real ``model_max_length``, as rapidfireai does."""
_UNSET_MODEL_MAX_LENGTH = 10**9  # transformers' "no limit" sentinel is 1e30
MIN_INPUT_LENGTH = 64
"""The prompt budget never drops below this many tokens (rapidfireai's floor)."""

GENERATION_SECONDS = "generation_seconds"
"""Logged as ``eval_generation_seconds``: wall seconds one evaluation spent generating (not scoring)."""

RESERVED_METRICS = frozenset(
    {
        "loss",
        "runtime",
        "samples_per_second",
        "steps_per_second",
        "model_preparation_time",
        GENERATION_SECONDS,
    }
)
"""Names ``compute_metrics`` may not return: TRL's own eval metrics, and the generation time."""


class GenerationMetricsError(RuntimeError):
    """``compute_metrics`` raised or returned something that is not ``{name: number}`` (fails its run only)."""


def function_name(fn: Any) -> str:
    """``fn``'s name for messages (``functools.partial`` unwrapped)."""
    inner = getattr(fn, "func", fn)
    return str(getattr(inner, "__qualname__", None) or getattr(inner, "__name__", None) or repr(fn))


def generation_enabled(compute_metrics: Any, generation_config: Any) -> bool:
    """True when a run evaluates by generating: both ``compute_metrics`` and ``generation_config`` are set."""
    return compute_metrics is not None and generation_config is not None


# ---------------------------------------------------------------------------------------------- settings
def _as_dict(generation_config: Any) -> dict[str, Any]:
    """A ``generation_config`` (dict or ``transformers.GenerationConfig``) as a plain dict of what it sets."""
    if isinstance(generation_config, Mapping):
        return dict(generation_config)
    diff = getattr(generation_config, "to_diff_dict", None)
    if callable(diff):  # a GenerationConfig: the values that differ from transformers' defaults
        return {k: v for k, v in diff().items() if k not in ("transformers_version", "_from_model_config")}
    raise ConfigError(
        "generation_config must be a dict (e.g. {'max_new_tokens': 64, 'do_sample': False}) or a "
        f"transformers.GenerationConfig, got {type(generation_config).__name__}"
    )


def check_generation_config(generation_config: Any) -> dict[str, Any]:
    """Check a run's ``generation_config`` before anything is built (imports transformers).

    Args:
        generation_config: The run's ``generation_config`` (a dict or a ``GenerationConfig``).

    Returns:
        The settings it gives, as a dict (control keys included, defaults not filled in).

    Raises:
        ConfigError: not a dict or GenerationConfig, a key neither ``generate`` nor the evaluation knows (with the
            closest valid key), a bad control value, or a value transformers rejects (its message quoted).
    """
    from transformers import GenerationConfig

    given = _as_dict(generation_config)
    known = set(GenerationConfig().to_dict()) - {"transformers_version", "_from_model_config"}
    for key in given:
        if not isinstance(key, str):
            raise ConfigError(f"generation_config keys must be strings, got {key!r}")
        if key not in known and key not in CONTROL_KEYS:
            hint = closest_name(key, [*known, *CONTROL_KEYS])
            raise ConfigError(
                f"generation_config has an unknown key {key!r}"
                + (f"; did you mean {hint!r}?" if hint else "")
                + " (keys are GenerationConfig fields, e.g. max_new_tokens, do_sample, temperature, or "
                "max_input_length / add_generation_prompt / truncation_side)"
            )
    _check_control(given)
    merged = _merged(given, pad_token_id=None, eos_token_id=None)
    try:
        GenerationConfig(**merged).validate()
    except ValueError as exc:
        raise ConfigError(f"generation_config: transformers rejects it: {exc}") from None
    return given


def _check_control(given: Mapping[str, Any]) -> None:
    limit = given.get("max_input_length")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ConfigError(
            f"generation_config['max_input_length'] must be a positive integer (tokens), got {limit!r}"
        )
    side = given.get("truncation_side", "left")
    if side not in ("left", "right"):
        raise ConfigError(f"generation_config['truncation_side'] must be 'left' or 'right', got {side!r}")
    if not isinstance(given.get("add_generation_prompt", True), bool):
        raise ConfigError("generation_config['add_generation_prompt'] must be True or False")


def _merged(given: Mapping[str, Any], pad_token_id: Any, eos_token_id: Any) -> dict[str, Any]:
    """``generate`` keywords: the given ones, then rapidfireai's defaults for the keys missing."""
    out = {k: v for k, v in given.items() if k not in CONTROL_KEYS}
    sampling = bool(out.get("do_sample", DEFAULT_GENERATION["do_sample"]))
    for key, value in DEFAULT_GENERATION.items():
        if key not in out and (sampling or key not in _SAMPLING_DEFAULTS):
            out[key] = value
    if "pad_token_id" not in out and pad_token_id is not None:
        out["pad_token_id"] = pad_token_id
    if "eos_token_id" not in out and eos_token_id is not None:
        out["eos_token_id"] = eos_token_id
    out.setdefault("use_cache", True)  # a model loaded with use_cache=False would regenerate every prefix
    return out


@dataclass(frozen=True)
class GenerationSettings:
    """How one run generates at evaluation.

    Attributes:
        generate_kwargs: keyword arguments for ``model.generate`` (defaults filled in).
        max_input_length: prompt budget in tokens (longer prompts are truncated on ``truncation_side``).
        add_generation_prompt: passed to the chat template of conversational prompts.
        truncation_side: ``"left"`` (keep the end of the prompt) or ``"right"``.
        batch_size: prompts per ``generate`` call (the run's ``per_device_eval_batch_size``).
        seed: the torch seed set before each evaluation's generation (same sampling noise for every run and every
            evaluation; the run's own RNG stream is saved and restored around it).
    """

    generate_kwargs: Mapping[str, Any]
    max_input_length: int
    add_generation_prompt: bool = True
    truncation_side: str = "left"
    batch_size: int = 8
    seed: int = 0


def resolve_settings(
    generation_config: Any,
    *,
    pad_token_id: Any,
    eos_token_id: Any,
    model_max_length: Any,
    batch_size: int,
    seed: int,
) -> GenerationSettings:
    """A run's generation settings: its ``generation_config`` with rapidfireai's defaults for what is missing.

    Args:
        generation_config: The run's ``generation_config`` (dict or ``GenerationConfig``).
        pad_token_id: The tokenizer's pad id (the eos id when it has none), unless the config sets one.
        eos_token_id: The tokenizer's eos id, unless the config sets one.
        model_max_length: The tokenizer's ``model_max_length`` (tokens; a huge or missing value means unset).
        batch_size: Prompts per ``generate`` call.
        seed: Torch seed for the generation of every evaluation.

    Returns:
        The settings.
    """
    given = _as_dict(generation_config)
    kwargs = _merged(given, pad_token_id, eos_token_id)
    limit = given.get("max_input_length")
    if limit is None:
        usable = model_max_length
        if not isinstance(usable, int) or usable <= 0 or usable >= _UNSET_MODEL_MAX_LENGTH:
            usable = DEFAULT_MODEL_MAX_LENGTH
        limit = max(MIN_INPUT_LENGTH, usable - int(kwargs.get("max_new_tokens") or 0))
    return GenerationSettings(
        generate_kwargs=kwargs,
        max_input_length=int(limit),
        add_generation_prompt=bool(given.get("add_generation_prompt", True)),
        truncation_side=str(given.get("truncation_side", "left")),
        batch_size=max(1, int(batch_size)),
        seed=int(seed),
    )


# ---------------------------------------------------------------------------------------------- examples
@dataclass(frozen=True)
class EvalExample:
    """One eval row as the generation sees it.

    Attributes:
        prompt: a string, or a conversational list of ``{"role", "content"}`` messages (rendered with the
            tokenizer's chat template).
        reference: the text ``compute_metrics`` compares the prediction with.
    """

    prompt: Any
    reference: str


def _last_content(value: Any) -> Any:
    """A completion's text: the string itself, or the last message's ``content``."""
    if isinstance(value, str):
        return value
    if isinstance(value, Sequence) and value and isinstance(value[-1], Mapping):
        return value[-1].get("content")
    return None


def _from_messages(messages: Any) -> tuple[Any, Any]:
    """``messages`` ending with an assistant turn: (the turns before it, its content)."""
    if isinstance(messages, Sequence) and not isinstance(messages, str) and len(messages) >= 2:
        last = messages[-1]
        if isinstance(last, Mapping) and last.get("role") == "assistant":
            return list(messages[:-1]), last.get("content")
    return None, None


def _example(row: Mapping[str, Any]) -> tuple[Any, Any]:
    """(prompt, reference) of one row: rapidfireai's column patterns first, then ours."""
    if "input" in row and "output" in row:
        return row["input"], row["output"]
    if "prompt" in row and "completion" in row:
        return row["prompt"], _last_content(row["completion"])
    if "text" in row:
        return row["text"], row.get("response", row.get("instruction", row["text"]))
    if "instruction" in row and "response" in row:
        return row["instruction"], row["response"]
    # beyond rapidfireai: TRL's conversational "messages", DPO's chosen reply, a GRPO row's answer column
    if "messages" in row:
        return _from_messages(row["messages"])
    if "prompt" in row and "chosen" in row:
        return row["prompt"], _last_content(row["chosen"])
    if "prompt" in row and "answer" in row:
        answer = row["answer"]
        return row["prompt"], None if answer is None else str(answer)
    return None, None


def _usable_prompt(prompt: Any) -> bool:
    if isinstance(prompt, str):
        return bool(prompt.strip())
    return (
        isinstance(prompt, Sequence)
        and bool(prompt)
        and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in prompt)
    )


def eval_examples(rows: Any) -> tuple[list[EvalExample], int]:
    """The eval rows (after ``formatting_func``) as prompts and references.

    Column patterns, in order (rapidfireai's first): ``input``/``output``; ``prompt``/``completion`` (a string
    or the last message of a conversational completion); ``text`` (reference ``response``, else ``instruction``,
    else the text); ``instruction``/``response``; then ``messages`` (the turns before the last assistant turn,
    and its content); ``prompt``/``chosen`` (DPO: the chosen reply); ``prompt``/``answer`` (e.g. GRPO's
    numeric answers). A row whose prompt or reference is empty or not text is skipped (rapidfireai skips it
    too).

    Args:
        rows: An iterable of row mappings (a ``datasets.Dataset``).

    Returns:
        ``(examples, skipped)``: the usable examples in row order, and how many rows were skipped.
    """
    out: list[EvalExample] = []
    skipped = 0
    for row in rows:
        prompt, reference = _example(row) if isinstance(row, Mapping) else (None, None)
        if _usable_prompt(prompt) and isinstance(reference, str) and reference.strip():
            out.append(EvalExample(prompt, reference.strip()))
        else:
            skipped += 1
    return out, skipped


def sample_indices(n: int, samples: int | None, seed: int) -> list[int]:
    """The eval examples that are generated for: all ``n``, or a fixed sample of ``samples`` of them.

    The sample depends only on ``(n, samples, seed)``, so every run of an experiment (same eval set, same seed)
    generates for the same rows at every evaluation.

    Args:
        n: Usable eval examples.
        samples: ``eval_generation_samples`` (``None``: all of them).
        seed: The experiment seed.

    Returns:
        Sorted indices into the examples.
    """
    if samples is None or samples >= n:
        return list(range(n))
    return sorted(random.Random(seed).sample(range(n), samples))


# ---------------------------------------------------------------------------------------------- prechecks
def check_generation_eval(spec: Any, eval_rows: Any) -> list[str]:
    """A run's ``compute_metrics``/``generation_config``, checked before anything is built.

    Args:
        spec: The run spec (``trainer_type``, ``compute_metrics``, ``generation_config``).
        eval_rows: The eval rows after ``formatting_func``, or ``None`` when ``run_fit`` got no eval set.

    Returns:
        Notes for the user (e.g. ``generation_config`` without ``compute_metrics`` generates nothing).

    Raises:
        ConfigError: ``compute_metrics`` alone for a kind whose TRL trainer takes none (GRPO: the kind table's
            ``takes_compute_metrics``); both set but no eval set;
            a bad ``generation_config`` (see :func:`check_generation_config`); no eval row with a prompt and a
            reference (the column patterns are named).
    """
    metrics, config = spec.compute_metrics, spec.generation_config
    if config is not None:
        check_generation_config(config)
    if metrics is not None and config is None:
        kind = trainer_kind(spec.trainer_type)
        if not kind.takes_compute_metrics:
            raise ConfigError(
                "compute_metrics without generation_config goes to the TRL trainer (as in rapidfireai), and "
                f"{kind.trainer_class_name} takes none. Add generation_config={{...}} (e.g. {{'max_new_tokens': 64, "
                "'do_sample': False}) to score generated completions, or remove compute_metrics "
                f"({kind.name} logs its own evaluation metrics)"
            )
        return []
    if config is not None and metrics is None:
        return [
            "generation_config is set but compute_metrics is not: nothing is generated at evaluation (as in "
            "rapidfireai); set RFModelConfig(compute_metrics=...) to score generated completions"
        ]
    if config is None:
        return []
    if eval_rows is None:
        raise ConfigError(
            f"compute_metrics {function_name(metrics)!r} with generation_config scores completions generated for "
            "the eval set, but run_fit got no eval_dataset: pass one (run_fit(..., eval_dataset, ...))"
        )
    examples, skipped = eval_examples(eval_rows)
    if not examples:
        raise ConfigError(
            f"compute_metrics with generation_config: none of the {len(eval_rows)} eval rows (after "
            f"formatting_func; columns {sorted(eval_rows.column_names)}) has a prompt and a reference text. "
            "Rows need input/output, prompt/completion, text, instruction/response, messages (ending with an "
            "assistant turn), prompt/chosen or prompt/answer"
        )
    if skipped:
        return [
            f"{skipped} of {len(eval_rows)} eval rows have no prompt or reference text: nothing is generated for them"
        ]
    return []


# ---------------------------------------------------------------------------------------------- metrics
def check_metrics(result: Any, fn: Callable[..., Any], prefix: str = "eval") -> dict[str, float]:
    """``compute_metrics``' result as logged metrics: ``{"<prefix>_<name>": float}``.

    A name that already starts with ``<prefix>_`` keeps it. Numbers of any real type (``int``, ``float``, numpy
    scalars) are accepted; NaN is kept as NaN (shown as missing, never as a number).

    Args:
        result: What ``compute_metrics((predictions, references))`` returned.
        fn: The function (for messages).
        prefix: TRL's ``metric_key_prefix`` (``"eval"``).

    Returns:
        The metrics to log.

    Raises:
        GenerationMetricsError: ``result`` is not a mapping of string names to real numbers (booleans are not
            numbers here), or uses a name TRL's eval or the generation time already logs (``RESERVED_METRICS``).
    """
    name = function_name(fn)
    if not isinstance(result, Mapping):
        raise GenerationMetricsError(
            f"compute_metrics {name!r} returned {type(result).__name__} {_short(result)}; it must return a dict "
            "{metric name: number}, e.g. {'rougeL': 0.42}"
        )
    out: dict[str, float] = {}
    for key, value in result.items():
        if not isinstance(key, str) or not key:
            raise GenerationMetricsError(
                f"compute_metrics {name!r} returned the metric name {key!r}: use strings"
            )
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise GenerationMetricsError(
                f"compute_metrics {name!r} returned {key!r}: {type(value).__name__} {_short(value)}, not a number; "
                "return {metric name: float}"
            )
        bare = key[len(prefix) + 1 :] if key.startswith(prefix + "_") else key
        if bare in RESERVED_METRICS:
            raise GenerationMetricsError(
                f"compute_metrics {name!r} returned {key!r}, which would replace {prefix}_{bare} "
                "(logged by TRL or by the generation timer); rename that metric"
            )
        out[f"{prefix}_{bare}"] = float(value)
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
