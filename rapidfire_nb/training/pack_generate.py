"""One batched ``generate`` for the runs of a pack that generate at the same moment (GRPO's rollouts).

Each run's ``GRPOTrainer`` calls the shared ``PeftModel``'s ``generate`` for its prompts; in a packed segment
(:mod:`~rapidfire_nb.training.packing`) the runs hand those calls in, and :func:`generate_together` answers them
with one ``generate`` over every run's rows, each row through its own run's adapter (the same per-row routing as the
fused forward), when their calls can share one:

* the same generation config (sampling settings, lengths, special tokens), prompts of the same padded length, no
  beam search, no stop strings, a plain tensor output;
* **exact per run**: each run samples from its own random state (``torch.multinomial`` is swapped, during the call,
  for one that draws each run's rows with that run's state), and a run whose rows have all ended draws nothing more
  (alone, its ``generate`` would have stopped): neither sampling nor LoRA dropout. Its output is cut at the length it
  would have had alone. So every run gets the token ids it gets alone (CPU: equal, tests).

Calls that cannot share one ``generate`` run one by one, each with its run's adapter and random state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .pack_rows import Rows, own_rng, routing

__all__ = ["generate_groups", "generate_together", "joinable_generate", "runs_that_fit"]


def joinable_generate(calls: list[dict[str, Any]]) -> bool:
    """Whether these ``generate`` keyword arguments can be answered by one batched call."""
    first = calls[0]
    config = first.get("generation_config")
    if config is None or set(first) - {"input_ids", "attention_mask", "generation_config"}:
        return False
    if (
        (getattr(config, "num_beams", None) or 1) != 1  # unset (None) is one beam
        or (getattr(config, "num_return_sequences", None) or 1) != 1
        or getattr(config, "stop_strings", None)
        or getattr(config, "return_dict_in_generate", None)
    ):
        return False
    if not config.do_sample:  # a run's end is seen at its sampling step; greedy calls go one by one
        return False
    shape = first["input_ids"].shape
    for c in calls:
        if set(c) != set(first) or c["input_ids"].shape[1:] != shape[1:]:
            return False
        if c["generation_config"].to_dict() != config.to_dict():
            return False
    return True


def generate_groups(model: Any, calls: dict[int, dict[str, Any]]) -> list[list[int]]:
    """The run ids whose ``generate`` calls one batched call answers, group by group: calls that can share one
    (:func:`joinable_generate`), as many per call as their KV caches fit (:func:`runs_that_fit`); a group of one
    generates alone."""
    joined: list[list[int]] = []
    for rid, kwargs in calls.items():
        for ids in joined:
            if joinable_generate([calls[ids[0]], kwargs]):
                ids.append(rid)
                break
        else:
            joined.append([rid])
    groups = []
    for ids in joined:
        fit = runs_that_fit(model, [calls[rid] for rid in ids]) if len(ids) > 1 else 1
        groups += [ids[i : i + fit] for i in range(0, len(ids), fit)]
    return groups


def runs_that_fit(model: Any, calls: list[dict[str, Any]]) -> int:
    """How many of these calls one batched ``generate`` takes so that their KV caches fit half the free memory
    (:func:`~rapidfire_nb.training.generation_batch.kv_cache_bytes` and ``runs_per_call``, the batched
    generation eval's cap; free memory: CUDA's, else the host's); at least 1."""
    from .free_memory import available_ram, free_cuda_bytes
    from .generation_batch import kv_cache_bytes, runs_per_call

    ids, config = calls[0]["input_ids"], calls[0]["generation_config"]
    tokens = int(ids.shape[1]) + int(config.max_new_tokens or 0)
    element = next(model.parameters()).element_size()
    per_run = kv_cache_bytes(model.config, int(ids.shape[0]), tokens, element)
    cuda = free_cuda_bytes() if ids.is_cuda else None
    return runs_per_call(len(calls), per_run, cuda[0] if cuda is not None else available_ram())


class _Seen:
    """A logits processor that keeps the ids generated so far (it changes no score)."""

    def __init__(self) -> None:
        self.input_ids: Any = None

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.input_ids = input_ids
        return scores


def generate_together(
    generate: Callable[..., Any], calls: list[dict[str, Any]], route: list[Rows]
) -> list[Any]:
    """One ``generate`` for ``calls`` (:func:`joinable_generate`), rows routed by ``route``; each call's output.

    Args:
        generate: the shared ``PeftModel``'s own ``generate``.
        calls: each run's keyword arguments, in ``route``'s order.
        route: each run's rows and random state (advanced by its draws: the caller gives it back to the run).

    Returns:
        Each run's ``(rows, prompt + generated)`` token ids, as its own ``generate`` returns them.
    """
    from transformers import LogitsProcessorList

    config = calls[0]["generation_config"]
    eos = config.eos_token_id
    eos_ids = torch.tensor([eos] if isinstance(eos, int) else list(eos or []), dtype=torch.long)
    prompt = int(calls[0]["input_ids"].shape[1])
    seen = _Seen()
    inputs = {key: torch.cat([c[key] for c in calls]) for key in calls[0] if key != "generation_config"}
    original = torch.multinomial

    def multinomial(probs: Any, num_samples: int, replacement: bool = False, **kwargs: Any) -> Any:
        if kwargs or probs.dim() != 2 or probs.shape[0] != route[-1].stop:
            return original(probs, num_samples, replacement, **kwargs)
        parts = []
        for rows in route:
            part = probs[rows.start : rows.stop]
            if rows.finished:  # alone it would not be sampling any more: draw nothing, its tokens are padding
                parts.append(torch.zeros((part.shape[0], num_samples), dtype=torch.long, device=part.device))
                continue
            with own_rng(rows, part.device):
                parts.append(original(part, num_samples, replacement))
        tokens = torch.cat(parts)
        _mark_finished(route, seen.input_ids, tokens[:, 0], prompt, eos_ids.to(tokens.device))
        return tokens

    torch.multinomial = multinomial
    try:
        with routing(route), torch.no_grad():
            out = generate(**inputs, generation_config=config, logits_processor=LogitsProcessorList([seen]))
    finally:
        torch.multinomial = original
    return [
        out[r.start : r.stop, : prompt + r.length] if r.length is not None else out[r.start : r.stop]
        for r in route
    ]


def _mark_finished(route: list[Rows], ids: Any, new: Any, prompt: int, eos: Any) -> None:
    """After a sampling step: a run whose every row has produced an end-of-sequence token is finished, with the
    length its own ``generate`` would have returned (it stops after the step its last row ended)."""
    if ids is None or eos.numel() == 0:
        return
    for rows in route:
        if rows.finished:
            continue
        done = torch.isin(new[rows.start : rows.stop], eos)
        if ids.shape[1] > prompt:
            done |= torch.isin(ids[rows.start : rows.stop, prompt:], eos).any(dim=1)
        if bool(done.all()):
            rows.finished = True
            rows.length = int(ids.shape[1]) - prompt + 1
