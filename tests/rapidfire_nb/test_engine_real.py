"""Real input: 2 LoRA configs x 2 chunks on SmolLM2-135M-Instruct + chatterbot tech_support equal plain TRL.

4 training rows, batch 2 -> 2 optimizer steps per run (chunk boundaries at steps 1 and 2), 2 eval rows,
max_length 64. rapidfire_nb trains 4 steps in all; the plain-TRL references another 4 (a SmolLM2 step is
~1 s on a quiet 2-core machine, up to 30 s on a busy one).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import TOL, adapter_from_folder, max_abs_diff, result_series, train_plain_trl

pytestmark = pytest.mark.real_model

SEED = 42


@pytest.fixture(scope="module")
def real(smollm2_dir: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
    from rapidfire_nb.data import chatterbot
    from rapidfire_nb.data.smollm2 import create_smollm2

    train, evald = chatterbot.load_tech_support(n_train=4, n_eval=2, seed=SEED)
    calls: list[dict] = []

    def create_model(model_config: dict) -> Any:
        calls.append(model_config)
        return create_smollm2(model_config)

    runs = [
        (1e-3, RFLoraConfig(r=8, lora_alpha=16, lora_dropout=0.1, target_modules=["q_proj", "v_proj"])),
        (
            5e-4,
            RFLoraConfig(
                r=16,
                lora_alpha=32,
                lora_dropout=0.05,
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            ),
        ),
    ]
    group = RFGridSearch(
        List(
            [
                RFModelConfig(
                    model_name=str(smollm2_dir),
                    peft_config=lora,
                    formatting_func=chatterbot.to_chat,
                    training_args=RFSFTConfig(
                        learning_rate=lr,
                        per_device_train_batch_size=2,
                        num_train_epochs=1,
                        max_length=64,
                        warmup_steps=1,
                        weight_decay=0.01,
                    ),
                )
                for lr, lora in runs
            ]
        ),
        "SFT",
    )
    root = tmp_path_factory.mktemp("real")
    exp = Experiment("real", experiment_path=root)
    exp.quiet = True
    exp.run_fit(group, create_model, train, evald, num_chunks=2, seed=SEED)
    out = {
        "info": exp.get_runs_info().set_index("run_id"),
        "results": exp.get_results(),
        "base_calls": len(calls),
    }
    exp.end()
    out["refs"] = {
        rid: train_plain_trl(leaf, create_smollm2, train, evald, SEED, root / f"plain-{rid}")
        for rid, leaf in enumerate(group.expand(SEED), start=1)
    }
    return out


def test_real_runs_complete_in_two_chunks_on_one_shared_base(real: dict[str, Any]) -> None:
    info = real["info"]
    assert list(info.status) == ["COMPLETED", "COMPLETED"]
    assert list(info.completed_steps) == [2, 2] and list(info.chunks_done) == [2, 2]
    assert real["base_calls"] == 1  # both LoRA runs share one loaded SmolLM2
    for rid in (1, 2):
        assert [s for s, _ in result_series(real["results"], rid, "eval_loss")] == [1, 2]


def test_real_runs_equal_plain_trl_and_adapters_changed(real: dict[str, Any]) -> None:
    for rid, ref in real["refs"].items():
        saved = adapter_from_folder(real["info"].loc[rid, "checkpoint_dir"])
        assert max_abs_diff(saved, ref.final) <= TOL, f"run {rid}"
        got, want = result_series(real["results"], rid, "loss"), ref.series("loss")
        assert [s for s, _ in got] == [s for s, _ in want] == [1, 2]
        assert max(abs(a - b) for (_, a), (_, b) in zip(got, want)) <= TOL, f"run {rid}: {got} != {want}"
        for name, initial in ref.initial.items():
            changed = (saved[name] != initial).float().mean().item()
            assert changed > 0.9, f"run {rid}: only {changed:.0%} of {name} changed"
