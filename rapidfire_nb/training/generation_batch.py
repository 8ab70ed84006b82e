"""Batched generation eval: the LoRA runs of one shared base answer the eval prompts in one ``generate``.

Every run that evaluates by generating (``compute_metrics`` + ``generation_config``) answers the same eval prompts
(the seeded sample of ``eval_generation_samples``). Time-sliced, each run generated alone at its chunk end: k runs
cost k ``generate`` calls of ``batch_size`` rows per prompt slice. Here a run's chunk-end evaluation computes its
eval loss as usual and *defers* the generation; once every run still training on the base has deferred (the end
of the round), one ``generate`` per prompt slice answers for all of them, each row through its own run's adapter
(PEFT's mixed-adapter batches, ``adapter_names=``, one name per row), and each run's ``compute_metrics`` values are
logged at the step it deferred at. Decoding at small batches is bound by reading the weights (CPU) or by kernel
launches (GPU), so one call of ``k * batch_size`` rows costs much less than k calls.

Exactness: a deferred run's adapter does not change until it trains again, and the batch always runs before that
(:meth:`GenerationBatcher.before_training`), before its adapter is deleted or the run moves, and when the
executor closes. Each run's rows are its own slice repeated with the same left padding, so greedy decoding gives
each run the token ids it gets alone (a test compares them and ``compute_metrics``' values); rows are cut after
their first eos (:meth:`GenerationEvaluator.decode`), as when alone. The RNG state and the model's train/eval
mode are the same before and after. Only greedy or beam-free decoding is batched: sampling draws every row from one
generator, so a sampled run generates alone (as it would). Training is untouched either way.

What is batched: runs of the ``SFT`` and ``DPO`` kinds with a LoRA adapter on a shared base, whose generation
settings, prompts and mixed-precision settings are equal; a run whose ``metric_for_best_model`` is a generated
metric, or every run when the early-stopping metric is one (the rung needs the value at the run's own chunk end:
``GroupSettings.batch_generation`` is False then), generates alone. Evaluations at a run's own ``eval_steps``
inside a chunk generate alone.

Timing: ``eval_generation_seconds`` of a batched evaluation is the run's share of the batch's wall time (the
batch's seconds divided by the runs in it). The metrics of the runs that deferred first arrive at the end of the
round (when a rung is decided anyway). A kernel killed before the batch ran loses those values for that step
(the checkpoint at the boundary is kept; the run continues from it without generating for that step again).

Memory: ``k`` runs hold ``k`` KV caches at once. :func:`runs_per_call` caps the runs of one ``generate`` by the
free memory (a GPU's free memory, or half the host's available memory), with a note when the cap splits a batch.

Threads: every method runs on the executor's device thread (the executor's hooks call them there).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .free_memory import available_ram, free_cuda_bytes
from .generation_eval import GenerationEvaluator
from .generation_spec import GenerationMetricsError
from .rng import capture_rng, restore_rng

__all__ = ["BATCHED_KINDS", "GenerationBatcher", "alone_reason", "kv_cache_bytes", "runs_per_call"]

#: Trainer kinds whose generation eval is batched (GRPO's rollouts and eval reward are the packed-steps issue's).
BATCHED_KINDS = frozenset({"SFT", "DPO"})
#: Share of the free memory the KV caches of one batched ``generate`` may take: all of a GPU's free memory is
#: not usable (activations, the allocator's fragments), and on a CPU the host's memory is every process's.
MEMORY_SHARE = 0.5


def kv_cache_bytes(config: Any, rows: int, tokens: int, element_bytes: int) -> int:
    """The key/value cache of ``rows`` sequences of ``tokens`` tokens (bytes): 2 (K and V) x layers x kv heads x
    head size x tokens x rows x element size (the layout of transformers' ``DynamicCache``).

    Args:
        config: the model's config (its text config's ``num_hidden_layers``, ``num_attention_heads``,
            ``num_key_value_heads``, ``hidden_size``, ``head_dim``); a missing field counts as 0 (no cap).
        rows: sequences in the call.
        tokens: prompt width + new tokens.
        element_bytes: bytes per cached number (the model's dtype).
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = int(getattr(text, "num_hidden_layers", 0) or 0)
    heads = int(getattr(text, "num_attention_heads", 0) or 0)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = getattr(text, "head_dim", None) or (int(getattr(text, "hidden_size", 0) or 0) // max(heads, 1))
    return 2 * layers * kv_heads * int(head_dim) * tokens * rows * element_bytes


def runs_per_call(runs: int, bytes_per_run: int, free_bytes: int | None) -> int:
    """How many runs one batched ``generate`` takes: all ``runs`` unless their KV caches exceed
    :data:`MEMORY_SHARE` of ``free_bytes`` (then as many as fit, at least 1: a run alone needs what it always did).

    Args:
        runs: runs waiting for the batch (>= 1).
        bytes_per_run: one run's KV cache for a prompt slice (:func:`kv_cache_bytes`), bytes.
        free_bytes: free device memory in bytes, or None (unknown: no cap).
    """
    if free_bytes is None or bytes_per_run <= 0:
        return runs
    return max(1, min(runs, int(free_bytes * MEMORY_SHARE) // bytes_per_run))


def alone_reason(kind: str, adapter: str | None, evaluator: GenerationEvaluator, args: Any) -> str | None:
    """Why a run that evaluates by generating must generate alone, or None (it is batched).

    Args:
        kind: its trainer kind (``"SFT"``).
        adapter: its LoRA adapter's name on the shared base, or None (full fine-tuning: its own model).
        evaluator: its generation evaluator (the settings: sampling or beam search is not batched).
        args: its TRL config (``metric_for_best_model`` naming a generated metric needs the value at once).
    """
    from rapidfire_nb.schema.trainer_kinds import is_trainer_metric

    kwargs = evaluator.settings.generate_kwargs
    best = getattr(args, "metric_for_best_model", None)
    if kind not in BATCHED_KINDS:
        return f"{kind} runs generate alone"
    if adapter is None:
        return "a full fine-tuning run has its own model"
    if kwargs.get("do_sample") or int(kwargs.get("num_beams") or 1) > 1:
        return "sampling or beam search draws every row of a batch from one generator"
    if isinstance(best, str) and not is_trainer_metric(
        kind, best if best.startswith("eval_") else f"eval_{best}"
    ):
        return f"metric_for_best_model {best!r} is read at the evaluation itself"
    return None


def _free_bytes(device: torch.device) -> int | None:
    """Free memory of ``device`` in bytes (:mod:`~rapidfire_nb.training.free_memory`: the CUDA device's, else the
    host's available memory), or None when not readable (no cap)."""
    cuda = free_cuda_bytes() if device.type == "cuda" else None
    return cuda[0] if cuda is not None else available_ram()


@dataclass
class _Member:
    """A run whose chunk-end generation may be batched."""

    run_id: int
    base_key: str
    model: Any  # the shared PeftModel
    adapter: str
    trainer: Any
    evaluator: GenerationEvaluator
    at_boundary: Callable[[int], bool]  # step -> True at the run's chunk end (or last step)
    done: Callable[[], bool]  # its train() has returned
    samples_seen: Callable[[int], int]  # step -> training rows consumed up to it
    settled: bool = False  # STOPPED / COMPLETED / FAILED: not waited for


@dataclass
class _Pending:
    step: int
    prefix: str


class GenerationBatcher:
    """Defers the chunk-end generation of the LoRA runs of each shared base and runs it batched.

    Args:
        deliver: ``deliver(run_id, step, samples_seen, metrics)`` logs a batched evaluation's metrics at the step it
            deferred at (``samples_seen``: training rows consumed up to it).
        note: a line for the user (a memory cap splitting a batch), said once per text by the executor.
    """

    def __init__(
        self, deliver: Callable[[int, int, int, dict[str, float]], None], note: Callable[[str], None]
    ) -> None:
        self._deliver = deliver
        self._note = note
        self._members: dict[int, _Member] = {}
        self._pending: dict[int, _Pending] = {}
        self._errors: dict[int, Exception] = {}
        self.calls = 0  # batched generate calls made (benchmark, tests)

    # ------------------------------------------------------------------ registration
    def register(self, member: _Member) -> None:
        """Batch ``member``'s chunk-end generation from now on (its evaluator's ``defer`` is set)."""
        self._members[member.run_id] = member
        member.evaluator.defer = lambda step, prefix: self._defer(member.run_id, step, prefix)

    def add_run(self, run_id: int, kind: str, base: Any, adapter: str | None, worker: Any) -> bool:
        """Batch the chunk-end generation of a run built on ``base`` when it can be (:func:`alone_reason`).

        Args:
            run_id: the run's id.
            kind: its trainer kind's name.
            base: its shared base (``key``, ``model``).
            adapter: its adapter's name, or None.
            worker: its ``RunWorker`` (``trainer``, ``stop_step``, ``done``, ``plan``).

        Returns:
            True when it is batched (its evaluator defers its chunk-end generation here).
        """
        trainer = worker.trainer
        evaluator = getattr(trainer, "_rapidfire_generation", None)
        if not isinstance(evaluator, GenerationEvaluator) or adapter is None or base is None:
            return False
        if alone_reason(kind, adapter, evaluator, trainer.args) is not None:
            return False
        plan = worker.plan

        def at_boundary(step: int) -> bool:
            stop = worker.stop_step
            return step >= plan.total_steps or (stop is not None and step >= stop)

        self.register(
            _Member(
                run_id,
                base.key,
                base.model,
                adapter,
                trainer,
                evaluator,
                at_boundary,
                lambda: bool(worker.done),
                plan.samples_seen,
            )
        )
        return True

    def batchable(self, run_id: int) -> bool:
        """True when run ``run_id``'s chunk-end generation is batched."""
        return run_id in self._members

    # ------------------------------------------------------------------ the executor's hooks
    def before_training(self, run_id: int) -> None:
        """The run is about to train again: its deferred generation runs first (its adapter is about to change).

        Raises:
            GenerationMetricsError: its ``compute_metrics`` failed in an earlier batch (the run then fails here,
                before it trains on, as it would have at that evaluation alone).
        """
        if run_id in self._pending:
            self._flush(self._members[run_id].base_key)
        error = self._errors.pop(run_id, None)
        if error is not None:
            raise error

    def settle(self, run_id: int, finished: bool) -> None:
        """The run's status changed: ``finished`` (STOPPED, COMPLETED, FAILED) runs are not waited for; a resumed
        one is again. A batch every remaining run waits for runs now."""
        member = self._members.get(run_id)
        if member is None:
            return
        member.settled = finished
        self._maybe_flush(member.base_key)

    def forget(self, run_id: int) -> None:
        """The run leaves this executor (deleted, moved): its deferred generation runs now, then it is dropped."""
        member = self._members.get(run_id)
        if member is None:
            return
        if run_id in self._pending:
            self._flush(member.base_key)
        self._members.pop(run_id, None)
        self._errors.pop(run_id, None)

    def flush_all(self) -> None:
        """Run every deferred generation (the executor closes)."""
        for key in {self._members[r].base_key for r in self._pending if r in self._members}:
            self._flush(key)

    # ------------------------------------------------------------------ deferral
    def _defer(self, run_id: int, step: int, prefix: str) -> bool:
        member = self._members.get(run_id)
        if member is None or not member.at_boundary(step):
            return False  # an evaluation inside a chunk (the run's own eval_steps): alone, now
        self._pending[run_id] = _Pending(step, prefix)
        self._maybe_flush(member.base_key)
        error = self._errors.pop(run_id, None)
        if error is not None:  # its own batch ran at once and its compute_metrics failed: fail as alone
            raise error
        return True

    def _maybe_flush(self, base_key: str) -> None:
        """Run the base's batch when every run it waits for has deferred."""
        waiting = [
            m
            for m in self._members.values()
            if m.base_key == base_key and not m.settled and not m.done() and m.run_id not in self._pending
        ]
        if not waiting and any(self._members[r].base_key == base_key for r in self._pending):
            self._flush(base_key)

    def _flush(self, base_key: str) -> None:
        """Generate for every deferred run of the base: one ``generate`` per prompt slice per group of runs with
        equal settings, then each run's ``compute_metrics``."""
        ids = [r for r in self._pending if self._members[r].base_key == base_key]
        groups: dict[tuple[Any, ...], list[int]] = {}
        for rid in ids:
            groups.setdefault(_group_key(self._members[rid]), []).append(rid)
        try:
            for group in groups.values():
                self._generate_group([self._members[r] for r in group])
        finally:
            for rid in ids:
                self._pending.pop(rid, None)

    def _generate_group(self, members: list[_Member]) -> None:
        first = members[0]
        model, evaluator = first.model, first.evaluator
        device = next(model.parameters()).device
        slices = evaluator.slices(device)
        per_call = self._runs_per_call(members, slices, device)
        rng, was_training = capture_rng(), model.training
        texts: dict[int, list[str]] = {m.run_id: [] for m in members}
        t0 = time.perf_counter()
        try:
            torch.manual_seed(evaluator.settings.seed)
            model.eval()
            with torch.no_grad(), first.trainer.autocast_smart_context_manager():
                for start in range(0, len(members), per_call):
                    self._generate_part(model, members[start : start + per_call], slices, texts)
        finally:
            model.train(was_training)
            restore_rng(rng)
        share = (time.perf_counter() - t0) / len(members)
        for m in members:
            if m.run_id in texts:
                self._score(m, texts[m.run_id], share)

    def _generate_part(
        self, model: Any, part: list[_Member], slices: list[dict[str, Any]], texts: dict[int, list[str]]
    ) -> None:
        """Every slice for the runs of ``part`` together; if that fails (e.g. out of memory), each run alone: a run
        whose own generation fails too fails at its next step (its error is raised before it trains on)."""
        try:
            for batch in slices:
                self._generate_slice(model, part, batch, texts)
            return
        except Exception as exc:
            if len(part) == 1:
                self._errors[part[0].run_id] = exc
                texts.pop(part[0].run_id, None)
                return
            self._note(
                f"generation eval: a batched generate of {len(part)} runs failed ({exc}); each run alone"
            )
        for m in part:
            texts[m.run_id] = []
            self._generate_part(model, [m], slices, texts)

    def _generate_slice(
        self, model: Any, part: list[_Member], batch: dict[str, Any], texts: dict[int, list[str]]
    ) -> None:
        """One ``generate`` of the slice repeated once per run of ``part``, each row through its run's adapter."""
        rows, width = batch["input_ids"].shape
        out = model.generate(
            input_ids=batch["input_ids"].repeat(len(part), 1),
            attention_mask=batch["attention_mask"].repeat(len(part), 1),
            adapter_names=[m.adapter for m in part for _ in range(rows)],
            **dict(part[0].evaluator.settings.generate_kwargs),
        )
        self.calls += 1
        for i, m in enumerate(part):
            texts[m.run_id] += m.evaluator.decode(out[i * rows : (i + 1) * rows, width:])

    def _runs_per_call(
        self, members: list[_Member], slices: list[dict[str, Any]], device: torch.device
    ) -> int:
        if len(members) == 1 or not slices:
            return 1
        settings = members[0].evaluator.settings
        rows, width = max((tuple(b["input_ids"].shape) for b in slices), key=lambda s: s[0] * s[1])
        new_tokens = int(settings.generate_kwargs.get("max_new_tokens") or 0)
        model = members[0].model
        element = next(model.parameters()).element_size()
        per_run = kv_cache_bytes(model.config, rows, width + new_tokens, element)
        free = _free_bytes(device)  # measured once: the note says what the cap was decided on
        fits = runs_per_call(len(members), per_run, free)
        if fits < len(members):
            self._note(
                f"generation eval: {fits} of {len(members)} runs per batched generate (each run's KV cache "
                f"{per_run / 2**20:.1f} MB; free memory {(free or 0) / 2**20:.0f} MB)"
            )
        return fits

    def _score(self, member: _Member, predictions: list[str], seconds: float) -> None:
        pending = self._pending[member.run_id]
        rng = capture_rng()
        try:
            metrics = member.evaluator.score(predictions, seconds, pending.prefix)
        except GenerationMetricsError as exc:
            if member.done():  # nothing left to fail: its last evaluation's metrics are missing, said once
                self._note(
                    f"run {member.run_id}: {exc} at step {pending.step}; its generation metrics are missing"
                )
            else:
                self._errors[member.run_id] = exc
            return
        finally:
            restore_rng(rng)
        self._deliver(member.run_id, pending.step, member.samples_seen(pending.step), metrics)


def _group_key(member: _Member) -> tuple[Any, ...]:
    """Runs whose rows can share a ``generate``: equal settings, prompts and mixed precision."""
    ev, args = member.evaluator, member.trainer.args
    kwargs = tuple(sorted((k, repr(v)) for k, v in ev.settings.generate_kwargs.items()))
    return (
        kwargs,
        ev.settings.batch_size,
        ev.settings.seed,
        tuple(tuple(ids) for ids in ev.prompt_ids),
        bool(getattr(args, "bf16", False)),
        bool(getattr(args, "fp16", False)),
    )
