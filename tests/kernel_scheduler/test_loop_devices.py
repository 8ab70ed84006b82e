"""The scheduler over several devices (fake executor with simulated step times; no torch)."""

from __future__ import annotations

import time

from kernel_scheduler import DeviceArbiter, Op, OpKind, RunStatus, Scheduler
from rapidfire_nb.testing.fake_devices import FakeDevices, SegmentRecord
from rapidfire_nb.testing.fakes import FakeSpec, Recorder

S = RunStatus


def _scheduler(fake: FakeDevices, n: int, spec: FakeSpec | None = None) -> tuple[Scheduler, Recorder]:
    rec = Recorder()
    sched = Scheduler(fake, listener=rec, idle_poll_s=0.002, arbiter=DeviceArbiter(), owner="multi")
    for run_id in range(1, n + 1):
        sched.add_run(run_id, spec or FakeSpec(rows=32, batch=4))  # 8 steps, 4 chunks of 2
    return sched, rec


def _fair(schedule: list[SegmentRecord], runs: int) -> list[str]:
    """Breaches of "no active run more than one chunk ahead of another", replayed from the recorded starts."""
    done = dict.fromkeys(range(1, runs + 1), 0)
    out = []
    for rec in sorted(schedule, key=lambda r: r.start):
        floor = min(done.values())
        if rec.segments_done > floor + 1:
            out.append(f"run {rec.run_id} started chunk {rec.segments_done} while a run had done {floor}")
        done[rec.run_id] = max(done[rec.run_id], rec.segments_done + 1)
    return out


def _overlaps(schedule: list[SegmentRecord]) -> int:
    """Pairs of segments on different devices that trained at the same time."""
    return sum(
        1
        for i, a in enumerate(schedule)
        for b in schedule[i + 1 :]
        if a.device != b.device and a.start < b.end and b.start < a.end
    )


def test_two_devices_train_four_runs_at_once_and_fairly():
    fake = FakeDevices(("d0", "d1"), num_chunks=4, seconds_per_step={"d0": 0.01, "d1": 0.01})
    sched, _ = _scheduler(fake, 4)
    sched.start()
    assert sched.wait(timeout=20)
    sched.close(5)
    snaps = sched.snapshot()
    assert [s.status for s in snaps] == [S.COMPLETED] * 4
    assert {s.device for s in snaps} == {"d0", "d1"}  # runs stick to where they were added (2 each)
    assert len(fake.schedule) == 16 and fake.violations == []
    assert {r.device for r in fake.schedule} == {"d0", "d1"}
    assert _fair(fake.schedule, 4) == []
    assert _overlaps(fake.schedule) >= 8  # the devices trained at the same time
    assert fake.moves == []  # equal speeds: nobody had to be taken over


def test_a_slow_device_hands_runs_to_the_fast_one_and_fairness_holds():
    fake = FakeDevices(("d0", "d1"), num_chunks=4, seconds_per_step={"d0": 0.002, "d1": 0.02})
    sched, _ = _scheduler(fake, 4)
    sched.start()
    assert sched.wait(timeout=30)
    sched.close(5)
    assert [s.status for s in sched.snapshot()] == [S.COMPLETED] * 4
    assert fake.violations == [] and _fair(fake.schedule, 4) == []
    assert fake.moves, "the fast device never took a run over"
    assert all(src == "d1" and dst == "d0" for _, src, dst, _ in fake.moves)
    on_fast = sum(1 for r in fake.schedule if r.device == "d0")
    assert on_fast > 8  # more than its half of the 16 chunks


def test_a_device_that_dies_hands_its_runs_over_and_they_rewind_to_their_checkpoint():
    fake = FakeDevices(
        ("d0", "d1"), num_chunks=4, seconds_per_step={"d0": 0.01, "d1": 0.01}, checkpoint_lag=1
    )
    sched, rec = _scheduler(fake, 4)
    killed = []

    def kill_when_d1_trains_chunk_2(snap):  # listener hook: runs on the scheduler thread
        if not killed and snap.device == "d1" and snap.on_device and snap.segments_done == 2:
            killed.append(snap.run_id)
            fake.kill("d1")

    rec.on_run = _chain(rec.on_run, kill_when_d1_trains_chunk_2)
    rewound: list[tuple[int, int]] = []
    rec.on_rewound = lambda snap, step: rewound.append((snap.run_id, step))
    sched.start()
    assert sched.wait(timeout=30)
    sched.close(5)
    snaps = sched.snapshot()
    assert killed, "the kill never happened"
    assert [s.status for s in snaps] == [S.COMPLETED] * 4
    assert {s.device for s in snaps} == {"d0"}
    lost = {rid for rid, src, _, _ in fake.moves if src == "d1"}
    assert lost == {s.run_id for s in snaps if s.run_id in {2, 4}}  # d1's two runs moved
    assert sorted(rid for rid, _ in rewound) == sorted(lost)
    assert all(step < 8 for _, step in rewound)
    statuses = rec.statuses(killed[0])
    assert S.INTERRUPTED in statuses and statuses[-1] is S.COMPLETED
    assert any("died" in note for note in rec.notes)
    assert [v for v in fake.violations if "dead" in v] == []


def test_when_every_device_dies_training_halts_and_runs_are_interrupted():
    fake = FakeDevices(("d0", "d1"), num_chunks=4, seconds_per_step={"d0": 0.05, "d1": 0.05})
    sched, _ = _scheduler(fake, 2)
    sched.start()
    for _ in range(500):
        if len(fake.inflight) == 2:
            break
        time.sleep(0.01)
    fake.kill("d0")
    fake.kill("d1")
    assert sched.wait(timeout=10)
    sched.close(5)
    assert sched.halted is not None and "died" in sched.halted
    assert {s.status for s in sched.snapshot()} <= {S.INTERRUPTED, S.NEW}


def test_clones_go_to_the_parent_device_warm_and_where_least_work_remains_cold():
    fake = FakeDevices(("d0", "d1"), num_chunks=4, seconds_per_step={"d0": 0.01, "d1": 0.01})
    sched, _ = _scheduler(fake, 3)  # d0: runs 1, 3; d1: run 2
    sched.start()
    assert sched.wait(timeout=20, chunks=1)
    warm = sched.submit(
        Op(OpKind.CLONE, run_id=1, payload={"spec": FakeSpec(rows=32, batch=4), "warm_start": True})
    )
    cold = sched.submit(Op(OpKind.CLONE, run_id=1, payload={"spec": FakeSpec(rows=32, batch=4)}))
    assert sched.wait(timeout=30)
    sched.close(5)
    added = {e[1]: e for e in fake.events if e[0] == "add_run"}
    _, _, built_on, warm_from, asked = added[warm.new_run_id]
    assert warm_from == 1 and asked == built_on  # the scheduler asked for the parent's device (its snapshot)
    assert added[cold.new_run_id][4] in ("d0", "d1")  # placed by the scheduler (least work: test_placement)
    assert {s.status for s in sched.snapshot()} == {S.COMPLETED}
    assert fake.violations == []


def test_stop_and_resume_across_devices():
    fake = FakeDevices(("d0", "d1"), num_chunks=4, seconds_per_step={"d0": 0.01, "d1": 0.01})
    sched, _ = _scheduler(fake, 4)
    sched.start()
    stop = sched.submit(Op(OpKind.STOP, run_id=2))
    assert sched.wait(timeout=20)
    assert sched.run_snapshot(2).status is S.STOPPED and stop.run_id == 2
    sched.submit(Op(OpKind.RESUME, run_id=2))
    assert sched.wait(timeout=20)
    sched.close(5)
    assert [s.status for s in sched.snapshot()] == [S.COMPLETED] * 4
    assert ("on_status", 2, "STOPPED") in fake.events and fake.violations == []


def test_device_states_name_what_each_device_does():
    fake = FakeDevices(("d0", "d1"), num_chunks=4, seconds_per_step={"d0": 0.01, "d1": 0.01})
    sched, _ = _scheduler(fake, 2)
    assert sched.devices == ("d0", "d1")
    assert sched.device_states() == {"d0": "idle", "d1": "idle"}
    fake.kill("d1")
    assert sched.device_states()["d1"] == "lost"
    sched.close(1)


def _chain(first, second):
    def both(snap):
        first(snap)
        second(snap)

    return both


def test_with_early_stopping_no_run_trains_past_a_rung_that_prunes_it():
    """Runs wait at a rung until every run reached it (several devices could otherwise run a chunk ahead)."""
    from kernel_scheduler import SuccessiveHalving

    # 8 steps, 4 chunks of 2; rungs at chunks 1 and 2 (eta 2): the worse half is pruned at each
    curves = {
        1: (1.0, 0.9, 0.8, 0.7),
        2: (2.0, 1.9, 1.8, 1.7),
        3: (1.5, 1.4, 1.3, 1.2),
        4: (3.0, 2.9, 2.8, 2.7),
    }
    fake = FakeDevices(
        ("d0", "d1"), num_chunks=4, seconds_per_step={"d0": 0.002, "d1": 0.02}
    )  # d1 10x slower
    rec = Recorder()
    sched = Scheduler(
        fake,
        listener=rec,
        idle_poll_s=0.002,
        arbiter=DeviceArbiter(),
        owner="es",
        early_stopping=SuccessiveHalving(metric="eval_loss", mode="min", reduction_factor=2, grace_chunks=1),
    )
    for run_id, curve in curves.items():
        sched.add_run(run_id, FakeSpec(rows=32, batch=4, curve=curve))
    sched.start()
    assert sched.wait(timeout=30)
    sched.close(5)
    snaps = {s.run_id: s for s in sched.snapshot()}
    assert snaps[1].status is S.COMPLETED
    pruned = {rid: s for rid, s in snaps.items() if s.pruned}
    assert set(pruned) == {2, 3, 4}
    for rid, snap in pruned.items():
        at = int(snap.stop_reason.split("chunk ")[1].split("/")[0])
        assert snap.segments_done == at, (
            f"run {rid} pruned at chunk {at} but trained {snap.segments_done} chunks"
        )
    assert fake.violations == []


def test_a_warm_clone_asked_mid_chunk_waits_when_its_parent_s_worker_dies():
    """Issue 34 item 3: a warm clone of run 2 asked mid-chunk, then run 2's worker killed: the clone failed with
    "run 2 has no completed chunk to warm-start from and is INTERRUPTED". It waits for run 2's next boundary on
    the device run 2 moves to, as it would without the fault, and starts there."""
    fake = FakeDevices(("d0", "d1"), num_chunks=4, seconds_per_step={"d0": 0.01, "d1": 0.05})
    sched, rec = _scheduler(fake, 2)  # run 1 on d0, run 2 on d1
    asked: list[int] = []

    def clone_then_kill(snap):  # listener hook, on the scheduler thread: run 2 starts its chunk 2 on d1
        if not asked and snap.run_id == 2 and snap.on_device and snap.segments_done == 1:
            ack = sched.submit(
                Op(OpKind.CLONE, run_id=2, payload={"spec": FakeSpec(rows=32, batch=4), "warm_start": True})
            )
            asked.append(ack.new_run_id)
            fake.kill("d1")

    rec.on_run = _chain(rec.on_run, clone_then_kill)
    sched.start()
    assert sched.wait(timeout=30)
    sched.close(5)
    assert asked, "the clone was never asked"
    child = sched.run_snapshot(asked[0])
    assert child is not None and child.error is None, child
    assert [s.status for s in sched.snapshot()] == [S.COMPLETED] * 3
    assert (child.parent_id, child.warm_start, child.device) == (2, True, "d0")
    moved = [m for m in fake.moves if m[0] == 2]
    assert moved and moved[0][1:3] == ("d1", "d0")
    built = [e for e in fake.events if e[0] == "add_run" and e[1] == asked[0]]
    assert built == [("add_run", asked[0], "d0", 2, "d0")]  # warm from run 2, on the device it moved to
    assert fake.steps[asked[0]] == 8 and [v for v in fake.violations if "dead" in v] == []
