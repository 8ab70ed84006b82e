"""Packed steps: the LoRA runs of one pack train in lockstep, with one forward and one backward over the shared base.

A pack's runs each keep their own TRL trainer, optimizer, LR schedule, clipping, logging, callbacks, evaluations,
RNG stream and checkpoints: only the forward and backward of their micro-batches are fused. Every run's
``train()`` is a greenlet on the device thread (:mod:`~rapidfire_nb.training.worker`); in a packed segment the
:class:`PackDriver` switches into each run in turn, and each run parks at the rendezvous of its training step:

* **forward**: the shared base's backbone (``LlamaModel`` under ``LlamaForCausalLM``; the module a causal LM's
  forward and TRL's fused LM head both call) is called with the run's micro-batch. When every run of the pack
  is there, the driver calls the backbone once on the concatenated micro-batches, each run's rows through its
  own adapter (:func:`routed_forward` on every ``peft`` LoRA ``Linear``: the base GEMMs once, each adapter on its
  own rows, no rank padding), and hands each run its rows' hidden states. The LM head and the loss are then
  each run's own code on its own slice (TRL's fused LM head included), so memory for logits stays one run's.
* **backward**: ``accelerator.backward(loss)``. When every run is there, the driver back-propagates the sum of
  the runs' losses (each scaled as accelerate does: ``loss / gradient_accumulation_steps``) once. The gradient
  reaching each run's loss is exactly 1.0, and each run's adapter sees only its own rows, so each run's
  gradients are its own. With gradient checkpointing the backward recomputes the fused forward over the same rows.
* **generate** (GRPO's rollouts): the runs' ``generate`` calls of equal settings are answered by one batched,
  sampled ``generate`` (:mod:`~rapidfire_nb.training.pack_generate`), each run sampling from its own random state.

Between switches each run gets back its own RNG state, accelerate ``GradientState``, grad mode and autocast state
(all of them the process's or the OS thread's, shared by the greenlets).

Exactness: on CPU (fp32) each row's results do not depend on the other rows of the batch (measured: 0.0 over
every LoRA gradient), so every packed run ends equal to a plain ``trainer.train()`` (tests). LoRA dropout draws
from each run's own RNG state, in each run's layer order, as alone (the state is swapped in around each
adapter's dropout). CUDA's GEMMs are not batch-invariant: there the difference is measured, not promised.

Forwards that are not training steps (evaluations, DPO's reference with adapters disabled, a greedy generation)
run alone, with the run's adapter made active first. A backbone call the driver cannot fuse (different shapes,
positional arguments, a cache) runs alone for each run, in lockstep: still exact.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from greenlet import getcurrent

from .adapters import activate_adapter
from .pack_generate import generate_groups, generate_together
from .pack_rows import Rows, current_route, join_calls, own_rng, routing, slice_output
from .rng import capture_rng, restore_rng

__all__ = ["PackDriver", "PackMember", "fusable_base", "routed_forward"]


@dataclass
class _Forward:
    kwargs: dict[str, Any]
    rng: dict[str, Any]
    accumulation: dict[str, Any] = field(default_factory=dict)  # the run's accelerate GradientState
    modes: _Modes | None = None  # its grad mode and autocast state


@dataclass
class _Backward:
    loss: Any
    rng: dict[str, Any]
    accumulation: dict[str, Any] = field(default_factory=dict)
    modes: _Modes | None = None


@dataclass
class _Generate:
    kwargs: dict[str, Any]
    rng: dict[str, Any]
    accumulation: dict[str, Any] = field(default_factory=dict)
    modes: _Modes | None = None


@dataclass
class _Modes:
    """A greenlet's share of the thread's torch modes (one OS thread runs every run of the pack)."""

    grad: bool
    autocast: tuple[tuple[str, bool, Any], ...]

    @staticmethod
    def now() -> _Modes:
        devices = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
        return _Modes(
            torch.is_grad_enabled(),
            tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in devices),
        )

    def restore(self) -> None:
        torch.set_grad_enabled(self.grad)
        for device, enabled, dtype in self.autocast:
            torch.set_autocast_enabled(device, enabled)
            torch.set_autocast_dtype(device, dtype)


@dataclass
class _Raise:
    exc: BaseException


@dataclass
class PackMember:
    """One run of a pack, as the driver drives it.

    Attributes:
        run_id: the run's id.
        adapter: its adapter's name on the shared base.
        worker: its :class:`~rapidfire_nb.training.worker.RunWorker`.
        enter: called before every switch into the run (its ``zero_grad`` and forward back on the shared base).
        own: its trainable parameters, in model order (its adapter's weights).
    """

    run_id: int
    adapter: str
    worker: Any
    enter: Any
    own: list[Any] = field(default_factory=list)


def _lora_linear_class() -> type:
    from peft.tuners.lora.layer import Linear

    return Linear


def _lora_linear_classes() -> tuple[type, ...]:
    """PEFT's LoRA ``Linear`` and, with bitsandbytes installed, its 8-bit and 4-bit LoRA layers (a quantized
    shared base)."""
    classes: list[type] = [_lora_linear_class()]
    try:
        from peft.tuners.lora import bnb

        classes += [getattr(bnb, name) for name in ("Linear8bitLt", "Linear4bit") if hasattr(bnb, name)]
    except ImportError:
        pass
    return tuple(classes)


def fusable_base(model: Any, adapters: list[str], checkpointing: bool = False) -> str | None:
    """Why the adapters ``adapters`` of the ``PeftModel`` ``model`` cannot share one fused pass, or None.

    Each adapter must sit only on plain ``peft`` LoRA ``Linear`` layers (no DoRA or other variant, no merged
    layer, no ``lora_bias``). With gradient checkpointing (``checkpointing``: the runs' ``gradient_checkpointing``,
    which their ``train()`` turns on later) the backward recomputes the fused forward (the same rows, the same
    adapters), so no adapter may use LoRA dropout: the recomputation would draw its masks from the process-wide
    state, not from each run's own.
    """
    linear = _lora_linear_classes()
    from peft.tuners.lora.layer import LoraLayer

    for module in model.modules():
        if not isinstance(module, LoraLayer):
            continue
        for name in adapters:
            if name not in getattr(module, "lora_A", {}):
                continue
            if type(module) not in linear:
                return f"its adapter sits on a {type(module).__name__} layer (packs take plain Linear layers)"
            if name in module.lora_variant or module.merged or module.lora_bias.get(name, False):
                return "its adapter is a LoRA variant (DoRA, bias) or merged"
    checkpointing = checkpointing or bool(getattr(_causal_lm(model), "is_gradient_checkpointing", False))
    if checkpointing and any(_dropout_of(model, name) > 0 for name in adapters):
        return "gradient checkpointing with LoRA dropout (its recomputation would draw other masks)"
    return None


def _dropout_of(model: Any, adapter: str) -> float:
    config = model.peft_config.get(adapter)
    return float(getattr(config, "lora_dropout", 0.0) or 0.0)


def _causal_lm(model: Any) -> Any:
    """The transformers model under a ``PeftModel`` (``model.base_model.model``)."""
    return model.base_model.model


def routed_forward(layer: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
    """A ``peft`` LoRA ``Linear``'s forward; inside a fused backbone call, each run's rows through its own adapter.

    The same arithmetic as ``peft.tuners.lora.layer.Linear.forward`` for the rows of each run: the base layer
    (once, over every run's rows), then ``result + lora_B(lora_A(dropout(x))) * scaling`` on that run's rows, cast
    back to the base's dtype. On a quantized base, ``peft.tuners.lora.bnb``'s ``Linear8bitLt`` / ``Linear4bit``
    arithmetic (the 4-bit result cloned first; the input cast and the output cast back only outside autocast).
    A run with no adapter on this layer keeps the base's result.
    """
    route = current_route()
    if route is None or args or kwargs or layer.disable_adapters or layer.merged:
        return type(layer).forward(layer, x, *args, **kwargs)
    plain = type(layer) is _lora_linear_class()
    result = layer.base_layer(x)
    if type(layer).__name__ == "Linear4bit":
        result = result.clone()  # as PEFT's 4-bit layer does
    dtype = result.dtype
    convert = plain or not torch.is_autocast_enabled()
    parts = []
    for rows in route:
        part = result[rows.start : rows.stop]
        if rows.adapter in layer.lora_A:
            lora_a, lora_b = layer.lora_A[rows.adapter], layer.lora_B[rows.adapter]
            dropout, scaling = layer.lora_dropout[rows.adapter], layer.scaling[rows.adapter]
            xi = x[rows.start : rows.stop]
            xi = layer._cast_input_dtype(xi, lora_a.weight.dtype) if convert else xi
            if rows.finished or isinstance(dropout, torch.nn.Identity) or not dropout.training:
                dropped = xi if rows.finished else dropout(xi)  # a finished run would not run this alone
            else:
                with own_rng(rows, xi.device):
                    dropped = dropout(xi)
            out = lora_b(lora_a(dropped)) * scaling
            part = part + (out.to(dtype) if convert and not plain else out)
        parts.append(part)
    joined = torch.cat(parts)
    return joined.to(dtype) if plain else joined


class PackDriver:
    """Drives the runs of packs on one shared base through packed segments (device thread only).

    Args:
        model: the shared ``peft.PeftModel``.

    Making it patches the base (the backbone's forward, the ``PeftModel``'s ``generate``, every LoRA ``Linear``'s
    forward; the layers again before each packed segment); outside a packed segment they behave exactly as before
    (one lookup more per call). :meth:`install_backward` patches each member's ``accelerator.backward``.
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self._members: dict[Any, PackMember] = {}  # greenlet -> its run, during a packed segment
        self.fused_steps = 0  # fused forward passes (tests, benchmark)
        self.alone_steps = 0  # forwards of a packed segment that ran alone (shapes differed)
        backbone = _causal_lm(model).base_model
        self._backbone_forward = type(backbone).forward.__get__(backbone)
        backbone.forward = self._backbone_call
        self._generate_original = model.generate
        model.generate = self._generate_call
        self.generated_together = 0  # batched generate calls (tests, benchmark)
        self._route: list[Rows] | None = None  # the last fused forward's rows, until its backward
        self._route_layers()

    def _route_layers(self) -> None:
        """Route every LoRA ``Linear`` of the base (again before each packed segment: a later run may have added
        layers, e.g. other ``target_modules``)."""
        linear = _lora_linear_classes()
        for module in self.model.modules():
            if type(module) in linear and "forward" not in module.__dict__:
                module.forward = functools.partial(routed_forward, module)

    # ------------------------------------------------------------------ installed on each member's trainer
    def install_backward(self, trainer: Any) -> None:
        """Route the trainer's ``accelerator.backward`` through the backward rendezvous (once per trainer)."""
        acc = trainer.accelerator
        if "backward" in acc.__dict__:
            return
        original = acc.backward

        def backward(loss: Any, **kwargs: Any) -> None:
            member = self._members.get(getcurrent())
            if member is None:
                return original(loss, **kwargs)
            if kwargs or acc.distributed_type != "NO":  # one device per process, no LOMO: not expected
                raise RuntimeError("a packed run's backward took arguments or a distributed setup")
            scaled = loss / acc.gradient_accumulation_steps  # what accelerate's backward does, in its order
            if acc.scaler is not None:  # fp16: each run's own loss scale (its gradients scaled as alone)
                scaled = acc.scaler.scale(scaled)
            self._rendezvous(_Backward(scaled, {}))
            return None

        acc.backward = backward

    # ------------------------------------------------------------------ the packed segment
    def run(self, members: list[PackMember], stop_step: int) -> dict[int, Any]:
        """Train every member until ``stop_step`` in lockstep; their ``SegmentResult`` by run id.

        Every member must be parked at the same step with the same next boundary. A member that fails leaves
        the pack (its result carries the error); the others go on.
        """
        pending: dict[int, Any] = {}
        results: dict[int, Any] = {}
        accumulation: dict[int, dict[str, Any]] = {}
        by_id = {m.run_id: m for m in members}
        self._route_layers()
        for m in members:
            self._members[m.worker.glet_or_new()] = m
            m.enter()
            self._sort(m, m.worker.start_packed(stop_step), pending, results)
        try:
            while pending:
                accumulation = {rid: req.accumulation for rid, req in pending.items()}
                modes = {rid: req.modes for rid, req in pending.items()}
                answers = self._answer(pending, by_id)
                for rid, (answer, rng) in answers.items():
                    m = by_id[rid]
                    restore_rng(rng)
                    _gradient_state().update(accumulation[rid])
                    m.enter()
                    if modes[rid] is not None:
                        modes[rid].restore()
                    self._sort(m, m.worker.resume_packed(answer), pending, results)
        finally:
            self._members.clear()
        return results

    def _answer(self, pending: dict[int, Any], by_id: dict[int, PackMember]) -> dict[int, tuple[Any, Any]]:
        """Answer one kind of request (backwards first, then generations, then forwards), taken from ``pending``."""
        for kind in (_Backward, _Generate, _Forward):
            ids = [rid for rid, req in pending.items() if isinstance(req, kind)]
            if not ids:
                continue
            taken = {rid: pending.pop(rid) for rid in ids}
            if kind is _Backward:
                return self._backward(taken)
            if kind is _Generate:
                return self._generate({rid: (by_id[rid], req) for rid, req in taken.items()})
            return self._forward({rid: (by_id[rid], req) for rid, req in taken.items()})
        return {}

    def _sort(self, m: PackMember, req: Any, pending: dict[int, Any], results: dict[int, Any]) -> None:
        if isinstance(req, (_Forward, _Backward, _Generate)):
            pending[m.run_id] = req
        else:
            results[m.run_id] = (
                req  # a SegmentResult (its boundary, its end or its error), or None (released)
            )

    def _rendezvous(self, request: _Forward | _Backward | _Generate) -> Any:
        """In a member's greenlet: hand ``request`` to the driver; returns its answer (or raises its error)."""
        request.rng = capture_rng()
        # accelerate's GradientState is one state for the process (sync_gradients, the dataloaders): each run of
        # the pack sets it in its own steps, so each gets its own back (an optimizer step skips when not synced)
        request.accumulation = dict(_gradient_state())
        request.modes = _Modes.now()  # grad mode and autocast are the thread's: each run gets its own back
        answer = getcurrent().parent.switch(request)
        if isinstance(answer, _Raise):
            raise answer.exc
        return answer

    def _backbone_call(self, *args: Any, **kwargs: Any) -> Any:
        member = self._members.get(getcurrent())
        if member is None:
            return self._backbone_forward(*args, **kwargs)
        if args or not torch.is_grad_enabled() or not self.model.training:
            self._make_active(member)  # an evaluation, DPO's reference, a generation: the run alone
            return self._backbone_forward(*args, **kwargs)
        return self._rendezvous(_Forward(kwargs, {}))

    def _generate_call(self, *args: Any, **kwargs: Any) -> Any:
        member = self._members.get(getcurrent())
        if member is None or args:
            return self._generate_original(*args, **kwargs)
        return self._rendezvous(_Generate(kwargs, {}))

    def _generate(
        self, requests: dict[int, tuple[PackMember, _Generate]]
    ) -> dict[int, tuple[Any, dict[str, Any]]]:
        """One batched ``generate`` per group of requests that can share one
        (:mod:`~rapidfire_nb.training.pack_generate`: e.g. runs of equal sampling settings), the others alone."""
        answers: dict[int, tuple[Any, dict[str, Any]]] = {}
        for ids in generate_groups(self.model, {rid: req.kwargs for rid, (_m, req) in requests.items()}):
            if len(ids) > 1:
                answers.update(self._generate_group({rid: requests[rid] for rid in ids}))
        for rid, (m, req) in requests.items():
            if rid not in answers:
                answers[rid] = self._generate_alone(m, req)
        return answers

    def _generate_group(self, group: dict[int, tuple[PackMember, _Generate]]) -> dict[int, tuple[Any, Any]]:
        route, start = [], 0
        for m, req in group.values():
            size = int(req.kwargs["input_ids"].shape[0])
            route.append(Rows(m.adapter, start, start + size, dict(req.rng)))
            start += size
        try:
            outs = generate_together(
                self._generate_original, [req.kwargs for _m, req in group.values()], route
            )
        except Exception:  # each alone gets its own error or result
            return {}
        self.generated_together += 1
        return {rid: (out, rows.rng or {}) for rid, out, rows in zip(group, outs, route)}

    def _generate_alone(self, member: PackMember, req: _Generate) -> tuple[Any, dict[str, Any]]:
        restore_rng(req.rng)
        self._make_active(member)
        try:
            out: Any = self._generate_original(**req.kwargs)
        except Exception as exc:
            out = _Raise(exc)
        return out, capture_rng()

    def _make_active(self, member: PackMember) -> None:
        if self.model.active_adapter != member.adapter:
            activate_adapter(self.model, member.adapter)

    def _all_trainable(self, members: list[PackMember]) -> None:
        """Every member's adapter trains in the fused pass (activating one adapter froze the others')."""
        for m in members:
            for p in m.own:
                if not p.requires_grad:
                    p.requires_grad_(True)

    # ------------------------------------------------------------------ the fused passes
    def _forward(
        self, requests: dict[int, tuple[PackMember, _Forward]]
    ) -> dict[int, tuple[Any, dict[str, Any]]]:
        """One backbone call over every request's micro-batch, or each alone when they cannot be joined."""
        merged = join_calls([req.kwargs for _m, req in requests.values()]) if len(requests) > 1 else None
        if merged is not None:
            kwargs, sizes = merged
            members = [m for m, _req in requests.values()]
            self._all_trainable(members)
            route, start = [], 0
            for (m, req), size in zip(requests.values(), sizes):
                route.append(Rows(m.adapter, start, start + size, dict(req.rng)))
                start += size
            try:
                with routing(route), torch.enable_grad():
                    out = self._backbone_forward(**kwargs)
            except Exception:  # e.g. out of memory: each alone gets its own error or result
                out = None
            if out is not None and getattr(out, "past_key_values", None) is None:
                self.fused_steps += 1
                self._route = route  # gradient checkpointing recomputes this pass in the backward
                return {
                    rid: (slice_output(out, rows.start, rows.stop), rows.rng or req.rng)
                    for (rid, (_m, req)), rows in zip(requests.items(), route)
                }
        return {rid: self._alone(m, req) for rid, (m, req) in requests.items()}

    def _alone(self, member: PackMember, req: _Forward) -> tuple[Any, dict[str, Any]]:
        self.alone_steps += 1
        restore_rng(req.rng)
        self._make_active(member)
        try:
            with torch.enable_grad():
                out: Any = self._backbone_forward(**req.kwargs)
        except Exception as exc:
            out = _Raise(exc)
        return out, capture_rng()

    def _backward(self, requests: dict[int, _Backward]) -> dict[int, tuple[Any, dict[str, Any]]]:
        """``backward`` of the sum of the requests' losses, once (each loss's gradient is exactly 1.0)."""
        losses = [req.loss for req in requests.values()]
        total = losses[0]
        for loss in losses[1:]:
            total = total + loss
        answer: Any = None
        route, self._route = self._route, None
        try:
            with routing(route) if route is not None else contextlib.nullcontext():
                total.backward()
        except Exception as exc:  # every member of this pass fails with it, as it would alone
            answer = _Raise(exc)
        return {rid: (answer, req.rng) for rid, req in requests.items()}


def _gradient_state() -> dict[str, Any]:
    """accelerate's ``GradientState`` shared dict (every instance's ``__dict__``), to save and put back."""
    from accelerate.state import GradientState

    return GradientState._shared_state  # type: ignore[no-any-return]
