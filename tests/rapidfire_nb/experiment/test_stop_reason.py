"""A stop may name its own reason (issue 37: the panel's "stop all but best k"): the run's stop_reason and the op's
applied message say it; only a stop takes one, a text of at most 200 characters."""

from __future__ import annotations

import pytest


def test_a_stop_names_its_reason_and_other_ops_take_none() -> None:
    from rapidfire_nb.errors import OpError
    from rapidfire_nb.experiment.session import FitSession
    from rapidfire_nb.testing.fakes import FakeSpec, Harness

    h = Harness([FakeSpec(rows=16, batch=4), FakeSpec(rows=16, batch=4)], mode="manual")
    fit = FitSession(h.sched, h.fake, None, None, None, None)  # type: ignore[arg-type]
    try:
        with pytest.raises(OpError, match="reason: only a stop names one"):
            fit.submit("delete", 1, reason="why not")
        with pytest.raises(OpError, match="at most 200 characters"):
            fit.submit("stop", 1, reason="x" * 201)
        ack = fit.submit("stop", 2, reason="stop all but best 1 by eval_loss")
        plain = fit.submit("stop", 1)
        h.settle()  # run 2 waits: it stops at once; run 1 trains: at the end of its chunk
        h.step()
        answered = {a.run_id: a for a in (fit.scheduler.ack(ack.op_id), fit.scheduler.ack(plain.op_id)) if a}
        assert answered[2].state == answered[1].state == "applied", answered
        assert answered[2].message.endswith(": stop all but best 1 by eval_loss"), answered[2].message
        assert "stop all but best" not in answered[1].message
        runs = {s.run_id: s for s in h.sched.snapshot()}
        assert runs[2].stop_reason == "stop all but best 1 by eval_loss" and not runs[2].pruned
        assert runs[1].stop_reason == "stopped by the user (api)"
    finally:
        h.close()
