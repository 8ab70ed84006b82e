"""The store's SQL schema, its migrations, errors and value helpers (standard library only)."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from enum import Enum
from pathlib import Path
from typing import Any

from rapidfire_nb import meta_keys
from rapidfire_nb.errors import ExperimentError
from rapidfire_nb.paths import STORE_FILENAME

SCHEMA_VERSION = 2
"""Stored in ``PRAGMA user_version``; bump it and add an entry to ``_MIGRATIONS`` to change the schema."""

BUSY_TIMEOUT_MS = 5000

OP_STATES = ("queued", "applied", "rejected")
RUN_SOURCES = ("fit", "clone")

RUN_FIELDS = (
    "status",
    "config",
    "hparams",
    "fingerprint",
    "parent_id",
    "warm_start",
    "source",
    "total_steps",
    "completed_steps",
    "chunks_done",
    "num_segments",
    "epoch",
    "samples_seen",
    "checkpoint_dir",
    "last_checkpoint",
    "error",
    "created_at",
    "updated_at",
)
"""Columns ``upsert_run`` accepts. SQL identifiers are only ever taken from this fixed tuple."""

_RUN_JSON_FIELDS = frozenset({"config", "hparams"})

_SCHEMA_V1 = (
    """CREATE TABLE meta (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )""",
    """CREATE TABLE runs (
        run_id          INTEGER PRIMARY KEY,
        status          TEXT NOT NULL DEFAULT 'NEW',
        config          TEXT NOT NULL DEFAULT '{}',
        hparams         TEXT NOT NULL DEFAULT '{}',
        fingerprint     TEXT,
        parent_id       INTEGER,
        warm_start      INTEGER NOT NULL DEFAULT 0,
        source          TEXT NOT NULL DEFAULT 'fit',
        total_steps     INTEGER NOT NULL DEFAULT 0,
        completed_steps INTEGER NOT NULL DEFAULT 0,
        chunks_done     INTEGER NOT NULL DEFAULT 0,
        epoch           REAL NOT NULL DEFAULT 0,
        samples_seen    INTEGER NOT NULL DEFAULT 0,
        checkpoint_dir  TEXT,
        last_checkpoint TEXT,
        error           TEXT,
        created_at      REAL NOT NULL,
        updated_at      REAL NOT NULL
    )""",
    """CREATE TABLE metrics (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id       INTEGER NOT NULL,
        step         INTEGER NOT NULL,
        samples_seen INTEGER,
        name         TEXT NOT NULL,
        value        REAL,
        wall_time    REAL NOT NULL
    )""",
    "CREATE INDEX metrics_by_run_name ON metrics (run_id, name, id)",
    "CREATE INDEX metrics_by_name ON metrics (name, run_id, id)",
    """CREATE TABLE ops (
        op_id        TEXT PRIMARY KEY,
        run_id       INTEGER,
        kind         TEXT NOT NULL,
        payload      TEXT NOT NULL DEFAULT 'null',
        source       TEXT NOT NULL,
        state        TEXT NOT NULL CHECK (state IN ('queued', 'applied', 'rejected')),
        message      TEXT NOT NULL DEFAULT '',
        requested_at REAL NOT NULL,
        applied_at   REAL
    )""",
    "CREATE INDEX ops_by_time ON ops (requested_at)",
    """CREATE TABLE inbox (
        id        INTEGER PRIMARY KEY AUTOINCREMENT,
        op_id     TEXT NOT NULL UNIQUE,
        run_id    INTEGER,
        kind      TEXT NOT NULL,
        payload   TEXT NOT NULL DEFAULT 'null',
        posted_at REAL NOT NULL,
        taken_at  REAL
    )""",
    "CREATE INDEX inbox_untaken ON inbox (taken_at, id)",
    """CREATE TABLE heartbeat (
        id      INTEGER PRIMARY KEY CHECK (id = 1),
        pid     INTEGER NOT NULL,
        host    TEXT NOT NULL,
        beat_at REAL NOT NULL
    )""",
)

_SCHEMA_V2 = ("ALTER TABLE runs ADD COLUMN num_segments INTEGER",)
"""v2: a run's chunks over all its epochs (its chunk plan's ``num_segments``), so readers can show done/total."""

_MIGRATIONS: dict[int, tuple[str, ...]] = {1: _SCHEMA_V1, 2: _SCHEMA_V2}
"""``_MIGRATIONS[v]`` turns a version ``v - 1`` database into version ``v`` (0 = empty file)."""

_OLDEST_READABLE = 1
"""A read-only store opens databases from this version on (later versions only add columns; missing ones read as
absent keys)."""


class StoreError(ExperimentError):
    """The experiment store cannot be used as asked."""


class ReadOnlyStoreError(StoreError):
    """A write was attempted through a ``Store(..., read_only=True)``."""


class SchemaVersionError(StoreError):
    """The database was written by a different (usually newer) version of rapidfire_nb."""


class ExperimentEndedError(StoreError):
    """An op was posted to the inbox of an experiment its kernel has ended (meta ``ended_at`` is set)."""


class OpIdReusedError(StoreError):
    """An op was posted with the ``op_id`` of an earlier op of another kind or run (an op id names one request)."""


def check_op_id(conn: sqlite3.Connection, op_id: str, kind: str, run_id: int | None) -> bool:
    """Whether ``op_id`` was already answered: True when the ops log holds this same op applied or rejected (the
    same request again is a duplicate; nothing new is queued).

    Raises:
        OpIdReusedError: ``op_id`` names an op of another kind or run, posted to the inbox or in the ops log.
            Source: the kernel's rule (``FitSession.submit``), so REST and the kernel refuse it in the same words.
    """
    answered = False
    for table in ("inbox", "ops"):
        columns = "kind, run_id, state" if table == "ops" else "kind, run_id"
        row = conn.execute(f"SELECT {columns} FROM {table} WHERE op_id = ?", (op_id,)).fetchone()
        if row is not None and (row["kind"], row["run_id"]) != (kind, run_id):
            raise OpIdReusedError(
                f"op id {op_id!r} was already used by the {row['kind']} of run {row['run_id']}; an op id names one "
                "request: leave op_id out or use a new one"
            )
        answered = answered or (
            row is not None and table == "ops" and row["state"] in ("applied", "rejected")
        )
    return answered


def post_inbox_row(conn: sqlite3.Connection, params: tuple[Any, ...], experiment_dir: Any) -> bool:
    """Insert one inbox op (``params``: op id, run id, kind, payload JSON, posted at) in the caller's transaction.

    Returns:
        True if posted; False for a duplicate (the same op posted before, or answered already: the ops log).

    Raises:
        ExperimentEndedError: the experiment's kernel ended it (meta ``ended_at``).
        OpIdReusedError: the op id names another op (:func:`check_op_id`).
    """
    ended = conn.execute("SELECT value FROM meta WHERE key = ?", (meta_keys.ENDED_AT,)).fetchone()
    if ended is not None and json.loads(ended["value"]) is not None:
        raise ExperimentEndedError(f"the experiment in {experiment_dir} has ended; its inbox is closed")
    if check_op_id(conn, params[0], params[2], params[1]):
        return False  # answered already (the ops log): the same request again is a duplicate
    sql = "INSERT OR IGNORE INTO inbox (op_id, run_id, kind, payload, posted_at) VALUES (?, ?, ?, ?, ?)"
    return bool(conn.execute(sql, params).rowcount == 1)


class DamagedStoreError(StoreError):
    """The store file is not a readable SQLite database (damaged, truncated, or another kind of file)."""


def damaged_store_message(path: Path, error: Exception) -> str:
    """What a damaged ``store.sqlite`` at ``path`` gets: the file, SQLite's words, and the ways on."""
    return (
        f"{path} cannot be read as a rapidfire_nb store: {error} (the file is damaged, truncated, or not an "
        "SQLite database). It was left as it is. Restore it from a backup to continue the experiment; or start "
        "it afresh with Experiment(name, overwrite=True) (deletes the experiment's folder: runs, checkpoints "
        "and logs); or use another experiment name."
    )


def _now() -> float:
    """Current unix time in seconds (a seam for tests)."""
    return time.time()


def _plain(value: Any) -> Any:
    """Enum members (RunStatus, ...) are stored as their values."""
    return value.value if isinstance(value, Enum) else value


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _require_str(what: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return value


def _pid_alive(pid: int) -> bool:
    """True when a live (not zombie) process with this pid exists on this machine (POSIX; always True on Windows)."""
    if os.name == "nt":  # os.kill(pid, 0) would send CTRL_C_EVENT there
        return True
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    try:  # a killed process its parent has not reaped yet (a zombie) still answers kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs (macOS): trust kill(pid, 0)
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _resolve_db_path(path: str | os.PathLike[str]) -> Path:
    """Accept the database file itself or the experiment folder holding ``store.sqlite``."""
    p = Path(path).expanduser()
    if p.suffix == ".sqlite" or p.is_file():
        return p
    return p / STORE_FILENAME
