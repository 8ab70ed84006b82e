"""GangExecutor with fake ranks: every call reaches every rank, rank 0 answers, one rank's death takes the gang
down at once, and revive() starts fresh ranks (issue 36). The real ranks: tests/rapidfire_nb/training."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

import pytest

from kernel_scheduler import RunStart, SegmentResult
from kernel_scheduler.chunks import plan_chunks
from rapidfire_nb.devices.errors import WorkerLost
from rapidfire_nb.devices.gang import GangExecutor, rank_env


class FakeRank:
    """A rank worker: records its calls; ``run_segment`` resolves when the test says (``finish``)."""

    def __init__(self, rank: int, generation: int) -> None:
        self.rank, self.generation, self.pid = rank, generation, 1000 * generation + rank
        self.calls: list[tuple[Any, ...]] = []
        self.dead = False
        self.killed = False
        self.closed = False
        self.segments: list[Future[SegmentResult]] = []
        self.barrier: threading.Barrier | None = None

    def alive(self, device: str | None = None) -> bool:
        return not self.dead

    def kill(self) -> None:
        self.killed = self.dead = True
        for fut in self.segments:
            if not fut.done():
                fut.set_result(SegmentResult(4, 16, error="killed", device_lost=True))

    def close(self) -> None:
        self.closed = True

    def add_run(self, run_id: int, spec: Any, warm_from: Any = None, resume_from: Any = None) -> RunStart:
        if self.barrier is not None:  # the ranks meet, as in a collective: only works if called at once
            self.barrier.wait(timeout=5)
        self.calls.append(("add_run", run_id, spec, resume_from))
        return RunStart(plan_chunks(16, 2, 2, 8), step=self.rank)

    def run_segment(self, run_id: int, stop_step: int) -> Future[SegmentResult]:
        self.calls.append(("run_segment", run_id, stop_step))
        fut: Future[SegmentResult] = Future()
        self.segments.append(fut)
        return fut

    def save_final(self, run_id: int) -> str:
        if self.dead:
            raise WorkerLost(f"rank {self.rank} died")
        self.calls.append(("save_final", run_id))
        return f"/final/{self.rank}"

    def checkpoint_dir(self, run_id: int) -> str:
        return f"/ckpt/{self.rank}"


@pytest.fixture
def gang() -> Any:
    generations: list[list[FakeRank]] = []

    def start() -> list[FakeRank]:
        ranks = [FakeRank(r, len(generations) + 1) for r in range(2)]
        barrier = threading.Barrier(2)
        for rank in ranks:
            rank.barrier = barrier
        generations.append(ranks)
        return ranks

    g = GangExecutor("cpu:0+cpu:1", start)
    g.generations = generations
    yield g
    g.close()


def test_every_call_reaches_every_rank_at_once_and_rank_0_answers(gang: Any) -> None:
    start = gang.add_run(1, "spec")  # the barrier needs both ranks in the call together
    assert start.step == 0  # rank 0's
    assert gang.devices == ("cpu:0+cpu:1",) and gang.size == 2 and gang.device_of(1) == "cpu:0+cpu:1"
    assert str(gang.save_final(1)) == "/final/0"
    ranks = gang.generations[0]
    assert [r.calls for r in ranks] == [
        [("add_run", 1, "spec", None), ("save_final", 1)],
        [("add_run", 1, "spec", None), ("save_final", 1)],
    ]
    with pytest.raises(ValueError):
        gang.add_run(2, "spec", device="cpu:0")


def test_a_segment_resolves_with_rank_0_s_result_once_every_rank_is_back(gang: Any) -> None:
    fut = gang.run_segment(1, 4)
    r0, r1 = gang.generations[0]
    r0.segments[0].set_result(SegmentResult(4, 16, metrics={"loss": 1.5}))
    assert not fut.done()  # rank 1 still trains
    r1.segments[0].set_result(SegmentResult(4, 16, metrics={"loss": 1.5}))
    assert fut.result(1) == SegmentResult(4, 16, metrics={"loss": 1.5})


def test_one_rank_dying_takes_the_gang_down_at_once_and_revive_starts_fresh_ranks(gang: Any) -> None:
    fut = gang.run_segment(1, 4)
    r0, r1 = gang.generations[0]
    r1.dead = True
    r1.segments[0].set_result(SegmentResult(2, 8, error="worker died: SIGKILL", device_lost=True))
    res = fut.result(1)  # rank 0 was waiting in a collective: killed, not left there until the timeout
    assert r0.killed and res.device_lost and res.step == 4
    assert res.error is not None and "gang cpu:0+cpu:1 lost a rank: worker died: SIGKILL" in res.error
    assert not gang.alive()
    with pytest.raises(WorkerLost, match="lost a rank"):
        gang.save_final(1)
    assert gang.revive() is True and gang.alive()
    assert [r.pid for r in gang.generations[1]] == gang.pids() == [2000, 2001]
    assert r0.closed and r1.closed  # the dead generation was reaped
    assert gang.add_run(1, "spec", resume_from="/ckpt").step == 0


def test_a_call_that_loses_a_rank_kills_the_other(gang: Any) -> None:
    r0, r1 = gang.generations[0]
    r0.dead = True
    with pytest.raises(WorkerLost, match="rank 0 died"):
        gang.save_final(1)
    assert r1.killed and not gang.alive()


def test_rank_env_is_torch_distributed_s_standard_variables() -> None:
    env = rank_env(1, 2, 29511, (None, None))
    assert env == {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29511",
        "RF_GANG_TIMEOUT_S": env["RF_GANG_TIMEOUT_S"],
    }
    assert int(env["RF_GANG_TIMEOUT_S"]) <= 600  # never gloo's 30-minute default
    assert rank_env(0, 2, 1, (2, 5))["CUDA_VISIBLE_DEVICES"] == "2,5"


def test_calls_still_reach_every_rank_once_the_pool_takes_no_work(gang: Any) -> None:
    """At interpreter exit concurrent.futures refuses new work; a script's exit hook still saves and closes."""
    gang._threads.shutdown(wait=True)  # as the interpreter's exit does to every pool
    assert str(gang.save_final(1)) == "/final/0"
    assert [r.calls for r in gang.generations[0]] == [[("save_final", 1)], [("save_final", 1)]]
    gang.close()
    assert all(r.closed for r in gang.generations[0])
