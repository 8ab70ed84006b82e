"""A clone's name through the clone path (no training: a real Store): ``prepare_clone`` names it ``"<parent>
(clone)"`` or as its changes say, ``record_clone`` stores the name with its config (what the panel, the page and
``get_runs_info()`` read), and a restarted kernel rebuilds the same name from the stored recipe."""

from __future__ import annotations

from pathlib import Path

from rapidfire_nb import meta_keys
from rapidfire_nb.automl import RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.experiment import tables
from rapidfire_nb.experiment.clones import prepare_clone, rebuild_clone_spec, record_clone
from rapidfire_nb.store import Store


def test_a_clone_is_named_after_its_parent_stored_and_rebuilt_the_same(tmp_path: Path) -> None:
    config = RFModelConfig(
        model_name="tiny",
        peft_config=RFLoraConfig(r=4, target_modules=["q_proj"]),
        training_args=RFSFTConfig(learning_rate=1e-3, max_steps=2),
        run_name="lr{learning_rate}",
        tags=["base"],
    )
    parent = RFGridSearch(config, "SFT").expand()[0]
    store = Store(tmp_path / "exp")
    store.upsert_run(1, status="COMPLETED", config=parent.to_json(), hparams=parent.hparams())
    plain = prepare_clone(parent, 1, {"learning_rate": 5e-4}, warm_start=False, source="panel")
    renamed = prepare_clone(parent, 1, {"run_name": "wd{weight_decay}", "tags": ["b"]}, False, "api")
    record_clone(store, 2, 1, plain)
    record_clone(store, 3, 1, renamed)
    info = tables.runs_table(store, {}, [], include_deleted=False)
    assert list(info.run_name) == ["lr0.001", "lr0.001 (clone)", "wd0"]
    assert list(info.tags) == [["base"], ["base"], ["b"]]
    recipes = store.get_meta(meta_keys.CLONES)
    assert [rebuild_clone_spec(parent, recipes[k]).run_name for k in ("2", "3")] == ["lr0.001 (clone)", "wd0"]
    assert plain.spec.fingerprint() != parent.fingerprint()  # the changed learning rate, not the name
    assert renamed.spec.fingerprint() == parent.fingerprint()  # a new name alone: the same config
    store.close()
