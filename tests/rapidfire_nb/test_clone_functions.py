"""A clone given a function (formatting_func, reward_funcs as one function or a list) is stored by reference and
rebuilt with that same function after a restart; a function that is gone fails that clone only, with the reason.
Only the keys the recipe records as given functions in code are looked up again, only function fields, and only
to a Python function of that very name: any other ``{"__function__": ...}`` value stays data or is an error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb.errors import ConfigError
from rapidfire_nb.experiment import decode_changes, encode_changes
from rapidfire_nb.experiment.clones import function_keys, rebuild_clone_spec
from tests.helpers import qa_dataset, qa_to_chat


def shout(row: dict[str, Any]) -> dict[str, Any]:
    """Another formatting_func: the same rows, answers in capitals."""
    out = qa_to_chat(row)
    out["completion"][0]["content"] = out["completion"][0]["content"].upper()
    return out


alias = qa_to_chat  # the same function under another name


def test_functions_round_trip_by_reference() -> None:
    changes = {"formatting_func": shout, "reward_funcs": [shout, qa_to_chat], "learning_rate": 1e-3}
    stored = encode_changes(changes)
    assert stored["formatting_func"] == {"__function__": f"{__name__}:shout"}
    assert stored["reward_funcs"][1] == {"__function__": "tests.helpers:qa_to_chat"}
    assert function_keys(changes) == ("formatting_func", "reward_funcs")
    back = decode_changes(stored, function_keys(changes))
    assert back == {"formatting_func": shout, "reward_funcs": [shout, qa_to_chat], "learning_rate": 1e-3}
    with pytest.raises(ConfigError, match=r"<lambda>' of module .* is not defined in this process"):
        decode_changes(encode_changes({"formatting_func": lambda row: row}), ["formatting_func"])


def test_a_reference_in_a_data_field_stays_data() -> None:
    system = {"__function__": "os:system"}
    back = decode_changes({"model_kwargs.attn": system, "learning_rate": 1e-3})
    assert back == {"model_kwargs.attn": {"__function__": "os:system"}, "learning_rate": 1e-3}


@pytest.mark.parametrize(
    ("changes", "functions", "message"),
    [
        # a function field holding a reference the recipe does not record as given in code (e.g. an old recipe,
        # or one written by anything else)
        (
            {"formatting_func": {"__function__": "os:system"}},
            [],
            "'formatting_func' is a function reference its "
            "recipe does not record as given in code; it is not looked up",
        ),
        (
            {"reward_funcs": [{"__function__": f"{__name__}:shout"}]},
            [],
            "'reward_funcs' is a function reference",
        ),
        # a recipe recording a data field as a function
        (
            {"learning_rate": {"__function__": "os:system"}},
            ["learning_rate"],
            "records 'learning_rate' as a "
            "function, but only formatting_func, compute_metrics, reward_funcs take functions",
        ),
        # recorded, but not a Python function of that name: a builtin, an alias
        (
            {"formatting_func": {"__function__": "os:system"}},
            ["formatting_func"],
            "refers to 'os:system', which "
            "is not a Python function defined under that name (it is builtin_function_or_method posix:system)",
        ),
        ({"formatting_func": {"__function__": "posix:system"}}, ["formatting_func"], "not a Python function"),
        (
            {"formatting_func": {"__function__": f"{__name__}:alias"}},
            ["formatting_func"],
            "(it is function tests.helpers:qa_to_chat)",
        ),
        ({"formatting_func": "shout"}, ["formatting_func"], "should be a function reference, got 'shout'"),
    ],
)
def test_references_that_were_not_recorded_from_code_are_never_looked_up(
    changes: dict[str, Any], functions: list[str], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        decode_changes(changes, functions)
    assert message in str(err.value)


def test_a_recipe_with_a_function_reference_it_does_not_record_fails_to_rebuild() -> None:
    parent = _group().expand(3)[0]
    recipe = {"parent": 1, "changes": {"formatting_func": {"__function__": "os:system"}}, "warm": False}
    with pytest.raises(ConfigError, match="does not record as given in code"):
        rebuild_clone_spec(parent, recipe)
    ok = {
        "parent": 1,
        "changes": encode_changes({"formatting_func": shout}),
        "functions": ["formatting_func"],
    }
    assert rebuild_clone_spec(parent, ok).formatting_func is shout


def _group() -> Any:
    from rapidfire_nb.automl import RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    return RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            formatting_func=qa_to_chat,
            peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
            training_args=RFSFTConfig(
                learning_rate=1e-3, per_device_train_batch_size=2, num_train_epochs=1, max_length=32
            ),
        ),
        "SFT",
    )


def test_a_clone_with_a_new_function_is_rebuilt_with_it_after_a_restart(tmp_path: Path) -> None:
    from rapidfire_nb import Experiment
    from rapidfire_nb.store import Store
    from rapidfire_nb.testing import tiny_create_model

    args = (_group(), tiny_create_model, qa_dataset(8))
    exp = Experiment("fn", experiment_path=tmp_path)
    exp.quiet = True
    exp.run_fit(*args, num_chunks=2, seed=3, background=True)
    child = exp.clone_modify(1, {"formatting_func": shout})
    other = exp.clone_modify(1, {"formatting_func": lambda row: qa_to_chat(row)})
    assert exp.wait(timeout=120)
    assert exp.session.spec(child).formatting_func is shout
    exp.end()
    with Store(tmp_path / "fn") as store:  # as if the kernel had died before the clones finished
        store.upsert_run(child, status="INTERRUPTED")
        store.upsert_run(other, status="INTERRUPTED")
        assert store.get_meta("clones")[str(child)]["changes"] == {
            "formatting_func": {"__function__": f"{__name__}:shout"}
        }
        assert store.get_meta("clones")[str(child)]["functions"] == ["formatting_func"]
    again = Experiment("fn", experiment_path=tmp_path)
    said: list[str] = []
    again.on_message(said.append)
    again.run_fit(*args, num_chunks=2, seed=3, background=True)
    assert again.wait(timeout=120)
    assert again.session.spec(child).formatting_func is shout  # not the parent's qa_to_chat
    statuses = {r["run_id"]: r for r in again.store.runs()}
    assert statuses[child]["status"] == "COMPLETED"
    assert statuses[other]["status"] == "FAILED" and "<lambda>' of module" in statuses[other]["error"]
    assert any(f"run {other} cannot be rebuilt after the restart" in line for line in said), said
    again.end()
