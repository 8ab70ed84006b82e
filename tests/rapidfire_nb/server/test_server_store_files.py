"""The server and the experiment's files: symlinked stores, damaged stores, ended experiments (issue 12)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rapidfire_nb.server.manager import ApiError, ExperimentsManager
from rapidfire_nb.store import Store
from tests.rapidfire_nb.server._stores import make_experiment


@pytest.fixture
def mgr(rf_root: Path, writers: dict[str, Store]) -> ExperimentsManager:
    return ExperimentsManager(rf_root)


@pytest.mark.parametrize("linked", ["store.sqlite", "store.sqlite-wal", "writer.lock"])
def test_a_store_file_symlinked_out_of_the_root_is_neither_served_nor_written(
    mgr: ExperimentsManager, rf_root: Path, tmp_path: Path, linked: str
) -> None:
    outside = make_experiment(tmp_path / "elsewhere", "secret")  # a live writer: ops would be accepted
    outside.close()
    folder = rf_root / "evil"
    folder.mkdir()
    if linked == "store.sqlite":
        (folder / "store.sqlite").symlink_to(outside.path)
    else:  # the store is a copy; one of the files SQLite or the lock writes is a link out of the root
        shutil.copy(outside.path, folder / "store.sqlite")
        (folder / linked).symlink_to(tmp_path / "elsewhere" / "secret" / linked)
    assert "evil" not in {x["name"] for x in mgr.list_experiments()["experiments"]}
    for call in (mgr.runs, mgr.snapshot, mgr.experiment):
        with pytest.raises(ApiError) as exc:
            call("evil")
        assert exc.value.status == 400 and "outside the experiments root" in exc.value.message
    with pytest.raises(ApiError) as exc:
        mgr.post_op("evil", {"kind": "stop", "run_id": 1})
    assert exc.value.status == 400
    with Store(outside.path) as target:
        assert target.take_inbox_ops() == []  # nothing was posted through the link
    assert os.path.islink(folder / linked)


def test_a_symlinked_store_inside_the_root_is_served(mgr: ExperimentsManager, rf_root: Path) -> None:
    (rf_root / "alias").mkdir()
    (rf_root / "alias" / "store.sqlite").symlink_to(rf_root / "live" / "store.sqlite")
    assert mgr.runs("alias")["runs"][0]["run_id"] == 1


def test_the_side_files_checked_include_the_writer_lock() -> None:
    from rapidfire_nb._writer_lock import LOCK_FILENAME
    from rapidfire_nb.paths import STORE_FILENAME, STORE_SIDE_FILES

    assert {LOCK_FILENAME, STORE_FILENAME} <= set(STORE_SIDE_FILES)


def test_a_damaged_store_is_listed_with_what_is_wrong_and_the_others_still_are(
    mgr: ExperimentsManager, rf_root: Path
) -> None:
    (rf_root / "broken").mkdir()
    (rf_root / "broken" / "store.sqlite").write_bytes(b"\x00garbage" * 300)
    by_name = {x["name"]: x for x in mgr.list_experiments()["experiments"]}
    assert sorted(by_name) == ["broken", "dead", "live"] and "error" not in by_name["live"]
    error = by_name["broken"]["error"]
    assert str(rf_root / "broken" / "store.sqlite") in error and "damaged" in error, error
    assert "file is not a database" in error and "backup" in error
    with pytest.raises(ApiError) as exc:
        mgr.snapshot("broken")
    assert exc.value.status == 500 and exc.value.message == error
