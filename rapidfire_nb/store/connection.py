"""The store's SQLite connections: one per thread, one write lock, schema set-up (standard library only)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .schema import (
    _MIGRATIONS,
    _OLDEST_READABLE,
    BUSY_TIMEOUT_MS,
    SCHEMA_VERSION,
    DamagedStoreError,
    ReadOnlyStoreError,
    SchemaVersionError,
    StoreError,
    _resolve_db_path,
    damaged_store_message,
)


class Connections:
    """The connection layer under :class:`rapidfire_nb.store.Store` (see its thread-safety contract)."""

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
        except sqlite3.OperationalError as exc:  # cannot open, locked, I/O: the file itself may be fine
            self.close()
            raise StoreError(f"cannot open the store {self.path}: {exc}") from exc
        except sqlite3.DatabaseError as exc:  # "file is not a database", "database disk image is malformed"
            self.close()
            raise DamagedStoreError(damaged_store_message(self.path, exc)) from exc
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
        uri = f"{self.path.resolve().as_uri()}?mode={mode}"
        if mode == "ro" and self._immutable():
            uri += "&immutable=1"
        return uri

    def _immutable(self) -> bool:
        """True when nobody here can write the folder and no write-ahead log is left in it: SQLite could not
        create the ``-shm`` file a WAL reader needs, so the file is read as immutable (nothing can change it)."""
        folder = self.path.parent
        return not os.access(folder, os.W_OK) and not self.path.with_name(self.path.name + "-wal").exists()

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
