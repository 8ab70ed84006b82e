"""DPO and GRPO through the same engine as SFT, exact to plain TRL (tiny model, CPU fp32).

=====  =====================================================================================================
what   runs (one experiment each) -> compared with ``DPOTrainer(...).train()`` / ``GRPOTrainer(...).train()``
=====  =====================================================================================================
DPO    LoRA, sigmoid loss, ``beta=List([0.1, 0.3])`` on one shared base (reference = that base with adapters
       disabled, no extra copy) + a third run with ``disable_dropout=False`` (gets its own base copy); 2 epochs
       x 2 chunks, lora_dropout 0.1, an eval set (evaluated at every chunk end).
DPO    full fine-tuning, 2 runs sharing one frozen reference model.
GRPO   LoRA, reward functions ``length_reward`` + ``digit_reward`` (reads the ``answer`` column), num_generations
       4, beta 0.04 (KL against the base with adapters disabled), temperatures 1.0 / 0.7 on one shared base.
       Run 1: steps_per_generation 1 (a generation round = 1 prompt = 1 step); run 2: steps_per_generation 2
       (a round = 2 prompts = 2 steps) with 6 prompts in 2 chunks: half an epoch is 3 prompts, not a whole
       number of generation rounds, so the engine moves the boundary to step 4 (a naive split would stop at
       step 3, inside a generation buffer).
=====  =====================================================================================================

Then every bad input of the issue (ConfigError before any training) and a reward function that raises during
training (only its run fails; the error names the function; the other run is still exact).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from rapidfire_nb import ConfigError, Experiment
from rapidfire_nb.automl import List, RFDPOConfig, RFGridSearch, RFGRPOConfig, RFLoraConfig, RFModelConfig
from rapidfire_nb.testing import length_reward, tiny_create_model, tiny_dpo_dataset, tiny_grpo_dataset
from tests.helpers import TOL, adapter_from_folder, adapter_state, max_abs_diff, result_series, worker_threads

SEED = 7
LORA = dict(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"])


def digit_reward(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
    """A second reward with variance: digits in the reply, minus 1 when it contains the right answer."""
    texts = [c if isinstance(c, str) else "".join(m["content"] for m in c) for c in completions]
    return [float(sum(ch.isdigit() for ch in t)) - float(a in t) for t, a in zip(texts, answer)]


# ------------------------------------------------------------------------------------------------ plain TRL
def plain_trl(
    leaf: Any, create_model_fn: Any, train: Any, evald: Any, output_dir: Any, ref_model: Any = None
) -> dict[str, Any]:
    """What a user writes without rapidfire_nb: the same TRL config, ``peft_config``, rows and seed, one ``train()``."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import DPOTrainer, GRPOTrainer

    from rapidfire_nb.spec import build_lora_config, build_training_args

    args, _ = build_training_args(leaf, output_dir=str(output_dir), default_seed=SEED)
    model, tok = create_model_fn(leaf.model_config_dict())
    fmt = leaf.formatting_func

    def rows(ds: Any) -> Any:
        return ds if ds is None or fmt is None else ds.map(fmt, remove_columns=ds.column_names)

    kwargs = dict(
        model=model,
        args=args,
        train_dataset=rows(train),
        eval_dataset=rows(evald),
        processing_class=tok,
        peft_config=build_lora_config(leaf),
    )
    if leaf.trainer_type == "GRPO":
        trainer = GRPOTrainer(reward_funcs=list(leaf.reward_funcs), **kwargs)
    else:
        trainer = DPOTrainer(ref_model=ref_model, **kwargs)
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.train()
    weights = (
        adapter_state(trainer.model)
        if leaf.lora is not None
        else {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    )
    return dict(weights=weights, log=list(trainer.state.log_history), max_steps=trainer.state.max_steps)


def series(log: list[dict[str, Any]], name: str) -> list[tuple[int, float]]:
    return [(int(h["step"]), float(h[name])) for h in log if name in h]


def assert_same_series(results: Any, rid: int, ref_log: list[dict[str, Any]], names: tuple[str, ...]) -> None:
    for name in names:
        ref = series(ref_log, name)
        got = result_series(results, rid, name)
        assert ref, f"plain TRL logged no {name!r}"
        assert [s for s, _ in got] == [s for s, _ in ref], f"run {rid}: {name} logged at other steps"
        worst = max(abs(a - b) for (_, a), (_, b) in zip(got, ref))
        assert worst <= TOL, f"run {rid}: {name} differs by {worst}"


# ================================================================================================ DPO
def _dpo_group() -> RFGridSearch:
    common = dict(
        loss_type="sigmoid",
        learning_rate=1e-3,
        per_device_train_batch_size=4,
        num_train_epochs=2,
        max_length=48,
        warmup_steps=1,
        logging_steps=1,
        eval_strategy="no",
    )
    return RFGridSearch(
        List(
            [
                RFModelConfig(
                    model_name="tiny",
                    peft_config=RFLoraConfig(**LORA),
                    training_args=RFDPOConfig(beta=List([0.1, 0.3]), **common),
                ),
                RFModelConfig(
                    model_name="tiny",
                    peft_config=RFLoraConfig(**LORA),
                    training_args=RFDPOConfig(beta=0.1, disable_dropout=False, **common),
                ),
            ]
        ),
        "DPO",
    )


@pytest.fixture(scope="module")
def dpo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("dpo")
    train, evald = tiny_dpo_dataset(8, seed=0), tiny_dpo_dataset(4, seed=1)
    group = _dpo_group()
    exp = Experiment("dpo", experiment_path=root)
    lines: list[str] = []
    exp.on_message(lines.append)
    exp.run_fit(group, tiny_create_model, train, evald, num_chunks=2, seed=SEED)
    ex = exp.session.executor
    out = dict(
        lines=lines,
        info=exp.get_runs_info().set_index("run_id"),
        results=exp.get_results(),
        trainers={rid: run.worker.trainer for rid, run in ex.runs.items()},
        adapters={rid: run.adapter for rid, run in ex.runs.items()},
        bases={rid: run.base for rid, run in ex.runs.items()},
        in_memory={
            rid: adapter_state(run.worker.trainer.model, adapter_name=run.adapter)
            for rid, run in ex.runs.items()
        },
        plans={rid: run.plan for rid, run in ex.runs.items()},
        tb=exp.path / "tensorboard",
    )
    exp.end()
    out["refs"] = {
        rid: plain_trl(leaf, tiny_create_model, train, None, root / f"plain-{rid}")
        for rid, leaf in enumerate(group.expand(SEED), start=1)
    }
    return out


def test_dpo_runs_complete_chunk_by_chunk(dpo: dict[str, Any]) -> None:
    info = dpo["info"]
    assert list(info.status) == ["COMPLETED"] * 3
    assert list(info.beta) == [0.1, 0.3, 0.1]
    for rid in (1, 2, 3):
        assert dpo["plans"][rid].boundaries == (1, 2, 3, 4)
        assert dpo["plans"][rid].labels == ((1, 1), (1, 2), (2, 1), (2, 2))
        assert (
            info.loc[rid, "completed_steps"]
            == info.loc[rid, "total_steps"]
            == dpo["refs"][rid]["max_steps"]
            == 4
        )
        assert info.loc[rid, "chunks_done"] == 4


def test_dpo_lora_weights_and_metrics_equal_plain_trl(dpo: dict[str, Any]) -> None:
    for rid, ref in dpo["refs"].items():
        saved = adapter_from_folder(dpo["info"].loc[rid, "checkpoint_dir"])
        assert max_abs_diff(saved, ref["weights"]) <= TOL, f"run {rid}: saved adapter differs"
        assert max_abs_diff(dpo["in_memory"][rid], ref["weights"]) <= TOL, (
            f"run {rid}: trained adapter differs"
        )
        assert_same_series(
            dpo["results"],
            rid,
            ref["log"],
            (
                "loss",
                "rewards/chosen",
                "rewards/rejected",
                "rewards/margins",
                "rewards/accuracies",
                "logps/chosen",
                "grad_norm",
            ),
        )
    # beta matters: the two beta runs on one base really trained different adapters
    assert max_abs_diff(dpo["in_memory"][1], dpo["in_memory"][2]) > 1e-4


def test_dpo_lora_reference_is_the_shared_base_with_adapters_disabled(dpo: dict[str, Any]) -> None:
    trainers, bases = dpo["trainers"], dpo["bases"]
    assert bases[1] is bases[2], "the two beta runs share one base"
    assert bases[3] is not bases[1], "disable_dropout=False disagrees with the others: its own base copy"
    notes = [line for line in dpo["lines"] if "settings that act on the shared model" in line]
    assert notes == [
        "[rapidfire] run 3 differs from a base of its model already loaded in settings that act on the shared "
        "model: disable_dropout=False (loaded base: True); it gets its own base copy (create_model_fn is called "
        "again)"
    ], notes
    assert bases[1].adapters == ["run_1", "run_2"] and bases[3].adapters == ["run_3"]
    for trainer in trainers.values():
        assert trainer.ref_model is None  # TRL then computes reference log-probs under disable_adapter()
        configs = trainer.model.peft_config
        assert "ref" not in configs and "default" not in configs, sorted(configs)
    # DPO's disable_dropout=True zeroed the dropout of its base only
    drops = {
        rid: {
            m.p
            for n, m in trainers[rid].model.named_modules()
            if type(m).__name__ == "Dropout" and f".{dpo['adapters'][rid]}" in n
        }
        for rid in (1, 3)
    }
    assert drops == {1: {0.0}, 3: {0.1}}


def test_dpo_metrics_keep_trl_names_in_store_results_and_tensorboard(dpo: dict[str, Any]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cols = set(dpo["results"].columns)
    assert {"rewards/chosen", "rewards/margins", "eval_rewards/margins", "eval_loss"} <= cols
    acc = EventAccumulator(str(dpo["tb"] / "run-1"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/rewards/margins", "train/rewards/chosen", "eval/rewards/margins"} <= tags
    assert [e.step for e in acc.Scalars("train/rewards/margins")] == [1, 2, 3, 4]


def test_dpo_full_fine_tuning_shares_one_frozen_reference(tmp_path: Any) -> None:
    train = tiny_dpo_dataset(4, seed=0)
    group = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            training_args=RFDPOConfig(
                beta=List([0.1, 0.3]),
                loss_type="sigmoid",
                learning_rate=1e-3,
                per_device_train_batch_size=2,
                num_train_epochs=1,
                max_length=48,
                logging_steps=1,
            ),
        ),
        "DPO",
    )
    exp = Experiment("dpo-full", experiment_path=tmp_path)
    exp.quiet = True
    exp.run_fit(group, tiny_create_model, train, num_chunks=2, seed=SEED)
    runs = exp.session.executor.runs
    refs = {rid: run.worker.trainer.ref_model for rid, run in runs.items()}
    got = {
        rid: {k: v.detach().clone() for k, v in run.worker.trainer.model.state_dict().items()}
        for rid, run in runs.items()
    }
    results = exp.get_results()
    exp.end()
    assert refs[1] is refs[2] and refs[1] is not None, "one reference per distinct base"
    assert all(not p.requires_grad for p in refs[1].parameters()) and not refs[1].training
    pristine, _ = tiny_create_model()
    assert max_abs_diff(refs[1].state_dict(), pristine.state_dict()) == 0.0, "the reference never trains"
    for rid, leaf in enumerate(group.expand(SEED), start=1):
        ref_model, _ = tiny_create_model()
        ref = plain_trl(leaf, tiny_create_model, train, None, tmp_path / f"plain-{rid}", ref_model=ref_model)
        assert max_abs_diff(got[rid], ref["weights"]) <= TOL, f"run {rid}"
        assert_same_series(results, rid, ref["log"], ("loss", "rewards/margins"))


def test_dpo_ref_model_name_loads_one_frozen_reference_through_create_model_fn(tmp_path: Any) -> None:
    train = tiny_dpo_dataset(4, seed=0)
    calls: list[str] = []

    def create(config: dict) -> Any:
        calls.append(config["model_name"])
        return tiny_create_model(config)

    group = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            ref_model_name="tiny-qwen2",
            peft_config=RFLoraConfig(**LORA),
            training_args=RFDPOConfig(
                beta=0.1, learning_rate=1e-3, max_length=48, per_device_train_batch_size=2, logging_steps=1
            ),
        ),
        "DPO",
    )
    exp = Experiment("dpo-ref-name", experiment_path=tmp_path)
    exp.quiet = True
    exp.run_fit(group, create, train, num_chunks=2, seed=SEED)
    run = exp.session.executor.runs[1]
    ref_model = run.worker.trainer.ref_model
    got = adapter_state(run.worker.trainer.model, adapter_name=run.adapter)
    results = exp.get_results()
    exp.end()
    assert sorted(calls) == ["tiny", "tiny-qwen2"] and type(ref_model).__name__ == "Qwen2ForCausalLM"
    assert not any(p.requires_grad for p in ref_model.parameters())
    (leaf,) = group.expand(SEED)
    ref = plain_trl(
        leaf,
        tiny_create_model,
        train,
        None,
        tmp_path / "plain",
        ref_model=tiny_create_model({"model_name": "tiny-qwen2"})[0],
    )
    assert max_abs_diff(got, ref["weights"]) <= TOL
    assert_same_series(results, 1, ref["log"], ("loss", "rewards/margins"))


# ================================================================================================ GRPO
GRPO_COMMON = dict(
    num_generations=4,
    max_completion_length=6,
    learning_rate=1e-2,
    beta=0.04,
    logging_steps=1,
    num_train_epochs=1,
)


def _grpo_group() -> RFGridSearch:
    return RFGridSearch(
        List(
            [
                RFModelConfig(
                    model_name="tiny",
                    peft_config=RFLoraConfig(**LORA),
                    reward_funcs=[length_reward, digit_reward],
                    training_args=RFGRPOConfig(
                        per_device_train_batch_size=4, steps_per_generation=1, temperature=1.0, **GRPO_COMMON
                    ),
                ),
                RFModelConfig(
                    model_name="tiny",
                    peft_config=RFLoraConfig(**LORA),
                    reward_funcs=[length_reward, digit_reward],
                    training_args=RFGRPOConfig(
                        per_device_train_batch_size=4, steps_per_generation=2, temperature=0.7, **GRPO_COMMON
                    ),
                ),
            ]
        ),
        "GRPO",
    )


@pytest.fixture(scope="module")
def grpo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from rapidfire_nb.training.executor import TorchExecutor

    root = tmp_path_factory.mktemp("grpo")
    train = tiny_grpo_dataset(6, seed=0)
    group = _grpo_group()
    exp = Experiment("grpo", experiment_path=root)
    exp.quiet = True
    at_boundary: list[tuple[int, int, int, bool]] = []
    original = TorchExecutor._on_boundary

    def spy(self: Any, run_id: int, step: int, rng: Any) -> None:
        tr = self._runs[run_id].worker.trainer
        every = tr.args.steps_per_generation * tr.args.num_iterations
        at_boundary.append((run_id, step, tr._step, tr._step % every == 0))
        original(self, run_id, step, rng)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TorchExecutor, "_on_boundary", spy)
        exp.run_fit(group, tiny_create_model, train, num_chunks=2, seed=SEED)
    ex = exp.session.executor
    out = dict(
        info=exp.get_runs_info().set_index("run_id"),
        results=exp.get_results(),
        at_boundary=at_boundary,
        trainers={rid: run.worker.trainer for rid, run in ex.runs.items()},
        in_memory={
            rid: adapter_state(run.worker.trainer.model, adapter_name=run.adapter)
            for rid, run in ex.runs.items()
        },
        plans={rid: run.plan for rid, run in ex.runs.items()},
        tb=exp.path / "tensorboard",
    )
    exp.end()
    out["refs"] = {
        rid: plain_trl(leaf, tiny_create_model, train, None, root / f"plain-{rid}")
        for rid, leaf in enumerate(group.expand(SEED), start=1)
    }
    return out


def test_grpo_chunks_end_on_generation_rounds(grpo: dict[str, Any]) -> None:
    info, plans = grpo["info"], grpo["plans"]
    assert list(info.status) == ["COMPLETED", "COMPLETED"]
    # run 1: 1 prompt x 4 completions per round, 1 step per round: half of 6 prompts -> step 3
    # run 2: 2 prompts per round, 2 steps per round: half (3 prompts) -> after round 2 -> step 4, not 3
    assert plans[1].boundaries == (3, 6) and plans[2].boundaries == (4, 6)
    for rid in (1, 2):
        assert plans[rid].labels == ((1, 1), (1, 2)), "every chunk once per epoch"
        assert info.loc[rid, "total_steps"] == grpo["refs"][rid]["max_steps"] == 6
        assert info.loc[rid, "completed_steps"] == 6 and info.loc[rid, "chunks_done"] == 2
        assert plans[rid].samples_seen(plans[rid].total_steps) == 6
    assert plans[2].samples_seen(3) == 4  # step 3 is inside round 2: its 2 prompts are generated already
    assert grpo["at_boundary"] and all(ok for *_, ok in grpo["at_boundary"]), grpo["at_boundary"]


def test_grpo_weights_losses_and_rewards_equal_plain_trl(grpo: dict[str, Any]) -> None:
    for rid, ref in grpo["refs"].items():
        saved = adapter_from_folder(grpo["info"].loc[rid, "checkpoint_dir"])
        assert max_abs_diff(saved, ref["weights"]) <= TOL, f"run {rid}: saved adapter differs"
        assert max_abs_diff(grpo["in_memory"][rid], ref["weights"]) <= TOL, (
            f"run {rid}: trained adapter differs"
        )
        assert_same_series(
            grpo["results"],
            rid,
            ref["log"],
            (
                "loss",
                "reward",
                "reward_std",
                "rewards/length_reward/mean",
                "rewards/digit_reward/mean",
                "kl",
                "completions/mean_length",
            ),
        )
    assert grpo["trainers"][1].ref_model is None and grpo["trainers"][1].beta == 0.04


def test_dpo_and_grpo_weights_are_bit_identical(dpo: dict[str, Any], grpo: dict[str, Any]) -> None:
    """The aim beyond the 1e-6 bar (measured: 0.0); a failure here alone means 'exact, but not bit-identical'."""
    for out in (dpo, grpo):
        for rid, ref in out["refs"].items():
            assert max_abs_diff(out["in_memory"][rid], ref["weights"]) == 0.0, f"run {rid}"


def test_grpo_metrics_in_tensorboard(grpo: dict[str, Any]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(grpo["tb"] / "run-2"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {
        "train/reward",
        "train/kl",
        "train/rewards/length_reward/mean",
        "train/rewards/digit_reward/mean",
    } <= tags


# ------------------------------------------------------------------------------------------------ geometry
class _Stop(Exception):
    pass


@pytest.mark.parametrize(
    "training, n_rows",
    [
        (dict(per_device_train_batch_size=4, steps_per_generation=1), 6),
        (dict(per_device_train_batch_size=2, steps_per_generation=2), 5),
        (dict(per_device_train_batch_size=4, steps_per_generation=2, gradient_accumulation_steps=3), 10),
        (
            dict(
                per_device_train_batch_size=4,
                gradient_accumulation_steps=2,
                num_iterations=2,
                num_train_epochs=1.5,
            ),
            7,
        ),
        (dict(per_device_train_batch_size=2, generation_batch_size=8, max_steps=7), 9),
    ],
)
def test_grpo_step_geometry_matches_trl(training: dict[str, Any], n_rows: int, tmp_path: Any) -> None:
    """Total steps and steps per epoch are TRL's own (its dataloader, its ``state.max_steps``), no training."""
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from rapidfire_nb.spec import build_lora_config, build_training_args
    from rapidfire_nb.training.kinds import get_kind

    args = dict(num_generations=4, max_completion_length=4, logging_steps=1)
    args.update(training)
    (leaf,) = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(**LORA),
            reward_funcs=[length_reward],
            training_args=RFGRPOConfig(**args),
        ),
        "GRPO",
    ).expand(SEED)
    targs, _ = build_training_args(leaf, output_dir=str(tmp_path), default_seed=SEED)
    model, tok = tiny_create_model()
    seen: dict[str, int] = {}

    class Probe(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            seen["max_steps"] = state.max_steps
            raise _Stop()

    trainer = GRPOTrainer(
        model=model,
        args=targs,
        reward_funcs=[length_reward],
        processing_class=tok,
        train_dataset=tiny_grpo_dataset(n_rows),
        peft_config=build_lora_config(leaf),
        callbacks=[Probe()],
    )
    grpo_kind = get_kind("GRPO")
    geo = grpo_kind.step_geometry(trainer)
    assert geo.grpo is not None
    assert geo.grpo.micro_steps_per_epoch == len(trainer.get_train_dataloader())
    with pytest.raises(_Stop):
        trainer.train()
    assert geo.total_steps == seen["max_steps"]
    # every boundary of every plan ends a generation round and an optimizer step
    g = geo.grpo
    for k in range(1, len(g.boundary_steps) + 1):
        plan = grpo_kind.plan_chunks(geo, k)
        assert plan.boundaries[-1] == geo.total_steps
        for b in plan.boundaries:
            within = b % geo.steps_per_epoch
            micro = min(within * g.gradient_accumulation_steps, g.micro_steps_per_epoch)
            assert micro % g.micro_steps_per_generation == 0 or b == geo.total_steps, (k, plan.boundaries)
    with pytest.raises(Exception, match=f"num_chunks <= {len(g.boundary_steps)}"):
        grpo_kind.plan_chunks(geo, len(g.boundary_steps) + 1)


# ================================================================================================ bad input
@pytest.fixture
def trained(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every ``RunWorker.run_until`` call: empty means nothing trained."""
    from rapidfire_nb.training.worker import RunWorker

    calls: list[tuple[int, int]] = []
    original = RunWorker.run_until

    def spy(self: Any, stop_step: int) -> Any:
        calls.append((self.run_id, stop_step))
        return original(self, stop_step)

    monkeypatch.setattr(RunWorker, "run_until", spy)
    return calls


def fails_before_training(trained: list, match: str, group: Any, train: Any, **kwargs: Any) -> str:
    exp = Experiment("bad-input")
    exp.quiet = True
    before = worker_threads()
    with pytest.raises(ConfigError, match=match) as err:
        exp.run_fit(group, tiny_create_model, train, **kwargs)
    assert trained == [] and worker_threads() - before == set()
    assert exp.store.runs() == [] and exp.store.metrics_since(0)[0] == []
    return str(err.value)


def _grpo(reward_funcs: Any = (length_reward,), **training: Any) -> RFGridSearch:
    args = dict(num_generations=4, max_completion_length=4, per_device_train_batch_size=4)
    args.update(training)
    return RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(**LORA),
            reward_funcs=list(reward_funcs) if reward_funcs else None,
            training_args=RFGRPOConfig(**args),
        ),
        "GRPO",
    )


def test_dpo_rows_without_preference_columns(trained: list) -> None:
    from datasets import Dataset

    rows = Dataset.from_dict({"prompt": ["What is 3 plus 4?"], "completion": ["7"]})
    group = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(**LORA),
            training_args=RFDPOConfig(per_device_train_batch_size=1),
        ),
        "DPO",
    )
    msg = fails_before_training(trained, "prompt/chosen/rejected", group, rows)
    assert "formatting_func" in msg and "completion" in msg
    # the same rows through a formatting_func that builds the pair are accepted
    from rapidfire_nb.training.data import prepare_dataset
    from rapidfire_nb.training.kinds import get_kind

    def to_pair(row: dict) -> dict:
        return {"prompt": row["prompt"], "chosen": row["completion"], "rejected": "8"}

    assert {"prompt", "chosen", "rejected"} <= set(
        prepare_dataset(rows, to_pair, get_kind("DPO"), "train").column_names
    )


def test_grpo_without_reward_funcs(trained: list) -> None:
    with pytest.raises(ConfigError, match="GRPO needs reward functions"):
        _grpo(reward_funcs=None).expand(SEED)
    from rapidfire_nb.training.kinds.rewards import check_reward_funcs

    with pytest.raises(ConfigError, match="GRPO needs reward functions"):
        check_reward_funcs([], ["prompt"])


@pytest.mark.parametrize(
    "training, numbers",
    [
        (dict(per_device_train_batch_size=3, steps_per_generation=1), ("3 completions", "num_generations=4")),
        (
            dict(per_device_train_batch_size=3, gradient_accumulation_steps=2),
            ("6 completions", "num_generations=4"),
        ),
        (
            dict(per_device_train_batch_size=2, generation_batch_size=6),
            ("6 completions", "num_generations=4"),
        ),
    ],
)
def test_generation_batch_not_divisible_by_num_generations(
    trained: list, training: dict, numbers: tuple
) -> None:
    msg = fails_before_training(
        trained, "not divisible by num_generations", _grpo(**training), tiny_grpo_dataset(8)
    )
    for text in numbers:
        assert text in msg, msg


def test_grpo_ref_model_name_is_rejected(trained: list) -> None:
    group = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            ref_model_name="tiny-qwen2",
            reward_funcs=[length_reward],
            training_args=RFGRPOConfig(num_generations=4, per_device_train_batch_size=4),
        ),
        "GRPO",
    )
    fails_before_training(trained, "not supported for GRPO", group, tiny_grpo_dataset(8))


def test_grpo_num_chunks_beyond_generation_rounds(trained: list) -> None:
    # 6 prompts, 2 prompts per round (batch 4 x steps_per_generation 2 / 4 generations) -> 3 rounds per epoch
    fails_before_training(
        trained, r"num_chunks <= 3", _grpo(steps_per_generation=2), tiny_grpo_dataset(6), num_chunks=4
    )


def no_kwargs(prompts: Any, completions: Any) -> list[float]:
    return [0.0] * len(completions)


def needs_solution(completions: Any, solution: Any, **kwargs: Any) -> list[float]:
    return [0.0] * len(completions)


@pytest.mark.parametrize("bad, why", [(no_kwargs, "answer"), (needs_solution, "solution")])
def test_reward_function_that_cannot_bind_trl_call(trained: list, bad: Any, why: str) -> None:
    msg = fails_before_training(
        trained, f"reward function '{bad.__name__}'", _grpo([length_reward, bad]), tiny_grpo_dataset(8)
    )
    assert why in msg and "completions=" in msg and "**kwargs" in msg


def test_reward_functions_of_the_issue_bind() -> None:
    from rapidfire_nb.data.gsm import correctness_reward, format_reward
    from rapidfire_nb.training.kinds.rewards import check_reward_funcs, reward_call_names

    check_reward_funcs(
        [correctness_reward, format_reward, length_reward, digit_reward, lambda **kw: []],
        ["prompt", "answer"],
    )
    assert reward_call_names(["prompt", "answer"]) == [
        "prompts",
        "completions",
        "completion_ids",
        "trainer_state",
        "log_extra",
        "log_metric",
        "answer",
    ]
    with pytest.raises(ConfigError, match="correctness_reward"):
        check_reward_funcs([correctness_reward], ["prompt"])  # no `answer` column in this data set


# ================================================================================================ failures
CALLS = {"n": 0}


def exploding_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    CALLS["n"] += 1
    if CALLS["n"] >= 2:
        raise ZeroDivisionError("boom")
    return [0.0] * len(completions)


def test_a_raising_reward_function_fails_only_its_run(tmp_path: Any) -> None:
    CALLS["n"] = 0
    train = tiny_grpo_dataset(4, seed=0)
    group = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(**LORA),
            reward_funcs=List([[length_reward], [length_reward, exploding_reward]]),
            training_args=RFGRPOConfig(per_device_train_batch_size=4, **GRPO_COMMON),
        ),
        "GRPO",
    )
    exp = Experiment("reward-fails", experiment_path=tmp_path)
    exp.quiet = True
    exp.run_fit(group, tiny_create_model, train, num_chunks=2, seed=SEED)
    info = exp.get_runs_info().set_index("run_id")
    run1 = exp.session.executor.runs[1]
    got = adapter_state(run1.worker.trainer.model, adapter_name=run1.adapter)
    results = exp.get_results()
    exp.end()
    assert list(info.status) == ["COMPLETED", "FAILED"]
    error = info.loc[2, "error"]
    assert "exploding_reward" in error and "ZeroDivisionError" in error and "boom" in error, error
    assert info.loc[2, "completed_steps"] < info.loc[2, "total_steps"]
    assert info.loc[1, "completed_steps"] == 4
    ref = plain_trl(group.expand(SEED)[0], tiny_create_model, train, None, tmp_path / "plain-1")
    assert max_abs_diff(got, ref["weights"]) <= TOL, "the surviving run is still exact"
    assert_same_series(results, 1, ref["log"], ("loss", "reward"))


def test_reward_wrapper_keeps_name_and_async() -> None:
    import asyncio

    from trl.trainer.utils import get_callable_name, is_async_callable

    from rapidfire_nb.training.kinds.rewards import RewardFunctionError, wrap_reward_funcs

    async def async_reward(completions: Any, **kwargs: Any) -> list[float]:
        raise KeyError("x")

    plain, wrapped_async = wrap_reward_funcs([length_reward, async_reward])
    assert get_callable_name(plain) == "length_reward" and not is_async_callable(plain)
    assert plain(prompts=["p"], completions=["abc"]) == [3.0]
    assert get_callable_name(wrapped_async) == "async_reward" and is_async_callable(wrapped_async)
    with pytest.raises(RewardFunctionError, match="reward function 'async_reward' raised KeyError"):
        asyncio.run(wrapped_async(completions=["a"]))
    assert math.isclose(plain(completions=["ab"])[0], 2.0)
