"""GRPO continued from a chunk-boundary checkpoint is exact: crash resume and warm clones, past the first epoch.

One GRPO LoRA run (tiny model, CPU fp32): 6 prompts, ``steps_per_generation=2`` (2 prompts x 4 completions per
generation round, 2 optimizer steps per round), 2 epochs x 2 chunks -> boundaries at steps 4, 6 | 10, 12. The
points continued from cover both ways transformers resumes past the first epoch: on an epoch boundary (step 6:
nothing to skip) and inside an epoch (step 10: it skips the epoch's first batches).

* **Crash**: a first executor trains to step 6 and is dropped (its boundary checkpoint is on disk); a fresh one
  resumes the run from ``checkpoint-6`` (as ``Experiment`` does after a restart), trains to 10 and is dropped;
  a third resumes from ``checkpoint-10`` and finishes. Every per-step metric and the final adapter must equal
  the uninterrupted run's.
* **Warm clone with no changes** from the run at step 6 and at step 10: its steps must equal the parent's.

GRPO's ``RepeatSampler`` draws each epoch's prompt order from its own generator, advanced once per epoch; a
resumed trainer used to make a fresh one, i.e. shuffle epoch 2 like epoch 1: other prompts from the first step
after the checkpoint (before the fix: every continuation here differed at its first step).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb.automl import RFGridSearch, RFGRPOConfig, RFLoraConfig, RFModelConfig
from rapidfire_nb.testing import length_reward, tiny_create_model, tiny_grpo_dataset
from tests.helpers import TOL, adapter_state, max_abs_diff, worker_threads

SEED = 42  # its RepeatSampler orders differ in the first round after every point continued from
LORA = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.1, "target_modules": ["q_proj", "v_proj"]}
ARGS = {
    "num_generations": 4,
    "max_completion_length": 6,
    "learning_rate": 1e-2,
    "beta": 0.04,
    "logging_steps": 1,
    "num_train_epochs": 2,
    "per_device_train_batch_size": 4,
    "steps_per_generation": 2,
    "temperature": 0.7,
}
BOUNDARIES = (4, 6, 10, 12)
# logged once per train() call or wall-clock: not part of the comparison (train_loss averages the steps of
# one train() call, so a resumed call averages fewer steps, as in transformers)
NOT_COMPARED = (
    "train_loss",
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
    "total_flos",
    "step_time",
)


def _leaf() -> Any:
    group = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(**LORA),
            reward_funcs=[length_reward],
            training_args=RFGRPOConfig(**ARGS),
        ),
        "GRPO",
    )
    (leaf,) = group.expand(SEED)
    return leaf


class Session:
    """One process's executor (what ``Experiment`` drives), recording every logged metric per run and step."""

    def __init__(self, exp_dir: Path) -> None:
        from rapidfire_nb.spec.bundles import GroupSettings, TrainingCallbacks
        from rapidfire_nb.training.executor import TorchExecutor

        self.logs: dict[int, dict[int, dict[str, float]]] = {}
        self.ex = TorchExecutor(
            GroupSettings("GRPO", tiny_create_model, num_chunks=2, seed=SEED),
            tiny_grpo_dataset(6, seed=0),
            None,
            exp_dir=exp_dir,
            callbacks=TrainingCallbacks(metric_sink=self._sink),
        )
        self.segments: dict[int, int] = {}
        self.plans: dict[int, Any] = {}

    def _sink(self, run_id: int, step: int, samples_seen: int, logs: dict[str, float]) -> None:
        self.logs.setdefault(run_id, {}).setdefault(step, {}).update(logs)

    def add(self, run_id: int, leaf: Any = None, **kwargs: Any) -> Any:
        start = self.ex.add_run(run_id, leaf if leaf is not None else _leaf(), **kwargs)
        self.segments[run_id] = start.segments_done
        self.plans[run_id] = start.plan
        return start

    def train(self, run_id: int, until_step: int | None = None) -> None:
        plan = self.plans[run_id]
        while self.segments[run_id] < plan.num_segments:
            stop = plan.boundaries[self.segments[run_id]]
            if until_step is not None and stop > until_step:
                break
            result = self.ex.run_segment(run_id, stop).result(timeout=300)
            assert result.error is None, result.error
            self.segments[run_id] += 1

    def adapter(self, run_id: int) -> dict[str, Any]:
        run = self.ex.runs[run_id]
        return adapter_state(run.worker.trainer.model, adapter_name=run.adapter)

    def close(self) -> None:
        self.ex.flush()
        self.ex.close()


def _renamed(weights: dict[str, Any], src: int, dst: int) -> dict[str, Any]:
    return {k.replace(f"run_{src}", f"run_{dst}"): v for k, v in weights.items()}


def _assert_same_steps(got: dict[int, dict[str, float]], ref: dict[int, dict[str, float]], what: str) -> None:
    assert sorted(got) == sorted(ref), (
        f"{what}: logged at steps {sorted(got)}, uninterrupted at {sorted(ref)}"
    )
    worst, first = 0.0, None
    for step in sorted(ref):
        names = {n for n in ref[step] if n not in NOT_COMPARED}
        assert names == {n for n in got[step] if n not in NOT_COMPARED}, (
            f"{what}: other metrics at step {step}"
        )
        for n in sorted(names):
            a, b = float(got[step][n]), float(ref[step][n])
            if math.isnan(a) and math.isnan(b):
                continue
            d = abs(a - b)
            if not d <= TOL and first is None:
                first = f"{n} at step {step}: {a} vs {b}"
            worst = max(worst, d) if not math.isnan(d) else math.inf
    assert first is None, f"{what}: first difference {first}; max difference {worst}"
    compared = {n for step in ref for n in ref[step]}  # rewards are logged on the steps that generated
    assert {"loss", "reward", "kl", "rewards/length_reward/mean", "completions/mean_length"} <= compared


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run 1 trained in one go; run 2 warm-cloned from it at step 6, run 3 at step 10 (no changes)."""
    s = Session(tmp_path_factory.mktemp("grpo-ref"))
    try:
        s.add(1)
        assert s.plans[1].boundaries == BOUNDARIES
        s.train(1, until_step=6)
        clone_6 = s.add(2, warm_from=1)
        s.train(1, until_step=10)
        clone_10 = s.add(3, warm_from=1)
        for rid in (1, 2, 3):
            s.train(rid)
        return {
            "logs": s.logs,
            "adapters": {rid: s.adapter(rid) for rid in (1, 2, 3)},
            "clone_starts": (clone_6.step, clone_10.step),
        }
    finally:
        s.close()


def test_crash_resume_within_and_at_epoch_boundaries_is_exact(
    uninterrupted: dict[str, Any], tmp_path: Path
) -> None:
    from rapidfire_nb.training.checkpoint import latest_checkpoint

    before = worker_threads()  # threads other tests of this process left
    logs: dict[int, dict[str, float]] = {}
    first = Session(tmp_path)
    try:
        first.add(1)
        first.train(1, until_step=6)
    finally:
        first.close()  # the process "dies": only the checkpoint on disk is left
    logs.update(first.logs[1])
    for resume_at, until in ((6, 10), (10, None)):  # on the boundary of epochs 1 and 2; then inside epoch 2
        s = Session(tmp_path)
        try:
            ckpt = latest_checkpoint(s.ex.run_dir(1))
            assert ckpt is not None and ckpt.name == f"checkpoint-{resume_at}"
            start = s.add(1, resume_from=ckpt)
            assert start.step == resume_at
            s.train(1, until_step=until)
            logs.update(s.logs[1])
            final = s.adapter(1) if until is None else None
        finally:
            s.close()
    assert worker_threads() - before == set(), "every session's device thread ended"
    _assert_same_steps(logs, uninterrupted["logs"][1], "crash-resumed run")
    assert final is not None
    assert max_abs_diff(final, uninterrupted["adapters"][1]) <= TOL, "final adapter differs"


@pytest.mark.parametrize("clone, at", [(2, 6), (3, 10)])
def test_warm_clone_without_changes_reproduces_its_parent(
    uninterrupted: dict[str, Any], clone: int, at: int
) -> None:
    assert uninterrupted["clone_starts"][clone - 2] == at
    parent = {step: v for step, v in uninterrupted["logs"][1].items() if step > at}
    _assert_same_steps(uninterrupted["logs"][clone], parent, f"warm clone from step {at}")
    assert (
        max_abs_diff(_renamed(uninterrupted["adapters"][clone], clone, 1), uninterrupted["adapters"][1])
        <= TOL
    )


def test_warm_clone_restarted_before_its_first_chunk_starts_from_its_warm_start(tmp_path: Path) -> None:
    """A warm clone (own learning rate) whose process died before its first chunk ended: after the restart it
    starts again from the warm-start folder it was created from, with its own hyperparameters, and trains exactly
    as a clone that was never interrupted."""
    from rapidfire_nb.experiment.restore import warm_start_checkpoint
    from rapidfire_nb.training.checkpoint import latest_checkpoint

    clone_leaf = _leaf().with_changes({"learning_rate": 3e-3})
    ref = Session(tmp_path / "ref")
    try:
        ref.add(1)
        ref.train(1, until_step=6)
        ref.add(2, clone_leaf, warm_from=1)
        ref.train(2)
        want_logs, want_adapter = ref.logs[2], ref.adapter(2)
    finally:
        ref.close()

    first = Session(tmp_path / "crash")
    try:
        first.add(1)
        first.train(1, until_step=6)
        first.add(
            2, clone_leaf, warm_from=1
        )  # writes runs/2/warm-start-from-run-1-step-6; then the process dies
    finally:
        first.close()
    second = Session(tmp_path / "crash")
    try:
        run_dir = second.ex.run_dir(2)
        assert latest_checkpoint(run_dir) is None  # no chunk of its own
        warm = warm_start_checkpoint(run_dir)
        assert warm is not None and warm.name == "warm-start-from-run-1-step-6"
        start = second.add(2, clone_leaf, resume_from=warm)
        assert start.step == 6
        second.train(2)
        _assert_same_steps(second.logs[2], want_logs, "warm clone restarted from its warm start")
        assert max_abs_diff(second.adapter(2), want_adapter) <= TOL
        lrs = [second.logs[2][s]["learning_rate"] for s in sorted(second.logs[2])]
        assert lrs == [
            want_logs[s]["learning_rate"] for s in sorted(want_logs)
        ]  # its own schedule, not the parent's
    finally:
        second.close()
