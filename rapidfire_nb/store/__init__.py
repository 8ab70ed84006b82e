"""One experiment's SQLite database: meta, runs, metrics, ops, inbox, heartbeat (standard library only).

The file is ``<experiment_dir>/store.sqlite`` in WAL mode, so readers (the panel, the server extension,
another kernel) never block the writer and always see committed data.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sqlite3
from collections.abc import Iterable, Mapping
from typing import Any

from .. import meta_keys
from ..redact import redact
from .connection import Connections
from .schema import (
    _RUN_JSON_FIELDS,
    OP_STATES,
    RUN_FIELDS,
    RUN_SOURCES,
    SCHEMA_VERSION,
    DamagedStoreError,
    ExperimentEndedError,
    OpIdReusedError,
    ReadOnlyStoreError,
    SchemaVersionError,
    StoreError,
    _dumps,
    _now,
    _pid_alive,
    _plain,
    _require_str,
    post_inbox_row,
)

__all__ = [
    "OP_STATES",
    "RUN_FIELDS",
    "RUN_SOURCES",
    "SCHEMA_VERSION",
    "DamagedStoreError",
    "ExperimentEndedError",
    "OpIdReusedError",
    "ReadOnlyStoreError",
    "SchemaVersionError",
    "Store",
    "StoreError",
]


class Store(Connections):
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

    Structured values (config, hparams, meta values, op and inbox payloads) are stored as JSON text and decoded
    on read, with the value under every secret-like key (``hub_token``, ``token``, ``api_key``, ...:
    :func:`rapidfire_nb.redact.is_secret_key`) stored as ``"<redacted>"``. Times are unix seconds (float). A
    metric value of NaN is stored as NULL and read back as NaN.

    Args:
        path: the experiment folder (``store.sqlite`` inside it is used) or the ``.sqlite`` file.
        read_only: open an existing store without write access (see above).

    Raises:
        FileNotFoundError: ``read_only`` and there is no database at ``path``.
        SchemaVersionError: the database has a schema version this code does not know.
        DamagedStoreError: the file is not a readable SQLite database (the message names it and says what to do).
        StoreError: SQLite cannot open the file (permissions, locked, I/O); the message names it.

    A read-only store in a folder this process cannot write (and with no write-ahead log left) is opened as
    immutable: SQLite could not create the shared-memory file a WAL reader needs there.
    """

    # ------------------------------------------------------------------ meta

    def set_meta(self, key: str, value: Any) -> None:
        """Store one JSON-encodable experiment-level value under ``key``."""
        self.update_meta({key: value})

    def update_meta(self, values: Mapping[str, Any]) -> None:
        """Store several meta values in one transaction."""
        rows = [(_require_str("meta key", k), _dumps(redact(_plain(v)))) for k, v in values.items()]
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
                value = _dumps(redact(value))
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
            _dumps(redact(payload)),
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

        Idempotent on ``op_id``. Checked in the same transaction as the insert: an op is never left in the inbox
        of an experiment that has ended (see :meth:`mark_ended`).

        Returns:
            True if posted, False if an op with this id was already posted.

        Raises:
            ExperimentEndedError: the experiment's kernel ended it (meta ``ended_at``); nothing would take the op.
            OpIdReusedError: ``op_id`` names an earlier op of another kind or run.
        """
        params = (
            _require_str("op_id", op_id),
            None if run_id is None else int(run_id),
            _require_str("op kind", _plain(kind)),
            _dumps(redact(payload)),
            _now(),
        )
        if not self.read_only:
            with self._write() as conn:
                return post_inbox_row(conn, params, self.experiment_dir)
        if self._closed:
            raise StoreError(f"store {self.path} is closed")
        conn = self._connect(writable=True)  # short-lived, the only read-write one of a read-only store
        try:
            with self._write_lock, self._transaction(conn):
                return post_inbox_row(conn, params, self.experiment_dir)
        finally:
            conn.close()

    def mark_ended(self, at: float | None = None) -> list[dict[str, Any]]:
        """The writer ends the experiment: set meta ``ended_at`` (unix s, default now) and take every untaken inbox
        op, in one transaction, so that each op posted is either returned here (to be answered) or refused by
        :meth:`post_inbox_op`. :meth:`reopen` clears it when a kernel trains the experiment again.

        Returns:
            The inbox ops nobody will apply (as :meth:`take_inbox_ops` returns them), oldest first.
        """
        ended_at = _now() if at is None else float(at)
        with self._write() as conn:
            conn.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (meta_keys.ENDED_AT, _dumps(ended_at)),
            )
            return self._take_inbox(conn)

    def reopen(self) -> None:
        """A kernel trains the experiment again: clear meta ``ended_at`` (the inbox accepts ops again)."""
        self.set_meta(meta_keys.ENDED_AT, None)

    def ended_at(self) -> float | None:
        """Unix seconds at which the experiment's kernel ended it, or None (never ended, or trained again since)."""
        value = self.get_meta(meta_keys.ENDED_AT)
        return None if value is None else float(value)

    def posted_op(self, op_id: str) -> dict[str, Any] | None:
        """The inbox op ``op_id`` (``{"kind", "run_id", "taken_at"}``), or None when none was posted with it."""
        rows = self._query("SELECT kind, run_id, taken_at FROM inbox WHERE op_id = ?", (op_id,))
        return dict(rows[0]) if rows else None

    def take_inbox_ops(self) -> list[dict[str, Any]]:
        """Atomically mark every untaken inbox op as taken and return them, oldest first."""
        with self._write() as conn:
            return self._take_inbox(conn)

    @staticmethod
    def _take_inbox(conn: sqlite3.Connection) -> list[dict[str, Any]]:
        rows = conn.execute(
            "SELECT id, op_id, run_id, kind, payload, posted_at FROM inbox WHERE taken_at IS NULL ORDER BY id"
        ).fetchall()
        if not rows:
            return []
        taken_at = _now()
        conn.executemany("UPDATE inbox SET taken_at = ? WHERE id = ?", [(taken_at, r["id"]) for r in rows])
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

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else "read-write"
        return f"Store({str(self.path)!r}, {mode}{', closed' if self._closed else ''})"
