"""The public API's plain arguments: run ids are ints, flags are bools, wait's limits are checked; and the
experiment created last is the current one.

No training: a bad argument is refused before anything looks for the run (so no session is needed), and a good
one reaches the usual "call run_fit first" error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rapidfire_nb.errors import ExperimentError
from rapidfire_nb.experiment.arguments import check_run_id, check_run_ids


@pytest.fixture
def exp(tmp_path: Path) -> Any:
    from rapidfire_nb import Experiment

    e = Experiment("ids", experiment_path=tmp_path)
    yield e
    e.end()


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (1.7, "float 1.7"),
        (True, "bool True"),
        ("two", "str 'two'"),
        ("2", "str '2'"),
        (None, "NoneType None"),
    ],
)
@pytest.mark.parametrize("method", ["stop", "resume", "delete", "load_model"])
def test_a_run_id_that_is_not_an_int_is_a_type_error_saying_what_a_run_id_is(
    exp: Any, method: str, value: Any, shown: str
) -> None:
    with pytest.raises(TypeError) as err:
        getattr(exp, method)(value)
    assert f"run_id must be a run id, got {shown}: a run id is an int" in str(err.value)
    assert "get_runs_info()" in str(err.value)


def test_clone_modify_and_submit_op_check_the_run_id_too(exp: Any) -> None:
    with pytest.raises(TypeError, match="run_id must be a run id, got float 1.0"):
        exp.clone_modify(1.0, {"learning_rate": 1e-4})
    with pytest.raises(TypeError, match="run_id must be a run id, got bool False"):
        exp.submit_op("stop", False)


def test_every_id_of_a_list_is_checked_before_any_op_is_sent(exp: Any) -> None:
    with pytest.raises(TypeError, match=r"run_id\[1\] must be a run id, got float 2.5"):
        exp.stop([1, 2.5])
    assert check_run_ids((1, np.int64(2))) == [1, 2]


def test_ints_and_numpy_ints_are_run_ids(exp: Any) -> None:
    assert check_run_id(np.int64(3)) == 3 and type(check_run_id(np.int64(3))) is int
    with pytest.raises(ExperimentError, match="call run_fit first"):
        exp.stop(np.int64(1))  # a good id: the usual error of an experiment that never trained
    with pytest.raises(ExperimentError, match="call run_fit first"):
        exp.stop(1)


@pytest.mark.parametrize("line", ["stop two", "resume 1.7", "delete 1 x", "clone one lr=1e-4"])
def test_the_magic_says_what_a_run_id_is(exp: Any, line: str) -> None:
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "rapidfire_nb")
    with pytest.raises(UsageError) as err:
        shell.run_line_magic("rapidfire", line)
    bad = line.split()[-1] if line.startswith("delete") else line.split()[1]
    assert f"{bad!r} is not a run id: a run id is a whole number" in str(err.value)
    assert "usage: %rapidfire" in str(err.value)


def test_experiment_created_again_becomes_the_current_one(tmp_path: Path) -> None:
    from rapidfire_nb import Experiment
    from rapidfire_nb.experiment import current_experiment

    a = Experiment("exp-A", experiment_path=tmp_path)
    b = Experiment("exp-B", experiment_path=tmp_path)
    assert current_experiment() is b
    again = Experiment("exp-A", experiment_path=tmp_path)
    assert again is a  # the live object
    assert current_experiment() is a  # ... and the one %rapidfire addresses now
    a.end()
    b.end()


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda e: e.clone_modify(1, {}, warm_start="no"),
            TypeError,
            "warm_start must be True or False, got str 'no'",
        ),
        (
            lambda e: e.submit_op("clone", 1, warm_start=1),
            TypeError,
            "warm_start must be True or False, got int 1",
        ),
        (
            lambda e: e.run_fit(None, None, None, background="yes"),
            TypeError,
            "background must be True, False or None, got str 'yes'",
        ),
        (lambda e: setattr(e, "quiet", "no"), TypeError, "quiet must be True or False, got str 'no'"),
        (lambda e: e.wait(timeout="5"), TypeError, "timeout must be seconds (a number) or None, got str '5'"),
        (lambda e: e.wait(timeout=-1), ValueError, "timeout must be >= 0 seconds"),
        (lambda e: e.wait(timeout=float("nan")), ValueError, "timeout must be >= 0 seconds"),
        (lambda e: e.wait(chunks="2"), TypeError, "chunks must be an int (chunks each active run has done"),
        (lambda e: e.wait(chunks=True), TypeError, "chunks must be an int"),
        (lambda e: e.wait(chunks=0), ValueError, "chunks must be >= 1 (or None to wait until no run is left"),
    ],
)
def test_flags_are_bools_and_wait_limits_are_checked(exp: Any, call: Any, error: type, message: str) -> None:
    with pytest.raises(error) as err:
        call(exp)
    assert message in str(err.value)


def test_quiet_and_overwrite_must_be_bools_when_created(tmp_path: Path) -> None:
    from rapidfire_nb import Experiment

    with pytest.raises(TypeError, match="quiet must be True or False, got str 'False'"):
        Experiment("q", experiment_path=tmp_path, quiet="False")
    with pytest.raises(TypeError, match="overwrite must be True or False, got str 'no'"):
        Experiment("q", experiment_path=tmp_path, overwrite="no")  # "no" would have wiped the experiment
    assert not (tmp_path / "q").exists()  # nothing was created


def test_an_op_id_names_one_request() -> None:
    from rapidfire_nb.errors import OpError
    from rapidfire_nb.experiment.session import FitSession
    from rapidfire_nb.testing.fakes import FakeSpec, Harness

    h = Harness([FakeSpec(rows=16, batch=4), FakeSpec(rows=16, batch=4)], mode="manual")
    fit = FitSession(h.sched, h.fake, None, None, None, None)  # type: ignore[arg-type]
    try:
        first = fit.submit("stop", 2, op_id="x")
        assert fit.submit("stop", 2, op_id="x") is first  # the same request again: its ack
        with pytest.raises(OpError, match="op id 'x' was already used by the stop of run 2"):
            fit.submit("resume", 2, op_id="x")  # before: silently answered with the stop's ack
        with pytest.raises(OpError, match="leave op_id out or use a new one"):
            fit.submit("stop", 1, op_id="x")
    finally:
        h.close()


def test_a_cell_waiting_for_the_device_says_who_holds_it() -> None:
    import threading

    from kernel_scheduler import DeviceArbiter
    from rapidfire_nb.experiment.reporter import Reporter
    from rapidfire_nb.experiment.session import FitSession
    from rapidfire_nb.testing.fakes import TIMEOUT, FakeSpec, Harness

    arb = DeviceArbiter()
    h = Harness([FakeSpec(rows=16, batch=4)], mode="manual", arbiter=arb, name="experiment 'a'")
    fit = FitSession(h.sched, h.fake, None, None, None, None)  # type: ignore[arg-type]
    said: list[str] = []
    inside = threading.Event()

    def cell() -> None:
        with fit.hold_device("build its runs", Reporter(printer=said.append)):
            inside.set()

    try:
        h.fake.wait_inflight()  # experiment 'a' trains a chunk
        t = threading.Thread(target=cell)
        t.start()
        assert not inside.wait(0.05)
        h.fake.resolve()
        assert inside.wait(TIMEOUT)
        t.join(TIMEOUT)
        assert said == [
            "[rapidfire] waiting for the device to build its runs: experiment 'a' holds it (one chunk of any "
            "experiment of this process trains at a time, so that every run stays exact)"
        ]
    finally:
        h.close()


def test_an_op_id_answered_by_an_earlier_kernel_is_not_applied_again() -> None:
    """A fresh-user pass: a stop with op id 'my-stop-1' applied in one kernel was applied again in the next (after a
    resume) and its stored answer overwritten. The new kernel remembers the ops log's answers."""
    from kernel_scheduler import OpAck
    from rapidfire_nb.errors import OpError
    from rapidfire_nb.experiment.session import FitSession
    from rapidfire_nb.testing.fakes import FakeSpec, Harness
    from rapidfire_nb.view.stops import answered_ops

    log = [
        {
            "op_id": "my-stop-1",
            "run_id": 2,
            "kind": "stop",
            "state": "applied",
            "message": "run 2 stopped at step 3",
        },
        {"op_id": "lost", "run_id": 1, "kind": "stop", "state": "queued", "message": "stop requested"},
    ]
    h = Harness([FakeSpec(rows=16, batch=4), FakeSpec(rows=16, batch=4)], mode="manual")
    h.sched.remember(answered_ops(log))
    fit = FitSession(h.sched, h.fake, None, None, None, None)  # type: ignore[arg-type]
    try:
        again = fit.submit("stop", 2, op_id="my-stop-1")
        assert again == OpAck("my-stop-1", 2, "stop", "applied", "run 2 stopped at step 3")
        assert h.sched.run_snapshot(2).status.value != "STOPPED"  # type: ignore[union-attr]  # not stopped again
        with pytest.raises(
            OpError, match="op id 'my-stop-1' was already used by the stop of run 2 \\(applied\\)"
        ):
            fit.submit("resume", 2, op_id="my-stop-1")
        assert (
            fit.submit("stop", 1, op_id="lost").state == "queued"
        )  # never applied by the dead kernel: it applies
    finally:
        h.close()


@pytest.mark.parametrize("op_id", [5, b"x", "", "  ", ["x"], "a b", "x" * 129, "é/ü", "s\n1"])
def test_an_op_id_that_is_not_a_string_is_refused(op_id: Any) -> None:
    """Fresh-user passes: submit_op("stop", 2, op_id=5) was queued, then broke a later cancel with a TypeError; ids
    REST refuses ("a b", 129 characters) were accepted by the kernel. One rule for both (kernel_scheduler.ops)."""
    from rapidfire_nb.errors import OpError
    from rapidfire_nb.experiment.session import FitSession
    from rapidfire_nb.testing.fakes import FakeSpec, Harness

    h = Harness([FakeSpec(rows=16, batch=4)], mode="manual")
    fit = FitSession(h.sched, h.fake, None, None, None, None)  # type: ignore[arg-type]
    try:
        with pytest.raises(
            OpError, match=r"op_id must be 1-128 characters: letters, digits, .* or left out; got"
        ):
            fit.submit("stop", 1, op_id=op_id)
        assert h.sched.run_snapshot(1).status.value != "STOPPED"  # type: ignore[union-attr]
        assert h.rec.ops_seen == {}  # nothing was queued
    finally:
        h.close()


def test_an_op_id_posted_through_the_server_and_not_read_yet_names_that_request(tmp_path: Path) -> None:
    """A fresh-user pass: a stop posted over REST as 'x1', then submit_op("resume", 3, op_id="x1") in the kernel
    before the inbox was read: the resume was answered and the REST stop silently dropped as its repeat."""
    from rapidfire_nb.errors import OpError
    from rapidfire_nb.experiment.session import FitSession
    from rapidfire_nb.store import Store
    from rapidfire_nb.testing.fakes import FakeSpec, Harness

    store = Store(tmp_path / "exp")
    assert store.post_inbox_op("x1", "stop", 3)
    h = Harness([FakeSpec(rows=16, batch=4)] * 3, mode="manual")
    fit = FitSession(h.sched, h.fake, None, None, None, store)  # type: ignore[arg-type]
    try:
        with pytest.raises(
            OpError, match=r"op id 'x1' was already used by the stop of run 3 \(posted through the server\)"
        ):
            fit.submit("resume", 3, op_id="x1")
        assert fit.submit("stop", 3, op_id="x1").state in (
            "queued",
            "applied",
        )  # the same request: it is that one
        assert store.posted_op("x1") == {"kind": "stop", "run_id": 3, "taken_at": None}
        assert store.posted_op("nope") is None
    finally:
        h.close()
        store.close()
