"""One experiment's SQLite database: meta, runs, metrics, ops, inbox, heartbeat (standard library only).

The file is ``<experiment_dir>/store.sqlite`` in WAL mode, so readers (the panel, the server extension,
another kernel) never block the writer and always see committed data.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import sqlite3
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from enum import Enum
from pathlib import Path
from typing import Any

from rapidfire_nb.errors import ExperimentError
from rapidfire_nb.paths import STORE_FILENAME

__all__ = [
    "OP_STATES",
    "RUN_FIELDS",
    "RUN_SOURCES",
    "SCHEMA_VERSION",
    "ReadOnlyStoreError",
    "SchemaVersionError",
    "Store",
    "StoreError",
]

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


class Store:
    """One experiment's SQLite database (``<experiment_dir>/store.sqlite``, WAL mode).

    Thread-safety contract:

    * Each thread gets its own ``sqlite3`` connection (``threading.local``), opened on first use and
      closed by :meth:`close`; connections are never shared between threads.
    * All writes in this process go through one lock and one ``BEGIN IMMEDIATE`` transaction each, so
      a write is atomic and writes never interleave. Other processes are serialised by SQLite's own
      locking (busy timeout 5 s).
    * Reads run without the lock and see the last committed state (WAL: readers never block the
      writer and are never blocked by it).
    * The scheduler thread is the only writer of experiment state (meta, runs, metrics, ops,
      heartbeat). Everyone else reads, and other processes use ``Store(path, read_only=True)``.
    * A read-only store opens its connections with ``file:...?mode=ro`` and raises
      :class:`ReadOnlyStoreError` on every write except :meth:`post_inbox_op`, the one channel from
      another process (the server extension) into the kernel; that call opens a separate short-lived
      read-write connection. The writer collects posted ops with :meth:`take_inbox_ops`.

    Structured values (config, hparams, meta values, op payloads) are stored as JSON text and decoded
    on read. Times are unix seconds (float). A metric value of NaN is stored as NULL and read back
    as NaN.

    Args:
        path: the experiment folder (``store.sqlite`` inside it is used) or the ``.sqlite`` file.
        read_only: open an existing store without write access (see above).

    Raises:
        FileNotFoundError: ``read_only`` and there is no database at ``path``.
        SchemaVersionError: the database has a schema version this code does not know.
    """

    def __init__(self, path: str | os.PathLike[str], read_only: bool = False) -> None:
        self.path = _resolve_db_path(path)
        self.read_only = read_only
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._closed = False
        try:
            if read_only:
                if not self.path.is_file():
                    raise FileNotFoundError(f"no rapidfire_nb store at {self.path}")
                self._check_version(self._conn())
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._init_schema()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ connections

    @property
    def experiment_dir(self) -> Path:
        """The folder holding the database file."""
        return self.path.parent

    def _connect(self, *, writable: bool) -> sqlite3.Connection:
        if writable:
            # mode=rw: never create the file by accident (read-only stores use this for the inbox).
            target, uri = (str(self.path), False) if not self.read_only else (self._uri("rw"), True)
        else:
            target, uri = self._uri("ro"), True
        conn = sqlite3.connect(
            target,
            uri=uri,
            timeout=BUSY_TIMEOUT_MS / 1000,
            isolation_level=None,  # autocommit; transactions are explicit (BEGIN IMMEDIATE)
            check_same_thread=False,  # only so close() may run on another thread
        )
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS:d}")
        conn.execute("PRAGMA synchronous = NORMAL")
        return conn

    def _uri(self, mode: str) -> str:
        return f"{self.path.resolve().as_uri()}?mode={mode}"

    def _conn(self) -> sqlite3.Connection:
        """This thread's connection (read-only ones for a read-only store)."""
        if self._closed:
            raise StoreError(f"store {self.path} is closed")
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect(writable=not self.read_only)
            with self._conns_lock:
                if self._closed:
                    conn.close()
                    raise StoreError(f"store {self.path} is closed")
                self._conns.append(conn)
            self._local.conn = conn
        return conn

    @staticmethod
    @contextlib.contextmanager
    def _transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One serialised write transaction on this thread's connection."""
        if self.read_only:
            raise ReadOnlyStoreError(
                f"store {self.path} was opened read-only; only post_inbox_op() may write through it"
            )
        with self._write_lock, self._transaction(self._conn()) as conn:
            yield conn

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        return self._conn().execute(sql, tuple(params)).fetchall()

    # ------------------------------------------------------------------ schema

    def _init_schema(self) -> None:
        conn = self._conn()
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            warnings.warn(
                f"SQLite could not enable WAL mode for {self.path} (journal_mode={mode}); readers may "
                "block training while it writes. Put experiments on a local disk (experiment_path=...).",
                RuntimeWarning,
                stacklevel=3,
            )
        with self._write() as conn:
            version = self._check_version(conn)
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[target]:
                    conn.execute(statement)
            if version != SCHEMA_VERSION:
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION:d}")

    def _check_version(self, conn: sqlite3.Connection) -> int:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{self.path} has store schema version {version}, but this rapidfire_nb only knows "
                f"versions up to {SCHEMA_VERSION}: it was written by a newer rapidfire_nb. Upgrade "
                "rapidfire_nb, or use a different experiment name / experiment_path."
            )
        if self.read_only and version < _OLDEST_READABLE:
            raise SchemaVersionError(
                f"{self.path} has store schema version {version} (current: {SCHEMA_VERSION}); open it "
                "once for writing (e.g. from the kernel that owns the experiment) to create or upgrade it."
            )
        return version

    @property
    def schema_version(self) -> int:
        """The database's ``PRAGMA user_version``."""
        return int(self._query("PRAGMA user_version")[0][0])

    # ------------------------------------------------------------------ meta

    def set_meta(self, key: str, value: Any) -> None:
        """Store one JSON-encodable experiment-level value under ``key``."""
        self.update_meta({key: value})

    def update_meta(self, values: Mapping[str, Any]) -> None:
        """Store several meta values in one transaction."""
        rows = [(_require_str("meta key", k), _dumps(_plain(v))) for k, v in values.items()]
        with self._write() as conn:
            conn.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                rows,
            )

    def get_meta(self, key: str, default: Any = None) -> Any:
        """The decoded value stored under ``key``, or ``default``."""
        rows = self._query("SELECT value FROM meta WHERE key = ?", (key,))
        return json.loads(rows[0]["value"]) if rows else default

    def meta(self) -> dict[str, Any]:
        """All meta values, decoded (experiment name, created_at, fingerprint, trainer_type, ...)."""
        return {
            r["key"]: json.loads(r["value"]) for r in self._query("SELECT key, value FROM meta ORDER BY key")
        }

    # ------------------------------------------------------------------ runs

    def upsert_run(self, run_id: int, **fields: Any) -> None:
        """Insert run ``run_id`` or update only the given columns of it.

        ``updated_at`` is set to now unless given; ``created_at`` too on insert. Columns not given
        keep their value (or their default on insert). Enum values (e.g. ``RunStatus``) are stored
        as their ``.value``; ``config``/``hparams`` as JSON.

        Raises:
            TypeError: a field name is not one of :data:`RUN_FIELDS`.
            ReadOnlyStoreError: the store is read-only.
        """
        unknown = sorted(set(fields) - set(RUN_FIELDS))
        if unknown:
            raise TypeError(f"unknown run field(s) {unknown}; known fields: {list(RUN_FIELDS)}")
        now = _now()
        values: dict[str, Any] = {}
        for name in RUN_FIELDS:  # fixed order; identifiers come from RUN_FIELDS only
            if name not in fields:
                continue
            value = _plain(fields[name])
            if name in _RUN_JSON_FIELDS:
                value = _dumps(value)
            elif name == "warm_start":
                value = int(bool(value))
            values[name] = value
        values.setdefault("updated_at", now)
        insert = {"created_at": now, **values}
        insert_cols = ", ".join(["run_id", *insert])
        placeholders = ", ".join("?" * (len(insert) + 1))
        updates = ", ".join(f"{name} = excluded.{name}" for name in values)
        sql = (
            f"INSERT INTO runs ({insert_cols}) VALUES ({placeholders}) "
            f"ON CONFLICT (run_id) DO UPDATE SET {updates}"
        )
        with self._write() as conn:
            conn.execute(sql, (int(run_id), *insert.values()))

    @staticmethod
    def _decode_run(row: sqlite3.Row) -> dict[str, Any]:
        run = dict(row)
        for name in _RUN_JSON_FIELDS:
            run[name] = json.loads(run[name]) if run[name] is not None else None
        run["warm_start"] = bool(run["warm_start"])
        return run

    def get_run(self, run_id: int) -> dict[str, Any] | None:
        """Run ``run_id`` as a dict of all columns (JSON decoded), or None."""
        rows = self._query("SELECT * FROM runs WHERE run_id = ?", (int(run_id),))
        return self._decode_run(rows[0]) if rows else None

    def runs(self) -> list[dict[str, Any]]:
        """All runs ordered by run_id (deleted ones included: their status says so)."""
        return [self._decode_run(r) for r in self._query("SELECT * FROM runs ORDER BY run_id")]

    def next_run_id(self) -> int:
        """One more than the largest run id ever stored (1 for an empty store); ids are never reused."""
        return int(self._query("SELECT COALESCE(MAX(run_id), 0) + 1 FROM runs")[0][0])

    # ------------------------------------------------------------------ metrics

    @staticmethod
    def _metric_params(row: Mapping[str, Any], now: float) -> tuple[Any, ...]:
        try:
            run_id, step, name, value = row["run_id"], row["step"], row["name"], row["value"]
        except KeyError as exc:
            raise ValueError(f"metric row {dict(row)!r} lacks {exc.args[0]!r}") from None
        fvalue = None if value is None else float(value)
        if fvalue is not None and math.isnan(fvalue):
            fvalue = None  # SQLite has no NaN; NULL reads back as NaN
        samples_seen = row.get("samples_seen")
        wall_time = row.get("wall_time")
        return (
            int(run_id),
            int(step),
            None if samples_seen is None else int(samples_seen),
            _require_str("metric name", name),
            fvalue,
            now if wall_time is None else float(wall_time),
        )

    def add_metrics(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Append metric points in one transaction.

        Args:
            rows: dicts with ``run_id``, ``step``, ``name``, ``value`` and optionally ``samples_seen``
                and ``wall_time`` (default: now).

        Returns:
            The number of rows written.
        """
        now = _now()
        params = [self._metric_params(r, now) for r in rows]
        if not params:
            return 0
        with self._write() as conn:
            conn.executemany(
                "INSERT INTO metrics (run_id, step, samples_seen, name, value, wall_time) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                params,
            )
        return len(params)

    @staticmethod
    def _decode_metric(row: sqlite3.Row) -> dict[str, Any]:
        point = dict(row)
        if point["value"] is None:
            point["value"] = math.nan
        return point

    def metrics_since(
        self, cursor: int = 0, run_id: int | None = None, limit: int | None = None
    ) -> tuple[list[dict[str, Any]], int]:
        """Metric points appended after ``cursor``, oldest first.

        Args:
            cursor: the last metric row id already seen (0 for all).
            run_id: only this run's points (the cursor still counts all rows).
            limit: at most this many points.

        Returns:
            ``(points, new_cursor)``: points have ``id, run_id, step, samples_seen, name, value,
            wall_time``; ``new_cursor`` is the last returned id, or ``cursor`` when none.
        """
        sql = "SELECT id, run_id, step, samples_seen, name, value, wall_time FROM metrics WHERE id > ?"
        params: list[Any] = [int(cursor)]
        if run_id is not None:
            sql += " AND run_id = ?"
            params.append(int(run_id))
        sql += " ORDER BY id"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        points = [self._decode_metric(r) for r in self._query(sql, params)]
        return points, (points[-1]["id"] if points else int(cursor))

    def delete_metrics_after(self, run_id: int, step: int) -> int:
        """Drop run ``run_id``'s metric rows logged after optimizer step ``step`` (a run resumed from an older
        checkpoint logs those steps again). Returns the number of rows removed."""
        with self._write() as conn:
            cur = conn.execute("DELETE FROM metrics WHERE run_id = ? AND step > ?", (int(run_id), int(step)))
            return int(cur.rowcount)

    def count_metrics(self, up_to: int | None = None) -> int:
        """The number of metric rows, only those with id <= ``up_to`` when given.

        A reader that received every row up to a cursor compares this with how many it got: fewer means rows
        were deleted since (:meth:`delete_metrics_after` on a resume), so its copy is stale and it should reload.
        """
        if up_to is None:
            return int(self._query("SELECT COUNT(*) FROM metrics")[0][0])
        return int(self._query("SELECT COUNT(*) FROM metrics WHERE id <= ?", (int(up_to),))[0][0])

    def latest_metrics(self, names: Iterable[str]) -> dict[int, dict[str, float]]:
        """The most recent value of each of ``names`` for every run that logged it.

        Returns:
            ``{run_id: {name: value}}``; runs without any of the names are absent.
        """
        wanted = [names] if isinstance(names, str) else list(dict.fromkeys(names))
        if not wanted:
            return {}
        marks = ", ".join("?" * len(wanted))  # placeholders only; the names are bound
        rows = self._query(
            "SELECT m.run_id, m.name, m.value FROM metrics AS m JOIN ("
            f"  SELECT MAX(id) AS id FROM metrics WHERE name IN ({marks}) GROUP BY run_id, name"
            ") AS latest ON m.id = latest.id ORDER BY m.run_id",
            wanted,
        )
        result: dict[int, dict[str, float]] = {}
        for r in rows:
            result.setdefault(r["run_id"], {})[r["name"]] = math.nan if r["value"] is None else r["value"]
        return result

    # ------------------------------------------------------------------ ops

    def add_op(
        self,
        op_id: str,
        kind: str,
        run_id: int | None = None,
        payload: Any = None,
        *,
        source: str = "api",
        state: str = "queued",
        message: str = "",
        requested_at: float | None = None,
    ) -> bool:
        """Record an IC Op. Idempotent on ``op_id``.

        Returns:
            True if recorded, False if an op with this id already exists (it is left unchanged).
        """
        state = _plain(state)
        if state not in OP_STATES:
            raise ValueError(f"op state must be one of {OP_STATES}, got {state!r}")
        params = (
            _require_str("op_id", op_id),
            None if run_id is None else int(run_id),
            _require_str("op kind", _plain(kind)),
            _dumps(payload),
            _require_str("op source", _plain(source)),
            state,
            message or "",
            _now() if requested_at is None else float(requested_at),
        )
        with self._write() as conn:
            cur = conn.execute(
                "INSERT OR IGNORE INTO ops (op_id, run_id, kind, payload, source, state, message, "
                "requested_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                params,
            )
            return cur.rowcount == 1

    def update_op(self, op_id: str, state: str, message: str = "", applied_at: float | None = None) -> bool:
        """Set an op's state and message; ``applied_at`` defaults to now unless the state is ``queued``.

        Returns:
            True if the op exists.
        """
        state = _plain(state)
        if state not in OP_STATES:
            raise ValueError(f"op state must be one of {OP_STATES}, got {state!r}")
        if applied_at is None and state != "queued":
            applied_at = _now()
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE ops SET state = ?, message = ?, applied_at = ? WHERE op_id = ?",
                (state, message or "", applied_at, op_id),
            )
            return cur.rowcount == 1

    @staticmethod
    def _decode_op(row: sqlite3.Row) -> dict[str, Any]:
        op = dict(row)
        op["payload"] = json.loads(op["payload"])
        return op

    def ops(self) -> list[dict[str, Any]]:
        """All ops, ordered by ``requested_at`` (then insertion order)."""
        return [
            self._decode_op(r)
            for r in self._query(
                "SELECT op_id, run_id, kind, payload, source, state, message, requested_at, applied_at "
                "FROM ops ORDER BY requested_at, rowid"
            )
        ]

    def get_op(self, op_id: str) -> dict[str, Any] | None:
        """One op as a dict, or None."""
        rows = self._query(
            "SELECT op_id, run_id, kind, payload, source, state, message, requested_at, applied_at "
            "FROM ops WHERE op_id = ?",
            (op_id,),
        )
        return self._decode_op(rows[0]) if rows else None

    # ------------------------------------------------------------------ inbox

    def post_inbox_op(self, op_id: str, kind: str, run_id: int | None = None, payload: Any = None) -> bool:
        """Leave an op for the writer (the kernel) to pick up. Allowed on read-only stores.

        Idempotent on ``op_id``.

        Returns:
            True if posted, False if an op with this id was already posted.
        """
        params = (
            _require_str("op_id", op_id),
            None if run_id is None else int(run_id),
            _require_str("op kind", _plain(kind)),
            _dumps(payload),
            _now(),
        )
        sql = "INSERT OR IGNORE INTO inbox (op_id, run_id, kind, payload, posted_at) VALUES (?, ?, ?, ?, ?)"
        if not self.read_only:
            with self._write() as conn:
                return conn.execute(sql, params).rowcount == 1
        if self._closed:
            raise StoreError(f"store {self.path} is closed")
        conn = self._connect(writable=True)  # short-lived, the only read-write one of a read-only store
        try:
            with self._write_lock, self._transaction(conn):
                return conn.execute(sql, params).rowcount == 1
        finally:
            conn.close()

    def take_inbox_ops(self) -> list[dict[str, Any]]:
        """Atomically mark every untaken inbox op as taken and return them, oldest first."""
        with self._write() as conn:
            rows = conn.execute(
                "SELECT id, op_id, run_id, kind, payload, posted_at FROM inbox "
                "WHERE taken_at IS NULL ORDER BY id"
            ).fetchall()
            if not rows:
                return []
            taken_at = _now()
            conn.executemany(
                "UPDATE inbox SET taken_at = ? WHERE id = ?", [(taken_at, r["id"]) for r in rows]
            )
        return [{**dict(r), "payload": json.loads(r["payload"]), "taken_at": taken_at} for r in rows]

    # ------------------------------------------------------------------ heartbeat

    def beat(self, pid: int | None = None) -> None:
        """Record that the writer (``pid``, default this process) on this host is alive, now."""
        params = (os.getpid() if pid is None else int(pid), socket.gethostname(), _now())
        with self._write() as conn:
            conn.execute(
                "INSERT INTO heartbeat (id, pid, host, beat_at) VALUES (1, ?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET pid = excluded.pid, host = excluded.host, "
                "beat_at = excluded.beat_at",
                params,
            )

    def heartbeat(self) -> dict[str, Any] | None:
        """The last beat as ``{"pid", "host", "beat_at"}``, or None if there never was one."""
        rows = self._query("SELECT pid, host, beat_at FROM heartbeat WHERE id = 1")
        return dict(rows[0]) if rows else None

    def writer_alive(self, stale_after: float = 30.0) -> bool:
        """True when the last beat is at most ``stale_after`` seconds old and its process exists.

        The process check (``os.kill(pid, 0)``) is done when the beat came from this host; a beat
        from another host (a shared folder) or on Windows is judged by its age alone.
        """
        hb = self.heartbeat()
        if hb is None or _now() - float(hb["beat_at"]) > stale_after:
            return False
        if hb["host"] != socket.gethostname():
            return True
        return _pid_alive(int(hb["pid"]))

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Close every connection this store opened (any thread's). Idempotent."""
        with self._write_lock, self._conns_lock:  # waits for a write in progress to finish
            self._closed = True
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else "read-write"
        return f"Store({str(self.path)!r}, {mode}{', closed' if self._closed else ''})"
