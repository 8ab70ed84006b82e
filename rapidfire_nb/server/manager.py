"""What the server extension's handlers hand their work to: reads experiment stores, posts ops to the inbox.

Standard library + :mod:`rapidfire_nb.store` / :mod:`rapidfire_nb.paths` / :mod:`rapidfire_nb.view` /
:mod:`rapidfire_nb.view.wire` only (no jupyter_server, no torch), so it is tested without a server. The snapshot is
built by :func:`rapidfire_nb.view.store_snapshot`, the same module that builds the kernel's. Every store is
opened read-only for one call and closed again; the only write is :meth:`Store.post_inbox_op`. Nothing from a
request is unpickled, evaluated or put into SQL text: names are validated by
:func:`rapidfire_nb.paths.validate_experiment_name`, numbers are parsed as ``int``, op requests are read and checked
field by field by :mod:`rapidfire_nb.server.checks`, changes against the editable fields the kernel stored (meta
``editable_fields``).

Errors are :class:`ApiError` with an HTTP status and a message meant for the user.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kernel_scheduler import OP_KINDS as KIND_INFO
from kernel_scheduler import OpKind, RunStatus
from rapidfire_nb import meta_keys
from rapidfire_nb.errors import ConfigError
from rapidfire_nb.paths import (
    STORE_FILENAME,
    experiment_dir,
    experiments_root,
    list_experiments,
    validate_experiment_name,
)
from rapidfire_nb.store import ExperimentEndedError, OpIdReusedError, SchemaVersionError, Store, StoreError
from rapidfire_nb.view import StoreRows, editable_fields, reported_status, store_snapshot
from rapidfire_nb.view.meta_check import UNKNOWN_END, checked_meta, meta_value
from rapidfire_nb.view.wire import encode_points

from .checks import (
    MAX_JSON_DEPTH,
    OP_KINDS,
    ApiError,
    check_change,
    describe,
    int_param,
    json_depth,
    json_text_depth,
    parse_op,
    parse_op_body,
    parse_reason,
)

__all__ = [
    "MAX_JSON_DEPTH",
    "OP_KINDS",
    "ApiError",
    "ExperimentsManager",
    "encode_points",
    "json_depth",
    "json_text_depth",
]

DEFAULT_METRICS_LIMIT = 20_000
MAX_METRICS_LIMIT = 200_000


class ExperimentsManager:
    """Read-only views of the experiments under one root, plus posting ops to an experiment's inbox.

    Args:
        root: the experiments root (default: :func:`rapidfire_nb.paths.experiments_root`, i.e. ``$RF_HOME`` or
            the user data dir, the same default as the kernel's).
        stale_after: seconds after which a writer heartbeat counts as stale (its ONGOING runs are reported as
            INTERRUPTED and ops are refused).
    """

    def __init__(self, root: str | Path | None = None, stale_after: float = 30.0) -> None:
        self.root = experiments_root(root) if root not in (None, "") else experiments_root()
        self.stale_after = float(stale_after)

    # ------------------------------------------------------------------ stores

    def _dir(self, name: Any) -> Path:
        try:
            validate_experiment_name(name)
            path = experiment_dir(self.root, name)
        except ConfigError as exc:
            raise ApiError(400, f"bad experiment name: {exc}") from None
        if not (path / STORE_FILENAME).is_file():
            raise ApiError(404, f"no experiment named {name!r} under {self.root}")
        return path

    @contextlib.contextmanager
    def _open(self, name: Any) -> Iterator[Store]:
        path = self._dir(name)
        try:
            store = Store(path, read_only=True)
        except FileNotFoundError:
            raise ApiError(404, f"no experiment named {name!r} under {self.root}") from None
        except SchemaVersionError as exc:
            raise ApiError(409, str(exc)) from None
        except (StoreError, sqlite3.Error) as exc:
            raise ApiError(500, f"cannot read experiment {name!r}: {exc}") from None
        try:
            yield store
        except sqlite3.Error as exc:
            raise ApiError(500, f"cannot read experiment {name!r}: {exc}") from None
        finally:
            store.close()

    def _alive(self, store: Store) -> bool:
        """A kernel holds the experiment: a fresh heartbeat, and it has not ended it (``experiment.end()``)."""
        return store.writer_alive(stale_after=self.stale_after) and self._ended_at(store) is None

    @staticmethod
    def _ended_at(store: Store) -> float | None:
        """Meta ``ended_at``, or None (never ended); a malformed value reads as ``UNKNOWN_END`` (0.0), as the
        store takes no op while it is set."""
        value = meta_value(meta_keys.ENDED_AT, store.get_meta(meta_keys.ENDED_AT))
        return None if value is None else float(value)

    @staticmethod
    def _ended_message(name: str, ended_at: float) -> str:
        when = (
            "at an unknown time: its meta ended_at is malformed"
            if ended_at == UNKNOWN_END
            else f"{time.time() - ended_at:.0f} s ago"
        )
        return (
            f"experiment {name!r} has ended (experiment.end() ran in its kernel {when}); "
            "nothing applies ops to it now. To continue it, re-run the notebook's Experiment(...) and run_fit(...) "
            "cells (finished runs are not trained again), then send the op again."
        )

    # ------------------------------------------------------------------ GET experiments

    def list_experiments(self) -> dict[str, Any]:
        """Every experiment under the root with a one-line summary; unreadable ones carry ``error``."""
        out = []
        for name in list_experiments(self.root):
            try:
                out.append(self._summary(name))
            except ApiError as exc:
                if exc.status not in (400, 404):  # 400: e.g. a symlink leading out of the root, never listed
                    out.append({"name": name, "error": exc.message})
        return {"root": str(self.root), "now": time.time(), "experiments": out}

    def experiment(self, name: Any) -> dict[str, Any]:
        """One experiment's summary (as in :meth:`list_experiments`)."""
        return self._summary(name)

    def _summary(self, name: str) -> dict[str, Any]:
        with self._open(name) as store:
            meta, warnings = checked_meta(store.meta())
            alive = self._alive(store)
            hb = store.heartbeat()
            runs = store.runs()
        counts: dict[str, int] = {}
        for r in runs:
            st = reported_status(r["status"], alive)
            counts[st] = counts.get(st, 0) + 1
        return {
            "name": name,
            "trainer_type": meta.get(meta_keys.TRAINER_TYPE),
            "created_at": meta.get(meta_keys.CREATED_AT),
            "ended_at": meta.get(meta_keys.ENDED_AT),
            "updated_at": max((r["updated_at"] for r in runs), default=meta.get(meta_keys.CREATED_AT)),
            "num_runs": sum(n for st, n in counts.items() if st != RunStatus.DELETED.value),
            "status_counts": counts,
            "writer_alive": alive,
            "ended": meta.get(meta_keys.ENDED_AT) is not None,
            "last_beat": hb["beat_at"] if hb else None,
            **({"warnings": warnings} if warnings else {}),
        }

    # ------------------------------------------------------------------ GET runs

    def runs(self, name: Any) -> dict[str, Any]:
        """Every run of the experiment (deleted ones too) with all stored columns and latest loss/eval_loss."""
        with self._open(name) as store:
            alive = self._alive(store)
            rows = store.runs()
            latest = store.latest_metrics(["loss", "eval_loss"])
        runs = []
        for r in rows:
            m = latest.get(r["run_id"], {})
            runs.append(
                {
                    **r,
                    "stored_status": r["status"],
                    "status": reported_status(r["status"], alive),
                    "loss": m.get("loss"),
                    "eval_loss": m.get("eval_loss"),
                }
            )
        return {"experiment": name, "writer_alive": alive, "runs": runs}

    # ------------------------------------------------------------------ GET metrics

    def metrics(
        self,
        name: Any,
        cursor: Any = 0,
        run_id: Any = None,
        limit: Any = None,
        fmt: str = "rows",
        seen: Any = None,
    ) -> dict[str, Any]:
        """Metric points after ``cursor`` (the store's metric row id), oldest first, and the new cursor.

        Args:
            cursor: last row id already seen (0: from the start).
            run_id: only this run's points.
            limit: at most this many points (default 20,000, at most 200,000); ``more`` says whether
                there may be more after the returned cursor.
            fmt: ``rows`` (a list of ``{run_id, step, samples_seen, name, value, wall_time}``) or ``columnar``
                (the panel's encoding, see :func:`encode_points`).
            seen: how many points the caller holds (all runs, up to ``cursor``). When rows it holds were
                deleted since (a run resumed from an older checkpoint drops the steps it will log again), the
                reply is ``{"reset": true, "cursor": 0, "points": <empty>}``: reload from cursor 0.
        """
        cur = int_param("cursor", cursor, minimum=0)
        rid = None if run_id in (None, "") else int_param("run_id", run_id, minimum=1)
        lim = (
            DEFAULT_METRICS_LIMIT
            if limit in (None, "")
            else int_param("limit", limit, minimum=1, maximum=MAX_METRICS_LIMIT)
        )
        if fmt not in ("rows", "columnar"):
            raise ApiError(400, f"format must be 'rows' or 'columnar', got {describe(fmt)}")
        held = None if seen in (None, "") else int_param("seen", seen, minimum=0)
        if held is not None and rid is not None:
            raise ApiError(400, "seen counts the points of every run; it cannot be combined with run_id")
        with self._open(name) as store:
            if held is not None and store.count_metrics(cur) != held:
                empty: Any = encode_points([]) if fmt == "columnar" else []
                return {"experiment": name, "points": empty, "cursor": 0, "more": True, "reset": True}
            points, new_cursor = store.metrics_since(cur, run_id=rid, limit=lim)
        body: Any
        if fmt == "columnar":
            body = encode_points(points)
        else:
            body = [
                {k: p[k] for k in ("run_id", "step", "samples_seen", "name", "value", "wall_time")}
                for p in points
            ]
        return {
            "experiment": name,
            "points": body,
            "cursor": new_cursor,
            "more": len(points) == lim,
            "reset": False,
        }

    # ------------------------------------------------------------------ GET snapshot

    def snapshot(self, name: Any) -> dict[str, Any]:
        """The panel's snapshot (docs/ARCHITECTURE.md, "Panel source") built from the store alone.

        Built by :func:`rapidfire_nb.view.store_snapshot`: ``on_device`` is None and no run is ``on_device``
        (only the kernel knows which run holds the device); ONGOING runs of a dead writer are INTERRUPTED;
        without a live writer ``legal_ops`` are empty (nothing would apply them); a run's ``num_segments`` is
        the one the kernel stored (None in a store written before schema v2). Extra keys: ``writer_alive``,
        ``last_beat``, ``source: "store"``, ``device_status`` (the header's device chip in place of the
        kernel's "run N on device") and, when a meta value has the wrong JSON type, ``warnings`` (one line per
        key: the value is ignored, :func:`rapidfire_nb.view.meta_check.checked_meta`; so in summaries).
        """
        with self._open(name) as store:
            rows = StoreRows.read(store)  # malformed meta values left out
            warnings = checked_meta(store.meta())[1]
            alive = self._alive(store)
            hb = store.heartbeat()
        snap = store_snapshot(name, rows, alive, hb["beat_at"] if hb else None)
        if warnings:
            snap["warnings"] = warnings
        return snap

    # ------------------------------------------------------------------ POST ops

    def post_op_request(self, name: Any, raw: bytes) -> dict[str, Any]:
        """:meth:`post_op` of a POST's raw body, read by :func:`~rapidfire_nb.server.checks.parse_op_body`.

        Raises:
            ApiError: 413 for a body over 64 KiB, 400 for one that is not UTF-8 JSON or nests too deeply, and what
                :meth:`post_op` raises.
        """
        return self.post_op(name, parse_op_body(raw))

    def post_op(self, name: Any, body: Any) -> dict[str, Any]:
        """Validate an op request and leave it in the experiment's inbox for its kernel (idempotent on op_id).

        Args:
            body: the decoded JSON request ``{"op_id"?, "kind", "run_id", "changes"?, "warm_start"?, "reason"?}``
                (``reason``: a stop's own, at most 200 characters, e.g. ``"stop all but best 2 by eval_loss"``;
                the kernel records it as the run's ``stop_reason``, as for one sent over the comm).

        Returns:
            ``{"op_id", "kind", "run_id", "state": "queued", "duplicate", "message"}`` (``duplicate``: an op
            with this id was posted before; nothing new was queued).

        Raises:
            ApiError: 400 bad payload, 404 unknown experiment, 409 the experiment has ended or no live kernel holds it
                (the message says how to continue), or ``op_id`` was used before by an op of another kind or run.
        """
        op_id, kind, run_id, changes, warm = parse_op(body)
        reason = parse_reason(kind, body)
        with self._open(name) as store:
            run = store.get_run(run_id)
            if run is None:
                raise ApiError(400, f"experiment {name!r} has no run {run_id}")
            takes_changes = KIND_INFO[OpKind(kind)].takes_changes
            if takes_changes:
                self._check_changes(store, run, changes)
            ended_at = self._ended_at(store)
            if ended_at is not None:
                raise ApiError(409, self._ended_message(name, ended_at))
            if not self._alive(store):
                hb = store.heartbeat()
                when = (
                    f"its last heartbeat was {time.time() - hb['beat_at']:.0f} s ago"
                    if hb
                    else "it never started training"
                )
                raise ApiError(
                    409,
                    f"no kernel is running experiment {name!r} ({when}); ops are applied by the "
                    "kernel that trains it. Re-run its notebook cells (Experiment(...) then "
                    "run_fit(...)) and try again.",
                )
            payload = (
                {"changes": changes, "warm_start": warm}
                if takes_changes
                else {"reason": reason}
                if reason
                else None
            )
            # the one write: post_inbox_op opens its own short-lived read-write connection
            try:
                posted = store.post_inbox_op(op_id, kind, run_id, payload)
            except ExperimentEndedError:  # end() ran since the check above
                raise ApiError(
                    409,
                    self._ended_message(name, time.time() if (at := self._ended_at(store)) is None else at),
                ) from None
            except OpIdReusedError as exc:  # the kernel refuses the same case in the same words
                raise ApiError(409, str(exc)) from None
        return {
            "op_id": op_id,
            "kind": kind,
            "run_id": run_id,
            "state": "queued",
            "duplicate": not posted,
            "message": (
                f"{kind} for run {run_id} sent to the kernel; it is applied at the next chunk boundary"
                if posted
                else f"op {op_id} was already sent; nothing new was queued"
            ),
        }

    @staticmethod
    def _check_changes(store: Store, run: dict[str, Any], changes: dict[str, Any]) -> None:
        """Every changed field must be editable for this run and its value of the stored JSON type."""
        run_id = run["run_id"]
        fields = editable_fields(
            meta_value(meta_keys.EDITABLE_FIELDS, store.get_meta(meta_keys.EDITABLE_FIELDS)),
            run_id,
            run.get("hparams"),
        )
        if fields is None:
            raise ApiError(400, f"run {run_id} has no editable fields recorded; clone it from its notebook")
        for key, value in changes.items():
            check_change(key, value, fields, run_id)
