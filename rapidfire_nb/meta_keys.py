"""Every key of an experiment store's ``meta`` table, in one place (standard library only, no imports).

The kernel writes them (the recorder, ``run_fit``'s start, clones, trackers); the kernel, the server page, the
static copy and a restarted kernel read them. Each value is JSON. Rank 0 in ``tests/test_import_layers.py``: the
view, the store, the server and the experiment may all import it.
"""

from __future__ import annotations

__all__ = [
    "ADDED_RUNS",
    "ALL",
    "CLOCK",
    "CLONES",
    "CREATED_AT",
    "DEVICES",
    "EARLY_STOPPING",
    "EARLY_STOPPING_BOOK",
    "EDITABLE_FIELDS",
    "ENDED_AT",
    "EVAL_DATA",
    "EVAL_GENERATION_SAMPLES",
    "EVAL_METRIC_NAMES",
    "FINGERPRINT",
    "HPARAM_COLUMNS",
    "METRIC_NAMES",
    "NAME",
    "NUM_CHUNKS",
    "PACKS",
    "PANEL_METRICS",
    "SEED",
    "TRACKED_RUNS",
    "TRACKERS",
    "TRAINER_TYPE",
    "TRAIN_DATA",
]

# ------------------------------------------------------------------------------------------------ the experiment

NAME = "name"
"""The experiment's name (written once, when its folder is created)."""

CREATED_AT = "created_at"
"""Unix seconds the experiment's folder was created."""

ENDED_AT = "ended_at"
"""Unix seconds ``experiment.end()`` ran, or None: while set, the server refuses ops (the inbox is closed)."""

FINGERPRINT = "fingerprint"
"""The config group's fingerprint: a later ``run_fit`` with another group is refused (or starts a new folder)."""

TRAINER_TYPE = "trainer_type"
"""``"SFT"``, ``"DPO"`` or ``"GRPO"``."""

HPARAM_COLUMNS = "hparam_columns"
"""The hyperparameters that differ between runs (the tables' and the panel's columns), a list of names."""

# ------------------------------------------------------------------------------------------------ run_fit's inputs

NUM_CHUNKS = "num_chunks"
"""Chunks per epoch."""

SEED = "seed"
"""``run_fit``'s seed."""

TRAIN_DATA = "train_data"
"""The training dataset as its summary (rows, fingerprint): a restart is checked against it."""

EVAL_DATA = "eval_data"
"""The evaluation dataset's summary, or None."""

EVAL_GENERATION_SAMPLES = "eval_generation_samples"
"""Rows of the eval set that generation metrics read, or None."""

PANEL_METRICS = "panel_metrics"
"""``run_fit(..., panel_metrics=[...], best_by=...)``: ``{"plots": [names] | None, "best_by": name | None}`` (None
for either: the trainer kind's defaults, :mod:`rapidfire_nb.view.metrics_view`)."""

# ------------------------------------------------------------------------------------------------ runs and metrics

EDITABLE_FIELDS = "editable_fields"
"""Run id (str) -> {hyperparameter -> JSON type name}: the fields a clone of that run may change from the panel,
the magic or the server."""

CLONES = "clones"
"""Run id (str) -> the recipe a clone was made with (parent, changes, warm start): a restart rebuilds the clone."""

ADDED_RUNS = "added_runs"
"""Run id (str) -> the info the early-stopping policy added that run with (e.g. ``{"source": "trial", "trial":
9}``, an Optuna trial number); a restarted kernel hands it back to the policy to rebuild the runs."""

METRIC_NAMES = "metric_names"
"""Every metric name in the store, sorted."""

EVAL_METRIC_NAMES = "eval_metric_names"
"""Generation metric names in the order they were first seen (the result tables' columns)."""

DEVICES = "devices"
"""Run id (str) -> the device it trains on (``{"3": "cpu:1"}``), written when the experiment trains on several
devices (``run_fit(devices=...)``); the server page and restarts read it."""

PACKS = "packs"
"""Run id (str) -> the id of the pack it trains in (the pack's smallest run id; ``{"3": 1}``), for the runs that
train packed (``run_fit(packing=...)``, :mod:`rapidfire_nb.spec.packs`); a run that left packing is removed. The
panel, the server page, ``get_runs_info()`` and a restarted kernel read it."""

# ------------------------------------------------------------------------------------------------ progress

CLOCK = "clock"
"""Training time: ``{"busy_s": seconds before the current stretch, "busy_since": unix s | None}``
(:meth:`rapidfire_nb.view.clock.TrainingClock.to_meta`)."""

EARLY_STOPPING = "early_stopping"
"""The early-stopping policy's progress (``EarlyStoppingPolicy.progress()``), written whenever it changes; the server
page and a kernel without the scheduler read it."""

EARLY_STOPPING_BOOK = "early_stopping_book"
"""What a rung policy decided, for a restarted kernel to rebuild: ``{"policy": its describe(), "events": [...]}``,
its rung book's events in order (each run's value at each rung with the metric, the rungs decided, the runs
judged: :mod:`kernel_scheduler.early_stopping.book`); appended by :mod:`rapidfire_nb.store.rung_book`."""

# ------------------------------------------------------------------------------------------------ trackers

TRACKERS = "trackers"
"""``{backend name: its state}`` (e.g. ``{"mlflow": {"uri", "experiment_id", "runs": {...}}}``): a restarted kernel
continues the same tracker runs."""

TRACKED_RUNS = "tracked_runs"
"""The ids of the ended runs (COMPLETED, FAILED) whose points every tracker wrote and flushed. A restart writes the
stored points of any other ended run to the trackers again (its kernel died before they wrote them)."""

ALL = frozenset(
    {
        NAME,
        CREATED_AT,
        ENDED_AT,
        FINGERPRINT,
        TRAINER_TYPE,
        HPARAM_COLUMNS,
        NUM_CHUNKS,
        SEED,
        TRAIN_DATA,
        EVAL_DATA,
        EVAL_GENERATION_SAMPLES,
        PANEL_METRICS,
        EDITABLE_FIELDS,
        CLONES,
        ADDED_RUNS,
        METRIC_NAMES,
        EVAL_METRIC_NAMES,
        DEVICES,
        PACKS,
        CLOCK,
        EARLY_STOPPING,
        EARLY_STOPPING_BOOK,
        TRACKERS,
        TRACKED_RUNS,
    }
)
"""Every meta key above."""
