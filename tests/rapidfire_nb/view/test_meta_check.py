"""rapidfire_nb.view.meta_check: malformed meta values are left out with one warning each (issue 34 item 9)."""

from __future__ import annotations

from rapidfire_nb.view import StoreRows, store_snapshot
from rapidfire_nb.view.meta_check import UNKNOWN_END, checked_meta, meta_value

GOOD = {
    "hparam_columns": ["learning_rate"],
    "num_chunks": 4,
    "clock": {"busy_s": 3.0, "busy_since": None},
    "devices": {"1": "cpu:0"},
    "editable_fields": {"1": {"learning_rate": "number"}},
    "early_stopping": {"policy": "median"},
    "panel_metrics": {"plots": ["loss"], "best_by": None},
    "fingerprint": {"kept": "no known shape"},
}


def test_good_values_pass_unchanged() -> None:
    assert checked_meta(GOOD) == (GOOD, [])
    assert checked_meta({"hparam_columns": None}) == ({"hparam_columns": None}, [])


def test_each_malformed_value_is_dropped_with_a_warning() -> None:
    bad = {
        "hparam_columns": 7,
        "num_chunks": True,
        "clock": "busy",
        "devices": ["cpu"],
        "editable_fields": {"1": "garbage"},
        "early_stopping": 3,
        "panel_metrics": {"plots": 5},
        "metric_names": [{"a": 1}],
    }
    meta, warnings = checked_meta({**bad, "seed": 42})
    assert meta == {"seed": 42}
    assert warnings == [
        "meta 'hparam_columns' holds a number, not a list of names; ignored",
        "meta 'num_chunks' holds a boolean, not a positive integer; ignored",
        'meta \'clock\' holds a string, not {"busy_s": seconds, "busy_since": unix seconds | null}; ignored',
        "meta 'devices' holds a list of names, not an object: run id -> device name; ignored",
        "meta 'editable_fields' holds an object of another shape, not an object: run id -> {field: JSON type name}; "
        "ignored",
        "meta 'early_stopping' holds a number, not an object (the policy's progress); ignored",
        "meta 'panel_metrics' holds an object of another shape, not "
        '{"plots": [names] | null, "best_by": name | null}; ignored',
        "meta 'metric_names' holds a list, not a list of names; ignored",
    ]


def test_a_malformed_end_reads_as_ended() -> None:
    assert meta_value("ended_at", "yesterday") == UNKNOWN_END
    assert meta_value("ended_at", 5.0) == 5.0 and meta_value("ended_at", None) is None
    meta, warnings = checked_meta({"ended_at": [1]})
    assert meta == {"ended_at": UNKNOWN_END} and "read as ended at an unknown time" in warnings[0]


class _Store:
    def __init__(self, meta: dict[str, object]) -> None:
        self._meta = meta

    def meta(self) -> dict[str, object]:
        return self._meta

    def runs(self) -> list[dict[str, object]]:
        return []

    def latest_metrics(self, names: object) -> dict[int, dict[str, object]]:
        return {}

    def ops(self) -> list[dict[str, object]]:
        return []


def test_the_store_snapshot_is_built_without_the_bad_values() -> None:
    rows = StoreRows.read(
        _Store({"hparam_columns": 7, "num_chunks": "4", "metric_names": 3, "created_at": 1.0})
    )
    snap = store_snapshot("e", rows, True, None)
    assert snap["hparam_columns"] == [] and snap["num_chunks"] == 0 and snap["metric_names"] == []
