"""DPO's reference computed once per micro-batch and shared by the runs that train on it (issue 38 item 4).

Tiny model, CPU fp32. One config group of 4 LoRA DPO runs on one shared base, 2 epochs x 2 chunks, batch 4 of 8 rows
(4 micro-batches per run), ``disable_dropout=False`` with LoRA dropout 0.1 (the policy forward draws random numbers,
the reference forward with adapters disabled draws none): runs 1-3 (``beta`` 0.1 / 0.3 and ``loss_type="ipo"``) see
the same micro-batches; run 4 has a shorter ``max_length`` (other reference inputs). Every run's per-step losses,
rewards and final adapter equal a plain ``DPOTrainer(...).train()`` of its config (0.0), and the shared cache
computed 4 references for runs 1-3 (one per micro-batch, 8 hits) plus run 4's own 4 (no wrong hit).
Then: full fine-tuning runs sharing one frozen reference share its log-probs too (0.0); a reference forward that
draws random numbers is never shared (the random state is put back, a note says why).
"""

from __future__ import annotations

from typing import Any

import pytest

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFDPOConfig, RFGridSearch, RFLoraConfig, RFModelConfig
from rapidfire_nb.testing import tiny_create_model, tiny_dpo_dataset
from rapidfire_nb.training.kinds import dpo_reference
from tests.helpers import adapter_from_folder, adapter_state, max_abs_diff, result_series
from tests.rapidfire_nb.test_dpo_grpo import plain_trl, series

SEED = 7  # plain_trl (test_dpo_grpo) seeds with its SEED, 7
COMMON = dict(
    learning_rate=1e-3,
    per_device_train_batch_size=4,
    num_train_epochs=2,
    warmup_steps=1,
    logging_steps=1,
    eval_strategy="no",
    disable_dropout=False,  # LoRA dropout draws random numbers in the policy forward
)
LORA = RFLoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"])
NAMES = ("loss", "rewards/chosen", "rewards/rejected", "logps/chosen", "grad_norm")


def _lora_group() -> RFGridSearch:
    def leaf(**training: Any) -> RFModelConfig:
        return RFModelConfig(
            model_name="tiny", peft_config=LORA, training_args=RFDPOConfig(**COMMON, **training)
        )

    return RFGridSearch(
        List(
            [
                leaf(beta=List([0.1, 0.3]), max_length=64),
                leaf(beta=0.2, loss_type="ipo", max_length=64),
                leaf(beta=0.1, max_length=26),  # every row truncated (29 tokens):: other reference inputs
            ]
        ),
        "DPO",
    )


def _assert_equal_plain(results: Any, rid: int, ref: dict[str, Any]) -> None:
    for name in NAMES:
        got, want = result_series(results, rid, name), series(ref["log"], name)
        assert want and [s for s, _ in got] == [s for s, _ in want], (rid, name)
        worst = max(abs(a - b) for (_, a), (_, b) in zip(got, want))
        assert worst == 0.0, f"run {rid}: {name} differs from plain TRL by {worst}"


@pytest.fixture(scope="module")
def lora(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("dpo-ref")
    train = tiny_dpo_dataset(8, seed=3)
    group = _lora_group()
    exp = Experiment("dpo-ref", experiment_path=root)
    lines: list[str] = []
    exp.on_message(lines.append)
    exp.run_fit(group, tiny_create_model, train, None, num_chunks=2, seed=SEED)
    ex = exp.session.executor
    cache = dpo_reference.cache_of(ex.models)
    out = dict(
        lines=lines,
        info=exp.get_runs_info().set_index("run_id"),
        results=exp.get_results(),
        counts=(cache.computed, cache.hits, cache.unshared),
        in_memory={
            rid: adapter_state(run.worker.trainer.model, adapter_name=run.adapter)
            for rid, run in ex.runs.items()
        },
        bases={rid: run.base for rid, run in ex.runs.items()},
        shared={
            rid: hasattr(run.worker.trainer, "_rapidfire_reference_cache") for rid, run in ex.runs.items()
        },
    )
    exp.end()
    out["refs"] = {
        rid: plain_trl(leaf, tiny_create_model, train, None, root / f"plain-{rid}")
        for rid, leaf in enumerate(group.expand(SEED), start=1)
    }
    return out


def test_lora_runs_sharing_the_reference_equal_plain_trl(lora: dict[str, Any]) -> None:
    assert list(lora["info"].status) == ["COMPLETED"] * 4
    assert lora["bases"][1] is lora["bases"][2] is lora["bases"][3] is lora["bases"][4], "one shared base"
    assert all(lora["shared"].values())
    for rid, ref in lora["refs"].items():
        assert ref["max_steps"] == 4
        saved = adapter_from_folder(lora["info"].loc[rid, "checkpoint_dir"])
        assert max_abs_diff(saved, ref["weights"]) == 0.0, f"run {rid}: saved adapter differs"
        assert max_abs_diff(lora["in_memory"][rid], ref["weights"]) == 0.0, f"run {rid}: adapter differs"
        _assert_equal_plain(lora["results"], rid, ref)
    assert max_abs_diff(lora["in_memory"][1], lora["in_memory"][2]) > 1e-4, "beta changed the training"


def test_reference_computed_once_per_micro_batch(lora: dict[str, Any]) -> None:
    computed, hits, unshared = lora["counts"]
    # runs 1-3: 4 micro-batches computed once, 2 x 4 hits; run 4 (max_length 26): its own 4, never a hit
    assert (computed, hits, unshared) == (8, 8, 0)
    assert not [line for line in lora["lines"] if "not shared" in line]


def test_full_fine_tuning_runs_share_the_frozen_references_log_probs(tmp_path: Any) -> None:
    group = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            training_args=RFDPOConfig(
                beta=List([0.1, 0.5]),
                **{**COMMON, "num_train_epochs": 1, "learning_rate": 1e-4},
                max_length=64,
            ),
        ),
        "DPO",
    )
    train = tiny_dpo_dataset(8, seed=4)
    exp = Experiment("dpo-ref-full", experiment_path=tmp_path)
    exp.run_fit(group, tiny_create_model, train, None, num_chunks=2, seed=SEED)
    ex = exp.session.executor
    cache = dpo_reference.cache_of(ex.models)
    trainers = {rid: run.worker.trainer for rid, run in ex.runs.items()}
    weights = {
        rid: {k: v.detach().clone() for k, v in t.model.state_dict().items()} for rid, t in trainers.items()
    }
    results = exp.get_results()
    exp.end()
    assert trainers[1].ref_model is trainers[2].ref_model
    assert (cache.computed, cache.hits, cache.unshared) == (2, 2, 0)
    for rid, leaf in enumerate(group.expand(SEED), start=1):
        ref_model = dpo_reference.reference_module(trainers[rid])
        ref = plain_trl(leaf, tiny_create_model, train, None, tmp_path / f"plain-{rid}", ref_model=ref_model)
        assert max_abs_diff(weights[rid], ref["weights"]) == 0.0, f"run {rid}: weights differ"
        _assert_equal_plain(results, rid, ref)


class _Accelerator:
    device = "cpu"

    @staticmethod
    def unwrap_model(model: Any) -> Any:
        return model


def _fake_trainer(ref_model: Any) -> Any:
    from types import SimpleNamespace

    args = SimpleNamespace(neftune_noise_alpha=None, gradient_checkpointing_kwargs=None)
    return SimpleNamespace(
        ref_model=ref_model, model=None, args=args, accelerator=_Accelerator(), ld_alpha=None
    )


def test_a_reference_forward_that_draws_random_numbers_is_not_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    def drawing(trainer: Any, inputs: Any) -> tuple[Any, Any]:
        noise = torch.rand(2)
        return noise[:1], noise[1:]

    monkeypatch.setattr(dpo_reference, "reference_logps", drawing)
    notes: list[str] = []
    cache = dpo_reference.ReferenceCache(note=notes.append)
    trainer = _fake_trainer(torch.nn.Linear(2, 2).eval())
    batch = {"input_ids": torch.ones(2, 3, dtype=torch.long), "completion_mask": torch.ones(2, 3)}
    state = torch.get_rng_state()
    assert cache.reference(trainer, batch) is None and cache.reference(trainer, batch) is None
    assert torch.equal(torch.get_rng_state(), state), "the random state was put back"
    assert (cache.computed, cache.hits, cache.unshared, len(cache)) == (0, 0, 2, 0)
    assert len(notes) == 1 and "drew random numbers" in notes[0], notes


def test_a_hit_needs_the_same_inputs_and_unchanged_reference_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    calls: list[int] = []

    def computing(trainer: Any, inputs: Any) -> tuple[Any, Any]:
        calls.append(1)
        return torch.zeros(1), torch.ones(1)

    monkeypatch.setattr(dpo_reference, "reference_logps", computing)
    cache = dpo_reference.ReferenceCache()
    reference = torch.nn.Linear(2, 2).eval()
    trainer = _fake_trainer(reference)
    ids = torch.arange(6).reshape(2, 3)
    batch = {"input_ids": ids, "completion_mask": torch.ones(2, 3)}
    got = [cache.reference(trainer, batch), cache.reference(trainer, {**batch, "input_ids": ids.clone()})]
    assert (cache.computed, cache.hits) == (1, 1) and got[1] is not None and float(got[1][1]) == 1.0
    cache.reference(trainer, {**batch, "input_ids": ids.flip(1)})  # other bytes (same shape and dtype)
    cache.reference(
        trainer, {**batch, "completion_mask": torch.ones(2, 3, dtype=torch.float64)}
    )  # other dtype
    assert (cache.computed, cache.hits) == (3, 1)
    with torch.no_grad():
        reference.weight.add_(0.0)  # an in-place change (even of no value): the reference may differ
    cache.reference(trainer, batch)
    trainer.ld_alpha = 0.5  # a setting that changes the reference
    cache.reference(trainer, batch)
    assert (cache.computed, cache.hits, len(calls)) == (5, 1, 5)
    small = dpo_reference.ReferenceCache(max_bytes=len(cache._entries.popitem()[1].content) + 8)
    for flip in (False, True, False):
        small.reference(trainer, {**batch, "input_ids": ids.flip(1) if flip else ids})
    assert (small.computed, small.hits, len(small)) == (3, 0, 1), "bounded: the oldest entry was dropped"


def test_dropout_in_the_reference_forward_refuses_sharing() -> None:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1)).train()
    trainer = _fake_trainer(model)
    assert "dropout p=0.1 at 1" in str(dpo_reference.random_draw_reason(trainer, model))
    assert dpo_reference.random_draw_reason(trainer, model.eval()) is None
    trainer.args.neftune_noise_alpha = 5.0
    assert "neftune" in str(dpo_reference.random_draw_reason(trainer, model.train()))


def test_off_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert dpo_reference.sharing_enabled()
    monkeypatch.setenv(dpo_reference.SWITCH, "0")
    assert not dpo_reference.sharing_enabled()
    assert dpo_reference.install(_fake_trainer(None), None) is False
