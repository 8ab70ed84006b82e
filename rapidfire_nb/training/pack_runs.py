"""Which runs train packed, and the results of the runs a packed segment trained ahead of their turn.

The scheduler asks for one run's segment at a time (``run_segment(run_id, stop_step)``). When that run belongs to
a pack (:func:`rapidfire_nb.spec.packs.pack_key` equal, the same shared base, parked at the same step, in the
rotation), :class:`PackRuns` trains every member of the pack to that boundary in one packed segment
(:class:`~rapidfire_nb.training.packing.PackDriver`) and keeps the other members' results. Their logs, boundary
snapshot and final state are held too, so the kernel sees each member's chunk when the scheduler asks for it
(moments later, in the same round), as if it had trained then: metrics, checkpoints and statuses stay in the
scheduler's order.

A member stopped by an op before its turn came (a user's stop, "stop all but best k") is put back where the
scheduler believes it is: its trainer is rebuilt from its last boundary snapshot (the path a restart takes,
exact), and what it trained ahead is dropped. A deleted member's is simply dropped.

Device thread only, except :meth:`PackRuns.on_status` (the scheduler thread, between segments).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rapidfire_nb.spec.footprint import BaseShapes, activation_bytes, format_bytes

from .checkpoint import write_snapshot
from .free_memory import available_ram, free_cuda_bytes
from .packing import PackDriver, PackMember, fusable_base
from .warm_start import checkpoint_step
from .worker import RunHooks

__all__ = ["PackRuns", "packs_for"]

log = logging.getLogger(__name__)

#: Statuses after which a run is not trained ahead of its turn (the scheduler may not give it one).
_OUT = ("STOPPED", "DELETED", "COMPLETED", "FAILED", "INTERRUPTED")


@dataclass
class _Ahead:
    stop_step: int
    result: Any = None
    held: list[Callable[[], None]] = field(default_factory=list)  # its logs, boundary, final state, in order


def packs_for(executor: Any, group: Any, note: Callable[[str], None]) -> PackRuns | None:
    """The executor's packs, or None when its group does not pack on its device (``run_fit(packing=...)``:
    :func:`rapidfire_nb.spec.packs.packing_applies`)."""
    import torch

    from rapidfire_nb.spec.packs import pack_key, packing_applies

    packing = getattr(group, "packing", "auto")
    device = "cuda" if torch.cuda.is_available() else "cpu"  # where this process' trainers train
    if not packing_applies(packing, device, group.trainer_type):
        return None
    return PackRuns(executor, lambda spec: pack_key(spec, group.trainer_type, group.seed), note)


class PackRuns:
    """The packs of one executor.

    Args:
        executor: the :class:`~rapidfire_nb.training.executor.TorchExecutor` (its runs, device and hooks).
        key_of: ``key_of(spec) -> tuple | None``: the run's pack key (``None``: never packed).
        note: says a line to the user (once per text).
    """

    def __init__(self, executor: Any, key_of: Callable[[Any], Any], note: Callable[[str], None]) -> None:
        self.ex = executor
        self._key_of = key_of
        self._note = note
        self._keys: dict[int, Any] = {}
        self._out: set[int] = set()
        self._ahead: dict[int, _Ahead] = {}
        self._holding: dict[int, _Ahead] = {}  # members trained ahead, during a packed segment
        self._drivers: dict[int, PackDriver] = {}  # by id() of the shared base model
        self.packed_segments = 0
        self._pack_of: dict[int, int | None] = {}
        self._capped = ""  # the last memory note said

    # ------------------------------------------------------------------ executor hooks
    def add(self, run_id: int, spec: Any) -> None:
        """A run was built (device thread): remember its pack key."""
        self._keys[run_id] = self._key_of(spec)  # a rebuilt run stays out of packs until it is resumed

    def hold(self, run_id: int, fn: Callable[[], None]) -> bool:
        """Keep ``fn`` (a log, boundary or final-state hook of ``run_id``) until its turn; False: not held."""
        ahead = self._holding.get(run_id)
        if ahead is None:
            return False
        ahead.held.append(fn)
        return True

    def wrap(self, run_id: int, spec: Any, hooks: RunHooks) -> RunHooks:
        """A run is being built (device thread): its pack key is kept, and its ``hooks`` returned with their
        boundary, log and final-state calls waiting while the run trains ahead of its turn."""
        self.add(run_id, spec)
        on_boundary, on_log, on_final = hooks.on_boundary, hooks.on_log, hooks.on_final

        def boundary(step: int, rng: dict[str, Any]) -> None:
            if not self.hold(run_id, lambda: on_boundary(step, rng)):
                on_boundary(step, rng)

        def log_(step: int, logs: dict[str, float]) -> None:
            if not self.hold(run_id, lambda: on_log(step, logs)):
                on_log(step, logs)

        def final(step: int, rng: dict[str, Any]) -> None:
            assert on_final is not None
            if not self.hold(run_id, lambda: on_final(step, rng)):
                on_final(step, rng)

        return RunHooks(hooks.activate, boundary, log_, final if on_final is not None else None)

    def on_status(self, run_id: int, status: str) -> None:
        """The scheduler changed ``run_id``'s status (scheduler thread, between segments)."""
        if status in _OUT:
            self._out.add(run_id)
        else:
            self._out.discard(run_id)
        if run_id in self._ahead and status in _OUT:
            self.ex.device.run(lambda: self._rewind(run_id, status))

    def drop(self, run_id: int) -> None:
        self._ahead.pop(run_id, None)
        self._keys.pop(run_id, None)

    # ------------------------------------------------------------------ segments (device thread)
    def segment(self, run_id: int, stop_step: int) -> Any:
        """``run_id``'s segment until ``stop_step``: trained ahead already, packed with its pack, or alone."""
        ahead = self._ahead.pop(run_id, None)
        if ahead is not None:
            if ahead.stop_step == stop_step:
                for fn in ahead.held:
                    fn()
                return ahead.result
            self._rewind_now(run_id)  # never expected: the scheduler asked for another boundary
        members = self._members(run_id, stop_step)
        run = self.ex.runs[run_id]
        self._tell_pack([m.run_id for m in members] or [run_id])
        if len(members) < 2:
            return run.worker._segment(stop_step)
        driver = self._driver(run.base.model)
        ids = [m.run_id for m in members]
        self._holding = {rid: _Ahead(stop_step) for rid in ids if rid != run_id}
        try:
            results = driver.run(members, stop_step)
        finally:
            holding, self._holding = self._holding, {}
        self.packed_segments += 1
        for rid, ahead in holding.items():
            ahead.result = results.get(rid)
            self._ahead[rid] = ahead
        return results.get(run_id)

    def _tell_pack(self, ids: list[int]) -> None:
        """The kernel learns each run's pack (its smallest run id; None: alone) when it changes."""
        pack = min(ids) if len(ids) > 1 else None
        for rid in ids:
            if self._pack_of.get(rid) != pack:
                self._pack_of[rid] = pack
                self.ex.callbacks.on_pack(rid, pack)

    def _members(self, run_id: int, stop_step: int) -> list[PackMember]:
        runs = self.ex.runs
        run = runs[run_id]
        key = self._keys.get(run_id)
        if key is None or run.adapter is None or run.own is None:
            return []
        step = _position(run)
        same = [
            r
            for rid, r in sorted(runs.items())
            if rid == run_id
            or (
                self._keys.get(rid) == key
                and rid not in self._out
                and rid not in self._ahead
                and r.base is run.base
                and r.own is not None
                and not r.worker.done
                and _position(r) == step
                and r.plan == run.plan
            )
        ]
        for r in list(same):
            if not r.own.force(self._own_params(r.base.model, r.adapter)):  # it clips its own way: alone
                self._keys[r.run_id] = None
                same.remove(r)
        if len(same) < 2 or run not in same:
            return []
        checkpointing = any(
            bool(getattr(r.worker.trainer.args, "gradient_checkpointing", False)) for r in same
        )
        why = fusable_base(run.base.model, [r.adapter for r in same], checkpointing)
        if why is not None:
            self._note(f"runs {', '.join(str(r.run_id) for r in same)} train alone: {why}")
            self._keys.update({r.run_id: None for r in same})
            return []
        same = self._within_memory(run, same)
        return [self._member(r) for r in same] if len(same) > 1 else []

    def _within_memory(self, run: Any, same: list[Any]) -> list[Any]:
        """``same`` cut to the members whose activations fit the device's free memory together (one pack of
        consecutive run ids holding ``run``), with a note once per size; a pack's extra memory against
        time-slicing is ``k - 1`` runs' activations (:func:`~rapidfire_nb.spec.footprint.activation_bytes`)."""
        fit = self._memory_cap(run)
        if fit is None or fit[0] >= len(same):
            return same
        cap, per_run, free = fit
        i = same.index(run) // cap * cap
        text = (
            f"packs of at most {cap} runs on this device: each run adds ~{format_bytes(per_run)} of activations "
            f"per micro-batch to a pack, and {format_bytes(free)} is free"
        )
        if text != self._capped:
            self._capped = text
            self._note(text)
        return same[i : i + cap]

    def _memory_cap(self, run: Any) -> tuple[int, int, int] | None:
        """How many runs of ``run``'s shape fit one pack in the free memory (>= 1), with one run's activations and
        the free memory (bytes), or None (not known)."""
        shapes = BaseShapes.from_config(getattr(run.base.model.base_model.model, "config", None))
        args = run.worker.trainer.args
        cuda = free_cuda_bytes()
        free = cuda[0] if cuda is not None else available_ram()
        if shapes is None or free is None:
            return None
        rows = int(args.per_device_train_batch_size) * (
            2 if run.kind.name == "DPO" else 1
        )  # chosen + rejected
        tokens = rows * int(getattr(args, "max_length", None) or 1024)
        per_run = activation_bytes(shapes, tokens, 2 if (args.bf16 or args.fp16) else 4)
        return max(1, 1 + int(0.8 * free) // max(per_run, 1)), per_run, free

    def _member(self, run: Any) -> PackMember:
        model, own = run.base.model, run.own

        def enter() -> None:
            own.activate()  # its zero_grad on the shared base
            run.kind.on_activate(run.worker.trainer)  # its forward (e.g. TRL's fused LM head settings)

        params = self._own_params(model, run.adapter)
        self._driver(model).install_backward(run.worker.trainer)
        return PackMember(run.run_id, run.adapter, run.worker, enter, params)

    def _own_params(self, model: Any, adapter: str) -> list[Any]:
        """The adapter's weights, in model order (what its trainer's optimizer holds)."""
        marker = f".{adapter}."
        return [p for name, p in model.named_parameters() if marker in name]

    def _driver(self, model: Any) -> PackDriver:
        driver = self._drivers.get(id(model))
        if driver is None or driver.model is not model:
            driver = self._drivers[id(model)] = PackDriver(model)
        return driver

    # ------------------------------------------------------------------ a member stopped before its turn
    def _rewind(self, run_id: int, status: str) -> None:
        if status == "DELETED":
            self._ahead.pop(run_id, None)
            return
        self._rewind_now(run_id)

    def _rewind_now(self, run_id: int) -> None:
        """Put ``run_id`` back at its last boundary: rebuilt from its snapshot there (or from its start), as a
        restart would; what it trained ahead is dropped."""
        self._ahead.pop(run_id, None)
        ex = self.ex
        run = ex.runs[run_id]
        # without a boundary in this process yet: where it started (a warm clone, a run continued after a restart)
        folder = _start_folder(run)
        if run.last is not None:
            ex.flush()  # a queued write of that very checkpoint finishes first
            folder = run.run_dir / f"checkpoint-{run.last.step}"
            if not (folder / "trainer_state.json").exists():
                write_snapshot(run.last, folder)
        spec = run.spec
        ex.drop_run(run_id)  # on the device thread: its train() unwinds and its adapter leaves the base now
        ex._add_run(run_id, spec, None, folder)
        if run.last is not None:
            _put_back(ex.runs[run_id], run.last)
        step = _position(ex.runs[run_id])  # the rebuilt run's start
        self._note(
            f"run {run_id}: stopped before the chunk it trained in its pack counted; it goes on from step {step}"
        )


def _put_back(run: Any, last: Any) -> None:
    """The rebuilt ``run`` holds its boundary snapshot ``last`` as before, and its adapter the weights of it: its
    trainer loads them only when its ``train()`` starts, while a STOPPED run's final weights are saved, and a warm
    clone of it starts from ``last``, at once."""
    from peft import set_peft_model_state_dict

    run.last = last
    loaded = set_peft_model_state_dict(run.base.model, last.weights, adapter_name=run.adapter)
    if loaded.unexpected_keys:
        raise RuntimeError(
            f"run {run.run_id}: its boundary weights do not fit its adapter: {loaded.unexpected_keys[:3]}"
        )


def _start_folder(run: Any) -> Path | None:
    """The checkpoint folder ``run``'s trainer was built to resume from (a restart's ``checkpoint-<step>``, a warm
    clone's ``warm-start-from-run-<p>-step-<s>``), or None (it started from scratch)."""
    folder = run.worker.resume_from
    return Path(folder) if folder else None


def _position(run: Any) -> int:
    """The global step ``run`` is parked at. A trainer whose ``train()`` has not started yet reads step 0 but
    starts at the step of the checkpoint it resumes from (a warm clone, a run rebuilt after a restart or a
    rewind): packing it by step 0 would train it in lockstep with runs at another position."""
    step = run.worker.step
    folder = _start_folder(run)
    if step == 0 and folder is not None:
        try:
            return checkpoint_step(folder)
        except (OSError, KeyError, ValueError):  # its train() fails on it too: never packed
            return -1
    return step
