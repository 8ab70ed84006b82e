"""Clone-modify: a new run from a parent's spec plus changes, recorded so a restarted kernel rebuilds it.

A clone's changes are stored as JSON in the experiment's meta (``clones``: ``{child id: {"parent", "changes",
"warm", "functions"}}``). A function given as a change from code (``formatting_func``, ``reward_funcs``,
``compute_metrics``) is stored by reference, ``{"__function__": "module:qualname"}`` — nothing is pickled — and
the recipe's ``functions`` lists the keys that were given functions. After a restart only those keys are looked
up again, only if they are function fields, and only to a Python function whose own ``module:qualname`` is the
reference: any other ``{"__function__": ...}`` value (written by anything but this code, e.g. a clone posted to
the server's inbox with a dict in ``model_kwargs``) stays plain data, or is an error naming the key.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import meta_keys
from ..errors import ConfigError, OpError
from ..run_folder import checkpoint_step, latest_checkpoint, readable_checkpoint, run_dir
from ..spec import FUNCTION_KEYS
from ..training.kinds import WARM_FORBIDDEN, warm_start_violations  # torch-free: the kinds' warm-start rules

__all__ = [
    "CloneRequest",
    "WARM_FORBIDDEN",
    "check_continuation",
    "continued_total",
    "decode_changes",
    "encode_changes",
    "final_state_missing",
    "function_keys",
    "prepare_clone",
    "rebuild_clone_spec",
    "record_clone",
]


@dataclass(frozen=True)
class CloneRequest:
    """A checked clone: the child's spec and what the op carries (``changes`` as JSON, ``warm_start``).

    Attributes:
        functions: the keys of ``changes`` given functions (recorded so that only they are decoded again).
    """

    spec: Any
    changes: Mapping[str, Any]
    encoded: dict[str, Any]
    warm_start: bool
    functions: tuple[str, ...] = ()

    def payload(self) -> dict[str, Any]:
        """The op payload the scheduler receives (the spec is not stored with the op)."""
        return {"changes": self.encoded, "warm_start": self.warm_start, "spec": self.spec}


def prepare_clone(
    parent: Any,
    run_id: int,
    changes: Mapping[str, Any] | None,
    warm_start: bool,
    source: str,
    parent_run: Any = None,
) -> CloneRequest:
    """Check a clone of run ``run_id`` (spec ``parent``) and build the child's spec.

    Args:
        parent: the parent's run spec, or None when the run does not exist.
        changes: ``{hparam name: value}`` (the ``hparams()`` naming scheme).
        warm_start: start from the parent's latest chunk boundary (a finished parent's final state).
        source: who asks; only ``"api"`` may change function-valued fields.
        parent_run: the parent's :class:`~kernel_scheduler.RunSnapshot` (status, step, steps per epoch), or None;
            a warm clone of a COMPLETED or STOPPED parent continues it and must train past its step
            (:func:`check_continuation`).

    Raises:
        OpError: unknown run, a change a warm start cannot take (suggests a cold clone), or a continuation whose
            budget does not reach past the parent's step (names ``max_steps`` and the smallest value that does).
        ConfigError: unknown field (with the closest valid name) or invalid value.
    """
    if parent is None:
        raise OpError(f"run {run_id} does not exist")
    changes = dict(changes or {})
    if warm_start:
        bad = warm_start_violations(changes)
        if bad:
            raise OpError(
                f"{', '.join(bad)} cannot be changed in a warm start (it changes how data is batched or "
                "sampled, or the adapter's shape); use a cold clone (warm_start=False)"
            )
    child = parent.with_changes(changes, allow_functions=(source == "api"))
    if warm_start and parent_run is not None:
        check_continuation(child, run_id, changes, parent_run)
    return CloneRequest(child, changes, encode_changes(changes), bool(warm_start), function_keys(changes))


def continued_total(child: Any, changes: Mapping[str, Any], parent_run: Any) -> int | None:
    """The optimizer steps a warm clone of ``parent_run`` trains in all (the parent's included): its
    ``max_steps`` when > 0, else the parent's total when the budget is not changed (``num_train_epochs`` cannot
    change in a warm start, and a warm clone batches like its parent). None when it cannot be told before the
    trainer is built (``max_steps`` changed to -1: epochs x steps per epoch; the build checks it then)."""
    max_steps = (getattr(child, "training", None) or {}).get("max_steps", -1)
    if isinstance(max_steps, int) and not isinstance(max_steps, bool) and max_steps > 0:
        return max_steps
    if "max_steps" not in changes:
        return int(parent_run.total_steps) or None
    return None


def check_continuation(child: Any, run_id: int, changes: Mapping[str, Any], parent_run: Any) -> None:
    """Refuse a warm clone that would start at its parent's end and not train past it.

    A warm clone of a finished (COMPLETED or STOPPED) run continues it from its final state; one asked for while
    the parent trains its last chunk waits for that chunk's end, which is the parent's end too. Either way it
    trains until its ``completed_steps`` (the parent's steps included) reach its total, so the total must exceed
    the step it starts at.

    Raises:
        OpError: naming ``max_steps`` and the fix (more epochs: ``max_steps`` = epochs x steps per epoch).
    """
    status = getattr(parent_run.status, "value", parent_run.status)
    step = int(parent_run.step)
    last_chunk = (
        status == "ONGOING"
        and bool(parent_run.on_device)
        and int(parent_run.num_segments) > 0
        and int(parent_run.segments_done) >= int(parent_run.num_segments) - 1
    )
    if last_chunk:
        status, step = "in its last chunk: a warm clone starts where it ends,", int(parent_run.total_steps)
    elif status not in ("COMPLETED", "STOPPED") or step < 1:
        return
    total = continued_total(child, changes, parent_run)
    if total is None or total > step:
        return
    max_steps = (getattr(child, "training", None) or {}).get("max_steps", -1)
    if isinstance(max_steps, int) and max_steps > 0:
        given = f"max_steps={max_steps}" + ("" if "max_steps" in changes else f" (run {run_id}'s, kept)")
    else:
        given = f"its budget of {total} steps (num_train_epochs x steps per epoch; no max_steps given)"
    raise OpError(
        f"{given} does not continue run {run_id}: it is {status} at step {step}, and a warm clone trains until "
        f"its completed_steps (run {run_id}'s {step} included) reach max_steps; set max_steps above {step}, "
        f"e.g. max_steps={2 * step}" + (", or clone it cold (warm_start=False)" if last_chunk else "")
    )


def final_state_missing(experiment_dir: Path, run_id: int, step: int) -> str | None:
    """Why run ``run_id``, finished at optimizer ``step`` before this ``run_fit``, cannot be continued from disk; None
    when it can: its last checkpoint (the final state the kernel that trained it wrote: adapter, optimizer,
    scheduler, RNG, trainer state) is complete, readable and at ``step``."""
    folder = latest_checkpoint(run_dir(experiment_dir, run_id))
    if folder is None:
        return "no checkpoint of it is on disk (it was removed)"
    if not readable_checkpoint(folder):
        return f"its checkpoint {folder.name} is damaged"
    at = checkpoint_step(folder)
    if at != step:
        return (
            f"its last checkpoint is at step {at}, not at its final step {step} (it finished before rapidfire_nb "
            "kept a finished run's final state)"
        )
    return None


def record_clone(store: Any, child_id: int, parent_id: int, request: CloneRequest) -> None:
    """Write the child's run row and its recipe (meta ``clones``) to the store."""
    spec = request.spec
    store.upsert_run(
        child_id,
        status="NEW",
        config=spec.to_json(),
        hparams=spec.hparams(),
        fingerprint=spec.fingerprint(),
        source="clone",
        parent_id=int(parent_id),
        warm_start=request.warm_start,
        total_steps=0,
        completed_steps=0,
        chunks_done=0,
        epoch=0.0,
        samples_seen=0,
    )
    clones = store.get_meta(meta_keys.CLONES, {}) or {}
    clones[str(child_id)] = {
        "parent": int(parent_id),
        "changes": request.encoded,
        "warm": request.warm_start,
        "functions": list(request.functions),
    }
    store.set_meta(meta_keys.CLONES, clones)


def rebuild_clone_spec(parent: Any, recipe: Mapping[str, Any]) -> Any:
    """A stored clone's spec after a restart: its parent's spec with the recorded changes.

    Raises:
        ConfigError: a recorded function is gone (a lambda, or its cell not run again), a reference the
            recipe does not record as a function, or a change that no longer validates.
    """
    changes = decode_changes(recipe.get("changes") or {}, recipe.get("functions") or ())
    return parent.with_changes(changes, allow_functions=True)


def function_keys(changes: Mapping[str, Any]) -> tuple[str, ...]:
    """The keys of ``changes`` whose value is a function or a list of functions (as given in code)."""

    def is_function(value: Any) -> bool:
        if isinstance(value, (list, tuple)):
            return bool(value) and all(callable(v) for v in value)
        return callable(value)

    return tuple(k for k, v in changes.items() if is_function(v))


def encode_changes(changes: Mapping[str, Any]) -> dict[str, Any]:
    """A clone's changes as JSON: a function (or a list of functions, e.g. ``reward_funcs``) is stored by reference,
    ``{"__function__": "module:qualname"}``, so a restarted kernel can find it again (nothing is pickled); the
    keys that hold them are :func:`function_keys` (stored beside, the only ones decoded again)."""

    def one(value: Any) -> Any:
        if callable(value):
            return {
                "__function__": f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', '?')}"
            }
        if isinstance(value, (list, tuple)):
            return [one(v) for v in value]
        return value

    return {k: one(v) for k, v in changes.items()}


def decode_changes(changes: Mapping[str, Any], functions: Iterable[str] = ()) -> dict[str, Any]:
    """The inverse of :func:`encode_changes` for the keys ``functions`` (the recipe's record of the keys given
    functions in code): their references are looked up in their (already imported) module — ``__main__`` is the
    notebook's namespace, so its cells must have been run again. Every other value is data, returned as stored.

    Raises:
        ConfigError: ``functions`` names a key that takes no function; a function key's value is a reference the
            recipe does not record as one; a reference that is not a Python function defined under that name
            (a lambda, a nested function, a cell not re-run, a builtin or an alias such as ``os:system``).
    """
    recorded = set(functions)
    for key in sorted(recorded):
        if key not in FUNCTION_KEYS:
            raise ConfigError(
                f"this clone's recipe records {key!r} as a function, but only {', '.join(FUNCTION_KEYS)} take "
                "functions; the recipe was not written by rapidfire_nb — clone the run again"
            )
    out = {}
    for key, value in changes.items():
        if key in recorded:
            out[key] = [_lookup(key, v) for v in value] if isinstance(value, list) else _lookup(key, value)
        elif key in FUNCTION_KEYS and _has_reference(value):
            raise ConfigError(
                f"this clone's {key!r} is a function reference its recipe does not record as given in code; it "
                "is not looked up — clone the run again with the function"
            )
        else:
            out[key] = value
    return out


def _has_reference(value: Any) -> bool:
    if isinstance(value, list):
        return any(_has_reference(v) for v in value)
    return isinstance(value, dict) and "__function__" in value


def _lookup(key: str, value: Any) -> Any:
    """The function a ``{"__function__": "module:qualname"}`` reference of change ``key`` names."""
    if not (
        isinstance(value, dict) and set(value) == {"__function__"} and isinstance(value["__function__"], str)
    ):
        raise ConfigError(f"this clone's {key!r} should be a function reference, got {value!r}")
    ref = value["__function__"]
    module_name, _, qualname = ref.partition(":")
    target: Any = sys.modules.get(module_name)
    for part in qualname.split("."):
        target = getattr(target, part, None) if target is not None else None
    if target is None:
        raise ConfigError(
            f"the function {qualname!r} of module {module_name!r} that this clone was given "
            "is not defined in this process (define it again, e.g. re-run its cell)"
        )
    if not inspect.isfunction(target) or f"{target.__module__}:{target.__qualname__}" != ref:
        raise ConfigError(
            f"this clone's {key!r} refers to {ref!r}, which is not a Python function defined under that name "
            f"(it is {type(target).__name__} {getattr(target, '__module__', '?')}:"
            f"{getattr(target, '__qualname__', '?')}); only functions given in code are looked up again"
        )
    return target
