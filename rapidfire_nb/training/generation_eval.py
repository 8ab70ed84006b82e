"""Generation-based evaluation on the device thread: generate for the eval prompts, score with ``compute_metrics``.

:func:`install` wraps one trainer's ``evaluation_loop`` (the loop behind ``Trainer.evaluate()``), so every
evaluation — at each chunk end and at the run's own ``eval_steps`` — also generates a completion for each eval
example of the run's :class:`GenerationEvaluator` with the run's own adapter (active while it trains), calls
``compute_metrics((predictions, references))`` and adds its values as ``eval_<name>`` to the metrics TRL logs
in the same line as ``eval_loss`` (so they reach the store, TensorBoard, the panel, the result tables, and
``evaluate()``'s return value that ``metric_for_best_model`` reads), with ``eval_generation_seconds``.

Exactness: the process-wide RNG state (python, numpy, torch, CUDA) is captured before the generation and restored
after ``compute_metrics`` (which may draw random numbers too); generation runs under ``torch.no_grad()`` in eval
mode and the model's mode is put back; the tokenizer is not modified (prompts are tokenized once, when the run is
built, and left-padded here). So a run trains exactly as it would without it. Sampling (``do_sample=True``)
starts from ``torch.manual_seed(seed)`` at every evaluation: every run and every chunk sees the same noise.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rapidfire_nb.spec.bundles import GroupSettings

from .generation_spec import (
    GENERATION_SECONDS,
    EvalExample,
    GenerationMetricsError,
    GenerationSettings,
    check_metrics,
    function_name,
)
from .rng import capture_rng, restore_rng

__all__ = ["GenerationEvaluator", "attach_generation_eval", "install", "maybe_attach_generation_eval"]


def _tokenizer(processing_class: Any) -> Any:
    return getattr(processing_class, "tokenizer", None) or processing_class


class GenerationEvaluator:
    """Generates for a fixed list of eval examples and scores the predictions with ``compute_metrics``.

    Args:
        tokenizer: The run's tokenizer (its chat template renders conversational prompts).
        examples: The eval examples generated for (already sampled).
        settings: ``generate`` keywords, prompt budget, batch size, seed.
        compute_metrics: ``compute_metrics((predictions, references)) -> {name: number}``.
        on_names: Called with the logged metric names after an evaluation (the result tables list them).

    Attributes:
        defer: ``defer(step, prefix) -> bool``, or None (every evaluation generates here, alone).
        truncated: how many prompts are longer than ``settings.max_input_length`` tokens (cut on
            ``settings.truncation_side``).
        last_predictions: the predictions of the latest evaluation (for tests and debugging).
    """

    def __init__(
        self,
        tokenizer: Any,
        examples: Sequence[EvalExample],
        settings: GenerationSettings,
        compute_metrics: Callable[[Any], Any],
        on_names: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.tokenizer = _tokenizer(tokenizer)
        self.settings = settings
        self.compute_metrics = compute_metrics
        self.references = [e.reference for e in examples]
        self._on_names = on_names or (lambda names: None)
        self.truncated = 0
        self._ids = [self._encode(e.prompt) for e in examples]
        self.last_predictions: list[str] = []
        #: ``defer(step, prefix) -> bool``: set by the executor when the run's chunk-end evaluations are batched
        #: with other runs' (:class:`~rapidfire_nb.training.generation_batch.GenerationBatcher`); None: alone.
        self.defer: Callable[[int, str], bool] | None = None

    @property
    def prompt_ids(self) -> list[list[int]]:
        """The token ids of each eval prompt, truncated to the prompt budget (a copy)."""
        return [list(ids) for ids in self._ids]

    def _encode(self, prompt: Any) -> list[int]:
        """Token ids of one prompt, truncated to the prompt budget."""
        tok, s = self.tokenizer, self.settings
        if isinstance(prompt, str):
            ids = list(tok(prompt)["input_ids"])  # as rapidfireai: the tokenizer's own special tokens
        else:  # conversational: the chat template (as TRL renders it for training), no extra special tokens
            text = tok.apply_chat_template(
                list(prompt), tokenize=False, add_generation_prompt=s.add_generation_prompt
            )
            ids = list(tok(text, add_special_tokens=False)["input_ids"])
        if len(ids) > s.max_input_length:
            self.truncated += 1
            ids = ids[-s.max_input_length :] if s.truncation_side == "left" else ids[: s.max_input_length]
        return ids

    def _batch(self, rows: list[list[int]], device: Any) -> dict[str, Any]:
        """Left-padded ``input_ids`` and ``attention_mask`` for one ``generate`` call."""
        pad = self.settings.generate_kwargs.get("pad_token_id")
        if pad is None:
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), int(pad), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            if row:
                ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
                mask[i, width - len(row) :] = 1
        return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}

    def slices(self, device: Any) -> list[dict[str, Any]]:
        """The left-padded ``generate`` inputs, one per ``settings.batch_size`` prompts, in example order.

        A batched evaluation (:mod:`~rapidfire_nb.training.generation_batch`) repeats each slice once per run, so
        every run's rows are padded exactly as when it generates alone.
        """
        size = self.settings.batch_size
        return [self._batch(self._ids[i : i + size], device) for i in range(0, len(self._ids), size)]

    def decode(self, new_tokens: Any) -> list[str]:
        """Decode generated ids (``[rows, new tokens]``) without special tokens, each row cut after its first eos.

        ``generate`` pads a row that ended (eos) with ``pad_token_id`` until every row of its call ends: cutting at
        the eos makes a row's text independent of the other rows of the call (a batched evaluation has more).
        """
        eos = self.settings.generate_kwargs.get("eos_token_id")
        eos_ids = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
        rows: list[list[int]] = []
        for row in new_tokens.tolist():
            cut = next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))
            rows.append(row[:cut])
        return list(self.tokenizer.batch_decode(rows, skip_special_tokens=True))

    def generate(self, model: Any, autocast: Any = None) -> list[str]:
        """One completion per example, decoded without special tokens (the caller isolates the RNG)."""
        device = next(model.parameters()).device
        kwargs = dict(self.settings.generate_kwargs)
        predictions: list[str] = []
        with torch.no_grad(), autocast() if autocast is not None else contextlib.nullcontext():
            for batch in self.slices(device):
                out = model.generate(**batch, **kwargs)
                predictions += self.decode(out[:, batch["input_ids"].shape[1] :])
        return predictions

    def score(self, predictions: list[str], seconds: float, prefix: str = "eval") -> dict[str, float]:
        """``compute_metrics`` over ``predictions`` as ``{"<prefix>_<name>": value, ...}`` with
        ``<prefix>_generation_seconds`` (``seconds``); the caller isolates the RNG.

        Raises:
            GenerationMetricsError: ``compute_metrics`` raised or returned something else than ``{name: number}``.
        """
        self.last_predictions = list(predictions)
        try:
            result = self.compute_metrics((list(predictions), list(self.references)))
        except Exception as exc:
            raise GenerationMetricsError(
                f"compute_metrics {function_name(self.compute_metrics)!r} raised {type(exc).__name__}: {exc}"
            ) from exc
        metrics = check_metrics(result, self.compute_metrics, prefix)
        metrics[f"{prefix}_{GENERATION_SECONDS}"] = seconds
        self._on_names(list(metrics))
        return metrics

    def evaluate(self, model: Any, prefix: str = "eval", autocast: Any = None) -> dict[str, float]:
        """Generate, score and return ``{"<prefix>_<name>": value, "<prefix>_generation_seconds": s}``.

        The RNG state is the same before and after; so is the model's train/eval mode.

        Raises:
            GenerationMetricsError: ``compute_metrics`` raised or returned something else than
                ``{name: number}`` (the message names the function).
        """
        rng = capture_rng()
        was_training = model.training
        try:
            torch.manual_seed(self.settings.seed)
            model.eval()
            t0 = time.perf_counter()
            predictions = self.generate(model, autocast)
            seconds = time.perf_counter() - t0
            model.train(was_training)
            return self.score(predictions, seconds, prefix)
        finally:
            model.train(was_training)
            restore_rng(rng)


def install(trainer: Any, evaluator: GenerationEvaluator) -> None:
    """Make every ``trainer.evaluate()`` also run ``evaluator`` and log its metrics with TRL's eval metrics.

    ``Trainer.evaluate`` calls ``self.evaluation_loop(...)`` and then logs ``output.metrics``; the wrapper (an
    instance attribute) adds the generation metrics to those metrics. ``predict()`` (``description`` other than
    ``"Evaluation"``) is left alone. When ``evaluator.defer`` is set and takes the evaluation (``defer(step,
    prefix)`` returns True: a chunk-end evaluation batched with other runs'), nothing is generated here: the
    batch logs the metrics later, at the same step.

    Args:
        trainer: The run's TRL trainer.
        evaluator: Its generation evaluator.
    """
    original = trainer.evaluation_loop

    def evaluation_loop(dataloader: Any, description: str, *args: Any, **kwargs: Any) -> Any:
        output = original(dataloader, description, *args, **kwargs)
        if description == "Evaluation":
            prefix = kwargs.get("metric_key_prefix", args[2] if len(args) > 2 else "eval")
            defer = evaluator.defer
            if defer is not None and defer(int(trainer.state.global_step), prefix):
                return output
            model = trainer.accelerator.unwrap_model(trainer.model)
            output.metrics.update(evaluator.evaluate(model, prefix, trainer.autocast_smart_context_manager))
        return output

    trainer.evaluation_loop = evaluation_loop
    trainer._rapidfire_generation = evaluator


def attach_generation_eval(
    trainer: Any,
    tokenizer: Any,
    eval_ds: Any,
    spec: Any,
    *,
    samples: int | None,
    seed: int,
    on_metric_names: Callable[[list[str]], None],
    note: Callable[[str], None],
) -> None:
    """Make a run's evaluations generate for the (sampled) eval rows and log ``compute_metrics``' values.

    Args:
        trainer: the run's TRL trainer (its ``per_device_eval_batch_size`` is the generation batch, in rows).
        tokenizer: its tokenizer or processor.
        eval_ds: the eval dataset (rows before ``formatting_func``).
        spec: the run's ``LeafConfig`` (``generation_config``, ``compute_metrics``).
        samples: eval rows generated for (a seeded sample, the same rows for every run); None: all of them.
        seed: the experiment seed (the sample).
        on_metric_names: told the metric names ``compute_metrics`` returned (on the device thread).
        note: a line for the user (prompts cut to ``max_input_length``).
    """
    from .generation_spec import eval_examples, resolve_settings, sample_indices

    examples, _ = eval_examples(eval_ds)
    picked = [examples[i] for i in sample_indices(len(examples), samples, seed)]
    tok = getattr(tokenizer, "tokenizer", None) or tokenizer
    settings = resolve_settings(
        spec.generation_config,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        model_max_length=getattr(tok, "model_max_length", None),
        batch_size=trainer.args.per_device_eval_batch_size,
        seed=seed,
    )
    evaluator = GenerationEvaluator(tok, picked, settings, spec.compute_metrics, on_metric_names)
    if evaluator.truncated:
        note(
            f"{evaluator.truncated} of {len(picked)} eval prompts are longer than "
            f"max_input_length={settings.max_input_length} tokens and are cut on the {settings.truncation_side} "
            "for generation (set generation_config['max_input_length'] to change it)"
        )
    install(trainer, evaluator)


def maybe_attach_generation_eval(
    trainer: Any,
    tokenizer: Any,
    eval_ds: Any,
    spec: Any,
    group: GroupSettings,
    on_metric_names: Callable[[list[str]], None],
    note: Callable[[str], None],
) -> bool:
    """:func:`attach_generation_eval` for a run that evaluates by generating (``compute_metrics`` and
    ``generation_config`` both set); nothing for another.

    Args:
        trainer, tokenizer, eval_ds, spec, on_metric_names, note: as :func:`attach_generation_eval`'s.
        group: the config group's settings (``eval_generation_samples``: eval rows generated for, None: all;
            ``seed``: the sample's seed).

    Returns:
        True when it was attached.
    """
    from .generation_spec import generation_enabled

    if not generation_enabled(spec.compute_metrics, spec.generation_config):
        return False
    attach_generation_eval(
        trainer,
        tokenizer,
        eval_ds,
        spec,
        samples=group.eval_generation_samples,
        seed=group.seed,
        on_metric_names=on_metric_names,
        note=note,
    )
    return True
