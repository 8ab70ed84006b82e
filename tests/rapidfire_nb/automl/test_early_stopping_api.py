"""run_fit's early_stopping argument (no training): ConfigError on bad arguments before anything is built, the
stop reasons read back from an ops log, the panel snapshot's and the static copy's pruned mark."""

from __future__ import annotations

from typing import Any

import pytest

from kernel_scheduler import RunStatus
from rapidfire_nb.automl import MedianStopping, SuccessiveHalving
from rapidfire_nb.automl.early_stopping import check_early_stopping
from rapidfire_nb.errors import ConfigError
from rapidfire_nb.view.stops import StopInfo, stop_history


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: SuccessiveHalving(reduction_factor=1),
            "SuccessiveHalving: reduction_factor must be an integer >= 2",
        ),
        (
            lambda: SuccessiveHalving(grace_chunks=0),
            "SuccessiveHalving: grace_chunks must be an integer >= 1",
        ),
        (lambda: SuccessiveHalving(mode="minimize"), "SuccessiveHalving: mode must be 'min'"),
        (
            lambda: SuccessiveHalving(metric=""),
            "SuccessiveHalving: metric must be the name of a logged metric",
        ),
        (lambda: MedianStopping(min_runs=1), "MedianStopping: min_runs must be an integer >= 2"),
    ],
)
def test_bad_arguments_are_config_errors(make: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()


def test_not_a_policy_is_refused() -> None:
    with pytest.raises(ConfigError, match="early_stopping must be a policy such as SuccessiveHalving"):
        check_early_stopping("halving", eval_dataset=[1])


def test_an_eval_metric_needs_an_eval_dataset() -> None:
    with pytest.raises(
        ConfigError, match="compares 'eval_loss', an evaluation metric, but run_fit has no eval"
    ):
        check_early_stopping(SuccessiveHalving(), eval_dataset=None)
    assert check_early_stopping(SuccessiveHalving(metric="loss"), eval_dataset=None) is not None


def test_each_run_fit_gets_a_fresh_copy() -> None:
    policy = SuccessiveHalving()
    copy = check_early_stopping(policy, eval_dataset=[1])
    assert copy is not policy and repr(copy) == repr(policy)
    assert check_early_stopping(None, eval_dataset=None) is None


def test_run_fit_refuses_before_training(tmp_path: Any) -> None:
    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import RFGridSearch, RFModelConfig, RFSFTConfig

    exp = Experiment("bad-es", experiment_path=tmp_path)
    group = RFGridSearch(
        configs=[RFModelConfig(model_name="tiny", training_args=RFSFTConfig(max_steps=2))], trainer_type="SFT"
    )
    with pytest.raises(ConfigError, match="early_stopping must be a policy"):
        exp.run_fit(group, lambda cfg: None, [{"text": "a"}], [{"text": "b"}], early_stopping=0.5)
    with pytest.raises(ConfigError, match="has no eval_dataset"):
        exp.run_fit(group, lambda cfg: None, [{"text": "a"}], None, early_stopping=SuccessiveHalving())
    assert exp.get_runs_info().empty
    exp.end()


def _op(kind: str, run_id: int, source: str, at: float, **payload: Any) -> dict[str, Any]:
    return {
        "op_id": f"{kind}-{run_id}-{at}",
        "run_id": run_id,
        "kind": kind,
        "payload": payload,
        "source": source,
        "state": "applied",
        "requested_at": at,
        "applied_at": at,
    }


def test_stop_history_from_the_ops_log() -> None:
    ops = [
        _op("stop", 1, "early_stopping", 1.0, reason="pruned at chunk 1/4: ...", chunk=1),
        _op("stop", 2, "early_stopping", 1.1, reason="pruned at chunk 2/4: ...", chunk=2),
        _op("resume", 2, "panel", 2.0),
        _op("stop", 3, "magic", 2.5),
        {**_op("stop", 4, "early_stopping", 3.0, reason="x", chunk=1), "state": "rejected"},
    ]
    got = stop_history(ops)
    assert got[1] == StopInfo("pruned at chunk 1/4: ...", pruned=True)
    assert got[2] == StopInfo(
        None, pruned=False, exempt_through=2
    )  # the user's resume: not judged up to chunk 2
    assert got[3] == StopInfo("stopped by the user (magic)", pruned=False)
    assert 4 not in got
    # in the order applied: a policy stop after the user's resume (a later rung) makes it pruned again
    got = stop_history([*ops, _op("stop", 2, "early_stopping", 4.0, reason="pruned at chunk 4/4", chunk=4)])
    assert got[2] == StopInfo("pruned at chunk 4/4", pruned=True, exempt_through=2)


def test_the_store_snapshot_and_static_copy_show_the_reason() -> None:
    from rapidfire_nb.panel.static import render_html
    from rapidfire_nb.view import StoreRows, store_snapshot

    runs = [
        {"run_id": 1, "status": RunStatus.COMPLETED.value, "hparams": {}},
        {"run_id": 2, "status": RunStatus.STOPPED.value, "hparams": {}},
    ]
    reason = "pruned at chunk 1/4: eval_loss 2.71 not in the best 1 of 2 at this rung (cutoff 2.43)"
    rows = StoreRows(
        meta={"num_chunks": 4}, runs=runs, ops=[_op("stop", 2, "early_stopping", 1.0, reason=reason, chunk=1)]
    )
    snap = store_snapshot("exp", rows, writer_alive=False)
    by_id = {r["run_id"]: r for r in snap["runs"]}
    assert by_id[2]["pruned"] and by_id[2]["stop_reason"] == reason
    assert not by_id[1]["pruned"] and by_id[1]["stop_reason"] is None
    html = render_html(snap, [])
    assert 'data-pruned-for="2"' in html and "run 2 ✂ early stopping: pruned at chunk 1/4" in html
