"""Training time and tqdm-like progress of an experiment, the same in the kernel, the server page and scripts.

*Elapsed* is **training time**: the seconds during which at least one run was NEW or ONGOING (in the rotation).
It stops while nothing trains (every run stopped, finished or failed, or the experiment ended) and goes on when a
run is resumed or cloned. The kernel's recorder keeps a :class:`TrainingClock` and writes its state to the store's
meta (``clock``: ``{"busy_s": seconds before the current stretch, "busy_since": unix s | None}``) only when the
experiment starts or stops training; :func:`training_seconds` reads it back for the kernel's panel, the server
page and the static copy alike, so they agree.

:func:`progress_stats` derives the header's numbers from a snapshot's runs and the training time: overall
percentage, optimizer steps per second, seconds per chunk and the time left. Standard library +
:mod:`kernel_scheduler` only (the server extension imports it through :mod:`rapidfire_nb.view`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from kernel_scheduler import RunStatus

from .. import meta_keys

__all__ = [
    "CLOCK_META_KEY",
    "TrainingClock",
    "fmt_duration",
    "percent_text",
    "progress_stats",
    "stats_text",
    "training_seconds",
]

#: The store meta key holding :meth:`TrainingClock.to_meta` (:data:`rapidfire_nb.meta_keys.CLOCK`).
CLOCK_META_KEY = meta_keys.CLOCK


def training_seconds(
    clock: Any, now: float, *, writer_alive: bool = True, last_beat: float | None = None
) -> float:
    """Seconds of training recorded in a meta ``clock``, up to ``now``.

    Args:
        clock: the meta value (:meth:`TrainingClock.to_meta`); anything else counts as no training.
        now: unix seconds.
        writer_alive: whether the process that trains is alive; a dead writer's open stretch ends at
            ``last_beat`` (its last heartbeat), or adds nothing when that is unknown.
        last_beat: unix seconds of the writer's last heartbeat.

    Returns:
        Seconds (>= 0).
    """
    if not isinstance(clock, Mapping):
        return 0.0
    busy = _number(clock.get("busy_s")) or 0.0
    since = _number(clock.get("busy_since"))
    if since is not None:
        end = now if writer_alive else (last_beat if last_beat is not None else since)
        busy += max(0.0, end - since)
    return max(0.0, busy)


def is_training(clock: Any, writer_alive: bool = True) -> bool:
    """Whether ``clock`` (a meta value) is in a training stretch of a live writer."""
    return writer_alive and isinstance(clock, Mapping) and _number(clock.get("busy_since")) is not None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


class TrainingClock:
    """The training-time state of one writer (the kernel's recorder), fed every run status change.

    Args:
        previous: the meta ``clock`` an earlier process left (its seconds are kept), or None.
        last_beat: that process's last heartbeat (ends a stretch it left open when it died).

    Not thread-safe: one thread (the scheduler's) calls :meth:`observe`.
    """

    def __init__(self, previous: Any = None, last_beat: float | None = None) -> None:
        self.busy_s = training_seconds(previous, 0.0, writer_alive=False, last_beat=last_beat)
        self.busy_since: float | None = None
        self._statuses: dict[int, RunStatus] = {}

    def observe(self, run_id: int, status: RunStatus, now: float) -> bool:
        """Note run ``run_id``'s status at ``now`` (unix s); True when training started or stopped."""
        self._statuses[run_id] = status
        busy = any(s.in_rotation() for s in self._statuses.values())
        if busy and self.busy_since is None:
            self.busy_since = now
            return True
        if not busy and self.busy_since is not None:
            self.busy_s += max(0.0, now - self.busy_since)
            self.busy_since = None
            return True
        return False

    def to_meta(self) -> dict[str, float | None]:
        """The meta ``clock`` value (see the module docstring)."""
        return {"busy_s": self.busy_s, "busy_since": self.busy_since}


def fmt_duration(seconds: float | None) -> str:
    """``m:ss`` or ``h:mm:ss`` (the front end's ``fmtElapsed``); ``-`` for None."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = max(0, int(seconds))
    h, m, sec = s // 3600, s % 3600 // 60, s % 60
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def progress_stats(runs: Iterable[Mapping[str, Any]], elapsed_s: float, training: bool) -> dict[str, Any]:
    """The header's tqdm-like numbers for a snapshot's runs.

    Work planned counts every step of runs in the rotation or completed, and the steps done by runs that
    stopped or failed (their remaining steps are not planned: the time left is for the planned work); DELETED runs
    do not count. The percentage is of the full budget (every run's ``total_steps``, DELETED ones left out), so it
    reads 100 only when every run has its full budget, never for an experiment whose runs were stopped short;
    ``short_runs`` counts those (STOPPED, FAILED or INTERRUPTED before their budget). Rates are steps and chunks done
    per second of training time; the front end smooths the time left (widgets/eta.js).

    Args:
        runs: the snapshot's runs (``status``, ``completed_steps``, ``total_steps``, ``chunks_done``).
        elapsed_s: training seconds (:func:`training_seconds`).
        training: whether the experiment trains now (the time left is shown only then).

    Returns:
        ``{"percent", "steps_done", "steps_planned", "steps_budget", "short_runs", "steps_per_s", "s_per_chunk",
        "eta_s", "elapsed_s", "training"}``; a number that cannot be known yet is None.
    """
    done = planned = chunks = budget = short = 0
    left = 0
    for run in runs:
        status = run.get("status")
        if status == RunStatus.DELETED.value:
            continue
        steps, total = int(run.get("completed_steps") or 0), int(run.get("total_steps") or 0)
        active = status in (RunStatus.NEW.value, RunStatus.ONGOING.value)
        done += steps
        chunks += int(run.get("chunks_done") or 0)
        budget += max(total, steps)
        if not active and status != RunStatus.COMPLETED.value and steps < total:
            short += 1
        if active or status == RunStatus.COMPLETED.value:
            planned += max(total, steps)
            if active:
                left += max(0, total - steps)
        else:
            planned += steps
    rate = done / elapsed_s if elapsed_s > 1.0 and done else None
    return {
        "percent": 100.0 * done / budget if budget else None,
        "steps_done": done,
        "steps_planned": planned,
        "steps_budget": budget,
        "short_runs": short,
        "steps_per_s": rate,
        "s_per_chunk": elapsed_s / chunks if chunks and elapsed_s > 0 else None,
        "eta_s": left / rate if training and rate and left else (0.0 if training and not left else None),
        "elapsed_s": elapsed_s,
        "training": training,
    }


def percent_text(percent: float) -> str:
    """A percentage rounded to a whole number, except that under 100 never reads "100" (``widgets/format.js``)."""
    return "99" if 99.5 <= percent < 100 else f"{percent:.0f}"


def stats_text(stats: Mapping[str, Any]) -> str:
    """E.g. ``"45% · 3.2 steps/s · 12 s/chunk · 1:23 left"``, ``"62% · 2 runs short of budget · ..."`` (what is not
    known yet is left out; "100%" only when every run has its full budget: 99.6 % reads 99 %)."""
    parts = []
    if stats.get("percent") is not None:
        parts.append(f"{percent_text(stats['percent'])}%")
    short = stats.get("short_runs") or 0
    if short:
        parts.append(f"{short} run{'' if short == 1 else 's'} short of budget")
    rate = stats.get("steps_per_s")
    if rate:
        parts.append(f"{rate:.3g} steps/s" if rate >= 1 else f"{1 / rate:.3g} s/step")
    if stats.get("s_per_chunk"):
        parts.append(f"{stats['s_per_chunk']:.3g} s/chunk")
    if stats.get("training") and stats.get("eta_s") is not None:
        parts.append(f"{fmt_duration(stats['eta_s'])} left")
    return " · ".join(parts)
