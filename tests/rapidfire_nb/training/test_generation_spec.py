"""The pure part of generation-based evaluation: settings (rapidfireai's defaults), eval examples, the seeded
sample, the metric check, and the checks before training (no torch, fakes for the spec and the rows)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest

from rapidfire_nb.errors import ConfigError
from rapidfire_nb.training.generation_spec import (
    DEFAULT_GENERATION,
    EvalExample,
    GenerationMetricsError,
    check_generation_eval,
    check_metrics,
    eval_examples,
    resolve_settings,
    sample_indices,
)

USER = [{"role": "user", "content": "Can I build a carport?"}]


def _settings(config: Any, model_max_length: Any = 8192, batch_size: int = 8) -> Any:
    return resolve_settings(
        config,
        pad_token_id=2,
        eos_token_id=2,
        model_max_length=model_max_length,
        batch_size=batch_size,
        seed=3,
    )


def test_missing_keys_get_rapidfireais_defaults() -> None:
    s = _settings({})
    assert dict(s.generate_kwargs) == {
        **DEFAULT_GENERATION,
        "pad_token_id": 2,
        "eos_token_id": 2,
        "use_cache": True,
    }
    assert DEFAULT_GENERATION == {"max_new_tokens": 128, "do_sample": True, "temperature": 0.7, "top_p": 0.9}
    assert (s.max_input_length, s.add_generation_prompt, s.truncation_side, s.batch_size, s.seed) == (
        8192 - 128,
        True,
        "left",
        8,
        3,
    )


def test_given_keys_win_and_greedy_gets_no_sampling_defaults() -> None:
    s = _settings({"max_new_tokens": 32, "do_sample": False, "use_cache": False, "pad_token_id": 0})
    assert dict(s.generate_kwargs) == {
        "max_new_tokens": 32,
        "do_sample": False,
        "use_cache": False,
        "pad_token_id": 0,
        "eos_token_id": 2,
    }
    tutorial = _settings({"max_new_tokens": 256, "temperature": 0.8, "top_k": 30})
    assert tutorial.generate_kwargs["do_sample"] is True and tutorial.generate_kwargs["temperature"] == 0.8
    assert tutorial.generate_kwargs["top_p"] == 0.9 and tutorial.generate_kwargs["top_k"] == 30


def test_control_keys_steer_the_prompt_and_never_reach_generate() -> None:
    s = _settings({"max_input_length": 100, "add_generation_prompt": False, "truncation_side": "right"})
    assert (s.max_input_length, s.add_generation_prompt, s.truncation_side) == (100, False, "right")
    assert not {"max_input_length", "add_generation_prompt", "truncation_side"} & set(s.generate_kwargs)


@pytest.mark.parametrize(
    "model_max_length, max_new_tokens, budget",
    [(8192, 128, 8064), (int(1e30), 128, 4096 - 128), (None, 16, 4096 - 16), (100, 64, 64), (512, 6, 506)],
)
def test_prompt_budget_as_rapidfireai(model_max_length: Any, max_new_tokens: int, budget: int) -> None:
    assert _settings({"max_new_tokens": max_new_tokens}, model_max_length).max_input_length == budget


class _Config:
    """A fake transformers.GenerationConfig: to_diff_dict() holds what the user set."""

    def to_diff_dict(self) -> dict[str, Any]:
        return {"max_new_tokens": 12, "transformers_version": "5", "_from_model_config": False}


def test_a_generation_config_object_counts_with_what_it_sets() -> None:
    assert dict(_settings(_Config()).generate_kwargs)["max_new_tokens"] == 12
    assert "transformers_version" not in _settings(_Config()).generate_kwargs


def test_eval_examples_follow_rapidfireais_column_patterns_then_trls() -> None:
    rows = [
        {"input": "2+2?", "output": " 4 "},
        {"prompt": USER, "completion": [{"role": "assistant", "content": "Yes, with a permit."}]},
        {"prompt": "Plain prompt", "completion": "plain completion"},
        {"text": "Some text", "response": "the response"},
        {"text": "Only text"},
        {"instruction": "Say hi", "response": "hi"},
        {"messages": [*USER, {"role": "assistant", "content": "Ask the municipality."}]},
        {"prompt": USER, "chosen": [{"role": "assistant", "content": "good"}], "rejected": []},
        {"prompt": USER, "answer": 42},
    ]
    examples, skipped = eval_examples(rows)
    assert skipped == 0
    assert [e.reference for e in examples] == [
        "4",
        "Yes, with a permit.",
        "plain completion",
        "the response",
        "Only text",
        "hi",
        "Ask the municipality.",
        "good",
        "42",
    ]
    assert examples[1] == EvalExample(USER, "Yes, with a permit.") and examples[6].prompt == USER


def test_rows_without_a_prompt_or_a_reference_are_skipped() -> None:
    rows = [
        {"prompt": USER, "completion": [{"role": "assistant", "content": "  "}]},
        {"input": "", "output": "x"},
        {"question": "no pattern", "reply": "x"},
        {"messages": [*USER]},  # no assistant turn to compare with
        {"prompt": USER, "answer": None},
        {"prompt": [{"content": "no role"}], "completion": "x"},
        {"input": "ok", "output": "fine"},
    ]
    examples, skipped = eval_examples(rows)
    assert (len(examples), skipped) == (1, 6) and examples[0].reference == "fine"


def test_the_sample_is_fixed_by_the_seed_and_the_same_for_every_run() -> None:
    picked = sample_indices(100, 32, seed=42)
    assert picked == sorted(picked) and len(set(picked)) == 32 and max(picked) < 100
    assert picked == sample_indices(100, 32, seed=42) != sample_indices(100, 32, seed=43)
    assert (
        sample_indices(10, None, 1)
        == sample_indices(10, 10, 1)
        == sample_indices(10, 99, 1)
        == list(range(10))
    )


def my_metrics(eval_preds: Any) -> Any:
    return {}


def test_metrics_are_named_as_trl_names_eval_metrics() -> None:
    import numpy as np

    got = check_metrics(
        {"rougeL": 0.5, "eval_bleu": np.float32(0.25), "count": 3, "nan": math.nan}, my_metrics
    )
    assert got == {
        "eval_rougeL": 0.5,
        "eval_bleu": 0.25,
        "eval_count": 3.0,
        "eval_nan": pytest.approx(math.nan, nan_ok=True),
    }
    assert all(type(v) is float for v in got.values())
    assert check_metrics({"acc": 1}, my_metrics, prefix="test") == {"test_acc": 1.0}


@pytest.mark.parametrize(
    "result, message",
    [
        ([0.5], "compute_metrics 'my_metrics' returned list [0.5]; it must return a dict"),
        (0.5, "returned float 0.5; it must return a dict"),
        ({"rougeL": "0.5"}, "returned 'rougeL': str '0.5', not a number"),
        ({"rougeL": None}, "returned 'rougeL': NoneType None, not a number"),
        ({"ok": True}, "returned 'ok': bool True, not a number"),
        ({"rouge": {"L": 0.5}}, "returned 'rouge': dict"),
        ({3: 0.5}, "returned the metric name 3"),
        ({"loss": 0.1}, "returned 'loss', which would replace eval_loss"),
        ({"eval_generation_seconds": 1.0}, "which would replace eval_generation_seconds"),
    ],
)
def test_anything_but_numbers_fails_naming_the_function(result: Any, message: str) -> None:
    with pytest.raises(GenerationMetricsError, match="my_metrics") as err:
        check_metrics(result, my_metrics)
    assert message in str(err.value)


@dataclass
class FakeSpec:
    trainer_type: str = "SFT"
    compute_metrics: Any = None
    generation_config: Any = None


class FakeRows(list):
    """A list of row dicts with ``column_names`` (what the check reads of a datasets.Dataset)."""

    @property
    def column_names(self) -> list[str]:
        return sorted(self[0]) if self else []


ROWS = FakeRows([{"prompt": USER, "completion": [{"role": "assistant", "content": "Yes."}]}])


def test_checks_before_training() -> None:
    assert check_generation_eval(FakeSpec(), ROWS) == []
    assert check_generation_eval(FakeSpec(compute_metrics=my_metrics), None) == []  # goes to the TRL trainer
    with pytest.raises(ConfigError, match="GRPOTrainer takes none. Add generation_config"):
        check_generation_eval(FakeSpec("GRPO", compute_metrics=my_metrics), ROWS)


def test_checks_of_a_generation_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """Needs transformers (its GenerationConfig validates the values)."""
    pytest.importorskip("transformers")
    both = FakeSpec(compute_metrics=my_metrics, generation_config={"max_new_tokens": 8})
    assert check_generation_eval(both, ROWS) == []
    with pytest.raises(ConfigError, match="run_fit got no eval_dataset"):
        check_generation_eval(both, None)
    with pytest.raises(
        ConfigError, match="none of the 1 eval rows .* columns \\['answer_text', 'question'\\]"
    ):
        check_generation_eval(both, FakeRows([{"question": "q", "answer_text": "a"}]))
    notes = check_generation_eval(both, FakeRows([*ROWS, {"question": "q"}]))
    assert notes == ["1 of 2 eval rows have no prompt or reference text: nothing is generated for them"]
    notes = check_generation_eval(FakeSpec(generation_config={"max_new_tokens": 8}), ROWS)
    assert notes and "compute_metrics is not: nothing is generated" in notes[0]
    for config, message in [
        ({"max_new_token": 8}, "unknown key 'max_new_token'; did you mean 'max_new_tokens'?"),
        ({"max_new_tokens": 0}, "transformers rejects it: .*max_new_tokens"),
        ({"max_input_length": -5}, "max_input_length'\\] must be a positive integer"),
        ({"truncation_side": "middle"}, "'left' or 'right'"),
        ({"add_generation_prompt": "yes"}, "must be True or False"),
        ("greedy", "generation_config must be a dict"),
    ]:
        with pytest.raises(ConfigError, match=message):
            check_generation_eval(FakeSpec(compute_metrics=my_metrics, generation_config=config), ROWS)
