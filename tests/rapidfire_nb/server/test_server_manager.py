"""rapidfire_nb.server.manager without a server: reads, crash reconciliation, op validation, the inbox."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb.server import manager as manager_mod
from rapidfire_nb.server.manager import ApiError, ExperimentsManager, encode_points
from rapidfire_nb.store import Store
from tests.rapidfire_nb.server._stores import make_experiment

# docs/ARCHITECTURE.md, "Panel source": the keys panel.js reads
SNAPSHOT_KEYS = {
    "experiment",
    "started_at",
    "now",
    "progress",
    "on_device",
    "num_chunks",
    "hparam_columns",
    "runs",
    "ops",
    "metric_names",
}
RUN_KEYS = {
    "run_id",
    "status",
    "on_device",
    "hparams",
    "completed_steps",
    "total_steps",
    "chunks_done",
    "epoch",
    "samples_seen",
    "loss",
    "eval_loss",
    "error",
    "parent_id",
    "warm_start",
    "legal_ops",
}
OP_KEYS = {"op_id", "run_id", "kind", "state", "message", "requested_at", "applied_at"}


@pytest.fixture
def mgr(rf_root: Path, writers: dict[str, Store]) -> ExperimentsManager:
    return ExperimentsManager(rf_root)


def _status(exc: pytest.ExceptionInfo[ApiError]) -> int:
    return exc.value.status


def test_default_root_is_the_kernels(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RF_HOME", str(tmp_path / "home"))
    assert ExperimentsManager().root == tmp_path / "home"
    assert ExperimentsManager("").root == tmp_path / "home"
    assert ExperimentsManager(tmp_path / "x").root == tmp_path / "x"


def test_list_experiments(mgr: ExperimentsManager, rf_root: Path) -> None:
    (rf_root / "no-store").mkdir()
    data = mgr.list_experiments()
    assert data["root"] == str(rf_root)
    by_name = {x["name"]: x for x in data["experiments"]}
    assert list(by_name) == ["dead", "live"]
    assert by_name["live"]["writer_alive"] is True and by_name["live"]["last_beat"] is not None
    assert by_name["live"]["status_counts"] == {"ONGOING": 1, "COMPLETED": 1, "NEW": 1}
    assert by_name["dead"]["writer_alive"] is False
    assert by_name["dead"]["status_counts"] == {"INTERRUPTED": 1, "COMPLETED": 1, "NEW": 1}
    assert by_name["dead"]["num_runs"] == 3 and by_name["dead"]["trainer_type"] == "SFT"


def test_unreadable_experiments_are_listed_with_their_error(mgr: ExperimentsManager, rf_root: Path) -> None:
    (rf_root / "garbage").mkdir()
    (rf_root / "garbage" / "store.sqlite").write_bytes(b"not a database at all" * 100)
    newer = make_experiment(rf_root, "newer")
    newer.close()
    conn = sqlite3.connect(rf_root / "newer" / "store.sqlite")
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    by_name = {x["name"]: x for x in mgr.list_experiments()["experiments"]}
    assert "error" in by_name["garbage"] and "error" in by_name["newer"]
    assert "newer rapidfire_nb" in by_name["newer"]["error"]
    with pytest.raises(ApiError) as exc:
        mgr.snapshot("newer")
    assert _status(exc) == 409
    with pytest.raises(ApiError) as exc:
        mgr.runs("garbage")
    assert _status(exc) == 500


def test_symlink_out_of_the_root_is_refused(mgr: ExperimentsManager, rf_root: Path, tmp_path: Path) -> None:
    outside = make_experiment(tmp_path / "elsewhere", "secret")
    outside.close()
    (rf_root / "evil").symlink_to(tmp_path / "elsewhere" / "secret", target_is_directory=True)
    assert "evil" not in {x["name"] for x in mgr.list_experiments()["experiments"]}
    with pytest.raises(ApiError) as exc:
        mgr.runs("evil")
    assert _status(exc) == 400 and "outside" in exc.value.message


@pytest.mark.parametrize(
    "name", ["..", ".", "../live", "a/b", "a\\b", "%2e%2e", ".hidden", "", "x" * 129, "a b", "na\x00me", "é"]
)
def test_bad_names_are_400(mgr: ExperimentsManager, name: str) -> None:
    for call in (mgr.runs, mgr.snapshot, mgr.metrics, mgr.experiment):
        with pytest.raises(ApiError) as exc:
            call(name)
        assert _status(exc) == 400 and "experiment name" in exc.value.message
    with pytest.raises(ApiError) as exc:
        mgr.post_op(name, {"kind": "stop", "run_id": 1})
    assert _status(exc) == 400


def test_unknown_experiment_is_404(mgr: ExperimentsManager, rf_root: Path) -> None:
    (rf_root / "empty").mkdir()
    for name in ("nope", "empty"):
        with pytest.raises(ApiError) as exc:
            mgr.snapshot(name)
        assert _status(exc) == 404


def test_runs_reconcile_a_dead_writer(mgr: ExperimentsManager) -> None:
    live = {r["run_id"]: r for r in mgr.runs("live")["runs"]}
    dead = {r["run_id"]: r for r in mgr.runs("dead")["runs"]}
    assert live[1]["status"] == "ONGOING"
    assert dead[1]["status"] == "INTERRUPTED" and dead[1]["stored_status"] == "ONGOING"
    assert dead[2]["status"] == "COMPLETED" and dead[3]["status"] == "NEW"
    assert dead[1]["hparams"]["lora.r"] == 8 and dead[1]["config"] == {"model_name": "tiny", "rid": 1}
    assert dead[1]["loss"] == pytest.approx(2.0 / 3) and dead[1]["eval_loss"] == 1.5


def test_stale_heartbeat_counts_as_dead(
    rf_root: Path, writers: dict[str, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    import rapidfire_nb.store as store_mod

    real_now = store_mod._now
    monkeypatch.setattr(store_mod, "_now", lambda: real_now() - 120)
    writers["live"].beat()
    monkeypatch.setattr(store_mod, "_now", real_now)
    assert ExperimentsManager(rf_root).runs("live")["runs"][0]["status"] == "INTERRUPTED"
    assert ExperimentsManager(rf_root, stale_after=600).runs("live")["runs"][0]["status"] == "ONGOING"


def test_snapshot_is_panel_shaped(mgr: ExperimentsManager) -> None:
    snap = mgr.snapshot("live")
    assert SNAPSHOT_KEYS <= set(snap)
    assert snap["experiment"] == "live" and snap["num_chunks"] == 4 and snap["on_device"] is None
    assert snap["hparam_columns"] == ["learning_rate", "lora.r"]
    assert snap["metric_names"] == ["eval_loss", "learning_rate", "loss"]
    assert snap["progress"] == "chunk 1/4 of epoch 1"  # run 3 (NEW) has done no chunk yet
    runs = {r["run_id"]: r for r in snap["runs"]}
    assert all(RUN_KEYS <= set(r) for r in runs.values())
    assert runs[1]["hparams"] == {"learning_rate": 1e-3, "lora.r": 8}
    assert runs[1]["legal_ops"] == ["stop", "delete", "clone"]
    assert runs[2]["legal_ops"] == ["delete", "clone"]
    assert [set(o) for o in snap["ops"]] == [OP_KEYS]
    assert snap["ops"][0]["state"] == "rejected" and snap["writer_alive"] is True


def test_snapshot_without_a_kernel_offers_no_ops(mgr: ExperimentsManager) -> None:
    snap = mgr.snapshot("dead")
    assert snap["writer_alive"] is False
    assert [r["status"] for r in snap["runs"]] == ["INTERRUPTED", "COMPLETED", "NEW"]
    assert all(r["legal_ops"] == [] for r in snap["runs"])
    assert snap["progress"].startswith("no kernel is running this experiment")


def test_metrics_cursor(mgr: ExperimentsManager) -> None:
    first = mgr.metrics("live", 0, None, 3)
    assert len(first["points"]) == 3 and first["more"] is True
    assert set(first["points"][0]) == {"run_id", "step", "samples_seen", "name", "value", "wall_time"}
    rest = mgr.metrics("live", str(first["cursor"]))
    assert rest["more"] is False and len(rest["points"]) == 9 - 3
    assert math.isnan(rest["points"][-1]["value"])  # JSON-encoded as null by the handler
    assert mgr.metrics("live", rest["cursor"]) == {**rest, "points": [], "more": False}
    only2 = mgr.metrics("live", 0, "2")["points"]
    assert {p["run_id"] for p in only2} == {2} and len(only2) == 5
    col = mgr.metrics("live", 0, None, None, "columnar")["points"]
    assert col["names"] == ["loss", "eval_loss", "grad_norm"] and col["value"][-1] is None
    assert len(col["run"]) == len(col["step"]) == len(col["samples"]) == len(col["name"]) == 9


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("-1",), "cursor"),
        (("abc",), "cursor"),
        (("1.5",), "cursor"),
        ((0, "x"), "run_id"),
        ((0, "0"), "run_id"),
        ((0, None, "0"), "limit"),
        ((0, None, "10000000"), "limit"),
        ((0, None, None, "csv"), "format"),
    ],
)
def test_metrics_bad_params(mgr: ExperimentsManager, args: tuple[Any, ...], fragment: str) -> None:
    with pytest.raises(ApiError) as exc:
        mgr.metrics("live", *args)
    assert _status(exc) == 400 and fragment in exc.value.message


def test_encode_points_matches_the_panels() -> None:
    from rapidfire_nb.panel import encode_points as panel_encode

    pts = [
        {"run_id": 1, "step": 1, "samples_seen": 2, "name": "loss", "value": 1.0},
        {"run_id": 2, "step": 1, "samples_seen": None, "name": "eval_loss", "value": float("nan")},
    ]
    assert encode_points(pts) == panel_encode(pts)


# ------------------------------------------------------------------ ops


def test_stop_goes_to_the_inbox(mgr: ExperimentsManager, writers: dict[str, Store]) -> None:
    out = mgr.post_op("live", {"op_id": "op-1", "kind": "stop", "run_id": 1})
    assert out["op_id"] == "op-1" and out["state"] == "queued" and out["duplicate"] is False
    again = mgr.post_op("live", {"op_id": "op-1", "kind": "stop", "run_id": 1})
    assert again["duplicate"] is True
    taken = writers["live"].take_inbox_ops()
    assert [(o["op_id"], o["kind"], o["run_id"], o["payload"]) for o in taken] == [("op-1", "stop", 1, None)]


def test_op_id_is_made_when_missing(mgr: ExperimentsManager, writers: dict[str, Store]) -> None:
    out = mgr.post_op("live", {"kind": "resume", "run_id": 3, "changes": {}, "warm_start": False})
    assert len(out["op_id"]) == 32
    assert writers["live"].take_inbox_ops()[0]["op_id"] == out["op_id"]


def test_clone_payload(mgr: ExperimentsManager, writers: dict[str, Store]) -> None:
    changes = {
        "learning_rate": 2e-4,
        "lora.r": 4,
        "packing": True,
        "lr_scheduler_type": "cosine",
        "lora.target_modules": ["q_proj"],
    }
    mgr.post_op("live", {"op_id": "c1", "kind": "clone", "run_id": 2, "changes": changes, "warm_start": True})
    mgr.post_op("live", {"op_id": "c2", "kind": "clone", "run_id": 2, "changes": {"learning_rate": 1}})
    taken = writers["live"].take_inbox_ops()
    assert taken[0]["payload"] == {"changes": changes, "warm_start": True}
    assert taken[1]["payload"] == {
        "changes": {"learning_rate": 1},
        "warm_start": False,
    }  # an int is a fine float


BAD_OPS: list[tuple[Any, str]] = [
    ([1, 2], "JSON object"),
    ("stop", "JSON object"),
    ({"kind": "stop", "run_id": 1, "extra": 1}, "unknown key"),
    ({"kind": "explode", "run_id": 1}, "kind must be"),
    ({"kind": None, "run_id": 1}, "kind must be"),
    ({"kind": "stop"}, "run_id is missing"),
    ({"kind": "stop", "run_id": "1"}, "run_id must be"),
    ({"kind": "stop", "run_id": True}, "run_id must be"),
    ({"kind": "stop", "run_id": 1.0}, "run_id must be"),
    ({"kind": "stop", "run_id": 0}, "run_id must be"),
    ({"kind": "stop", "run_id": 2**70}, "run_id must be"),
    ({"kind": "stop", "run_id": 99}, "has no run 99"),
    ({"kind": "stop", "run_id": 1, "op_id": ""}, "op_id"),
    ({"kind": "stop", "run_id": 1, "op_id": "../../x"}, "op_id"),
    ({"kind": "stop", "run_id": 1, "op_id": 5}, "op_id"),
    ({"kind": "stop", "run_id": 1, "op_id": "x" * 200}, "op_id"),
    ({"kind": "stop", "run_id": 1, "changes": {"learning_rate": 1e-4}}, "takes no changes"),
    ({"kind": "delete", "run_id": 1, "warm_start": True}, "takes no changes"),
    ({"kind": "clone", "run_id": 1, "warm_start": "yes"}, "warm_start must be"),
    ({"kind": "clone", "run_id": 1, "changes": [["learning_rate", 1]]}, "changes must be"),
    ({"kind": "clone", "run_id": 1, "changes": {"learning_rat": 1e-4}}, "not an editable field"),
    ({"kind": "clone", "run_id": 1, "changes": {"formatting_func": "lambda x: x"}}, "not an editable field"),
    ({"kind": "clone", "run_id": 1, "changes": {"__class__": 1}}, "not an editable field"),
    ({"kind": "clone", "run_id": 1, "changes": {"learning_rate": "1e-4"}}, "learning_rate must be a number"),
    ({"kind": "clone", "run_id": 1, "changes": {"learning_rate": True}}, "learning_rate must be a number"),
    ({"kind": "clone", "run_id": 1, "changes": {"lora.r": 4.5}}, "lora.r must be an integer"),
    ({"kind": "clone", "run_id": 1, "changes": {"lora.r": False}}, "lora.r must be an integer"),
    ({"kind": "clone", "run_id": 1, "changes": {"packing": 1}}, "packing must be true or false"),
    ({"kind": "clone", "run_id": 1, "changes": {"lr_scheduler_type": {"a": 1}}}, "must be a string"),
    ({"kind": "clone", "run_id": 1, "changes": {"lora.target_modules": "q_proj"}}, "must be a list"),
    ({"kind": "clone", "run_id": 1, "changes": {"lora.target_modules": [["q"]]}}, "must be a list"),
    ({"kind": "clone", "run_id": 1, "changes": {"learning_rate": math.inf}}, "must be a number"),
    ({"kind": "clone", "run_id": 1, "changes": {f"k{i}": 1 for i in range(101)}}, "at most 100"),
]


@pytest.mark.parametrize(("body", "fragment"), BAD_OPS)
def test_bad_ops_are_400_and_queue_nothing(
    mgr: ExperimentsManager, writers: dict[str, Store], body: Any, fragment: str
) -> None:
    with pytest.raises(ApiError) as exc:
        mgr.post_op("live", body)
    assert _status(exc) == 400 and fragment in exc.value.message
    assert writers["live"].take_inbox_ops() == []


def test_fields_the_kernel_marks_other_cannot_be_changed(
    mgr: ExperimentsManager, writers: dict[str, Store]
) -> None:
    fields = writers["live"].get_meta("editable_fields")
    fields["1"]["callbacks"] = "other"
    fields["1"]["weird"] = "a type from the future"
    fields["1"]["eval_steps"] = "null"
    writers["live"].set_meta("editable_fields", fields)
    for field in ("callbacks", "weird"):
        with pytest.raises(ApiError) as exc:
            mgr.post_op("live", {"kind": "clone", "run_id": 1, "changes": {field: 1}})
        assert "cannot be changed from here" in exc.value.message
    for value in (None, 5, 0.5, "steps", [1, "a"]):
        mgr.post_op("live", {"kind": "clone", "run_id": 1, "changes": {"eval_steps": value}})
    with pytest.raises(ApiError):
        mgr.post_op("live", {"kind": "clone", "run_id": 1, "changes": {"eval_steps": {"nested": 1}}})
    with pytest.raises(ApiError) as exc:  # a run the kernel recorded no fields for
        writers["live"].upsert_run(7, status="NEW", hparams={"learning_rate": 1e-3})
        mgr.post_op("live", {"kind": "clone", "run_id": 7, "changes": {"learning_rate": 1e-4}})
    assert "no editable fields" in exc.value.message


def test_without_editable_fields_the_run_hparams_decide(rf_root: Path) -> None:
    w = make_experiment(rf_root, "old", editable=False)
    try:
        mgr = ExperimentsManager(rf_root)
        mgr.post_op("old", {"op_id": "ok", "kind": "clone", "run_id": 1, "changes": {"lora.r": 32}})
        for bad in ({"lora.rr": 32}, {"lora.r": "32"}, {"formatting_func": "<function g>"}):
            with pytest.raises(ApiError) as exc:
                mgr.post_op("old", {"kind": "clone", "run_id": 1, "changes": bad})
            assert exc.value.status == 400
        assert [o["op_id"] for o in w.take_inbox_ops()] == ["ok"]
    finally:
        w.close()


def test_no_kernel_no_op(mgr: ExperimentsManager, writers: dict[str, Store]) -> None:
    with pytest.raises(ApiError) as exc:
        mgr.post_op("dead", {"kind": "resume", "run_id": 1})
    assert _status(exc) == 409 and "no kernel is running experiment 'dead'" in exc.value.message
    assert writers["dead"].take_inbox_ops() == []


def test_stores_are_only_opened_read_only(mgr: ExperimentsManager, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[bool] = []

    class Spy(Store):
        def __init__(self, path: Any, read_only: bool = False) -> None:
            opened.append(read_only)
            super().__init__(path, read_only=read_only)

    monkeypatch.setattr(manager_mod, "Store", Spy)
    mgr.list_experiments()
    mgr.experiment("live")
    mgr.runs("live")
    mgr.metrics("live")
    mgr.snapshot("dead")
    mgr.post_op("live", {"kind": "stop", "run_id": 1})
    assert opened and all(opened)


def test_metrics_reset_when_held_points_were_deleted(
    mgr: ExperimentsManager, writers: dict[str, Store]
) -> None:
    store = writers["live"]
    first = mgr.metrics("live", 0)
    held = len(first["points"])
    assert store.count_metrics() == held == store.count_metrics(first["cursor"])
    assert mgr.metrics("live", first["cursor"], seen=held)["reset"] is False
    store.add_metrics([{"run_id": 1, "step": 9, "name": "loss", "value": 0.1}])
    assert (
        mgr.metrics("live", first["cursor"], seen=str(held))["points"][0]["step"] == 9
    )  # new rows: no reset
    assert store.delete_metrics_after(1, 1) > 0  # a resume from step 1 drops rows this reader holds
    reply = mgr.metrics("live", first["cursor"], seen=held, fmt="columnar")
    assert reply["reset"] is True and reply["cursor"] == 0 and reply["points"]["run"] == []
    with pytest.raises(ApiError) as exc:
        mgr.metrics("live", 0, 1, seen=0)
    assert _status(exc) == 400
