"""Each run's pack as the views read it from meta ``packs`` (a malformed value costs a warning, never an error)."""

from __future__ import annotations

from rapidfire_nb import meta_keys
from rapidfire_nb.view.devices_view import stored_packs
from rapidfire_nb.view.meta_check import checked_meta


def test_stored_packs_reads_run_ids_and_pack_ids_only() -> None:
    meta = {meta_keys.PACKS: {"1": 1, "2": 1, "7": 5, "x": 1, "8": True, "9": "1", "10": None}}
    assert stored_packs(meta) == {1: 1, 2: 1, 7: 5}
    assert stored_packs({}) == {} and stored_packs({meta_keys.PACKS: [1, 2]}) == {}


def test_a_malformed_packs_value_is_dropped_with_a_warning() -> None:
    meta, warnings = checked_meta({meta_keys.PACKS: {"1": "one"}, meta_keys.NUM_CHUNKS: 4})
    assert meta == {meta_keys.NUM_CHUNKS: 4}
    assert warnings == [
        "meta 'packs' holds an object of another shape, not an object: run id -> pack id; ignored"
    ]
    good = {meta_keys.PACKS: {"1": 1, "3": 1}}
    assert checked_meta(good) == (good, [])
