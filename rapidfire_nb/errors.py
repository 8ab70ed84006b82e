"""Exceptions raised by rapidfire_nb (all importable without torch)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["ConfigError", "ExperimentError", "OpError", "closest_name"]


class ConfigError(ValueError):
    """Bad user input found before any training starts.

    The message always names the offending field and says how to fix it.
    """


class ExperimentError(RuntimeError):
    """An experiment-level misuse (e.g. ``run_fit`` while training, a different config group)."""


class OpError(ValueError):
    """An IC Op that cannot be accepted (unknown run id, illegal for the run's status, bad changes)."""


def closest_name(name: str, candidates: Iterable[str]) -> str | None:
    """Return the candidate closest to ``name`` (difflib ratio >= 0.6), or ``None``."""
    matches = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None
