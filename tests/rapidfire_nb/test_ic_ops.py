"""IC Ops (issue 4): stop, resume, delete, clone-modify cold/warm, illegal ops, idempotent op ids, ops after
the end of training — every rule of the issue's "Semantics" section, on the tiny model.

One module-scoped experiment drives every op, then every test asserts on what it recorded:

=====  ======================================  ===============================================================
run    config                                  what happens to it
=====  ======================================  ===============================================================
1      lr 1e-3, r 4, linear + warmup 1         never touched: the reference of runs 2, 5 and 6
2      identical to run 1                      stopped after chunk 1 (op_id ``x`` sent twice), resumed after
                                               every other run finished: must equal run 1 and plain TRL
3      lr 5e-4                                 deleted mid-training
4      clone of 1, cold, ``lora.r=8``          new id max+1, starts at step 0, completes
5      clone of 1, warm, no changes            its losses equal run 1's at the same steps
6      clone of 1, warm, ``learning_rate``     its logged LR follows the clone config's schedule
7      clone of 1 (COMPLETED), cold            after every run finished: trains again, wait() returns
=====  ======================================  ===============================================================

16 rows, batch 2 -> 8 steps, 4 chunks (boundaries 2, 4, 6, 8), logging every step, lora_dropout > 0 (so a
warm start must restore the RNG too).
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

SEED = 5
N_TRAIN = 16
BATCH = 2
TOTAL = N_TRAIN // BATCH  # 8 optimizer steps
NUM_CHUNKS = 4
BOUNDARIES = [2, 4, 6, 8]
LR = 1e-3
WARM_LR = 5e-3
WAIT_S = 150


def _leaf_args(lr: float) -> dict[str, Any]:
    return {
        "learning_rate": lr,
        "per_device_train_batch_size": BATCH,
        "num_train_epochs": 1,
        "max_length": 32,
        "logging_steps": 1,
        "lr_scheduler_type": "linear",
        "warmup_steps": 1,
    }


def _group() -> Any:
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    configs = List(
        [
            RFModelConfig(
                model_name="tiny",
                formatting_func=qa_to_chat,
                peft_config=RFLoraConfig(
                    r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"]
                ),
                training_args=RFSFTConfig(**_leaf_args(lr)),
            )
            for lr in (LR, LR, 5e-4)
        ]
    )
    return RFGridSearch(configs=configs, trainer_type="SFT")


def _status(exp: Any, rid: int) -> str:
    snap = exp.run_snapshot(rid)
    return snap.status.value if snap else "MISSING"


def _until(cond: Any, timeout: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def _catch(fn: Any) -> BaseException | None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the test asserts on the type
        return exc
    return None


@pytest.fixture(scope="module")
def ic(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model

    root = tmp_path_factory.mktemp("icops")
    train = qa_dataset(N_TRAIN, seed=0)
    group = _group()
    exp = Experiment("icops", experiment_path=root)
    exp.quiet = True
    out: dict[str, Any] = {"exp": exp}
    t0 = time.monotonic()
    exp.run_fit(group, tiny_create_model, train, num_chunks=NUM_CHUNKS, seed=SEED, background=True)
    out["returned_at_once_s"] = time.monotonic() - t0
    out["wait_chunks_1"] = exp.wait(timeout=WAIT_S, chunks=1)

    # --- ops while training runs
    out["stop_x_1"] = exp.submit_op("stop", 2, op_id="x")
    out["stop_x_2"] = exp.submit_op("stop", 2, op_id="x")
    out["status_1_when_resumed"] = _status(exp, 1)
    out["resume_ongoing"] = exp.resume(1)
    out["delete_3"] = exp.delete(3)
    out["clone_cold"] = exp.clone_modify(1, {"lora.r": 8})
    out["clone_cold_status_at_once"] = _status(exp, out["clone_cold"])
    out["clone_warm_same"] = exp.clone_modify(1, {}, warm_start=True)
    out["clone_warm_lr"] = exp.clone_modify(1, {"learning_rate": WARM_LR}, warm_start=True)
    out["err_warm_r"] = _catch(lambda: exp.clone_modify(1, {"lora.r": 8}, warm_start=True))
    out["err_warm_bs"] = _catch(
        lambda: exp.clone_modify(1, {"per_device_train_batch_size": 4}, warm_start=True)
    )
    out["err_unknown_field"] = _catch(lambda: exp.clone_modify(1, {"learning_rat": 1e-4}))
    out["unknown_stop"] = exp.stop(99)
    out["unknown_list"] = exp.delete([98, 97])
    out["err_unknown_clone"] = _catch(lambda: exp.clone_modify(99, {}))
    out["stopped"] = _until(lambda: _status(exp, 2) == "STOPPED")
    out["deleted"] = _until(lambda: _status(exp, 3) == "DELETED")
    out["snap_2_stopped"] = exp.run_snapshot(2)
    out["snap_3_deleted"] = exp.run_snapshot(3)
    executor = exp.session.executor
    out["dropped_3"] = _until(lambda: not executor.has_run(3))
    base_model = next(iter(executor.runs.values())).base.model
    out["adapters_after_delete"] = _until(lambda: "run_3" not in base_model.peft_config) and sorted(
        base_model.peft_config
    )

    # --- every other run finishes; the stopped run does not end the experiment
    out["wait_all"] = exp.wait(timeout=WAIT_S)
    out["statuses_after_wait"] = {s.run_id: s.status.value for s in exp.run_snapshots()}
    out["info_mid"] = exp.get_runs_info()
    out["info_mid_all"] = exp.get_runs_info(include_deleted=True)
    out["tb_dirs"] = sorted(p.name for p in (exp.path / "tensorboard").iterdir())

    # --- illegal ops on finished / deleted runs: rejected, never a crash
    out["stop_completed"] = exp.stop(1)
    out["resume_completed"] = exp.resume(1)
    out["deleted_ops"] = [exp.stop(3), exp.resume(3), exp.delete(3)]
    out["err_clone_deleted"] = _catch(lambda: exp.clone_modify(3, {}))

    # --- resume after every other run finished: the loop starts again
    out["resume_2"] = exp.resume(2)
    out["wait_resume"] = exp.wait(timeout=WAIT_S)
    # --- cloning a finished run trains again
    out["clone_after"] = exp.clone_modify(1, {"learning_rate": 2e-3})
    out["wait_after"] = exp.wait(timeout=WAIT_S)
    out["loop_error"] = exp.session.scheduler.loop_error
    out["info"] = exp.get_runs_info()
    out["info_all"] = exp.get_runs_info(include_deleted=True)
    out["results"] = exp.get_results()
    out["results_all"] = exp.get_results(include_deleted=True)
    out["ops"] = exp.ops()
    out["totals"] = {rid: run.plan.total_steps for rid, run in exp.session.executor.runs.items()}
    exp.end()
    out["ref_2"] = train_plain_trl(
        list(group.expand(SEED))[1], tiny_create_model, train, None, SEED, root / "plain-2"
    )
    return out


def _row(info: Any, rid: int) -> Any:
    rows = info[info.run_id == rid]
    assert len(rows) == 1, f"run {rid}: {len(rows)} rows in {list(info.run_id)}"
    return rows.iloc[0]


def _losses(results: Any, rid: int) -> list[tuple[int, float]]:
    return result_series(results, rid, "loss")


# ============================================================================================ stop / resume
def test_run_fit_in_background_returns_at_once(ic: dict[str, Any]) -> None:
    assert ic["returned_at_once_s"] < 30
    assert ic["wait_chunks_1"] is True


def test_stop_parks_run_at_a_chunk_boundary_others_complete(ic: dict[str, Any]) -> None:
    ack = ic["stop_x_1"]
    assert ack.kind == "stop" and ack.run_id == 2 and ack.state in ("queued", "applied")
    assert ack.message
    assert ic["stopped"], "run 2 never became STOPPED"
    snap = ic["snap_2_stopped"]
    assert snap.step in BOUNDARIES[:-1], f"stopped at step {snap.step}, not at an inner chunk boundary"
    assert snap.segments_done == BOUNDARIES.index(snap.step) + 1
    assert ic["wait_all"] is True, "wait() did not return while run 2 was STOPPED"
    st = ic["statuses_after_wait"]
    assert st[2] == "STOPPED", st
    assert st[1] == "COMPLETED" and st[3] == "DELETED", st
    assert _row(ic["info_mid"], 2).status == "STOPPED"
    assert _row(ic["info_mid"], 2).completed_steps == snap.step


def test_resumed_run_equals_a_run_never_stopped(ic: dict[str, Any]) -> None:
    ack = ic["resume_2"]
    assert ack.state in ("queued", "applied"), ack
    assert ic["wait_resume"] is True
    info = ic["info"]
    assert _row(info, 2).status == "COMPLETED"
    assert _row(info, 2).completed_steps == TOTAL
    final_2 = adapter_from_folder(_row(info, 2).checkpoint_dir)
    final_1 = adapter_from_folder(_row(info, 1).checkpoint_dir)
    ref = ic["ref_2"]
    assert max_abs_diff(final_2, ref.final) <= TOL, "resumed run's adapter differs from plain TRL"
    assert max_abs_diff(final_2, final_1) <= TOL, "resumed run's adapter differs from the identical run 1"
    got = _losses(ic["results"], 2)
    want = ref.series("loss")
    assert [s for s, _ in got] == list(range(1, TOTAL + 1))
    assert [s for s, _ in got] == [s for s, _ in want]
    assert max(abs(a - b) for (_, a), (_, b) in zip(got, want)) <= TOL, f"{got} != {want}"
    assert result_series(ic["results"], 2, "learning_rate") == ref.series("learning_rate")


def test_resume_of_an_ongoing_run_is_rejected(ic: dict[str, Any]) -> None:
    assert ic["status_1_when_resumed"] == "ONGOING"
    ack = ic["resume_ongoing"]
    assert ack.state == "rejected" and "ONGOING" in ack.message, ack


def test_same_op_id_is_applied_once(ic: dict[str, Any]) -> None:
    a1, a2 = ic["stop_x_1"], ic["stop_x_2"]
    assert a1.op_id == a2.op_id == "x"
    ops = ic["ops"]
    rows = ops[ops.op_id == "x"]
    assert len(rows) == 1, rows
    assert rows.iloc[0].state == "applied"
    stops_of_2 = ops[(ops.kind == "stop") & (ops.run_id == 2)]
    assert len(stops_of_2) == 1, stops_of_2


# ============================================================================================ delete
def test_delete_marks_deleted_and_hides_the_run(ic: dict[str, Any]) -> None:
    assert ic["delete_3"].state in ("queued", "applied")
    assert ic["deleted"]
    snap = ic["snap_3_deleted"]
    assert snap.step in [0, *BOUNDARIES[:-1]], f"deleted at step {snap.step}, not at a chunk boundary"
    for info in (ic["info_mid"], ic["info"]):
        assert 3 not in list(info.run_id)
    assert _row(ic["info_all"], 3).status == "DELETED"
    assert _row(ic["info_mid_all"], 3).status == "DELETED"
    # its metrics are left out of get_results() too, unless asked for
    assert 3 not in set(ic["results"].run_id)
    kept = ic["results_all"][ic["results_all"].run_id == 3]
    assert list(kept.step) == list(range(1, snap.step + 1)), (snap.step, list(kept.step))
    assert len(ic["results_all"]) == len(ic["results"]) + len(kept)


def test_delete_frees_the_runs_trainer_and_adapter(ic: dict[str, Any]) -> None:
    """A deleted run never trains again: the executor forgets it and its adapter leaves the shared base."""
    assert ic["dropped_3"]
    assert ic["adapters_after_delete"] and "run_3" not in ic["adapters_after_delete"]
    assert {"run_1", "run_2"} <= set(ic["adapters_after_delete"])
    assert 3 not in ic["totals"]


def test_delete_renames_tensorboard_folder(ic: dict[str, Any]) -> None:
    dirs = ic["tb_dirs"]
    assert "deleted-run-3" in dirs, dirs
    assert "run-3" not in dirs, dirs
    assert "run-1" in dirs and "run-2" in dirs, dirs


def test_ops_on_a_deleted_run_are_rejected(ic: dict[str, Any]) -> None:
    from rapidfire_nb.errors import OpError

    for ack in ic["deleted_ops"]:
        assert ack.state == "rejected" and "DELETED" in ack.message, ack
    err = ic["err_clone_deleted"]
    assert isinstance(err, OpError) and "DELETED" in str(err), repr(err)


# ============================================================================================ clones
def test_cold_clone_gets_next_id_and_trains_from_step_0(ic: dict[str, Any]) -> None:
    cid = ic["clone_cold"]
    assert cid == 4
    assert ic["clone_cold_status_at_once"] == "NEW"
    row = _row(ic["info"], cid)
    assert row.status == "COMPLETED" and row.completed_steps == TOTAL == row.total_steps
    steps = [s for s, _ in _losses(ic["results"], cid)]
    assert steps == list(range(1, TOTAL + 1)), "a cold clone starts at step 0"
    saved = adapter_from_folder(row.checkpoint_dir)
    a_weights = [v for k, v in saved.items() if "lora_A" in k]
    assert a_weights and all(v.shape[0] == 8 for v in a_weights), "lora.r=8 not applied"


def test_warm_clone_without_changes_continues_like_its_parent(ic: dict[str, Any]) -> None:
    cid = ic["clone_warm_same"]
    assert cid == 5
    assert _row(ic["info"], cid).status == "COMPLETED"
    got = _losses(ic["results"], cid)
    assert got, "the warm clone logged nothing"
    first = got[0][0]
    assert first - 1 in BOUNDARIES[:-1], f"warm clone started at step {first - 1}, not at a parent's boundary"
    assert [s for s, _ in got] == list(range(first, TOTAL + 1)), "warm clone must continue the parent's steps"
    parent = dict(_losses(ic["results"], 1))
    for step, loss in got:
        assert abs(loss - parent[step]) <= TOL, f"step {step}: clone {loss} != parent {parent[step]}"
    final_c = adapter_from_folder(_row(ic["info"], cid).checkpoint_dir)
    final_p = adapter_from_folder(_row(ic["info"], 1).checkpoint_dir)
    assert max_abs_diff(final_c, final_p) <= TOL


def _schedule(base_lr: float, total: int) -> dict[int, float]:
    """LR logged at step s by the HF Trainer: the linear schedule with 1 warmup step, after s scheduler steps."""
    import torch
    from transformers import get_scheduler

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base_lr)
    sched = get_scheduler("linear", opt, num_warmup_steps=1, num_training_steps=total)
    out = {}
    for s in range(1, total + 1):
        opt.step()
        out[s] = sched.get_last_lr()[0]  # the LR step s used (logged at step s)
        sched.step()
    return out


def test_schedule_formula_matches_the_parent(ic: dict[str, Any]) -> None:
    """Sanity of the formula used below, on run 1's own logged LR."""
    want = _schedule(LR, TOTAL)
    got = dict(result_series(ic["results"], 1, "learning_rate"))
    assert sorted(got) == list(range(1, TOTAL + 1))
    for s, v in got.items():
        assert v == pytest.approx(want[s], rel=1e-9, abs=1e-15), f"step {s}: {v} != {want[s]}"


def test_warm_clone_with_new_learning_rate_follows_its_schedule(ic: dict[str, Any]) -> None:
    cid = ic["clone_warm_lr"]
    assert cid == 6
    assert _row(ic["info"], cid).status == "COMPLETED"
    got = result_series(ic["results"], cid, "learning_rate")
    assert got and got[-1][0] == TOTAL
    assert got[0][0] - 1 in BOUNDARIES[:-1], "warm clone did not continue from a parent's boundary"
    want = _schedule(WARM_LR, ic["totals"][cid])
    for s, v in got:
        assert v == pytest.approx(want[s], rel=1e-9, abs=1e-15), f"step {s}: LR {v}, schedule {want[s]}"
    parent = dict(result_series(ic["results"], 1, "learning_rate"))
    assert all(v != parent[s] for s, v in got if parent[s] != 0), "the new learning_rate had no effect"


def test_warm_clone_of_shape_or_batching_field_suggests_a_cold_clone(ic: dict[str, Any]) -> None:
    from rapidfire_nb.errors import OpError

    for key in ("err_warm_r", "err_warm_bs"):
        err = ic[key]
        assert isinstance(err, OpError), f"{key}: {err!r}"
        assert "cold" in str(err) and "warm_start=False" in str(err), str(err)
    assert "lora.r" in str(ic["err_warm_r"])
    assert "per_device_train_batch_size" in str(ic["err_warm_bs"])


def test_unknown_field_names_the_closest_valid_one(ic: dict[str, Any]) -> None:
    from rapidfire_nb.errors import ConfigError

    err = ic["err_unknown_field"]
    assert isinstance(err, ConfigError), repr(err)
    assert "learning_rat" in str(err) and "learning_rate" in str(err).replace("learning_rat'", ""), str(err)


def test_rejected_clones_consume_no_run_id(ic: dict[str, Any]) -> None:
    ids = sorted(ic["info_all"].run_id)
    assert ids == [1, 2, 3, 4, 5, 6, 7], ids


# ============================================================================================ illegal ops
def test_ops_on_unknown_run_ids_are_rejected(ic: dict[str, Any]) -> None:
    from rapidfire_nb.errors import OpError

    ack = ic["unknown_stop"]
    assert ack.state == "rejected" and "99" in ack.message and "does not exist" in ack.message
    lst = ic["unknown_list"]
    assert isinstance(lst, list) and [a.run_id for a in lst] == [98, 97]
    assert all(a.state == "rejected" for a in lst)
    err = ic["err_unknown_clone"]
    assert isinstance(err, OpError) and "99" in str(err), repr(err)


def test_stop_or_resume_of_completed_run_is_rejected(ic: dict[str, Any]) -> None:
    for ack in (ic["stop_completed"], ic["resume_completed"]):
        assert ack.state == "rejected" and "COMPLETED" in ack.message, ack


def test_loop_survived_every_illegal_op(ic: dict[str, Any]) -> None:
    assert ic["loop_error"] is None, ic["loop_error"]
    assert ic["wait_resume"] and ic["wait_after"]


# ============================================================================================ after the end
def test_cloning_a_finished_run_trains_again(ic: dict[str, Any]) -> None:
    cid = ic["clone_after"]
    assert cid == 7
    assert ic["wait_after"] is True
    row = _row(ic["info"], cid)
    assert row.status == "COMPLETED" and row.completed_steps == TOTAL
    assert [s for s, _ in _losses(ic["results"], cid)] == list(range(1, TOTAL + 1))


def test_ops_lists_every_op_with_state_and_message(ic: dict[str, Any]) -> None:
    ops = ic["ops"]
    for col in ("op_id", "run_id", "kind", "state", "message"):
        assert col in ops.columns, list(ops.columns)
    assert ops.op_id.is_unique
    assert set(ops.state) <= {"applied", "rejected"}, "an op was left queued"
    assert ops.message.map(lambda m: isinstance(m, str) and bool(m)).all()
    got = sorted((r.kind, int(r.run_id), r.state) for r in ops.itertuples())
    want = sorted(
        [
            ("stop", 2, "applied"),
            ("resume", 1, "rejected"),
            ("delete", 3, "applied"),
            ("clone", 1, "applied"),
            ("clone", 1, "applied"),
            ("clone", 1, "applied"),
            ("stop", 99, "rejected"),
            ("delete", 98, "rejected"),
            ("delete", 97, "rejected"),
            ("stop", 1, "rejected"),
            ("resume", 1, "rejected"),
            ("stop", 3, "rejected"),
            ("resume", 3, "rejected"),
            ("delete", 3, "rejected"),
            ("clone", 3, "rejected"),
            ("resume", 2, "applied"),
            ("clone", 1, "applied"),
        ]
    )
    assert got == want, got
