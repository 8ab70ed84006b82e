"""The ``pack`` column: the executor's ``on_pack(run_id, pack_id)`` -> the store's meta ``packs`` -> ``get_runs_info()``,
the page's snapshot and ``%rapidfire status`` (stores written directly through the kernel's callbacks; no training)."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest

from kernel_scheduler import RunStatus
from rapidfire_nb import magic, meta_keys, view
from rapidfire_nb.experiment.binding import SessionBinding
from rapidfire_nb.experiment.record_writes import record_pack
from rapidfire_nb.experiment.reporter import Reporter
from rapidfire_nb.experiment.start import _callbacks, _record_group
from rapidfire_nb.experiment.tables import runs_table
from rapidfire_nb.store import Store
from rapidfire_nb.view.snapshot import StoreRows
from tests.rapidfire_nb.server._stores import make_experiment


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = make_experiment(tmp_path, "packs", statuses={1: "ONGOING", 2: "ONGOING", 3: "COMPLETED"})
    yield s
    s.close()


def _kernel_callbacks(store: Store) -> Any:
    """The callbacks run_fit gives its executor, over a recorder that writes at once (its thread's order)."""
    recorder = types.SimpleNamespace(on_metrics=None, on_final=None, in_order=lambda fn: fn())
    return _callbacks(store, Reporter(quiet=True), recorder, SessionBinding())  # type: ignore[arg-type]


def test_on_pack_is_stored_and_get_runs_info_shows_a_pack_column(store: Store, tmp_path: Path) -> None:
    assert "pack" not in runs_table(store, {}, [], False).columns  # nobody packed: the table reads as before
    callbacks = _kernel_callbacks(store)
    callbacks.on_pack(1, 1)
    callbacks.on_pack(2, 1)
    assert store.get_meta(meta_keys.PACKS) == {"1": 1, "2": 1}
    table = runs_table(store, {}, [], False)
    assert table["pack"].tolist() == [1, 1, None]
    assert table["pack"].dtype == object and table["pack"][2] is None  # never a NaN shown as a number
    assert list(table.columns[-3:]) == ["stop_reason", "pack", "config"]
    # a restarted kernel (another reader of the file) shows it
    with Store(tmp_path / "packs", read_only=True) as reopened:
        assert runs_table(reopened, {}, [], False)["pack"].tolist() == [1, 1, None]
    callbacks.on_pack(2, None)  # left packing
    assert store.get_meta(meta_keys.PACKS) == {"1": 1}
    assert runs_table(store, {}, [], False)["pack"].tolist() == [1, None, None]


def test_record_pack_writes_only_a_change() -> None:
    class Meta:
        def __init__(self) -> None:
            self.values: dict[str, Any] = {}
            self.writes = 0

        def get_meta(self, key: str, default: Any = None) -> Any:
            return self.values.get(key, default)

        def set_meta(self, key: str, value: Any) -> None:
            self.values[key] = value
            self.writes += 1

    meta = Meta()
    record_pack(meta, 3, 1)
    record_pack(meta, 3, 1)
    record_pack(meta, 4, None)  # never packed: nothing to remove
    assert (meta.values, meta.writes) == ({meta_keys.PACKS: {"3": 1}}, 1)
    record_pack(meta, 3, None)
    assert (meta.values, meta.writes) == ({meta_keys.PACKS: {}}, 2)


def test_the_page_and_the_panel_snapshot_carry_each_runs_pack(store: Store) -> None:
    callbacks = _kernel_callbacks(store)
    callbacks.on_pack(2, 2)
    callbacks.on_pack(3, 2)
    snap = view.store_snapshot("packs", StoreRows.read(store), writer_alive=True)
    assert [r["pack"] for r in snap["runs"]] == [None, 2, 2]
    reopened = view.reopened_snapshot("packs", StoreRows.read(store))
    assert [r["pack"] for r in reopened["runs"]] == [None, 2, 2]


def test_rapidfire_status_shows_the_pack_after_the_status(store: Store) -> None:
    _kernel_callbacks(store).on_pack(1, 1)
    _kernel_callbacks(store).on_pack(2, 1)
    runs = [{"run_id": i, "status": s} for i, s in ((1, "ONGOING"), (2, "ONGOING"), (3, "COMPLETED"))]
    exp = types.SimpleNamespace(
        panel_snapshot=lambda: {"runs": runs, "num_chunks": 4, "early_stopping": None},
        get_runs_info=lambda: runs_table(store, {}, [], False),
    )
    df = magic._status(exp)  # type: ignore[arg-type]
    assert list(df.columns[:2]) == ["status", "pack"]
    assert df["pack"].tolist() == [1, 1, None]


def test_a_new_session_forgets_the_packs_of_the_runs_that_train_again(store: Store) -> None:
    """After a restart the executor says the packs of the runs it trains afresh; a finished run keeps its pack."""
    store.set_meta(meta_keys.PACKS, {"1": 1, "2": 1, "3": 1})
    statuses = {1: RunStatus.INTERRUPTED, 2: RunStatus.ONGOING, 3: RunStatus.COMPLETED}
    snaps = [types.SimpleNamespace(run_id=i, status=st, spec=object()) for i, st in statuses.items()]
    session = types.SimpleNamespace(
        inputs=types.SimpleNamespace(fingerprint="f", trainer_type="SFT", meta=dict, panel_meta=dict),
        columns=[],
        recorder=types.SimpleNamespace(record_editable=lambda specs: None),
        specs=list,
        scheduler=types.SimpleNamespace(snapshot=lambda: snaps),
    )
    _record_group(session, store, {r["run_id"]: r for r in store.runs()})  # type: ignore[arg-type]
    assert store.get_meta(meta_keys.PACKS) == {"3": 1}
    assert runs_table(store, {}, [], False)["pack"].tolist() == [None, None, 1]
