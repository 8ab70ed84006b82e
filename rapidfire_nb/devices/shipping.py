"""Sending user code (``create_model_fn``, run specs with their functions) to a worker process.

:func:`ship` pickles with cloudpickle, which sends functions defined in ``__main__`` (a notebook cell, a script)
and closures by value, and everything importable by reference (the worker imports it). Before pickling it looks
into what would travel by value (a function's closure cells, the globals its code names, its defaults, a
partial's arguments, a dataclass' or plain object's fields, containers) for things that cannot or must not cross
a process boundary, so that the user reads which function is at fault and what to do, before any training:

* a loaded model (a ``torch.nn.Module``): it would be copied into every worker, on the wrong device;
* a threading lock, an open file or socket: they do not pickle.

Any other pickling failure is reported as a :class:`~rapidfire_nb.errors.ConfigError` too.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import socket
import sys
import threading
import types
from typing import Any

import cloudpickle

from rapidfire_nb.errors import ConfigError

__all__ = ["ship", "unship"]

_LOCKS = (type(threading.Lock()), type(threading.RLock()))
_MAX_DEPTH = 6  # levels of closures / fields / items looked into
_MAX_ITEMS = 1000  # items of one container looked at


def ship(obj: Any, what: str) -> bytes:
    """``obj`` as bytes a worker process can load with :func:`unship`.

    Args:
        obj: a function, a run spec (``LeafConfig``), a tuple of them...
        what: what ``obj`` is, for messages: ``"create_model_fn"``, ``"run 3's config"``.

    Raises:
        ConfigError: ``obj`` refers to a loaded model, a lock, an open file or socket, or fails to pickle; the
            message names ``what`` and the culprit.
    """
    problem = _find_problem(obj, what, 0, set())
    if problem is not None:
        raise ConfigError(f"{what} cannot be sent to a worker process: {problem}")
    try:
        data: bytes = cloudpickle.dumps(obj)
    except Exception as exc:
        raise ConfigError(
            f"{what} cannot be sent to a worker process: pickling failed with {type(exc).__name__}: {exc}; "
            "define what it needs inside it (or import it there)"
        ) from exc
    return data


def unship(data: bytes) -> Any:
    """The object :func:`ship` pickled (raises what unpickling raises, e.g. ModuleNotFoundError)."""
    return cloudpickle.loads(data)


def _kind(value: Any) -> str | None:
    """Why ``value`` must not travel, or None."""
    torch = sys.modules.get("torch")  # no torch loaded: no torch.nn.Module can exist
    if torch is not None and isinstance(value, torch.nn.Module):
        return f"a loaded model (torch.nn.Module {type(value).__name__})"
    if isinstance(value, _LOCKS) or isinstance(value, (threading.Condition, threading.Semaphore)):
        return "a threading lock"
    if isinstance(value, io.IOBase) and not isinstance(value, (io.BytesIO, io.StringIO)):
        return "an open file"
    if isinstance(value, socket.socket):
        return "an open socket"
    return None


_ADVICE = {
    "a loaded model": "load the model inside create_model_fn (each worker loads its own)",
    "a threading lock": "create it inside the function",
    "an open file": "open it inside the function",
    "an open socket": "open it inside the function",
}


def _advice(kind: str) -> str:
    return next(text for prefix, text in _ADVICE.items() if kind.startswith(prefix))


def _by_value(fn: types.FunctionType) -> bool:
    """True when cloudpickle sends ``fn``'s code and globals (not a reference the worker imports)."""
    module = getattr(fn, "__module__", None)
    return module == "__main__" or module not in sys.modules or "<locals>" in fn.__qualname__


def _find_problem(obj: Any, where: str, depth: int, seen: set[int]) -> str | None:
    """The first thing under ``obj`` that must not travel, described with where it is; None if none."""
    if depth > _MAX_DEPTH or id(obj) in seen:
        return None
    seen.add(id(obj))
    kind = _kind(obj)
    if kind is not None:
        return f"it refers to {kind} ({where}); {_advice(kind)}"
    for label, child in _children(obj):
        found = _find_problem(child, label, depth + 1, seen)
        if found is not None:
            return found
    return None


def _children(obj: Any) -> list[tuple[str, Any]]:
    """``(where, value)`` of what pickling ``obj`` by value would also pickle."""
    name = getattr(obj, "__name__", type(obj).__name__)
    if isinstance(obj, types.FunctionType):
        if not _by_value(obj):
            return []
        out = []
        for var, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ()):
            try:
                out.append((f"`{var}` in the closure of {name}", cell.cell_contents))
            except ValueError:  # an empty cell
                continue
        for var in _global_names(obj.__code__):
            if var in obj.__globals__:
                out.append((f"global `{var}` of {name}", obj.__globals__[var]))
        out += [(f"a default argument of {name}", d) for d in obj.__defaults__ or ()]
        out += [(f"default `{k}` of {name}", v) for k, v in (obj.__kwdefaults__ or {}).items()]
        return out
    if isinstance(obj, types.MethodType):
        return [(f"the object of method {name}", obj.__self__), (name, obj.__func__)]
    if isinstance(obj, functools.partial):
        return [("the function of a partial", obj.func), *[("a partial's argument", a) for a in obj.args]] + [
            (f"a partial's argument `{k}`", v) for k, v in obj.keywords.items()
        ]
    if isinstance(obj, dict):
        return [(f"`{k}`", v) for k, v in list(obj.items())[:_MAX_ITEMS]]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [(f"item {i}", v) for i, v in enumerate(list(obj)[:_MAX_ITEMS])]
    if isinstance(obj, (str, bytes, int, float, bool, type(None), types.ModuleType, type)):
        return []
    if dataclasses.is_dataclass(obj):
        return [(f.name, getattr(obj, f.name, None)) for f in dataclasses.fields(obj)]
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict):
        return [(f"`{k}` of a {type(obj).__name__}", v) for k, v in list(attrs.items())[:_MAX_ITEMS]]
    return []


def _global_names(code: types.CodeType) -> list[str]:
    """The global names ``code`` (and the functions nested in it) refers to."""
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _global_names(const)
    return names
