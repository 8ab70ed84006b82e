"""Continuing a finished run (issue 34 item 4): a warm clone of a COMPLETED run starts from its final state.

One experiment on the tiny model, 16 rows, batch 2 (8 steps an epoch), 2 chunks (boundaries 4 and 8), so a run
with ``max_steps=3`` ends inside chunk 1 and never reaches a chunk boundary (before the fix its warm clone failed
with "no completed chunk"):

=====  =======================================  ===============================================================
run    config                                   what happens to it
=====  =======================================  ===============================================================
1      constant LR, ``max_steps=3``             COMPLETED at step 3; never touched again
2      linear decay, ``max_steps=3``            COMPLETED at step 3; never touched again
3      warm clone of 1, ``max_steps=8``         continues run 1 at step 4: equals a plain TRL run of 8 steps
4      ``%rapidfire continue 2 max_steps=8``    continues run 2 with the 8-step schedule: differs from plain TRL
5      REST ``clone`` of 1, warm, ``max_steps``  as run 3 (after a REST continuation with too few steps is refused)
=====  =======================================  ===============================================================

A warm clone asking for no more steps than its parent made is refused before it gets a run id.
``lora_dropout > 0``: the continuation must carry the RNG on too.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.helpers import (
    TOL,
    adapter_from_folder,
    max_abs_diff,
    qa_dataset,
    qa_to_chat,
    result_series,
    train_plain_trl,
)

SEED = 3
N_TRAIN = 16
BATCH = 2
PARENT_STEPS = 3
MORE = 8
WAIT_S = 150


def _group() -> Any:
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    def config(schedule: str) -> Any:
        return RFModelConfig(
            model_name="tiny",
            formatting_func=qa_to_chat,
            peft_config=RFLoraConfig(
                r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"]
            ),
            training_args=RFSFTConfig(
                learning_rate=2e-3,
                per_device_train_batch_size=BATCH,
                max_steps=PARENT_STEPS,
                max_length=32,
                logging_steps=1,
                lr_scheduler_type=schedule,
            ),
        )

    return RFGridSearch(configs=List([config("constant"), config("linear")]), trainer_type="SFT")


def _catch(fn: Any) -> BaseException | None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the test asserts on the type
        return exc
    return None


@pytest.fixture(scope="module")
def cont(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from IPython.core.interactiveshell import InteractiveShell

    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model

    root = tmp_path_factory.mktemp("continue")
    train = qa_dataset(N_TRAIN, seed=0)
    group = _group()
    exp = Experiment("continue", experiment_path=root)
    exp.quiet = True
    out: dict[str, Any] = {"exp": exp}
    exp.run_fit(group, tiny_create_model, train, num_chunks=2, seed=SEED)
    info = exp.get_runs_info()
    out["parents_before"] = {
        rid: adapter_from_folder(info[info.run_id == rid].iloc[0].checkpoint_dir) for rid in (1, 2)
    }
    out["err_same"] = _catch(lambda: exp.clone_modify(1, {"max_steps": PARENT_STEPS}, warm_start=True))
    out["err_none"] = _catch(lambda: exp.clone_modify(1, {}, warm_start=True))
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "rapidfire_nb")
    out["err_magic"] = _catch(lambda: shell.run_line_magic("rapidfire", "continue 2"))
    out["ids_after_refusals"] = sorted(s.run_id for s in exp.run_snapshots())
    out["c_const"] = exp.clone_modify(1, {"max_steps": MORE}, warm_start=True)
    shell.run_line_magic("rapidfire", f"continue 2 max_steps={MORE}")  # the magic's continue: run 4
    out["c_linear"] = max(s.run_id for s in exp.run_snapshots())
    out["rest"] = _post_continue(exp, "rest-short", PARENT_STEPS), _post_continue(exp, "rest-continue", MORE)
    out["wait"] = exp.wait(timeout=WAIT_S)
    out["loop_error"] = exp.session.scheduler.loop_error
    out["info"] = exp.get_runs_info()
    out["snaps"] = {s.run_id: s for s in exp.run_snapshots()}
    out["results"] = exp.get_results()
    out["ops"] = exp.ops()
    exp.end()
    leaves = list(group.expand(SEED))
    for name, leaf in (("ref_const", leaves[0]), ("ref_linear", leaves[1])):
        out[name] = train_plain_trl(
            leaf.with_changes({"max_steps": MORE}), tiny_create_model, train, None, SEED, root / name
        )
    return out


def _post_continue(exp: Any, op_id: str, max_steps: int) -> dict[str, Any]:
    """POST a warm clone of run 1 to the REST manager (the server's ``POST .../ops``); its op row once taken."""
    from rapidfire_nb.server.manager import ExperimentsManager

    body = {
        "op_id": op_id,
        "kind": "clone",
        "run_id": 1,
        "changes": {"max_steps": max_steps},
        "warm_start": True,
    }
    answer = ExperimentsManager(exp.root).post_op(exp.path.name, body)
    assert answer["state"] == "queued" and not answer["duplicate"], answer
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        op = exp.store.get_op(op_id)
        if op is not None and op["state"] != "queued":
            return dict(op)
        time.sleep(0.05)
    raise AssertionError(f"the kernel did not take op {op_id}")


def _row(info: Any, rid: int) -> Any:
    rows = info[info.run_id == rid]
    assert len(rows) == 1, f"run {rid}: {len(rows)} rows in {list(info.run_id)}"
    return rows.iloc[0]


def _final(cont: dict[str, Any], rid: int) -> dict[str, Any]:
    return adapter_from_folder(_row(cont["info"], rid).checkpoint_dir)


def test_continued_constant_lr_run_equals_plain_trl_of_the_larger_budget(cont: dict[str, Any]) -> None:
    cid = cont["c_const"]
    assert cid == 3 and cont["wait"] is True and cont["loop_error"] is None
    row = _row(cont["info"], cid)
    assert (row.status, row.completed_steps) == ("COMPLETED", MORE)
    snap = cont["snaps"][cid]
    assert (snap.parent_id, snap.warm_start, snap.step, snap.total_steps) == (1, True, MORE, MORE)
    ref = cont["ref_const"]
    diff = max_abs_diff(_final(cont, cid), ref.final)
    assert diff == 0.0, f"continued run differs from plain TRL max_steps={MORE}: {diff}"
    got = result_series(cont["results"], cid, "loss")
    want = [(s, v) for s, v in ref.series("loss") if s > PARENT_STEPS]
    assert [s for s, _ in got] == list(range(PARENT_STEPS + 1, MORE + 1)), (
        "it must continue at the parent's step"
    )
    assert [s for s, _ in got] == [s for s, _ in want]
    assert max(abs(a - b) for (_, a), (_, b) in zip(got, want)) <= TOL, f"{got} != {want}"


def test_continued_linear_run_follows_the_new_totals_schedule_but_differs(cont: dict[str, Any]) -> None:
    cid = cont["c_linear"]
    assert cid == 4
    row = _row(cont["info"], cid)
    assert (row.status, row.completed_steps, cont["snaps"][cid].parent_id) == ("COMPLETED", MORE, 2)
    ref = cont["ref_linear"]
    want_lr = {s: v for s, v in ref.series("learning_rate") if s > PARENT_STEPS}
    got_lr = dict(result_series(cont["results"], cid, "learning_rate"))
    assert sorted(got_lr) == sorted(want_lr) == list(range(PARENT_STEPS + 1, MORE + 1))
    for s, v in got_lr.items():  # the schedule TRL builds for max_steps=8, from the parent's step on
        assert v == pytest.approx(want_lr[s], rel=1e-9, abs=1e-15), f"step {s}: LR {v} != {want_lr[s]}"
    # ... but the parent's 3 steps decayed towards 0 at step 3, not at step 8: the weights differ
    parent_lr = dict(result_series(cont["results"], 2, "learning_rate"))
    assert parent_lr[PARENT_STEPS] < dict(ref.series("learning_rate"))[PARENT_STEPS]
    assert max_abs_diff(_final(cont, cid), ref.final) > 1e-4


def test_parents_are_untouched(cont: dict[str, Any]) -> None:
    for rid in (1, 2):
        row = _row(cont["info"], rid)
        assert (row.status, row.completed_steps) == ("COMPLETED", PARENT_STEPS)
        assert max_abs_diff(_final(cont, rid), cont["parents_before"][rid]) == 0.0
        assert [s for s, _ in result_series(cont["results"], rid, "loss")] == list(range(1, PARENT_STEPS + 1))


def test_the_op_says_it_continues_the_parent(cont: dict[str, Any]) -> None:
    ops = cont["ops"]
    row = ops[(ops.kind == "clone") & (ops.state == "applied") & (ops.run_id == 1)].iloc[0]
    assert f"warm from run 1's final state, step {PARENT_STEPS}" in row.message, row.message


def test_a_continuation_without_more_steps_is_refused_before_it_gets_an_id(cont: dict[str, Any]) -> None:
    from rapidfire_nb.errors import OpError

    assert cont["ids_after_refusals"] == [1, 2]
    err = cont["err_magic"]  # %rapidfire continue 2 with no max_steps
    assert type(err).__name__ == "UsageError" and str(err).startswith(
        f"max_steps={PARENT_STEPS} (run 2's, kept)"
    ), err
    for key in ("err_same", "err_none"):
        err = cont[key]
        assert isinstance(err, OpError), (key, err)
        text = str(err)
        assert (
            f"COMPLETED at step {PARENT_STEPS}" in text and f"set max_steps above {PARENT_STEPS}" in text
        ), text
    assert str(cont["err_same"]).startswith(f"max_steps={PARENT_STEPS} does not continue run 1")
    assert str(cont["err_none"]).startswith(
        f"max_steps={PARENT_STEPS} (run 1's, kept) does not continue run 1"
    )


# ================================================================== the budget check alone (no training)
def _parent(
    status: str, step: int, total: int, on_device: bool = False, segments: tuple[int, int] = (0, 4)
) -> Any:
    from types import SimpleNamespace

    from kernel_scheduler import RunStatus

    done, num = segments
    return SimpleNamespace(
        status=RunStatus(status),
        step=step,
        total_steps=total,
        steps_per_epoch=8,
        on_device=on_device,
        segments_done=done,
        num_segments=num,
    )


def _child(max_steps: int) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(training={"max_steps": max_steps})


@pytest.mark.parametrize(
    ("status", "step", "total", "max_steps", "changes", "refused"),
    [
        ("COMPLETED", 3, 3, 4, {"max_steps": 4}, False),  # one more step
        ("COMPLETED", 3, 3, 2, {"max_steps": 2}, True),
        ("STOPPED", 4, 8, 8, {}, False),  # stopped half way, same budget: the plain continuation
        ("STOPPED", 4, 8, 4, {"max_steps": 4}, True),
        (
            "ONGOING",
            6,
            8,
            4,
            {"max_steps": 4},
            False,
        ),  # a training parent: its boundary is checked at the build
        ("COMPLETED", 3, 3, -1, {"max_steps": -1}, False),  # epochs x steps per epoch: checked at the build
    ],
)
def test_budget_check(
    status: str, step: int, total: int, max_steps: int, changes: Any, refused: bool
) -> None:
    from rapidfire_nb.errors import OpError
    from rapidfire_nb.experiment.clones import check_continuation

    err = _catch(lambda: check_continuation(_child(max_steps), 1, changes, _parent(status, step, total)))
    assert (err is not None) == refused, err
    if refused:
        assert isinstance(err, OpError) and f"set max_steps above {step}, e.g. max_steps={2 * step}" in str(
            err
        )


def test_rest_continues_and_refuses_like_the_api(cont: dict[str, Any]) -> None:
    short, longer = cont["rest"]
    assert short["state"] == "rejected" and short["message"].startswith(
        f"max_steps={PARENT_STEPS} does not continue run 1"
    ), short
    assert (
        longer["state"] == "applied"
        and f"run 5 created (warm from run 1's final state, step {PARENT_STEPS}" in (longer["message"])
    ), longer
    row = _row(cont["info"], 5)
    assert (row.status, row.completed_steps, cont["snaps"][5].parent_id) == ("COMPLETED", MORE, 1)
    assert max_abs_diff(_final(cont, 5), cont["ref_const"].final) == 0.0


def test_max_steps_is_editable_over_rest_also_for_a_run_by_epochs() -> None:
    """The server checks a clone's changes against the kernel's ``editable_fields``: a run that trains by epochs
    (no ``max_steps`` set) can still be continued from the panel's REST fallback or a POST."""
    from rapidfire_nb.experiment.record_writes import editable_fields
    from rapidfire_nb.spec import LeafConfig

    spec = LeafConfig(
        trainer_type="SFT", model_name="tiny", training={"num_train_epochs": 2, "learning_rate": 1e-3}
    )
    assert editable_fields({7: spec}) == {
        "7": {"max_steps": "int", "model_name": "str", "num_train_epochs": "int", "learning_rate": "float"}
    }


@pytest.mark.parametrize(
    ("on_device", "segments", "max_steps", "refused"),
    [
        (True, (3, 4), 8, True),  # training its last chunk: the clone would start at its end, step 8
        (True, (3, 4), 12, False),  # ... and continues it to 12
        (True, (2, 4), 8, False),  # training chunk 3 of 4: the clone starts at that chunk's end
        (False, (3, 4), 8, False),  # parked before its last chunk: the clone starts from that boundary
    ],
)
def test_a_warm_clone_asked_during_the_parents_last_chunk_must_train_past_its_end(
    on_device: bool, segments: tuple[int, int], max_steps: int, refused: bool
) -> None:
    """A fresh-user pass: a warm clone asked for while run 1 trained its last chunk got an id, then FAILED ("the
    clone's total steps (8) must exceed the parent's position (step 8)"). Now it is refused at once, saying why."""
    from rapidfire_nb.errors import OpError
    from rapidfire_nb.experiment.clones import check_continuation

    parent = _parent("ONGOING", 6, 8, on_device=on_device, segments=segments)
    err = _catch(lambda: check_continuation(_child(max_steps), 1, {"learning_rate": 1e-3}, parent))
    assert (err is not None) == refused, err
    if refused:
        assert isinstance(err, OpError)
        assert "it is in its last chunk: a warm clone starts where it ends, at step 8" in str(err)
        assert "set max_steps above 8, e.g. max_steps=16, or clone it cold (warm_start=False)" in str(err)
