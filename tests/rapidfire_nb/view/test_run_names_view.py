"""Run names and tags where the views show them (no torch: a real Store, rows written by hand): every snapshot's run
entry (the panel, the page, a reopened panel), ``get_runs_info()`` (``run_name`` after ``run_id``, ``tags`` before
``config``), and a run recorded before runs had names (no ``run_name`` in its config) shown by its id alone."""

from __future__ import annotations

from pathlib import Path

from rapidfire_nb.experiment import tables
from rapidfire_nb.store import Store
from rapidfire_nb.view.snapshot import (
    KernelState,
    StoreRows,
    kernel_snapshot,
    reopened_snapshot,
    store_snapshot,
)
from rapidfire_nb.view.text import run_label, run_labels


def _store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "exp")
    named = {"model_name": "m", "run_name": "lr1e-04-r8", "tags": ["sweep", "lora"]}
    store.upsert_run(1, status="COMPLETED", config=named, hparams={"learning_rate": 1e-4}, total_steps=4)
    store.upsert_run(
        2, status="STOPPED", config={"model_name": "m"}, hparams={"learning_rate": 2e-4}
    )  # before names
    clone = {"model_name": "m", "run_name": "lr1e-04-r8 (clone)", "tags": ["sweep", "lora"]}
    store.upsert_run(
        3, status="NEW", config=clone, hparams={"learning_rate": 3e-4}, parent_id=1, source="clone"
    )
    return store


def test_every_snapshot_carries_each_runs_name_and_tags_beside_its_id(tmp_path: Path) -> None:
    store = _store(tmp_path)
    rows = StoreRows.read(store)
    kernel = KernelState(started_at=None, num_chunks=2, hparam_columns=["learning_rate"])
    for snap in (
        store_snapshot("e", rows, writer_alive=False),
        reopened_snapshot("e", rows),
        kernel_snapshot("e", rows, kernel),
    ):
        got = [(r["run_id"], r["run_name"], r["tags"]) for r in snap["runs"]]
        assert got == [
            (1, "lr1e-04-r8", ["sweep", "lora"]),
            (2, None, []),
            (3, "lr1e-04-r8 (clone)", ["sweep", "lora"]),
        ]
    assert run_label(snap["runs"][0]) == "run 1 · lr1e-04-r8" and run_label(snap["runs"][1]) == "run 2"
    store.close()


def test_runs_info_has_run_name_after_run_id_and_tags_before_config(tmp_path: Path) -> None:
    store = _store(tmp_path)
    table = tables.runs_table(store, {}, [], include_deleted=False)
    columns = list(table.columns)
    assert columns[:3] == ["run_id", "run_name", "status"] and columns[-2:] == ["tags", "config"]
    assert list(table.run_name) == ["lr1e-04-r8", None, "lr1e-04-r8 (clone)"]  # None, never NaN
    assert list(table.tags) == [["sweep", "lora"], [], ["sweep", "lora"]]
    assert list(table.run_id) == [1, 2, 3]  # the id stays the key
    assert "lr1e-04-r8 (clone)" in repr(table[["run_id", "run_name"]])  # shown whole
    store.close()


def test_runs_info_without_names_or_tags_reads_as_before(tmp_path: Path) -> None:
    store = Store(tmp_path / "plain")
    store.upsert_run(1, status="COMPLETED", config={"model_name": "m"}, hparams={})
    store.upsert_run(
        2, status="COMPLETED", config={"model_name": "m", "run_name": None, "tags": []}, hparams={}
    )
    columns = list(tables.runs_table(store, {}, [], include_deleted=False).columns)
    assert columns[:2] == ["run_id", "status"] and "run_name" not in columns and "tags" not in columns
    store.upsert_run(2, config={"model_name": "m", "tags": ["x"]})  # tags alone: a tags column, no run_name
    columns = list(tables.runs_table(store, {}, [], include_deleted=False).columns)
    assert columns[:2] == ["run_id", "status"] and columns[-2:] == ["tags", "config"]
    store.close()


def test_malformed_labels_read_as_none() -> None:
    assert run_labels(None) == {"run_name": None, "tags": []}
    assert run_labels({"run_name": 3, "tags": "x"}) == {"run_name": None, "tags": []}
    assert run_labels({"run_name": "", "tags": ["a", 1]}) == {"run_name": None, "tags": ["a"]}


def test_rapidfire_status_shows_the_name_next_to_the_id(tmp_path: Path) -> None:
    import types

    from rapidfire_nb import magic

    store = _store(tmp_path)
    exp = types.SimpleNamespace(
        panel_snapshot=lambda: reopened_snapshot("e", StoreRows.read(store)),
        get_runs_info=lambda: tables.runs_table(store, {}, [], False),
    )
    df = magic._status(exp)  # type: ignore[arg-type]
    assert df.index.name == "run_id" and list(df.columns[:2]) == ["run_name", "status"]
    assert list(df.run_name) == ["lr1e-04-r8", None, "lr1e-04-r8 (clone)"]
    store.close()
