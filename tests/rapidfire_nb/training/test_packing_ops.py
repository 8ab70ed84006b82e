"""Packed steps under IC Ops, early stopping, failures and a kill -9 (issue 38 item 3), on the tiny model, CPU fp32.

Each case runs one script twice, with ``packing=True`` and with ``packing=False`` (time-sliced, itself equal to
plain TRL: ``test_packing.py``), and asserts every run's final adapter equal (0.0), every recorded training loss
equal, and the same statuses. The ops are sent at fixed points of the scheduler's order (when it asks for a
segment, or right after the executor learned a status), so both sides apply them at the same chunk boundaries.

The runs differ only in what a pack allows (learning rate, schedule, dropout, rank, weight decay): 16 rows, batch
4, one epoch in 4 chunks of one step (boundaries 1-4), an evaluation at every boundary. Packed, run 1's turn trains
every member one step in one fused pass; the others are "ahead" until the scheduler asks for their chunk.

The ops script (module fixtures ``plain`` and ``packed``); most ops at run 1's second turn, while runs 2-7 are
trained ahead to step 2 in its packed segment:

=====  ======================================  ===============================================================
run    config                                  what happens to it
=====  ======================================  ===============================================================
1, 3   two members                             never touched
2      member                                  stopped while ahead, resumed at once: back at step 1, trains
                                               its chunk alone, re-joins the pack at step 2
4      member                                  deleted while ahead: nothing of its step 2 recorded
5      member                                  stopped while ahead for good: its final weights are step 1's
6      member, ``compute_metrics`` raises      fails at its second chunk-end evaluation (inside the pack)
       from its second call
7      member whose loss is NaN from step 2    fails "diverged at step 2: loss is NaN" (inside the pack)
8      warm clone of run 1                     from run 1's step 2; trains in the pack from there
9      cold clone of run 3                     from step 0, alone, then joins the pack at step 2
10     warm clone of run 5 (STOPPED)           from run 5's step 1
9      (at run 1's last turn, whose packed     stopped after it finished ahead: STOPPED at step 3, step 3's
       segment trains runs 2-10 to their end)  weights
11     warm clone of run 8, ``max_steps=5``    from run 8's step 3 (its last step was trained ahead)
=====  ======================================  ===============================================================

Beside it: successive halving on a pack of 4 (the same runs pruned at the same rungs, the survivors packed on), and
a kill -9 of a packed experiment while a held boundary is recorded, continued in a new process (``_packing_child.py``).

The bugs these tests found (fixed in ``training/pack_runs.py``): a trainer whose ``train()`` has not started yet
reads step 0, so a warm clone or a run rebuilt at a checkpoint was packed with runs at step 0 and rebuilt from
scratch; and a member stopped while ahead was rebuilt with fresh adapter weights and no boundary, so its final
weights were wrong and a warm clone of it failed.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.testing import tiny_create_model
from rapidfire_nb.training.executor import TorchExecutor
from rapidfire_nb.training.pack_runs import PackRuns
from tests.helpers import adapter_from_folder, max_abs_diff, qa_dataset, qa_to_chat

SEED = 5
NUM_CHUNKS = 4  # 16 rows / batch 4 = 4 steps: one per chunk
NAN_LR = 2.5e-3  # the run whose training loss is NaN from step 2 on
QV = ["q_proj", "v_proj"]
CHILD = Path(__file__).with_name("_packing_child.py")
REPO = Path(__file__).resolve().parents[3]
Op = tuple[tuple[Any, ...], Callable[[Experiment], Any]]  # (when, op): see _train


def _config(lr: float, r: int = 4, dropout: float = 0.1, metrics: Any = None, **args: Any) -> Any:
    return RFModelConfig(
        model_name="tiny",
        peft_config=RFLoraConfig(r=r, lora_alpha=2 * r, lora_dropout=dropout, target_modules=QV),
        training_args=RFSFTConfig(
            learning_rate=lr,
            per_device_train_batch_size=4,
            num_train_epochs=1,
            max_length=48,
            logging_steps=1,
            **args,
        ),
        formatting_func=qa_to_chat,
        compute_metrics=metrics,
    )


def members(n: int = 4) -> list[Any]:
    """The first ``n`` configs of one pack (also the kill test's child group)."""
    return [
        _config(1e-3),
        _config(3e-3, r=8, lr_scheduler_type="cosine", warmup_steps=1),
        _config(2e-3, dropout=0.2, weight_decay=0.1),
        _config(5e-4, r=2, dropout=0.0, lr_scheduler_type="linear"),
        _config(1.5e-3, r=8),
    ][:n]


def _script_group() -> Any:
    calls: list[int] = []

    def broken_metrics(pred: Any) -> dict[str, float]:
        calls.append(1)
        if len(calls) > 1:
            raise ValueError("compute_metrics broke")
        return {"calls": float(len(calls))}

    configs = [*members(5), _config(1e-3, metrics=broken_metrics), _config(NAN_LR)]
    return RFGridSearch(configs=List(configs), trainer_type="SFT")


def _script() -> list[Op]:
    def at_run_1_step_2(exp: Experiment) -> None:
        exp.clone_modify(1, {"learning_rate": 4e-3}, warm_start=True)  # run 8
        exp.clone_modify(3, {"learning_rate": 3e-3}, warm_start=False)  # run 9
        exp.delete(4)
        exp.stop([2, 5])

    def at_run_1_step_4(exp: Experiment) -> None:  # the pack's last chunk: its members finish ahead
        exp.stop(9)
        exp.clone_modify(8, {"max_steps": 5}, warm_start=True)  # run 11: from run 8's step 3

    return [
        (("segment", 1, 2), at_run_1_step_2),
        (("status", 2, "STOPPED"), lambda exp: exp.resume(2)),
        (("status", 5, "STOPPED"), lambda exp: exp.clone_modify(5, {"learning_rate": 1e-3}, warm_start=True)),
        (("segment", 1, 4), at_run_1_step_4),
    ]


@dataclass
class Trained:
    """What one experiment left: final adapters (each run's ``final`` folder), the runs table (deleted runs
    included), every recorded training loss ``(run, step, loss)``, the segments the scheduler asked for, and,
    packed, each packed segment as ``(run, stop step, its members)``."""

    adapters: dict[int, Any]
    info: Any
    losses: list[tuple[int, int, float]]
    order: list[tuple[int, int]]
    packs: list[tuple[int, int, tuple[int, ...]]] = field(default_factory=list)
    ops: Any = None


def _nan_loss(original: Callable[..., Any]) -> Callable[..., Any]:
    """``SFTTrainer.compute_loss`` whose training loss is NaN from step 2 on for the run with ``NAN_LR``."""

    def compute_loss(self: Any, model: Any, inputs: Any, return_outputs: bool = False, **kw: Any) -> Any:
        out = original(self, model, inputs, return_outputs=return_outputs, **kw)
        if model.training and self.args.learning_rate == NAN_LR and self.state.global_step >= 1:
            return (out[0] * math.nan, out[1]) if return_outputs else out * math.nan
        return out

    return compute_loss


def _train(root: Path, name: str, packing: bool, ops: list[Op], group: Any, **fit: Any) -> Trained:
    """Run ``group`` with ``packing``, sending each op of ``ops`` once, when it is due: ``("segment", run, stop)``
    when the scheduler asks for that segment (before it starts), ``("status", run, status)`` right after the
    executor learned that status. Clones are built without the off-thread tokenizing (``prepare_run`` -> None):
    a clone is built at the first boundary after its op, the same on both sides."""
    from trl import SFTTrainer

    exp = Experiment(name, experiment_path=root)
    sent: set[int] = set()
    order: list[tuple[int, int]] = []
    packs: list[tuple[int, int, tuple[int, ...]]] = []
    run_segment, on_status, pack_of = TorchExecutor.run_segment, TorchExecutor.on_status, PackRuns._members

    def due(when: tuple[Any, ...]) -> None:
        for i, (at, op) in enumerate(ops):
            if at == when and i not in sent:
                sent.add(i)
                op(exp)

    def segment(self: TorchExecutor, run_id: int, stop_step: int) -> Any:
        order.append((run_id, stop_step))
        due(("segment", run_id, stop_step))
        return run_segment(self, run_id, stop_step)

    def status(self: TorchExecutor, run_id: int, value: str) -> None:
        on_status(self, run_id, value)
        due(("status", run_id, value))

    def packed(self: PackRuns, run_id: int, stop_step: int) -> Any:
        out = pack_of(self, run_id, stop_step)
        if out:
            packs.append((run_id, stop_step, tuple(m.run_id for m in out)))
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TorchExecutor, "run_segment", segment)
        mp.setattr(TorchExecutor, "on_status", status)
        mp.setattr(TorchExecutor, "prepare_run", lambda self, *a, **k: None)
        mp.setattr(PackRuns, "_members", packed)
        mp.setattr(SFTTrainer, "compute_loss", _nan_loss(SFTTrainer.compute_loss))
        exp.run_fit(
            group,
            tiny_create_model,
            qa_dataset(16, seed=0),
            qa_dataset(4, seed=1),
            num_chunks=NUM_CHUNKS,
            seed=SEED,
            packing=packing,
            **fit,
        )
        exp.wait()
    info = exp.get_runs_info(include_deleted=True).set_index("run_id")
    results, ops_table = exp.get_results(include_deleted=True), exp.ops()
    exp.end()
    rows = results.dropna(subset=["loss"])
    losses = sorted((int(r.run_id), int(r.step), float(r.loss)) for r in rows.itertuples())
    return Trained(_finals(Path(root) / name), info, losses, order, packs, ops_table)


def _finals(exp_dir: Path) -> dict[int, Any]:
    """Each run's saved final adapter (``runs/<id>/final``), by run id."""
    return {
        int(d.name): adapter_from_folder(d / "final")
        for d in (exp_dir / "runs").iterdir()
        if (d / "final" / "adapter_model.safetensors").exists()
    }


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    return _train(tmp_path_factory.mktemp("plain"), "plain", False, _script(), _script_group())


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    return _train(tmp_path_factory.mktemp("packed"), "packed", True, _script(), _script_group())


def _status(t: Trained) -> dict[int, tuple[str, int]]:
    return {int(rid): (row.status, int(row.completed_steps)) for rid, row in t.info.iterrows()}


def test_the_packed_script_ends_as_the_time_sliced_one(plain: Trained, packed: Trained) -> None:
    assert packed.order == plain.order  # the scheduler saw the same chunks in the same order
    assert (
        _status(packed)
        == _status(plain)
        == {
            **{rid: ("COMPLETED", 4) for rid in (1, 2, 3, 8, 10)},
            4: ("DELETED", 1),
            5: ("STOPPED", 1),
            6: ("FAILED", 2),
            7: ("FAILED", 1),
            9: ("STOPPED", 3),
            11: ("COMPLETED", 5),
        }
    )
    assert sorted(packed.adapters) == sorted(plain.adapters) == [1, 2, 3, 5, 8, 9, 10, 11]
    for rid, weights in plain.adapters.items():
        assert max_abs_diff(packed.adapters[rid], weights) == 0.0, rid
    # every step's loss, once: nothing trained ahead counted twice or lost
    assert packed.losses == plain.losses


def test_a_warm_clone_of_a_packed_member_trains_in_the_pack_from_its_start(packed: Trained) -> None:
    """Every packed segment, by (turn, stop step): run 8 starts at run 1's step 2 (a trainer not started yet,
    reading step 0) and joins runs 1-3 there; the cold clone 9 trains its first step alone, then packs with the
    runs at step 1 (2 and 10) and with the pack at step 2."""
    assert packed.packs == [
        (1, 1, (1, 2, 3, 4, 5, 6, 7)),
        (1, 2, (1, 2, 3, 4, 5, 6, 7)),
        (2, 2, (2, 9, 10)),
        (1, 3, (1, 2, 3, 8, 9, 10)),
        (1, 4, (1, 2, 3, 8, 9, 10)),
    ]
    assert (9, 1) in packed.order


def test_members_stopped_or_deleted_while_ahead_go_back_to_their_boundary(
    plain: Trained, packed: Trained
) -> None:
    """Runs 2, 4 and 5 were trained to step 2 ahead of their turn; the stop / delete made that chunk not count.
    Run 2, resumed at once, is back at step 1, trains with runs 9 and 10 (10: a warm clone of run 5 at step 1; 2
    and 10 rebuilt at a checkpoint and not started yet) to step 2, and re-joins the pack there (previous test);
    run 5's final weights are its step-1 weights (as time-sliced), and run 10 starts from them. Run 9, stopped
    after its last step was trained ahead (its train() over), is STOPPED at step 3 with step 3's weights; run 11
    starts from run 8's step 3 although run 8's last step was trained ahead."""
    ahead = [loss for loss in packed.losses if loss[0] in (4, 5)]
    assert ahead == [loss for loss in plain.losses if loss[0] in (4, 5)] and {s for _r, s, _l in ahead} == {1}
    assert [row.kind for row in packed.ops.itertuples() if row.run_id == 2] == ["stop", "resume"]
    for rid in (2, 5, 9, 10, 11):
        assert max_abs_diff(packed.adapters[rid], plain.adapters[rid]) == 0.0, rid


def test_a_failing_member_fails_alone_and_the_pack_goes_on(plain: Trained, packed: Trained) -> None:
    """Run 6's compute_metrics raises at its step-2 evaluation, run 7's loss is NaN at step 2: both inside the
    packed segment of run 1's second turn, ahead of their own; each fails with its own error when its turn comes,
    as time-sliced, and the others go on packed and exact (first test)."""
    errors = packed.info.error.to_dict()
    assert errors[6] == plain.info.error[6] and "compute_metrics broke" in errors[6]
    assert errors[7] == plain.info.error[7] == "diverged at step 2: loss is NaN"
    assert [loss[1] for loss in packed.losses if loss[0] == 7] == [
        1
    ]  # its NaN step never recorded as a number


def test_successive_halving_prunes_the_same_members_and_the_rest_keep_packing(tmp_path: Path) -> None:
    """Early stopping on a pack of 4: the same runs are pruned at the same rungs as time-sliced, with the same
    reasons; the survivors go on packed, and every run's final weights (a pruned run's: its rung's) are equal."""
    from rapidfire_nb.automl import SuccessiveHalving

    def halving() -> Any:
        return SuccessiveHalving(metric="eval_loss", mode="min", reduction_factor=2, grace_chunks=1)

    group = RFGridSearch(configs=List(members(4)), trainer_type="SFT")
    got = _train(tmp_path, "halving-packed", True, [], group, early_stopping=halving())
    want = _train(tmp_path, "halving-sliced", False, [], group, early_stopping=halving())
    assert (
        _status(got)
        == _status(want)
        == {1: ("STOPPED", 2), 2: ("STOPPED", 1), 3: ("COMPLETED", 4), 4: ("STOPPED", 1)}
    )
    assert got.packs == [(1, 1, (1, 2, 3, 4)), (1, 2, (1, 3))]  # runs 1 and 3 went on packed
    assert got.order == want.order
    assert got.info.stop_reason.to_dict() == want.info.stop_reason.to_dict()
    for rid, weights in want.adapters.items():
        assert max_abs_diff(got.adapters[rid], weights) == 0.0, rid
    assert got.losses == want.losses


def _spawn(root: Path, name: str, *freeze: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = root / f"{name}-{len(list(root.glob('*.log')))}.log"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    with open(log, "wb") as f:  # the child keeps its own descriptor
        child = subprocess.Popen(
            [sys.executable, str(CHILD), str(root), name, *freeze],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
        )
    return child, log


def test_kill_9_of_a_packed_experiment_then_continue_ends_exact(plain: Trained, tmp_path: Path) -> None:
    """The kernel dies (SIGKILL) while it records run 3's step-2 boundary, trained ahead in run 1's packed
    segment: runs 1 and 2 have their step-2 checkpoint on disk, run 3 its step-1 one. Continued, run 3 trains
    its chunk alone (the others are one step further), then the three pack again; each ends equal to the
    uninterrupted time-sliced run (0.0)."""
    from rapidfire_nb.run_folder import latest_checkpoint

    marker = tmp_path / "frozen"
    child, log = _spawn(tmp_path, "killed", "3", "2", str(marker))
    deadline = time.monotonic() + 180
    while not marker.exists():
        assert child.poll() is None, log.read_text()[-4000:]
        assert time.monotonic() < deadline, "the child never reached run 3's step-2 boundary"
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL
    runs = tmp_path / "killed" / "runs"
    on_disk = {rid: latest_checkpoint(runs / str(rid)) for rid in (1, 2, 3)}
    assert {rid: c.name if c else None for rid, c in on_disk.items()} == {
        1: "checkpoint-2",
        2: "checkpoint-2",
        3: "checkpoint-1",
    }
    child, log = _spawn(tmp_path, "killed")
    assert child.wait(timeout=240) == 0, log.read_text()[-4000:]
    out = log.read_text()
    assert "continuing from the last chunk checkpoints" in out, out[-3000:]
    packs = [line.split()[1:] for line in out.splitlines() if line.startswith("PACK ")]
    assert packs == [["1", "3", "1,2,3"], ["1", "4", "1,2,3"]], out[-3000:]  # run 3's chunk 1-2 alone
    finals = _finals(tmp_path / "killed")
    for rid in (1, 2, 3):
        assert max_abs_diff(finals[rid], plain.adapters[rid]) == 0.0, rid


def test_a_clone_that_adds_lora_layers_joins_the_pack_exactly(tmp_path: Path) -> None:
    """A cold clone of run 1 with ``target_modules`` q, k, v, o (runs 1-3 target q, v) adds LoRA layers to the shared
    base after the pack's driver was made; it joins the pack at step 2, and the new layers route each run's rows
    through its own adapter (before the fix they applied the active adapter to every row: 0.0004-0.004 off)."""
    qkvo = ["q_proj", "k_proj", "v_proj", "o_proj"]
    ops = [(("segment", 1, 2), lambda e: e.clone_modify(1, {"lora.target_modules": qkvo}, warm_start=False))]
    packed = _train(tmp_path, "packed", True, ops, RFGridSearch(configs=List(members(3)), trainer_type="SFT"))
    sliced = _train(
        tmp_path, "sliced", False, ops, RFGridSearch(configs=List(members(3)), trainer_type="SFT")
    )
    assert (1, 3, (1, 2, 3, 4)) in packed.packs  # the clone trains in the pack
    for rid in sorted(sliced.adapters):
        assert max_abs_diff(packed.adapters[rid], sliced.adapters[rid]) == 0.0, rid
