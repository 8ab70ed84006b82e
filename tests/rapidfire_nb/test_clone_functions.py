"""A clone given a function (formatting_func, reward_funcs as one function or a list) is stored by reference and
rebuilt with that same function after a restart; a function that is gone fails that clone only, with the reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb.errors import ConfigError
from rapidfire_nb.experiment import decode_changes, encode_changes
from tests.helpers import qa_dataset, qa_to_chat


def shout(row: dict[str, Any]) -> dict[str, Any]:
    """Another formatting_func: the same rows, answers in capitals."""
    out = qa_to_chat(row)
    out["completion"][0]["content"] = out["completion"][0]["content"].upper()
    return out


def test_functions_round_trip_by_reference() -> None:
    stored = encode_changes(
        {"formatting_func": shout, "reward_funcs": [shout, qa_to_chat], "learning_rate": 1e-3}
    )
    assert stored["formatting_func"] == {"__function__": f"{__name__}:shout"}
    assert stored["reward_funcs"][1] == {"__function__": "tests.helpers:qa_to_chat"}
    back = decode_changes(stored)
    assert back == {"formatting_func": shout, "reward_funcs": [shout, qa_to_chat], "learning_rate": 1e-3}
    with pytest.raises(ConfigError, match=r"<lambda>' of module .* is not defined in this process"):
        decode_changes(encode_changes({"formatting_func": lambda row: row}))


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
