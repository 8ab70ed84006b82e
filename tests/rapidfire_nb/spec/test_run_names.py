"""Run names and tags in the spec layer: where they are given, templates, unique names in a sweep, clones, the bad
inputs refused before training, and a fingerprint that names never change (an experiment recorded before names
existed reopens with the same fingerprints)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFRandomSearch, RFSFTConfig
from rapidfire_nb.errors import ConfigError
from rapidfire_nb.spec import LeafConfig, build_training_args
from rapidfire_nb.spec.names import clone_name, fill_run_name, unique_names


def _group(**labels: object) -> RFModelConfig:
    return RFModelConfig(
        model_name="m",
        peft_config=List([RFLoraConfig(r=8), RFLoraConfig(r=16)]),
        training_args=RFSFTConfig(learning_rate=List([1e-4, 2e-4]), max_steps=4),
        **labels,
    )


def test_a_template_names_each_run_of_a_grid_by_its_values() -> None:
    leaves = RFGridSearch(_group(run_name="lr{learning_rate:.0e}-r{lora.r}", tags=["sweep"]), "SFT").expand()
    assert [leaf.run_name for leaf in leaves] == ["lr1e-04-r8", "lr2e-04-r8", "lr1e-04-r16", "lr2e-04-r16"]
    assert all(leaf.tags == ("sweep",) for leaf in leaves)
    # an unset trainer field fills with TRL's default; literal braces stay
    leaf = RFGridSearch(RFModelConfig(model_name="m", run_name="{{x}} wd{weight_decay}"), "SFT").expand()[0]
    assert leaf.run_name == "{x} wd0"


def test_one_name_over_a_grid_gets_the_differing_hyperparameters_appended() -> None:
    names = [leaf.run_name for leaf in RFGridSearch(_group(run_name="base"), "SFT").expand()]
    assert names == [
        "base (learning_rate=0.0001, r=8)",
        "base (learning_rate=0.0002, r=8)",
        "base (learning_rate=0.0001, r=16)",
        "base (learning_rate=0.0002, r=16)",
    ]
    random = RFRandomSearch(_group(run_name="rs"), "SFT", num_runs=4).expand(seed=1)
    assert len({leaf.run_name for leaf in random}) == 4 and all(
        leaf.run_name.startswith("rs (") for leaf in random
    )
    # runs that differ in nothing are numbered; unnamed runs stay unnamed
    assert unique_names(["a", None, "a", "b"], [{"x": 1}, {"x": 1}, {"x": 1}, {"x": 2}]) == [
        "a #1",
        None,
        "a #2",
        "b",
    ]


def test_names_and_tags_are_labels_not_part_of_the_fingerprint_nor_hparams() -> None:
    named = RFGridSearch(_group(run_name="lr{learning_rate}-r{lora.r}", tags=["t"]), "SFT").expand()
    plain = RFGridSearch(_group(), "SFT").expand()
    assert [a.fingerprint() for a in named] == [b.fingerprint() for b in plain]
    assert "run_name" not in named[0].fingerprint() and "tags" not in named[0].fingerprint()
    assert "run_name" not in named[0].hparams() and "tags" not in named[0].hparams()
    stored = named[0].to_json()  # the store's config json holds them (restored after a restart)
    assert stored["run_name"] == "lr0.0001-r8" and stored["tags"] == ["t"]
    # a fingerprint recorded before names existed: the same JSON without the new keys
    before = {k: v for k, v in json.loads(plain[0].fingerprint()).items()}
    assert set(before) == {f for f in stored if f not in ("run_name", "tags", "hub_token")}


def test_trl_run_name_is_the_same_name_moved_out_of_the_hyperparameters() -> None:
    cfg = RFModelConfig(
        model_name="m", training_args=RFSFTConfig(run_name="hf-{learning_rate}", learning_rate=3e-4)
    )
    leaf = RFGridSearch(cfg, "SFT").expand()[0]
    assert (
        leaf.run_name == "hf-0.0003" and "run_name" not in leaf.training and "run_name" not in leaf.hparams()
    )
    args, _ = build_training_args(leaf, output_dir="/tmp/rf-names", default_seed=0, cuda_available=False)
    assert args.run_name == "hf-0.0003"  # TRL's own field carries it, for the user's callbacks
    legacy = LeafConfig(trainer_type="SFT", model_name="m", training={"run_name": "old", "max_steps": 2})
    assert legacy.run_name == "old" and legacy.training == {"max_steps": 2}
    both = RFModelConfig(model_name="m", run_name="a", training_args=RFSFTConfig(run_name="b"))
    with pytest.raises(ConfigError, match="run_name is set twice"):
        RFGridSearch(both, "SFT").expand()


@pytest.mark.parametrize(
    ("labels", "match"),
    [
        ({"run_name": 3}, "run_name must be a str"),
        ({"run_name": "  "}, "run_name is empty"),
        ({"run_name": "x" * 129}, "129 characters; keep it to 128"),
        ({"run_name": "a\nb"}, "control character"),
        ({"run_name": "lr{learning_rate"}, "not a valid template"),
        ({"run_name": "{}"}, "empty or numbered field"),
        ({"run_name": List(["a", "b"])}, "not a hyperparameter to search"),
        ({"tags": [1]}, r"tags\[0\] must be a str"),
        ({"tags": ["x" * 65]}, "1 to 64 characters"),
        ({"tags": {"a": 1}}, "must be a list of str"),
    ],
)
def test_bad_names_and_tags_are_refused_at_the_config(labels: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RFModelConfig(model_name="m", **labels)


def test_a_template_field_the_run_lacks_is_refused_at_the_expansion_with_the_closest_name() -> None:
    with pytest.raises(
        ConfigError, match=r"configs\[0\]: .*\{learnin_rate\} is not a hyperparameter.*\{learning_rate\}"
    ):
        RFGridSearch(_group(run_name="{learnin_rate}"), "SFT").expand()
    with pytest.raises(ConfigError, match=r"\{learning_rate:d\} does not fit the value 0.0001"):
        RFGridSearch(_group(run_name="{learning_rate:d}"), "SFT").expand()
    with pytest.raises(ConfigError, match="not a valid template"):
        RFSFTConfig(run_name="{oops")
    with pytest.raises(ConfigError, match="not a hyperparameter to search"):
        RFSFTConfig(run_name=List(["a", "b"]))


def test_a_clone_is_named_after_its_parent_unless_it_names_itself() -> None:
    parent = RFGridSearch(_group(run_name="lr{learning_rate}", tags=["t"]), "SFT").expand()[0]
    assert parent.run_name == "lr0.0001 (r=8)"  # the template leaves r out: the sweep's names add it
    child = parent.with_changes({"learning_rate": 5e-4})
    assert child.run_name == "lr0.0001 (r=8) (clone)" and child.tags == ("t",)
    assert child.fingerprint() == parent.with_changes({"learning_rate": 5e-4, "run_name": "x"}).fingerprint()
    renamed = parent.with_changes(
        {"learning_rate": 5e-4, "run_name": "lr{learning_rate}", "tags": ["u", "u"]}
    )
    assert renamed.run_name == "lr0.0005" and renamed.tags == ("u",)
    unnamed = RFGridSearch(_group(), "SFT").expand()[0].with_changes({"learning_rate": 5e-4})
    assert unnamed.run_name is None
    long = clone_name("y" * 128)
    assert long is not None and len(long) == 128 and long.endswith("… (clone)")
    with pytest.raises(ConfigError, match="run_name must be a str"):
        parent.with_changes({"run_name": 7})


def test_fill_run_name_formats_lists_and_floats_for_reading() -> None:
    values = {"lora.target_modules": ["q_proj", "v_proj"], "learning_rate": 0.00030000000000000003}
    assert fill_run_name("{lora.target_modules} {learning_rate}", values) == "q_proj,v_proj 0.0003"
    assert fill_run_name("plain", {}) == "plain" and fill_run_name(None, {}) is None


def test_an_experiment_recorded_with_trls_run_name_before_names_is_the_same_group(tmp_path: Path) -> None:
    """Before names, ``RFSFTConfig(run_name=...)`` was a training argument in the fingerprint: ``run_fit`` on such an
    experiment accepts the group (its recorded fingerprint is the legacy one), and still refuses another group."""
    from rapidfire_nb.experiment.inputs import FitInputs
    from rapidfire_nb.experiment.start import check_group
    from rapidfire_nb.store import Store

    cfg = RFModelConfig(
        model_name="m", training_args=RFSFTConfig(run_name="r-{max_steps}", max_steps=List([2, 3]))
    )
    specs = tuple(RFGridSearch(cfg, "SFT").expand())
    old = [
        json.loads(s.fingerprint()) for s in specs
    ]  # what the code before names recorded: run_name as written
    for plain in old:
        plain["training"]["run_name"] = "r-{max_steps}"
    recorded = json.dumps([json.dumps(p, sort_keys=True, separators=(",", ":")) for p in old])
    inputs = FitInputs(
        specs, "SFT", json.dumps([s.fingerprint() for s in specs]), (), print, [], None, None, None, 1, 0
    )
    assert recorded != inputs.fingerprint
    store = Store(tmp_path / "exp")
    store.upsert_run(1, status="COMPLETED", config={}, hparams={}, source="fit")
    store.set_meta("fingerprint", recorded)
    assert set(check_group("exp", store, inputs, trained_here=False) or {}) == {1}
    store.set_meta("fingerprint", json.dumps(["another group"]))
    with pytest.raises(Exception, match="already holds a different config group"):
        check_group("exp", store, inputs, trained_here=False)
    store.close()
