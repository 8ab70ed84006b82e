"""Batched generation eval (issue 39 part 1), on the tiny model, CPU fp32.

The same config group (4 LoRA runs of ranks 2, 4, 8 and 16, greedy generation eval of 6 prompts in slices of 4) is
trained twice, with ``batch_generation=True`` (the default) and ``False``. Batched, the runs' chunk-end answers
come from one ``generate`` per prompt slice (16 + 8 rows at chunk 1, each row through its run's adapter) instead of one per
run and slice; every run gets exactly the answers it gets alone (the same ``compute_metrics`` calls, in the same
order, and the same values in the results), and training is untouched (the same final adapters, bit for bit).
Early stopping prunes two runs at the first rung and one at the second: later batches do not wait for them.
"""

from __future__ import annotations

from typing import Any

import pytest

from rapidfire_nb import Experiment
from rapidfire_nb.automl import (
    List,
    RFGridSearch,
    RFLoraConfig,
    RFModelConfig,
    RFSFTConfig,
    SuccessiveHalving,
)
from rapidfire_nb.testing import tiny_create_model
from rapidfire_nb.training.generation_batch import kv_cache_bytes, runs_per_call
from tests.helpers import adapter_state, max_abs_diff, qa_dataset, qa_to_chat, result_series

SEED = 3
GREEDY = {"max_new_tokens": 6, "do_sample": False}


class Recorder:
    """A ``compute_metrics`` that records its calls and scores the answers' characters."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, eval_preds: Any) -> dict[str, float]:
        predictions, _ = eval_preds
        self.calls.append(list(predictions))
        return {"chars": sum(len(p) for p in predictions) / len(predictions)}


class CountingModel:
    """``create_model_fn`` wrapper counting the rows of every ``generate`` the base model runs."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def __call__(self, config: dict[str, Any]) -> Any:
        model, tok = tiny_create_model(config)
        original = model.generate

        def generate(*args: Any, **kwargs: Any) -> Any:
            self.rows.append(int(kwargs["input_ids"].shape[0]))
            return original(*args, **kwargs)

        model.generate = generate
        return model, tok


def _fit(tmp_path: Any, name: str, batch: bool) -> dict[str, Any]:
    metrics, counting = Recorder(), CountingModel()
    group = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            peft_config=List(
                [
                    RFLoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj"])
                    for r in (2, 4, 8, 16)
                ]
            ),
            training_args=RFSFTConfig(
                learning_rate=5e-2,
                per_device_train_batch_size=4,
                per_device_eval_batch_size=4,
                num_train_epochs=2,
                logging_steps=1,
                max_length=48,
            ),
            formatting_func=qa_to_chat,
            compute_metrics=metrics,
            generation_config=GREEDY,
        ),
        "SFT",
    )
    exp = Experiment(name, experiment_path=tmp_path)
    exp.quiet = True
    exp.run_fit(
        group,
        counting,
        qa_dataset(16),
        qa_dataset(6, seed=1),
        num_chunks=2,
        seed=SEED,
        batch_generation=batch,
        early_stopping=SuccessiveHalving(metric="eval_loss", reduction_factor=2, grace_chunks=1),
    )
    info = exp.get_runs_info().set_index("run_id")
    out = {
        "calls": metrics.calls,
        "rows": counting.rows,
        "status": dict(info.status),
        "chars": {rid: result_series(exp.get_results(), rid, "eval_chars") for rid in (1, 2, 3, 4)},
        "adapters": {rid: adapter_state(exp.load_model(rid)[0]) for rid in (1, 2, 3, 4)},
    }
    exp.end()
    return out


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    root = tmp_path_factory.mktemp("genbatch")
    return _fit(root, "batched", True), _fit(root, "alone", False)


def test_each_run_gets_exactly_its_answers_alone_and_trains_the_same(
    both: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    batched, alone = both
    assert batched["status"] == alone["status"]
    assert sorted(batched["status"].values()) == ["COMPLETED"] + ["STOPPED"] * 3  # pruned at rungs 1 and 2
    assert batched["calls"] == alone["calls"], "the same compute_metrics calls, answers and order"
    assert len({tuple(c) for c in alone["calls"]}) > 1, "the runs answer differently: the adapters matter"
    assert batched["chars"] == alone["chars"]
    for rid in (1, 2, 3, 4):
        assert max_abs_diff(batched["adapters"][rid], alone["adapters"][rid]) == 0.0, f"run {rid}"


def test_one_generate_per_prompt_slice_answers_every_run_waiting_at_the_round_end(
    both: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    batched, alone = both
    # 2 epochs x 2 chunks: 4 chunk ends; 6 prompts in slices of 4 and 2; 4 runs evaluate at chunk 1, the 2 rung 1
    # keeps at chunk 2, the one rung 2 keeps at chunks 3 and 4 (a pruned run is not waited for)
    evaluations = len(alone["calls"])
    assert evaluations == 4 + 2 + 1 + 1
    assert alone["rows"] == [4, 2] * evaluations
    assert batched["rows"] == [16, 8] + [8, 4] + [4, 2] * 2


def test_runs_per_call_caps_the_batch_by_free_memory() -> None:
    assert runs_per_call(4, 100, None) == 4  # unknown free memory: no cap
    assert runs_per_call(4, 100, 10_000) == 4
    assert runs_per_call(4, 100, 500) == 2  # half of 500 bytes holds 2 caches of 100
    assert runs_per_call(4, 100, 50) == 1  # never fewer than one run (it needs what it always did)


def test_kv_cache_bytes_follows_the_cache_layout() -> None:
    class Config:
        num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size = 30, 9, 3, 576

    # SmolLM2-135M: 2 (K, V) x 30 layers x 3 kv heads x 64 x 56 tokens x 16 rows x 4 bytes
    assert kv_cache_bytes(Config(), rows=16, tokens=56, element_bytes=4) == 2 * 30 * 3 * 64 * 56 * 16 * 4


def _dpo_fit(tmp_path: Any, name: str, batch: bool) -> tuple[list[list[str]], list[int]]:
    from rapidfire_nb.automl import RFDPOConfig
    from rapidfire_nb.testing import tiny_dpo_dataset

    metrics, counting = Recorder(), CountingModel()
    group = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
            training_args=RFDPOConfig(
                beta=List([0.1, 0.5]),
                learning_rate=5e-2,
                per_device_train_batch_size=2,
                per_device_eval_batch_size=2,
                max_steps=4,
                max_length=48,
                logging_steps=1,
            ),
            compute_metrics=metrics,
            generation_config=GREEDY,
        ),
        "DPO",
    )
    exp = Experiment(name, experiment_path=tmp_path)
    exp.quiet = True
    exp.run_fit(
        group,
        counting,
        tiny_dpo_dataset(8),
        tiny_dpo_dataset(3, seed=1),
        num_chunks=2,
        seed=SEED,
        batch_generation=batch,
    )
    assert set(exp.get_runs_info().status) == {"COMPLETED"}
    exp.end()
    return metrics.calls, counting.rows


def test_dpo_runs_answer_in_one_batched_generate_exactly_as_alone(tmp_path: Any) -> None:
    """DPO's reference pass (adapters disabled on the shared base) and batched answers live side by side."""
    batched_calls, batched_rows = _dpo_fit(tmp_path, "dpo-batched", True)
    alone_calls, alone_rows = _dpo_fit(tmp_path, "dpo-alone", False)
    assert batched_calls == alone_calls and len(alone_calls) == 4  # 2 runs x 2 chunk ends
    assert alone_rows == [2, 1] * 4 and batched_rows == [4, 2] * 2  # 3 prompts in slices of 2
