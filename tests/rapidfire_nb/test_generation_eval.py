"""Judging configs by what they generate (``compute_metrics`` + ``generation_config``), on the tiny model, CPU fp32.

* ``compute_metrics`` receives, at every chunk end, the decoded completions of the run's own adapter and the eval
  references of the fixed, seeded sample (the same rows for every run); its values land as ``eval_<name>`` beside
  ``eval_loss`` in the store, ``get_results()``, ``get_runs_info()`` and TensorBoard, with
  ``eval_generation_seconds``.
* Training stays exactly plain TRL's with sampling generation at every chunk end and at the run's own eval steps.
* GRPO's eval reward (no ``compute_metrics``) is the mean of each reward function over the completions generated
  for the eval prompts.
* A ``compute_metrics`` that raises, or returns something else than numbers, fails its run with the function
  named; the other run completes.
* The rapidfireai tutorial's SFT cell pattern runs with only the import line, the model and the data changed.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFGRPOConfig, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.testing import tiny_create_model, tiny_grpo_dataset
from rapidfire_nb.training.generation_spec import sample_indices
from tests.helpers import (
    TOL,
    adapter_state,
    max_abs_diff,
    qa_dataset,
    qa_to_chat,
    result_series,
    train_plain_trl,
)

SEED = 5
LORA = dict(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"])
GREEDY = {"max_new_tokens": 5, "do_sample": False}


class Recorder:
    """A ``compute_metrics`` that records what it receives and returns the mean prediction length."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], list[str]]] = []

    def __call__(self, eval_preds: Any) -> dict[str, float]:
        predictions, references = eval_preds
        self.calls.append((list(predictions), list(references)))
        return {"chars": sum(len(p) for p in predictions) / len(predictions), "eval_calls": len(self.calls)}


def _greedy_replies(model: Any, tok: Any, prompts: list[Any], max_new_tokens: int) -> list[str]:
    """What a user gets from ``generate`` on a left-padded batch of chat prompts (rapidfireai's recipe)."""
    import torch

    texts = [tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    tok.padding_side = "left"
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(
            **enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id
        )
    return tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)


# ------------------------------------------------------------------------------------------------ SFT
@pytest.fixture(scope="module")
def sft(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root = tmp_path_factory.mktemp("gen")
    metrics = Recorder()
    train, evald = qa_dataset(16, seed=0), qa_dataset(7, seed=1)
    group = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(**LORA),
            training_args=RFSFTConfig(
                learning_rate=List([1e-3, 3e-2]),
                per_device_train_batch_size=4,
                per_device_eval_batch_size=4,
                max_steps=4,
                logging_steps=1,
                max_length=48,
            ),
            formatting_func=qa_to_chat,
            compute_metrics=metrics,
            generation_config=GREEDY,
        ),
        "SFT",
    )
    exp = Experiment("gen", experiment_path=root)
    exp.quiet = True
    exp.run_fit(group, tiny_create_model, train, evald, num_chunks=2, seed=SEED, eval_generation_samples=4)
    finals = {rid: exp.load_model(rid) for rid in (1, 2)}
    out = dict(
        metrics=metrics,
        evald=evald,
        info=exp.get_runs_info().set_index("run_id"),
        results=exp.get_results(),
        metric_names=exp.panel_snapshot()["metric_names"],
        finals=finals,
    )
    acc = EventAccumulator(str(exp.path / "tensorboard" / "run-1"))
    acc.Reload()
    out["tb"] = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    exp.end()
    return out


def test_compute_metrics_gets_each_runs_completions_and_the_sampled_references_at_chunk_ends(
    sft: dict[str, Any],
) -> None:
    calls, evald = sft["metrics"].calls, sft["evald"]
    assert len(calls) == 4, "2 runs x 2 chunk ends, nothing more (eval_strategy 'no')"
    picked = sample_indices(len(evald), 4, SEED)
    assert len(picked) == 4
    references = [evald[i]["answer"] for i in picked]
    for predictions, refs in calls:
        assert refs == references, "the same seeded sample of eval rows, for every run, at every chunk end"
        assert len(predictions) == 4 and all(isinstance(p, str) for p in predictions)
    # chunk rotation: run 1 chunk 1, run 2 chunk 1, run 1 chunk 2, run 2 chunk 2; the last ones are the final
    # adapters', exactly what a user gets from generate() with the trained model
    prompts = [qa_to_chat(evald[i])["prompt"] for i in picked]
    for rid, call in ((1, calls[2]), (2, calls[3])):
        model, tok = sft["finals"][rid]
        assert call[0] == _greedy_replies(model, tok, prompts, GREEDY["max_new_tokens"]), f"run {rid}"


def test_generation_metrics_are_logged_beside_eval_loss_everywhere(sft: dict[str, Any]) -> None:
    results, info, calls = sft["results"], sft["info"], sft["metrics"].calls
    for rid, own in ((1, calls[0::2]), (2, calls[1::2])):
        chars = result_series(results, rid, "eval_chars")
        assert [s for s, _ in chars] == [2, 4] == [s for s, _ in result_series(results, rid, "eval_loss")]
        expected = [sum(len(p) for p in preds) / len(preds) for preds, _ in own]
        assert [v for _, v in chars] == pytest.approx(expected)
        seconds = result_series(results, rid, "eval_generation_seconds")
        assert [s for s, _ in seconds] == [2, 4] and all(v > 0 for _, v in seconds)
        assert info.loc[rid, "eval_chars"] == pytest.approx(expected[-1])
    # a name that starts with eval_ keeps it; the runs table lists the generation metrics after eval_loss
    assert "eval_calls" in results.columns and "eval_eval_calls" not in results.columns
    columns = list(info.columns)
    assert columns.index("eval_loss") < columns.index("eval_chars") < columns.index("checkpoint_dir")
    assert "eval_generation_seconds" not in columns
    assert {"eval_chars", "eval_generation_seconds"} <= set(sft["metric_names"])  # the panel's metric menu
    assert [s for s, _ in sft["tb"]["eval/chars"]] == [2, 4]


def test_training_is_exact_with_sampling_generation_at_chunk_ends_and_eval_steps(tmp_path: Any) -> None:
    """Sampling generation draws random numbers: the run's own RNG stream must not notice (dropout 0.1)."""
    train, evald = qa_dataset(16, seed=0), qa_dataset(5, seed=1)
    training = dict(
        learning_rate=1e-3,
        per_device_train_batch_size=4,
        max_steps=8,
        logging_steps=1,
        max_length=48,
        eval_strategy="steps",
        eval_steps=3,
        num_train_epochs=2,
    )
    metrics = Recorder()
    group = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(**LORA),
            training_args=RFSFTConfig(**training),
            formatting_func=qa_to_chat,
            compute_metrics=metrics,
            generation_config={"max_new_tokens": 4, "temperature": 1.0},  # rapidfireai's default: do_sample
        ),
        "SFT",
    )
    exp = Experiment("gen-exact", experiment_path=tmp_path)
    exp.quiet = True
    exp.run_fit(group, tiny_create_model, train, evald, num_chunks=2, seed=SEED)
    run = exp.session.executor.runs[1]
    got = adapter_state(run.worker.trainer.model, adapter_name=run.adapter)
    results = exp.get_results()
    exp.end()
    # 4 steps per epoch, 2 chunks each: chunk ends 2, 4, 6, 8; its own eval steps 3 and 6
    assert [s for s, _ in result_series(results, 1, "eval_chars")] == [2, 3, 4, 6, 8]
    assert len(metrics.calls) == 5
    (leaf,) = group.expand(SEED)
    plain = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(**LORA),
            training_args=RFSFTConfig(**training),
            formatting_func=qa_to_chat,
        ),
        "SFT",
    ).expand(SEED)[0]
    ref = train_plain_trl(plain, tiny_create_model, train, evald, SEED, tmp_path / "plain")
    assert max_abs_diff(got, ref.final) == 0.0
    for name in ("loss", "grad_norm"):
        assert result_series(results, 1, name) == ref.series(name), name
    ours = dict(result_series(results, 1, "eval_loss"))
    assert all(abs(ours[s] - v) <= TOL for s, v in ref.series("eval_loss")), "eval_loss at eval steps 3 and 6"
    assert leaf.generation_config and not plain.generation_config


# ------------------------------------------------------------------------------------------------ failures
def raising_metrics(eval_preds: Any) -> dict[str, float]:
    raise ValueError("rouge backend missing")


def text_metrics(eval_preds: Any) -> dict[str, Any]:
    return {"rougeL": "0.5"}


@pytest.mark.parametrize(
    "bad, message",
    [
        (raising_metrics, "compute_metrics 'raising_metrics' raised ValueError: rouge backend missing"),
        (text_metrics, "compute_metrics 'text_metrics' returned 'rougeL': str '0.5', not a number"),
    ],
)
def test_a_failing_compute_metrics_fails_its_run_naming_the_function(
    tmp_path: Any, bad: Any, message: str
) -> None:
    good = Recorder()
    common = dict(
        model_name="tiny",
        peft_config=RFLoraConfig(**LORA),
        training_args=RFSFTConfig(per_device_train_batch_size=4, max_steps=4, logging_steps=1, max_length=48),
        formatting_func=qa_to_chat,
        generation_config=GREEDY,
    )
    group = RFGridSearch(
        List([RFModelConfig(compute_metrics=bad, **common), RFModelConfig(compute_metrics=good, **common)]),
        "SFT",
    )
    exp = Experiment("gen-fail", experiment_path=tmp_path)
    exp.quiet = True
    exp.run_fit(group, tiny_create_model, qa_dataset(16), qa_dataset(4, seed=1), num_chunks=2, seed=SEED)
    info = exp.get_runs_info().set_index("run_id")
    exp.end()
    assert info.loc[1, "status"] == "FAILED" and message in info.loc[1, "error"], info.loc[1, "error"]
    assert info.loc[1, "completed_steps"] == 2, "it fails at its first chunk end, before training on"
    assert info.loc[2, "status"] == "COMPLETED" and len(good.calls) == 2
    assert math.isnan(info.loc[1, "eval_chars"]) and info.loc[2, "eval_chars"] > 0


# ------------------------------------------------------------------------------------------------ GRPO
def test_grpo_eval_reward_is_the_mean_reward_of_completions_generated_for_eval_prompts(tmp_path: Any) -> None:
    train, evald = tiny_grpo_dataset(4, seed=0), tiny_grpo_dataset(2, seed=3)
    eval_prompts = {p[-1]["content"] for p in evald["prompt"]}
    seen: list[tuple[bool, list[float]]] = []

    def chars_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        texts = [c if isinstance(c, str) else "".join(m["content"] for m in c) for c in completions]
        rewards = [float(len(t)) for t in texts]
        seen.append((all(p[-1]["content"] in eval_prompts for p in prompts), rewards))
        return rewards

    group = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(**LORA),
            reward_funcs=[chars_reward],
            training_args=RFGRPOConfig(
                num_generations=2,
                per_device_train_batch_size=4,
                per_device_eval_batch_size=4,
                max_completion_length=6,
                max_steps=2,
                logging_steps=1,
            ),
        ),
        "GRPO",
    )
    exp = Experiment("gen-grpo", experiment_path=tmp_path)
    exp.quiet = True
    exp.run_fit(group, tiny_create_model, train, evald, num_chunks=2, seed=SEED)
    results, info = exp.get_results(), exp.get_runs_info().set_index("run_id")
    exp.end()
    evals = [rewards for is_eval, rewards in seen if is_eval]
    assert len(evals) == 2, "one eval batch (2 prompts x 2 completions) at each of the 2 chunk ends"
    means = [sum(r) / len(r) for r in evals]
    got = result_series(results, 1, "eval_rewards/chars_reward/mean")
    assert [s for s, _ in got] == [1, 2] and [v for _, v in got] == pytest.approx(means)
    assert [v for _, v in result_series(results, 1, "eval_reward")] == pytest.approx(means)
    assert info.loc[1, "eval_reward"] == pytest.approx(means[-1])
    assert info.loc[1, "eval_rewards/chars_reward/mean"] == pytest.approx(means[-1])


# ------------------------------------------------------------------------------------------------ rapidfireai
def test_the_rapidfireai_tutorial_sft_cells_run_with_the_import_model_and_data_changed() -> None:
    """rapidfireai's ``rf-tutorial-sft-chatqa-lite`` cells with only these changes: the import lines, the tiny model
    for TinyLlama, tiny rows for the Bitext dataset (and sizes to match), and ROUGE-L from ``rouge_score`` inside
    ``compute_metrics`` (the tutorial's ``evaluate.load("rouge")`` needs the hub; the function's shape is its)."""
    from rapidfire_nb import Experiment  # was: from rapidfireai import Experiment

    # was: from rapidfireai.automl import ...
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    # was: dataset = load_dataset("bitext/Bitext-customer-support-llm-chatbot-training-dataset")
    dataset = {
        "train": qa_dataset(24, seed=0).rename_columns({"question": "instruction", "answer": "response"})
    }
    train_dataset = dataset["train"].select(range(16))  # was: range(128)
    eval_dataset = dataset["train"].select(range(16, 22))  # was: range(128, 152)
    train_dataset = train_dataset.shuffle(seed=42)
    eval_dataset = eval_dataset.shuffle(seed=42)

    def sample_formatting_function(row: dict[str, Any]) -> dict[str, Any]:
        """Function to preprocess each example from dataset"""
        SYSTEM_PROMPT = (
            "You are a helpful and friendly customer support assistant. Please answer the user's query."
        )
        return {
            "prompt": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": row["instruction"]},
            ],
            "completion": [{"role": "assistant", "content": row["response"]}],
        }

    experiment = Experiment(experiment_name="exp1-chatqa-lite", mode="fit")

    def sample_compute_metrics(eval_preds: Any) -> dict[str, float]:
        """Optional function to compute eval metrics based on predictions and labels"""
        predictions, labels = eval_preds
        from rouge_score import rouge_scorer  # was: import evaluate; rouge = evaluate.load("rouge")

        scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
        rouge_l = sum(scorer.score(ref, pred)["rougeL"].fmeasure for pred, ref in zip(predictions, labels))
        return {"rougeL": round(rouge_l / len(labels), 4)}

    peft_configs_lite = List(
        [
            RFLoraConfig(
                r=8, lora_alpha=16, lora_dropout=0.1, target_modules=["q_proj", "v_proj"], bias="none"
            ),
            RFLoraConfig(
                r=32,
                lora_alpha=64,
                lora_dropout=0.1,
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                bias="none",
            ),
        ]
    )
    with pytest.warns(FutureWarning, match="torch_dtype"):  # the tutorial's torch_dtype: mapped to dtype
        config_set_lite = List(
            [
                RFModelConfig(
                    model_name="tiny",  # was: "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
                    peft_config=peft_configs_lite,
                    training_args=RFSFTConfig(
                        learning_rate=lr,
                        lr_scheduler_type="linear",
                        per_device_train_batch_size=4,
                        per_device_eval_batch_size=4,
                        max_steps=4,  # was: 128
                        gradient_accumulation_steps=1,
                        logging_steps=2,
                        eval_strategy="steps",
                        eval_steps=4,
                        fp16=True,  # a GPU setting: switched off on this CPU, with a note
                    ),
                    model_type="causal_lm",
                    model_kwargs={"device_map": "auto", "torch_dtype": "auto", "use_cache": False},
                    formatting_func=sample_formatting_function,
                    compute_metrics=sample_compute_metrics,
                    generation_config={
                        "max_new_tokens": 8,  # was: 256
                        "temperature": 0.8,
                        "top_p": 0.9,
                        "top_k": 30,
                        "repetition_penalty": 1.05,
                    },
                )
                for lr in (1e-3, 1e-4)  # the tutorial writes the two configs out
            ]
        )

    def sample_create_model(model_config: dict[str, Any]) -> Any:
        """Function to create model object for any given config; must return tuple of (model, tokenizer)"""
        return tiny_create_model(model_config)  # was: AutoModelForCausalLM.from_pretrained(model_name, ...)

    config_group = RFGridSearch(configs=config_set_lite, trainer_type="SFT")
    experiment.run_fit(config_group, sample_create_model, train_dataset, eval_dataset, num_chunks=4, seed=42)
    info = experiment.get_runs_info()
    experiment.end()
    assert list(info.status) == ["COMPLETED"] * 4
    assert info["eval_rougeL"].notna().all() and info["eval_rougeL"].between(0, 1).all()


def char_code_score(eval_preds: Any) -> dict[str, float]:
    """A ``compute_metrics`` whose value differs between runs that generate different text."""
    predictions, _references = eval_preds
    return {"score": float(sum(ord(c) for text in predictions for c in text) % 997)}


def test_a_generation_metric_can_be_the_early_stopping_metric() -> None:
    from rapidfire_nb.automl import SuccessiveHalving

    group = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(**LORA),
            training_args=RFSFTConfig(
                learning_rate=List([3e-2, 1e-2, 3e-3, 1e-3]), per_device_train_batch_size=2, max_length=32
            ),
            formatting_func=qa_to_chat,
            compute_metrics=char_code_score,
            generation_config=GREEDY,
        ),
        "SFT",
    )
    exp = Experiment("gen-pruned")
    exp.quiet = True
    policy = SuccessiveHalving(metric="eval_score", mode="max", reduction_factor=2, grace_chunks=1)
    exp.run_fit(
        group,
        tiny_create_model,
        qa_dataset(8),
        qa_dataset(4, seed=1),
        num_chunks=2,
        seed=SEED,
        early_stopping=policy,
    )
    info = exp.get_runs_info()
    pruned = info[info.status == "STOPPED"]
    # 3 epochs x 2 chunks: rungs at chunks 1 (2 of 4 go on) and 2 (1 of 2 goes on)
    assert len(pruned) == 3 and list(info.status).count("COMPLETED") == 1, info[["run_id", "status"]]
    assert all("eval_score" in reason for reason in pruned.stop_reason), list(pruned.stop_reason)
    rungs = sorted(reason.split(":")[0] for reason in pruned.stop_reason)
    assert rungs == ["pruned at chunk 1/6", "pruned at chunk 1/6", "pruned at chunk 2/6"], rungs
    exp.end()
