"""Clone-modify: a new run from a parent's spec plus changes, recorded so a restarted kernel rebuilds it.

A clone's changes are stored as JSON in the experiment's meta (``clones``: ``{child id: {"parent", "changes",
"warm"}}``). A function given as a change (``formatting_func``, ``reward_funcs``, ``compute_metrics``) is stored by
reference, ``{"__function__": "module:qualname"}`` — nothing is pickled — and looked up again after a restart.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, OpError
from ..training.kinds import WARM_FORBIDDEN, warm_start_violations  # torch-free: the kinds' warm-start rules

__all__ = [
    "CloneRequest",
    "WARM_FORBIDDEN",
    "decode_changes",
    "encode_changes",
    "prepare_clone",
    "rebuild_clone_spec",
    "record_clone",
]


@dataclass(frozen=True)
class CloneRequest:
    """A checked clone: the child's spec and what the op carries (``changes`` as JSON, ``warm_start``)."""

    spec: Any
    changes: Mapping[str, Any]
    encoded: dict[str, Any]
    warm_start: bool

    def payload(self) -> dict[str, Any]:
        """The op payload the scheduler receives (the spec is not stored with the op)."""
        return {"changes": self.encoded, "warm_start": self.warm_start, "spec": self.spec}


def prepare_clone(
    parent: Any, run_id: int, changes: Mapping[str, Any] | None, warm_start: bool, source: str
) -> CloneRequest:
    """Check a clone of run ``run_id`` (spec ``parent``) and build the child's spec.

    Args:
        parent: the parent's run spec, or None when the run does not exist.
        changes: ``{hparam name: value}`` (the ``hparams()`` naming scheme).
        warm_start: start from the parent's latest chunk boundary.
        source: who asks; only ``"api"`` may change function-valued fields.

    Raises:
        OpError: unknown run, or a change a warm start cannot take (suggests a cold clone).
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
    return CloneRequest(child, changes, encode_changes(changes), bool(warm_start))


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
    clones = store.get_meta("clones", {}) or {}
    clones[str(child_id)] = {"parent": int(parent_id), "changes": request.encoded, "warm": request.warm_start}
    store.set_meta("clones", clones)


def rebuild_clone_spec(parent: Any, recipe: Mapping[str, Any]) -> Any:
    """A stored clone's spec after a restart: its parent's spec with the recorded changes.

    Raises:
        ConfigError: a recorded function is gone (a lambda, or its cell not run again), or a change no longer
            validates.
    """
    return parent.with_changes(decode_changes(recipe.get("changes") or {}), allow_functions=True)


def encode_changes(changes: Mapping[str, Any]) -> dict[str, Any]:
    """A clone's changes as JSON: a function (or a list of functions, e.g. ``reward_funcs``) is stored by reference,
    ``{"__function__": "module:qualname"}``, so a restarted kernel can find it again (nothing is pickled)."""

    def one(value: Any) -> Any:
        if callable(value):
            return {
                "__function__": f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', '?')}"
            }
        if isinstance(value, (list, tuple)):
            return [one(v) for v in value]
        return value

    return {k: one(v) for k, v in changes.items()}


def decode_changes(changes: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`encode_changes`: function references are looked up in their (already imported)
    module — ``__main__`` is the notebook's namespace, so its cells must have been run again.

    Raises:
        ConfigError: a referenced function is not there (a lambda, a nested function, or a cell not re-run).
    """

    def one(value: Any) -> Any:
        if isinstance(value, dict) and set(value) == {"__function__"}:
            module_name, _, qualname = str(value["__function__"]).partition(":")
            target: Any = sys.modules.get(module_name)
            for part in qualname.split("."):
                target = getattr(target, part, None) if target is not None else None
            if not callable(target):
                raise ConfigError(
                    f"the function {qualname!r} of module {module_name!r} that this clone was given "
                    "is not defined in this process (define it again, e.g. re-run its cell)"
                )
            return target
        if isinstance(value, list):
            return [one(v) for v in value]
        return value

    return {k: one(v) for k, v in changes.items()}
