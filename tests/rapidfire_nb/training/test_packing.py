"""Packed steps (issue 38), on the tiny model, CPU fp32: one forward and one backward over the shared base for the
LoRA runs of a pack, each run ending equal (0.0) to a plain ``trainer.train()`` of its config.

One config group of 4 LoRA runs that differ only in what a pack allows (learning rate, schedule, warmup, weight
decay, clipping, LoRA rank, alpha, dropout and target modules) forms one pack with ``packing=True``; a fifth run
with another batch size trains alone beside it. Every packed step is a fused pass (counted), and each run's
logged losses, gradient norms and final adapter equal plain TRL's, dropout included (each run's mask drawn from
its own RNG stream). A member stopped by the user while the pack trained it ahead of its turn is put back at its
last boundary, resumed, and still ends exact.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.testing import tiny_create_model
from tests.helpers import adapter_state, max_abs_diff, qa_dataset, qa_to_chat, train_plain_trl

SEED = 5
COMMON = {
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 2,
    "num_train_epochs": 2,
    "logging_steps": 1,
}
QV, QKVO = ["q_proj", "v_proj"], ["q_proj", "k_proj", "v_proj", "o_proj"]


def _group(with_outsider: bool) -> Any:
    runs = [
        (RFLoraConfig(r=4, lora_alpha=8, target_modules=QV), RFSFTConfig(learning_rate=1e-3, **COMMON)),
        (
            RFLoraConfig(r=8, lora_alpha=16, target_modules=QKVO, lora_dropout=0.1),
            RFSFTConfig(
                learning_rate=3e-3, lr_scheduler_type="cosine", warmup_steps=2, weight_decay=0.1, **COMMON
            ),
        ),
        (
            RFLoraConfig(r=2, lora_alpha=4, target_modules=QV, lora_dropout=0.2),
            RFSFTConfig(learning_rate=2e-3, max_grad_norm=0.0, **COMMON),
        ),
        (
            RFLoraConfig(r=16, lora_alpha=8, target_modules=QKVO, lora_dropout=0.05),
            RFSFTConfig(learning_rate=5e-4, lr_scheduler_type="linear", max_grad_norm=0.3, **COMMON),
        ),
    ]
    if with_outsider:  # another batch size: other micro-batches, so alone
        runs.append(
            (
                RFLoraConfig(r=4, lora_alpha=8, target_modules=QV),
                RFSFTConfig(learning_rate=1e-3, **{**COMMON, "per_device_train_batch_size": 3}),
            )
        )
    configs = [
        RFModelConfig(model_name="tiny", peft_config=lora, training_args=args, formatting_func=qa_to_chat)
        for lora, args in runs
    ]
    return RFGridSearch(configs=List(configs), trainer_type="SFT")


def _train_losses(history: list[dict[str, Any]]) -> list[tuple[int, float, float]]:
    return [(int(h["step"]), float(h["loss"]), float(h["grad_norm"])) for h in history if "loss" in h]


@pytest.fixture(scope="module")
def data() -> tuple[Any, Any]:
    return qa_dataset(24, seed=0), qa_dataset(6, seed=1)


@pytest.fixture(scope="module")
def plain(data: tuple[Any, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[int, Any]:
    train, evald = data
    root = tmp_path_factory.mktemp("plain")
    leaves = _group(with_outsider=True).expand(SEED)
    return {
        rid: train_plain_trl(leaf, tiny_create_model, train, evald, SEED, root / f"plain-{rid}")
        for rid, leaf in enumerate(leaves, start=1)
    }


def _mine(exp: Experiment) -> tuple[dict[int, Any], dict[int, Any]]:
    runs = exp.session.executor.runs
    adapters = {
        rid: adapter_state(run.worker.trainer.model, adapter_name=run.adapter) for rid, run in runs.items()
    }
    losses = {rid: _train_losses(run.worker.trainer.state.log_history) for rid, run in runs.items()}
    return adapters, losses


def test_a_pack_of_four_trains_fused_and_every_run_equals_plain_trl(
    data: tuple[Any, Any], plain: dict[int, Any], tmp_path: Any
) -> None:
    train, evald = data
    exp = Experiment("packed", experiment_path=tmp_path)
    exp.run_fit(
        _group(with_outsider=True), tiny_create_model, train, evald, num_chunks=2, seed=SEED, packing=True
    )
    packs = exp.session.executor.packs
    assert packs is not None
    drivers = list(packs._drivers.values())
    adapters, losses = _mine(exp)
    info = exp.get_runs_info().set_index("run_id")
    exp.end()
    assert list(info.status) == ["COMPLETED"] * 5
    # 6 optimizer steps x 2 micro-batches, every one a fused pass of runs 1-4; run 5 never in a pack
    assert packs.packed_segments == 4 and [(d.fused_steps, d.alone_steps) for d in drivers] == [(12, 0)]
    for rid in range(1, 6):
        ref = plain[rid]
        assert losses[rid] == _train_losses(ref.log_history), rid  # every step's loss and grad norm, exactly
        assert max_abs_diff(adapters[rid], ref.final) == 0.0, rid


def test_packing_off_and_auto_on_cpu_train_time_sliced(data: tuple[Any, Any], tmp_path: Any) -> None:
    train, evald = data
    for i, packing in enumerate((False, "auto")):
        exp = Experiment(f"sliced-{i}", experiment_path=tmp_path)
        exp.run_fit(_group(False), tiny_create_model, train, None, num_chunks=2, seed=SEED, packing=packing)
        assert exp.session.executor.packs is None  # CPU: "auto" measured no gain, so no packs
        exp.end()


def test_a_member_stopped_before_its_turn_goes_back_to_its_boundary_and_ends_exact(
    data: tuple[Any, Any], plain: dict[int, Any], tmp_path: Any
) -> None:
    """Run 3 is stopped while run 1's turn trains the whole pack: its chunk, trained ahead, does not count; it
    is rebuilt at its last boundary (step 2), resumed, and ends equal to plain TRL."""
    train, evald = data
    from rapidfire_nb.training.pack_runs import PackRuns

    exp = Experiment("packed-stop", experiment_path=tmp_path)

    original = PackRuns.segment
    stopped: list[int] = []

    def segment(self: PackRuns, run_id: int, stop_step: int) -> Any:
        result = original(self, run_id, stop_step)
        if run_id == 1 and stop_step > 2 and not stopped:  # run 1's second turn trained runs 2-4 ahead
            stopped.append(stop_step)
            exp.stop(3)
        return result

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PackRuns, "segment", segment)
        exp.run_fit(
            _group(False),
            tiny_create_model,
            train,
            evald,
            num_chunks=2,
            seed=SEED,
            packing=True,
            background=True,
        )
        deadline = time.monotonic() + 120
        while not stopped or exp.get_runs_info().set_index("run_id").loc[3, "status"] != "STOPPED":
            assert time.monotonic() < deadline, "run 3 was never stopped"
            time.sleep(0.05)
        info = exp.get_runs_info().set_index("run_id")
        assert (
            int(info.loc[3, "completed_steps"]) == 2
        )  # where the scheduler saw it, not where the pack had it
        exp.resume(3)
        exp.wait()
    adapters, losses = _mine(exp)
    info = exp.get_runs_info().set_index("run_id")
    exp.end()
    assert list(info.status) == ["COMPLETED"] * 4
    for rid in range(1, 5):
        assert max_abs_diff(adapters[rid], plain[rid].final) == 0.0, rid
        assert losses[rid][-1] == _train_losses(plain[rid].log_history)[-1], rid


def test_dpo_runs_with_other_beta_and_loss_pack_and_equal_plain_trl(tmp_path: Any) -> None:
    """DPO: runs 1-3 (beta 0.1 / 0.3, ``ipo``) form one pack over the shared reference (computed once per
    micro-batch); run 4 (a shorter ``max_length``) trains alone. Every run equals a plain ``DPOTrainer``."""
    from rapidfire_nb.testing import tiny_dpo_dataset
    from tests.rapidfire_nb.test_dpo_grpo import plain_trl
    from tests.rapidfire_nb.training.test_dpo_reference import SEED as DPO_SEED
    from tests.rapidfire_nb.training.test_dpo_reference import _assert_equal_plain, _lora_group

    train = tiny_dpo_dataset(8, seed=3)
    group = _lora_group()
    exp = Experiment("dpo-packed", experiment_path=tmp_path)
    exp.run_fit(group, tiny_create_model, train, None, num_chunks=2, seed=DPO_SEED, packing=True)
    ex = exp.session.executor
    assert ex.packs is not None
    fused = [(d.fused_steps, d.alone_steps) for d in ex.packs._drivers.values()]
    adapters = {
        rid: adapter_state(run.worker.trainer.model, adapter_name=run.adapter) for rid, run in ex.runs.items()
    }
    info = exp.get_runs_info().set_index("run_id")
    results = exp.get_results()
    exp.end()
    assert list(info.status) == ["COMPLETED"] * 4
    assert list(info["pack"]) == [1, 1, 1, None]
    assert fused == [(4, 0)]  # 4 steps of one micro-batch, each a fused pass of runs 1-3
    for rid, leaf in enumerate(group.expand(DPO_SEED), start=1):
        ref = plain_trl(leaf, tiny_create_model, train, None, tmp_path / f"plain-{rid}")
        assert max_abs_diff(adapters[rid], ref["weights"]) == 0.0, rid
        _assert_equal_plain(results, rid, ref)


def test_a_pack_that_would_not_fit_the_free_memory_is_split(
    data: tuple[Any, Any], plain: dict[int, Any], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With room for 2 runs' activations (each estimated at 1,000 bytes, 1,300 free), the 4 packable runs train as
    two packs (1-2 and 3-4), said once, and every run still equals plain TRL."""
    from rapidfire_nb.training import pack_runs

    monkeypatch.setattr(pack_runs, "activation_bytes", lambda shapes, tokens, dtype_bytes=4: 1000)
    monkeypatch.setattr(pack_runs, "available_ram", lambda: 1300)
    monkeypatch.setattr(pack_runs, "free_cuda_bytes", lambda: None)
    train, evald = data
    exp = Experiment("packed-split", experiment_path=tmp_path)
    lines: list[str] = []
    exp.on_message(lines.append)
    exp.run_fit(
        _group(with_outsider=False), tiny_create_model, train, evald, num_chunks=2, seed=SEED, packing=True
    )
    adapters, losses = _mine(exp)
    info = exp.get_runs_info().set_index("run_id")
    drivers = list(exp.session.executor.packs._drivers.values())
    exp.end()
    assert list(info["pack"]) == [1, 1, 3, 3]
    assert [d.fused_steps for d in drivers] == [24]  # 12 micro-batches, each fused twice (two packs of 2)
    said = [line for line in lines if "packs of at most 2 runs" in line]
    assert said == [
        "[rapidfire] packs of at most 2 runs on this device: each run adds ~1.0 KB of activations per micro-batch"
        " to a pack, and 1.3 KB is free"
    ]
    for rid in range(1, 5):
        assert losses[rid] == _train_losses(plain[rid].log_history), rid
        assert max_abs_diff(adapters[rid], plain[rid].final) == 0.0, rid


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_gradient_checkpointing_packs_without_lora_dropout(
    data: tuple[Any, Any], tmp_path: Any, dropout: float
) -> None:
    """With ``gradient_checkpointing=True`` (TRL's default, kept on a GPU) the backward recomputes the fused forward:
    without LoRA dropout the runs pack and equal plain TRL (0.0); with it they train alone, said once, still
    exact (the recomputation would draw other masks). Before the fix every packed run failed with PyTorch's
    CheckpointError."""
    train, _evald = data
    args = {**COMMON, "num_train_epochs": 1, "gradient_checkpointing": True}
    configs = [
        RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(r=r, lora_alpha=8, target_modules=QV, lora_dropout=dropout),
            training_args=RFSFTConfig(learning_rate=lr, **args),
            formatting_func=qa_to_chat,
        )
        for r, lr in ((4, 1e-3), (8, 3e-3))
    ]
    group = RFGridSearch(configs=List(configs), trainer_type="SFT")
    exp = Experiment(f"packed-gc-{dropout}", experiment_path=tmp_path)
    lines: list[str] = []
    exp.on_message(lines.append)
    exp.run_fit(group, tiny_create_model, train, None, num_chunks=2, seed=SEED, packing=True)
    adapters, _losses = _mine(exp)
    fused = sum(d.fused_steps for d in exp.session.executor.packs._drivers.values())
    info = exp.get_runs_info().set_index("run_id")
    exp.end()
    assert list(info.status) == ["COMPLETED"] * 2
    assert fused == (6 if dropout == 0.0 else 0)
    said = [line for line in lines if "gradient checkpointing with LoRA dropout" in line]
    assert len(said) == (0 if dropout == 0.0 else 1), lines
    for rid, leaf in enumerate(group.expand(SEED), start=1):
        ref = train_plain_trl(leaf, tiny_create_model, train, None, SEED, tmp_path / f"plain-{rid}")
        assert max_abs_diff(adapters[rid], ref.final) == 0.0, rid
