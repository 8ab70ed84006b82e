"""rapidfire_nb.store.Store: schema, round trips, read-only mode, inbox, heartbeat, concurrency."""

from __future__ import annotations

import enum
import math
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import rapidfire_nb.store as store_mod
from rapidfire_nb.errors import ExperimentError
from rapidfire_nb.store import (
    SCHEMA_VERSION,
    ReadOnlyStoreError,
    SchemaVersionError,
    Store,
    StoreError,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def exp_dir(tmp_path: Path) -> Path:
    return tmp_path / "exp"


@pytest.fixture
def store(exp_dir: Path):
    with Store(exp_dir) as s:
        yield s


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(store_mod, "_now", c)
    return c


# ------------------------------------------------------------------ file, schema


def test_store_file_is_wal_with_schema_version(store, exp_dir):
    assert store.path == exp_dir / "store.sqlite"
    assert store.experiment_dir == exp_dir
    raw = sqlite3.connect(store.path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == store.schema_version
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        raw.close()
    assert {"meta", "runs", "metrics", "ops", "inbox", "heartbeat"} <= tables
    conn = store._conn()
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL


def test_store_accepts_the_sqlite_file_path_and_reopens(exp_dir):
    with Store(exp_dir) as s:
        s.set_meta("name", "exp")
    with Store(exp_dir / "store.sqlite") as s:
        assert s.get_meta("name") == "exp"
        assert s.schema_version == SCHEMA_VERSION


def test_a_version_1_store_is_read_as_it_is_and_upgraded_by_its_writer(exp_dir):
    exp_dir.mkdir(parents=True, exist_ok=True)
    raw = sqlite3.connect(exp_dir / "store.sqlite")
    from rapidfire_nb.store.schema import _SCHEMA_V1

    for statement in _SCHEMA_V1:
        raw.execute(statement)
    raw.execute("INSERT INTO runs (run_id, status, created_at, updated_at) VALUES (1, 'ONGOING', 1.0, 1.0)")
    raw.execute("PRAGMA user_version = 1")
    raw.commit()
    raw.close()
    with Store(exp_dir, read_only=True) as ro:  # a reader (the server) does not need the new column
        assert ro.schema_version == 1
        run = ro.get_run(1)
        assert run is not None and run["status"] == "ONGOING" and run.get("num_segments") is None
    with Store(exp_dir) as rw:  # the writer migrates
        assert rw.schema_version == SCHEMA_VERSION == 2
        rw.upsert_run(1, num_segments=8)
        assert rw.get_run(1)["num_segments"] == 8


def test_newer_schema_version_is_a_clear_error(exp_dir):
    Store(exp_dir).close()
    raw = sqlite3.connect(exp_dir / "store.sqlite")
    raw.execute("PRAGMA user_version = 99")
    raw.close()
    for read_only in (False, True):
        with pytest.raises(SchemaVersionError, match="newer rapidfire_nb") as info:
            Store(exp_dir, read_only=read_only)
        assert "99" in str(info.value)
        assert isinstance(info.value, ExperimentError)


def test_read_only_store_needs_an_existing_initialised_database(tmp_path):
    with pytest.raises(FileNotFoundError):
        Store(tmp_path / "nothing", read_only=True)
    assert not (tmp_path / "nothing").exists()
    sqlite3.connect(tmp_path / "empty.sqlite").close()
    with pytest.raises(SchemaVersionError, match="open it once for writing"):
        Store(tmp_path / "empty.sqlite", read_only=True)


def test_closed_store_refuses_use(exp_dir):
    s = Store(exp_dir)
    s.close()
    s.close()  # idempotent
    assert s.closed
    with pytest.raises(StoreError, match="closed"):
        s.runs()
    with pytest.raises(StoreError, match="closed"):
        s.upsert_run(1, status="NEW")


# ------------------------------------------------------------------ meta


def test_meta_round_trip(store):
    assert store.get_meta("missing") is None
    assert store.get_meta("missing", 7) == 7
    store.set_meta("experiment", "exp")
    store.set_meta("num_chunks", 4)
    store.update_meta({"editable_fields": {"learning_rate": "float"}, "num_chunks": 8})
    key = "x'); DROP TABLE runs; --"
    store.set_meta(key, [1, None])
    assert store.get_meta(key) == [1, None]
    assert store.meta() == {
        "experiment": "exp",
        "num_chunks": 8,
        "editable_fields": {"learning_rate": "float"},
        key: [1, None],
    }
    assert store.runs() == []  # the table survived


# ------------------------------------------------------------------ runs


class Status(str, enum.Enum):
    NEW = "NEW"
    ONGOING = "ONGOING"


def test_upsert_get_runs_round_trip(store, clock):
    assert store.next_run_id() == 1
    assert store.get_run(1) is None
    store.upsert_run(3, status="NEW", config={"lr": 1e-4}, hparams={"learning_rate": 1e-4})
    clock.t = 1001.0
    store.upsert_run(
        1,
        status=Status.NEW,
        config={"lr": 2e-4},
        hparams={"learning_rate": 2e-4},
        fingerprint="abc",
        total_steps=40,
    )
    store.upsert_run(2, status="NEW", source="clone", parent_id=1, warm_start=True)
    clock.t = 1005.0
    store.upsert_run(
        1,
        status=Status.ONGOING,
        completed_steps=10,
        chunks_done=1,
        num_segments=8,
        epoch=0.25,
        samples_seen=80,
        last_checkpoint="/ckpt/1",
    )

    run1 = store.get_run(1)
    assert run1 == {
        "run_id": 1,
        "status": "ONGOING",
        "config": {"lr": 2e-4},
        "hparams": {"learning_rate": 2e-4},
        "fingerprint": "abc",
        "parent_id": None,
        "warm_start": False,
        "source": "fit",
        "total_steps": 40,
        "completed_steps": 10,
        "chunks_done": 1,
        "epoch": 0.25,
        "num_segments": 8,
        "samples_seen": 80,
        "checkpoint_dir": None,
        "last_checkpoint": "/ckpt/1",
        "error": None,
        "created_at": 1001.0,
        "updated_at": 1005.0,
    }
    runs = store.runs()
    assert [r["run_id"] for r in runs] == [1, 2, 3]
    assert runs[1]["warm_start"] is True and runs[1]["parent_id"] == 1 and runs[1]["source"] == "clone"
    assert runs[2]["config"] == {"lr": 1e-4} and runs[2]["created_at"] == 1000.0
    assert store.next_run_id() == 4


def test_upsert_run_rejects_unknown_fields(store):
    with pytest.raises(TypeError, match="unknown run field"):
        store.upsert_run(1, statuss="NEW")
    assert store.runs() == []


# ------------------------------------------------------------------ metrics


def test_metrics_cursor_paging(store):
    rows = [
        {
            "run_id": 1 + i % 2,
            "step": i,
            "samples_seen": 8 * i,
            "name": "train/loss",
            "value": 1.0 / (i + 1),
            "wall_time": 50.0 + i,
        }
        for i in range(25)
    ]
    assert store.add_metrics(iter(rows)) == 25
    seen = []
    cursor = 0
    for expected in (10, 10, 5):
        page, cursor = store.metrics_since(cursor, limit=10)
        assert len(page) == expected
        seen += page
    assert store.metrics_since(cursor) == ([], cursor)
    assert [p["step"] for p in seen] == list(range(25))
    assert [p["value"] for p in seen] == [r["value"] for r in rows]
    assert seen[3] == {
        "id": seen[3]["id"],
        "run_id": 2,
        "step": 3,
        "samples_seen": 24,
        "name": "train/loss",
        "value": 0.25,
        "wall_time": 53.0,
    }
    assert cursor == seen[-1]["id"]
    ids = [p["id"] for p in seen]
    assert ids == sorted(ids) and len(set(ids)) == 25

    run2, cursor2 = store.metrics_since(0, run_id=2)
    assert [p["step"] for p in run2] == list(range(1, 25, 2))
    assert cursor2 == run2[-1]["id"]

    store.add_metrics([{"run_id": 1, "step": 30, "name": "eval/loss", "value": 0.5}])
    page, _ = store.metrics_since(cursor)
    assert [(p["name"], p["step"]) for p in page] == [("eval/loss", 30)]
    assert page[0]["samples_seen"] is None


def test_metrics_nan_round_trips_and_latest_metrics(store):
    store.add_metrics(
        [
            {"run_id": 1, "step": 1, "name": "train/loss", "value": 2.0},
            {"run_id": 1, "step": 2, "name": "train/loss", "value": 1.5},
            {"run_id": 2, "step": 1, "name": "train/loss", "value": float("nan")},
            {"run_id": 2, "step": 1, "name": "eval/loss", "value": 3.0},
            {"run_id": 3, "step": 1, "name": "other", "value": 9.0},
        ]
    )
    latest = store.latest_metrics(["train/loss", "eval/loss"])
    assert set(latest) == {1, 2}
    assert latest[1] == {"train/loss": 1.5}
    assert math.isnan(latest[2]["train/loss"]) and latest[2]["eval/loss"] == 3.0
    assert store.latest_metrics("other") == {3: {"other": 9.0}}
    assert store.latest_metrics([]) == {}
    page, _ = store.metrics_since(0, run_id=2)
    assert math.isnan(page[0]["value"])


def test_add_metrics_is_all_or_nothing(store):
    with pytest.raises(ValueError, match="lacks 'value'"):
        store.add_metrics(
            [{"run_id": 1, "step": 1, "name": "a", "value": 1.0}, {"run_id": 1, "step": 2, "name": "a"}]
        )
    assert store.metrics_since(0) == ([], 0)
    assert store.add_metrics([]) == 0


# ------------------------------------------------------------------ ops


def test_ops_are_idempotent_on_op_id(store, clock):
    assert store.add_op("op-b", "stop", 2, None, source="panel", requested_at=20.0) is True
    assert (
        store.add_op(
            "op-a",
            "clone",
            1,
            {"changes": {"learning_rate": 1e-3}, "warm_start": True},
            source="api",
            requested_at=10.0,
        )
        is True
    )
    assert store.add_op("op-a", "delete", 3, {"x": 1}, source="server") is False
    assert store.get_op("op-a") == {
        "op_id": "op-a",
        "run_id": 1,
        "kind": "clone",
        "payload": {"changes": {"learning_rate": 1e-3}, "warm_start": True},
        "source": "api",
        "state": "queued",
        "message": "",
        "requested_at": 10.0,
        "applied_at": None,
    }
    assert [o["op_id"] for o in store.ops()] == ["op-a", "op-b"]
    clock.t = 30.0
    assert store.update_op("op-b", "rejected", "run 2 already stopped") is True
    op_b = store.get_op("op-b")
    assert (op_b["state"], op_b["message"], op_b["applied_at"]) == ("rejected", "run 2 already stopped", 30.0)
    assert store.update_op("op-a", "applied", "cloned as run 4", applied_at=25.0) is True
    assert store.get_op("op-a")["applied_at"] == 25.0
    assert store.update_op("missing", "applied") is False
    assert store.get_op("missing") is None
    with pytest.raises(ValueError, match="op state"):
        store.update_op("op-a", "done")
    with pytest.raises(ValueError, match="op_id"):
        store.add_op("", "stop", 1)


# ------------------------------------------------------------------ read-only + inbox


def test_read_only_store_reads_live_data_and_refuses_writes(store, exp_dir):
    store.upsert_run(1, status="NEW")
    store.add_metrics([{"run_id": 1, "step": 1, "name": "train/loss", "value": 1.0}])
    with Store(exp_dir, read_only=True) as ro:
        assert [r["run_id"] for r in ro.runs()] == [1]
        store.upsert_run(2, status="NEW")  # written after the reader opened
        assert [r["run_id"] for r in ro.runs()] == [1, 2]
        with pytest.raises(ReadOnlyStoreError, match="read-only"):
            ro.upsert_run(1, status="STOPPED")
        for write in (
            lambda: ro.set_meta("k", 1),
            lambda: ro.add_metrics([{"run_id": 1, "step": 2, "name": "x", "value": 1.0}]),
            lambda: ro.add_op("o", "stop", 1),
            lambda: ro.update_op("o", "applied"),
            lambda: ro.take_inbox_ops(),
            lambda: ro.beat(),
        ):
            with pytest.raises(ReadOnlyStoreError):
                write()
        # Even raw SQL through its connection cannot write.
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            ro._conn().execute("UPDATE runs SET status = 'X'")
    assert store.get_run(1)["status"] == "NEW"
    assert store.meta() == {} and store.ops() == []


def test_inbox_post_from_read_only_store_and_take_from_writer(store, exp_dir):
    with Store(exp_dir, read_only=True) as ro:
        assert ro.post_inbox_op("op-1", "stop", 2, {"reason": "user"}) is True
        assert ro.post_inbox_op("op-1", "stop", 2, {"reason": "again"}) is False
        assert ro.post_inbox_op("op-2", "clone", 1, {"changes": {"learning_rate": 0.1}}) is True
    assert store.post_inbox_op("op-3", "resume", 2) is True  # the writer may post too
    taken = store.take_inbox_ops()
    assert [(t["op_id"], t["kind"], t["run_id"]) for t in taken] == [
        ("op-1", "stop", 2),
        ("op-2", "clone", 1),
        ("op-3", "resume", 2),
    ]
    assert taken[0]["payload"] == {"reason": "user"}
    assert taken[2]["payload"] is None
    assert all(t["taken_at"] is not None for t in taken)
    assert store.take_inbox_ops() == []
    with Store(exp_dir, read_only=True) as ro:  # a taken op id stays used
        assert ro.post_inbox_op("op-1", "stop", 2) is False


def test_inbox_post_from_another_process(store, exp_dir):
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from rapidfire_nb.store import Store
        with Store({str(exp_dir)!r}, read_only=True) as ro:
            print(ro.post_inbox_op("srv-1", "delete", 5, {{"source": "server"}}))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"
    taken = store.take_inbox_ops()
    assert [(t["op_id"], t["kind"], t["run_id"], t["payload"]) for t in taken] == [
        ("srv-1", "delete", 5, {"source": "server"})
    ]


# ------------------------------------------------------------------ concurrency


def test_concurrent_writers_do_not_lose_rows(store, exp_dir):
    n_threads, n_batches, batch = 8, 40, 5
    errors: list[BaseException] = []
    start = threading.Barrier(n_threads + 1)
    stop_reading = threading.Event()

    def writer(t: int) -> None:
        try:
            start.wait()
            for b in range(n_batches):
                store.add_metrics(
                    {"run_id": t, "step": b * batch + i, "name": "train/loss", "value": float(i)}
                    for i in range(batch)
                )
                store.upsert_run(t, status="ONGOING", completed_steps=b + 1)
                store.add_op(f"op-{t}-{b}", "stop", t)
                store.post_inbox_op(f"in-{t}-{b}", "stop", t)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def reader() -> None:
        with Store(exp_dir, read_only=True) as ro:
            cursor = 0
            try:
                start.wait()
                while not stop_reading.is_set():
                    _, cursor = ro.metrics_since(cursor)
                    ro.runs()
            except BaseException as exc:  # pragma: no cover
                errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(n_threads)]
    read_thread = threading.Thread(target=reader)
    read_thread.start()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    stop_reading.set()
    read_thread.join()
    assert errors == []
    points, _ = store.metrics_since(0)
    assert len(points) == n_threads * n_batches * batch
    assert len({p["id"] for p in points}) == len(points)
    for t in range(n_threads):
        assert sorted(p["step"] for p in points if p["run_id"] == t) == list(range(n_batches * batch))
    assert [r["completed_steps"] for r in store.runs()] == [n_batches] * n_threads
    assert len(store.ops()) == n_threads * n_batches
    assert len(store.take_inbox_ops()) == n_threads * n_batches


# ------------------------------------------------------------------ heartbeat


def test_heartbeat_staleness(store, clock, exp_dir):
    assert store.heartbeat() is None
    assert store.writer_alive() is False
    store.beat()
    hb = store.heartbeat()
    assert hb["beat_at"] == 1000.0 and hb["pid"] > 0 and hb["host"]
    clock.t = 1029.0
    assert store.writer_alive() is True
    with Store(exp_dir, read_only=True) as ro:
        assert ro.writer_alive(stale_after=30.0) is True
        assert ro.writer_alive(stale_after=10.0) is False
    clock.t = 1031.0
    assert store.writer_alive() is False
    store.beat()
    assert store.writer_alive() is True


def test_heartbeat_with_dead_pid_is_not_alive(store):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # exited and reaped: its pid no longer exists
    store.beat(pid=proc.pid)
    assert store.heartbeat()["pid"] == proc.pid
    assert store.writer_alive() is False
    store.beat()  # this process
    assert store.writer_alive() is True


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs procfs")
def test_heartbeat_of_a_killed_unreaped_kernel_is_not_alive(store):
    """A SIGKILLed kernel stays a zombie until the Jupyter server reaps it; kill(pid, 0) still succeeds."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        store.beat(pid=proc.pid)
        assert store.writer_alive() is True
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child did not become a zombie"
            time.sleep(0.01)
        assert store.writer_alive() is False  # not reaped yet: a zombie
    finally:
        proc.kill()
        proc.wait()


def test_heartbeat_from_another_host_is_judged_by_age(store, clock):
    store.beat(pid=2**22 + 12345)
    raw = sqlite3.connect(store.path)
    raw.execute("UPDATE heartbeat SET host = 'elsewhere'")
    raw.commit()
    raw.close()
    assert store.writer_alive() is True
    clock.t += 60
    assert store.writer_alive() is False


def test_store_paths_atomic_import_only_the_standard_library():
    script = (
        f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r}); "
        "import rapidfire_nb.store, rapidfire_nb.paths, rapidfire_nb._atomic; "
        "print(sorted(m for m in ('torch', 'tensorboard', 'numpy', 'transformers') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
