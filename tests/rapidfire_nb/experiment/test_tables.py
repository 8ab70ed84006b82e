"""The result tables built from the store (no torch: a real Store, rows written by hand)."""

from __future__ import annotations

from pathlib import Path

from rapidfire_nb.experiment import tables
from rapidfire_nb.store import Store


def test_text_columns_keep_none_beside_a_failed_run(tmp_path: Path) -> None:
    store = Store(tmp_path / "exp")
    store.upsert_run(1, status="COMPLETED", config={}, hparams={}, total_steps=4, completed_steps=4)
    store.upsert_run(2, status="FAILED", config={}, hparams={}, error="diverged at step 2: loss is NaN")
    table = tables.runs_table(store, {}, [], include_deleted=False)
    assert list(table.status) == ["COMPLETED", "FAILED"]
    assert table.error[0] is None and table.error[1] == "diverged at step 2: loss is NaN"  # was NaN for run 1
    assert table.checkpoint_dir[0] is None and table.stop_reason[1] is None
    store.close()


def test_a_missing_train_dataset_is_named_as_missing() -> None:
    import pytest

    from rapidfire_nb import ConfigError
    from rapidfire_nb.experiment.inputs import FitArgs, check_fit_inputs

    with pytest.raises(
        ConfigError, match="train_dataset is required, got None"
    ):  # was "train_dataset is empty"
        check_fit_inputs(FitArgs(object(), lambda cfg: None, None, None, 2, 0))
