"""Real input: DPO and GRPO on SmolLM2-135M-Instruct, 2 LoRA configs x 2 chunks each, equal to plain TRL.

* DPO: chatterbot ``tech_support`` preference pairs (``rejected="shuffle"``: another question's answer, so no
  generation is needed here), sigmoid loss, ``beta=List([0.1, 0.3])``; 4 pairs, batch 2 -> 2 optimizer steps per
  run (one per chunk), 4 in all; the plain-TRL references another 4.
* GRPO: reasoning-gym ``gsm_symbolic`` problems with the package's ``correctness_reward`` and ``format_reward``
  (SmolLM2 earns 0 from both within 16 new tokens, which would leave every advantage at 0 and the weights
  untouched, so ``length_reward`` is added to give the group a gradient); num_generations 2, batch 2 -> one
  prompt per step, 2 steps per run, 4 in all (+4 for the references); two learning rates.

Everything is compared at 1e-6 (CPU, fp32): adapter weights, per-step losses and TRL's metrics.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import TOL, adapter_from_folder, max_abs_diff, result_series

pytestmark = pytest.mark.real_model

SEED = 42


def _plain(leaf: Any, train: Any, output_dir: Any) -> dict[str, Any]:
    """A plain ``DPOTrainer``/``GRPOTrainer(...).train()`` of the same config, rows and seed."""
    from peft import get_peft_model_state_dict
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import DPOTrainer, GRPOTrainer

    from rapidfire_nb.data.smollm2 import create_smollm2
    from rapidfire_nb.spec import build_lora_config, build_training_args

    args, _ = build_training_args(leaf, output_dir=str(output_dir), default_seed=SEED)
    model, tok = create_smollm2(leaf.model_config_dict())
    kwargs = dict(
        model=model, args=args, train_dataset=train, processing_class=tok, peft_config=build_lora_config(leaf)
    )
    trainer = (
        GRPOTrainer(reward_funcs=list(leaf.reward_funcs), **kwargs)
        if leaf.trainer_type == "GRPO"
        else DPOTrainer(**kwargs)
    )
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.train()
    weights = {k: v.detach().clone() for k, v in get_peft_model_state_dict(trainer.model).items()}
    return dict(weights=weights, log=list(trainer.state.log_history), max_steps=trainer.state.max_steps)


def _run(group: Any, train: Any, root: Any, name: str) -> dict[str, Any]:
    from rapidfire_nb import Experiment
    from rapidfire_nb.data.smollm2 import create_smollm2

    calls: list[dict] = []

    def create_model(model_config: dict) -> Any:
        calls.append(model_config)
        return create_smollm2(model_config)

    exp = Experiment(name, experiment_path=root)
    exp.quiet = True
    exp.run_fit(group, create_model, train, num_chunks=2, seed=SEED)
    out = dict(
        info=exp.get_runs_info().set_index("run_id"),
        results=exp.get_results(),
        base_calls=len(calls),
        plans={rid: run.plan for rid, run in exp.session.executor.runs.items()},
    )
    exp.end()
    out["refs"] = {
        rid: _plain(leaf, train, root / f"plain-{rid}") for rid, leaf in enumerate(group.expand(SEED), 1)
    }
    return out


def _check(out: dict[str, Any], metrics: tuple[str, ...]) -> None:
    info = out["info"]
    assert list(info.status) == ["COMPLETED", "COMPLETED"]
    assert out["base_calls"] == 1, "both LoRA runs share one loaded SmolLM2 (and it is their reference)"
    for rid, ref in out["refs"].items():
        assert out["plans"][rid].boundaries == (1, 2)
        assert info.loc[rid, "completed_steps"] == info.loc[rid, "total_steps"] == ref["max_steps"] == 2
        saved = adapter_from_folder(info.loc[rid, "checkpoint_dir"])
        diff = max_abs_diff(saved, ref["weights"])
        assert diff <= TOL, f"run {rid}: adapter differs from plain TRL by {diff}"
        for name in metrics:
            want = [(int(h["step"]), float(h[name])) for h in ref["log"] if name in h]
            got = result_series(out["results"], rid, name)
            assert want and [s for s, _ in got] == [s for s, _ in want], (rid, name, got, want)
            assert max(abs(a - b) for (_, a), (_, b) in zip(got, want)) <= TOL, (rid, name, got, want)


def test_dpo_on_smollm2_tech_support_pairs_equals_plain_trl(smollm2_dir: Any, tmp_path: Any) -> None:
    from rapidfire_nb.automl import List, RFDPOConfig, RFGridSearch, RFLoraConfig, RFModelConfig
    from rapidfire_nb.data import load_tech_support_preferences

    train, _ = load_tech_support_preferences(n_train=4, n_eval=0, seed=SEED, rejected="shuffle")
    group = RFGridSearch(
        RFModelConfig(
            model_name=str(smollm2_dir),
            peft_config=RFLoraConfig(
                r=8, lora_alpha=16, lora_dropout=0.05, target_modules=["q_proj", "v_proj"]
            ),
            training_args=RFDPOConfig(
                beta=List([0.1, 0.3]),
                loss_type="sigmoid",
                learning_rate=1e-3,
                per_device_train_batch_size=2,
                num_train_epochs=1,
                max_length=64,
            ),
        ),
        "DPO",
    )
    out = _run(group, train, tmp_path, "dpo-real")
    _check(out, ("loss", "rewards/chosen", "rewards/margins", "logps/rejected"))


def test_grpo_on_smollm2_gsm_symbolic_equals_plain_trl(smollm2_dir: Any, tmp_path: Any) -> None:
    from rapidfire_nb.automl import List, RFGridSearch, RFGRPOConfig, RFLoraConfig, RFModelConfig
    from rapidfire_nb.data.gsm import correctness_reward, format_reward, load_gsm_symbolic
    from rapidfire_nb.testing import length_reward

    train, _ = load_gsm_symbolic(n_train=2, n_eval=0, seed=SEED)
    group = RFGridSearch(
        RFModelConfig(
            model_name=str(smollm2_dir),
            peft_config=RFLoraConfig(
                r=8, lora_alpha=16, lora_dropout=0.05, target_modules=["q_proj", "v_proj"]
            ),
            reward_funcs=[correctness_reward, format_reward, length_reward],
            training_args=RFGRPOConfig(
                learning_rate=List([1e-3, 3e-4]),
                num_generations=2,
                per_device_train_batch_size=2,
                max_completion_length=16,
                beta=0.04,
                num_train_epochs=1,
            ),
        ),
        "GRPO",
    )
    out = _run(group, train, tmp_path, "grpo-real")
    _check(
        out,
        (
            "loss",
            "reward",
            "kl",
            "rewards/correctness_reward/mean",
            "rewards/format_reward/mean",
            "rewards/length_reward/mean",
            "completions/mean_length",
        ),
    )
