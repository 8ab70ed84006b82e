"""A secret in a config (``hub_token``, ``model_kwargs.token``) is used but never stored or shown (issue 12).

One tiny experiment trains with a hub token and a model-loading token; afterwards no file under the experiment
folder (store, WAL, TensorBoard events, checkpoints with ``training_args.bin``, final weights) holds either, nor
does anything the user or the server is shown; the run was given the real values; a restart with a rotated token
is the same config group.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb import Experiment
from rapidfire_nb.errors import ConfigError
from rapidfire_nb.server.manager import ApiError, ExperimentsManager

HUB = "hf_HUBsecret0123456789"
MODEL = "hf_MODELsecret987654321"


def _group(hub_token: str) -> Any:
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    config = RFModelConfig(
        model_name="tiny",
        model_kwargs={"token": MODEL},
        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(
            learning_rate=List([1e-3, 5e-4]),
            per_device_train_batch_size=2,
            max_steps=3,
            logging_steps=1,
            max_length=48,
            hub_token=hub_token,
        ),
    )
    return RFGridSearch(configs=config, trainer_type="SFT")


def _files_holding(folder: Path, secrets: tuple[str, ...]) -> list[str]:
    found = []
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{path.relative_to(folder)}: {s}" for s in secrets if s.encode() in data]
    return found


def test_secrets_train_but_are_never_stored_or_shown(tmp_path: Path) -> None:
    from rapidfire_nb.testing import tiny_sft_dataset
    from tests.helpers import slow_create_model

    given: list[dict[str, Any]] = []

    def create_model(model_config: dict[str, Any]) -> Any:
        given.append(model_config)
        kwargs = {k: v for k, v in model_config["model_kwargs"].items() if k != "token"}
        # each forward 0.1 s slower (same numbers): run 1 is still training when stop(1) arrives
        return slow_create_model({**model_config, "model_kwargs": kwargs})

    lines: list[str] = []
    exp = Experiment("secret", experiment_path=tmp_path)
    exp.on_message(lines.append)
    exp.run_fit(_group(HUB), create_model, tiny_sft_dataset(6), num_chunks=3, background=True)
    exp.wait(chunks=1)
    exp.stop(1)  # at its next boundary: its latest checkpoint (with training_args.bin) stays on disk
    exp.wait()
    # the run had the real values
    assert (
        given and given[0]["model_kwargs"]["token"] == MODEL and given[0]["training_args"]["hub_token"] == HUB
    )
    assert exp.session is not None and exp.session.executor is not None
    runs = exp.get_runs_info()
    shown = [runs.to_string(), json.dumps(exp.panel_snapshot()), exp.ops().to_string(), *lines]
    shown.append(repr(exp.session.specs()[1]))
    with pytest.raises(ConfigError, match="hub_token is a secret"):
        exp.clone_modify(1, {"hub_token": "hf_other"})
    with pytest.raises(ConfigError, match="model_kwargs.token is a secret"):
        exp.clone_modify(1, {"model_kwargs.token": "hf_other"})
    mgr = ExperimentsManager(tmp_path)
    with pytest.raises(ApiError, match="hub_token is a secret") as refused:
        mgr.post_op("secret", {"kind": "clone", "run_id": 1, "changes": {"hub_token": "hf_other"}})
    assert refused.value.status == 400
    shown += [json.dumps(mgr.runs("secret")), json.dumps(mgr.snapshot("secret"))]
    stored = mgr.runs("secret")["runs"][0]
    assert stored["config"]["training"]["hub_token"] == "<redacted>"
    assert stored["config"]["model_kwargs"] == {"token": "<redacted>"}
    assert (
        stored["hparams"]["model_kwargs.token"] == "<redacted>" and "hub_token" not in stored["fingerprint"]
    )
    assert list(runs["status"]) == ["STOPPED", "COMPLETED"]
    exp.end()
    assert [text for text in shown if HUB in text or MODEL in text] == []
    assert list((exp.path / "runs" / "1").glob("checkpoint-*/training_args.bin"))
    assert list(tmp_path.rglob("events.out.tfevents*"))
    assert _files_holding(tmp_path, (HUB, MODEL)) == []

    again = Experiment("secret", experiment_path=tmp_path)  # a restart with a rotated token: the same group
    again.on_message(lines.append)
    again.run_fit(
        _group("hf_ROTATEDsecret"), create_model, tiny_sft_dataset(6), num_chunks=3, background=False
    )
    again.end()
    assert any("no run left to train (1 COMPLETED, 1 STOPPED)" in line for line in lines[-4:]), lines[-4:]
    assert _files_holding(tmp_path, (HUB, MODEL, "hf_ROTATEDsecret")) == []


def test_a_mistyped_secret_is_not_quoted_in_the_error() -> None:
    import trl

    from rapidfire_nb import schema

    problem = schema.check_value(trl.SFTConfig, "hub_token", 12345678)
    assert problem is not None and "hub_token expects" in problem and "12345678" not in problem, problem
    assert "12345678" in (schema.check_value(trl.SFTConfig, "logging_steps", "12345678") or "")
