"""One run over several devices (issue 36): composite devices in the scheduler (names, leases, slots, placement,
the loop), with fakes only."""

from __future__ import annotations

import heapq
import random
import threading
from concurrent.futures import Future

import pytest

from kernel_scheduler import (
    Assignment,
    DeviceArbiter,
    DeviceView,
    FairPlacement,
    Op,
    OpKind,
    PlacedRun,
    RunStatus,
    Scheduler,
    SegmentResult,
    device_parts,
    device_width,
    overlaps,
    single_devices,
)
from kernel_scheduler.core import SchedulerCore
from kernel_scheduler.roster import DeviceRoster
from kernel_scheduler.slots import DeviceSlots
from rapidfire_nb.testing.fake_devices import FakeDevices, GangSpec, SegmentRecord
from rapidfire_nb.testing.fakes import FakeSpec, Recorder

S = RunStatus
P = FairPlacement()
G01 = "cpu:0+cpu:1"
G23 = "cpu:2+cpu:3"
TWO = ("cpu:0", "cpu:1", G01)
FOUR = ("cpu:0", "cpu:1", "cpu:2", "cpu:3", G01, G23)


# --- names ---


def test_device_parts_width_and_overlaps() -> None:
    assert device_parts(G01) == ("cpu:0", "cpu:1")
    assert device_parts("cpu:0") == ("cpu:0",)
    assert (device_width(G01), device_width("cuda:3")) == (2, 1)
    assert overlaps("cpu:0", G01) and overlaps(G01, "cpu:1") and overlaps(G01, G01)
    assert not overlaps("cpu:0", "cpu:1") and not overlaps(G01, G23) and not overlaps("cpu:2", G01)
    assert single_devices(FOUR) == ("cpu:0", "cpu:1", "cpu:2", "cpu:3")
    assert single_devices(("cpu:2+cpu:3", "cpu:0")) == ("cpu:2", "cpu:3", "cpu:0")


@pytest.mark.parametrize("name", ["cpu:0+", "+cpu:1", "", "cpu:0+cpu:0"])
def test_a_bad_device_name_raises_and_says_how_to_join_parts(name: str) -> None:
    with pytest.raises(ValueError, match="device name"):
        device_parts(name)


# --- the arbiter: a composite lease holds every part at once ---


def test_a_composite_lease_is_granted_all_at_once_and_first_come_first_served() -> None:
    arb = DeviceArbiter()
    grants: list[str] = []
    x = arb.request("x", device="cpu:1")
    gang = arb.request("g", on_grant=lambda: grants.append("g"), device=G01)
    assert x.granted and not gang.granted
    assert arb.holders("cpu:0") == [] and arb.holders(G01) == ["x"]  # the gang holds no part while it waits
    late = arb.request(
        "y", on_grant=lambda: grants.append("y"), device="cpu:0"
    )  # free, but the gang came first
    assert not late.granted and arb.waiting("cpu:0") == ["g", "y"]
    x.release()
    assert gang.granted and grants == ["g"] and arb.holders("cpu:1") == ["g"] == arb.holders("cpu:0")
    gang.release()
    assert late.granted and grants == ["g", "y"]
    other = arb.request("z", device=G23)  # shares no part: granted beside the others
    assert other.granted


def test_a_composite_request_waits_for_every_part_and_never_doubles_a_grant() -> None:
    rng = random.Random(3)
    arb = DeviceArbiter()
    names = ["cpu:0", "cpu:1", "cpu:2", "cpu:3", G01, G23, "cpu:1+cpu:2"]
    live: list = []
    for _ in range(2000):
        if live and rng.random() < 0.45:
            live.pop(rng.randrange(len(live))).release()
        else:
            live.append(arb.request(f"o{rng.randrange(3)}", device=rng.choice(names)))
        held = [lease for lease in live if lease.granted]
        parts = [p for lease in held for p in lease.parts]
        assert len(parts) == len(set(parts)), f"two leases hold one part: {held}"
        waiting = [lease for lease in live if not lease.granted]
        free = {p for n in names for p in device_parts(n)} - set(parts)
        if not held:  # nothing held: every request fits, none may wait
            assert waiting == []
        for lease in waiting[:1]:  # the first waiting one waits for a held part
            assert not set(lease.parts) <= free


# --- the device slots ---


def _slots(arb: DeviceArbiter, owner: str, devices: tuple[str, ...] = TWO) -> DeviceSlots:
    return DeviceSlots(devices, arb, owner, lambda: None)


def _future() -> Future[SegmentResult]:
    return Future()


def test_slots_a_device_is_busy_while_one_sharing_a_part_trains() -> None:
    slots = _slots(DeviceArbiter(), "x")
    slots.start(G01, 7, _future())
    assert slots.busy(G01) and slots.busy("cpu:0") and slots.busy("cpu:1")
    assert slots.running_ids() == {G01: 7, "cpu:0": 7, "cpu:1": 7}
    slots.end(G01)
    slots.start("cpu:1", 3, _future())
    assert slots.busy(G01) and slots.busy("cpu:1") and not slots.busy("cpu:0")
    assert slots.running_ids() == {"cpu:1": 3}


def test_slots_actions_of_a_composite_wait_for_its_parts_and_the_other_way() -> None:
    slots = _slots(DeviceArbiter(), "x")
    ran: list[str] = []
    slots.start("cpu:0", 1, _future())
    slots.queue(G01, lambda: ran.append(G01))
    slots.queue("cpu:1", lambda: ran.append("cpu:1"))
    slots.flush()
    assert ran == ["cpu:1"] and slots.pending(G01)
    slots.end("cpu:0")
    slots.release("cpu:0")
    slots.flush()
    assert ran == ["cpu:1"]  # its own idle lease of cpu:1 (the action just run) still holds a part
    assert slots.hold([G01]) == [G01]  # the next turn gives back the leases it does not use
    slots.flush()
    assert ran == ["cpu:1", G01]
    slots.start(G01, 2, _future())
    slots.queue("cpu:0", lambda: ran.append("cpu:0"))
    slots.flush()
    assert ran == ["cpu:1", G01] and slots.pending("cpu:0")


def test_hold_gives_back_unused_leases_so_two_schedulers_never_wait_for_each_other() -> None:
    arb = DeviceArbiter()
    x, y = _slots(arb, "x"), _slots(arb, "y")
    assert x.held("cpu:1")  # x ran an action on cpu:1 and keeps its lease, idle
    assert not y.held(G01)  # y's gang waits for cpu:1
    # x now wants cpu:0: it waits behind y's gang, which waits for x's idle cpu:1 -- unless x gives it back
    assert x.hold(["cpu:0"]) == []
    assert arb.holders("cpu:1") == ["y"] and y.held(G01) and y.hold([G01]) == [G01]
    y.release(G01)
    assert x.hold(["cpu:0"]) == ["cpu:0"]
    x.start("cpu:0", 1, _future())
    assert x.hold([]) == [] and arb.holders("cpu:0") == ["x"]  # a lease in use is kept


# --- placement ---


def r(
    run_id: int, device: str | None, done: int = 0, *, in_flight: bool = False, remaining: int = 0
) -> PlacedRun:
    return PlacedRun(run_id, S.ONGOING, done, device, True, in_flight, remaining)


def devs(*names: str, busy: tuple[str, ...] = (), dead: tuple[str, ...] = ()) -> list[DeviceView]:
    return [DeviceView(n, alive=n not in dead, busy=n in busy) for n in names]


def test_a_device_sharing_a_part_with_a_busy_one_gets_nothing() -> None:
    runs = [r(1, G01), r(2, "cpu:0"), r(3, "cpu:1")]
    assert DeviceView(G01).parts == ("cpu:0", "cpu:1")
    assert P.next_for(G01, devs(*TWO, busy=("cpu:1",)), runs) is None
    assert P.next_for("cpu:0", devs(*TWO, busy=(G01,)), runs) is None
    assert P.assign_free(devs(*TWO, busy=(G01,)), runs) == []
    assert P.assign_free(devs(*TWO, busy=("cpu:1",)), runs) == [Assignment(2, "cpu:0")]


def test_assign_free_never_gives_overlapping_devices_a_segment_in_one_turn() -> None:
    # the gang is furthest behind (or first by run id): it trains and both parts idle
    assert P.assign_free(devs(*TWO), [r(1, G01, 1), r(2, "cpu:0", 2), r(3, "cpu:1", 2)]) == [
        Assignment(1, G01)
    ]
    assert P.assign_free(devs(*TWO), [r(1, G01), r(2, "cpu:0"), r(3, "cpu:1")]) == [Assignment(1, G01)]
    # the single runs come first: both train, the gang waits its turn
    assert P.assign_free(devs(*TWO), [r(3, G01), r(1, "cpu:0"), r(2, "cpu:1")]) == [
        Assignment(1, "cpu:0"),
        Assignment(2, "cpu:1"),
    ]
    # a single run first on one part only: the other part trains its own, the gang waits
    assert P.assign_free(devs(*TWO), [r(2, G01), r(1, "cpu:0"), r(3, "cpu:1", 1)]) == [
        Assignment(1, "cpu:0"),
        Assignment(3, "cpu:1"),
    ]
    # four devices: the gang and the singles on the other pair all train at once
    runs = [r(1, G01), r(2, "cpu:2"), r(3, "cpu:3")]
    assert P.assign_free(devs(*FOUR), runs) == [
        Assignment(2, "cpu:2"),
        Assignment(3, "cpu:3"),
        Assignment(1, G01),
    ]


def test_no_takeover_across_widths_and_composites_never_take_over() -> None:
    # a free single device never takes a gang run from a busy or dead gang, nor a gang a single run
    gang_waits = [r(1, G23, in_flight=True), r(2, G23)]
    assert P.assign_free(devs(*FOUR, busy=(G23,)), gang_waits) == []
    assert P.assign_free(devs(*FOUR, dead=(G23,)), [r(2, G23)]) == []
    singles_wait = [r(1, "cpu:2", in_flight=True), r(2, "cpu:2"), r(3, None)]
    assert P.next_for(G01, devs(*FOUR, busy=("cpu:2",)), singles_wait) is None
    # single devices still take single runs over (from a busy device, or an unplaced run)
    out = P.assign_free(devs(*FOUR, busy=("cpu:2",)), singles_wait)
    assert out == [Assignment(2, "cpu:0", move_from="cpu:2"), Assignment(3, "cpu:1")]


def test_relocate_keeps_each_run_s_width() -> None:
    runs = [r(1, G01, remaining=10), r(2, "cpu:0", remaining=10), r(3, "cpu:3", remaining=30)]
    d = devs(*FOUR, dead=("cpu:0", G01))
    # the gang goes to the live gang, the single run to the live single device with the least work left
    assert P.relocate(d, runs) == [
        Assignment(1, G23, move_from=G01),
        Assignment(2, "cpu:1", move_from="cpu:0"),
    ]
    # no live gang left: the gang run gets no move (it stays lost); the single run still moves
    assert P.relocate(devs(*TWO, dead=("cpu:0", G01)), runs[:2]) == [
        Assignment(2, "cpu:1", move_from="cpu:0")
    ]


def test_place_new_by_width_and_by_the_work_on_shared_parts() -> None:
    runs = [r(1, G01, remaining=100), r(2, "cpu:2", remaining=10)]
    assert P.place_new(devs(*FOUR), runs, width=2) == G23  # 10 s on cpu:2 against 100 s on the other gang
    assert P.place_new(devs(*FOUR), runs) == "cpu:3"  # cpu:0 and cpu:1 share the gang's 100 s; cpu:2 has 10 s
    assert P.place_new(devs(*FOUR, dead=(G23, "cpu:3")), runs, width=2) == G01
    with pytest.raises(ValueError, match="no live device of 3 parts"):
        P.place_new(devs(*FOUR), runs, width=3)
    with pytest.raises(ValueError, match="width must be 1 or more"):
        P.place_new(devs(*FOUR), runs, width=0)


def test_assign_free_with_gangs_randomized() -> None:
    rng = random.Random(11)
    for _ in range(400):
        d = [DeviceView(n, alive=rng.random() > 0.1, busy=rng.random() < 0.2) for n in FOUR]
        runs = [
            r(i, rng.choice([*FOUR, None]), rng.randint(0, 3), in_flight=rng.random() < 0.2)
            for i in range(1, rng.randint(0, 10) + 1)
        ]
        out = P.assign_free(d, runs)
        busy = [v.name for v in d if v.busy]
        by_id = {x.run_id: x for x in runs}
        for i, a in enumerate(out):
            assert not any(overlaps(a.device, b) for b in busy), (a, busy)
            assert not any(overlaps(a.device, b.device) for b in out[i + 1 :]), out
            home = by_id[a.run_id].device
            assert device_width(a.device) == (device_width(home) if home else 1)
            assert a.move_from is None or device_width(a.device) == 1


# --- a pure simulation on a fake clock ---


def _simulate(devices: tuple[str, ...], homes: dict[int, str], chunks: int = 6) -> tuple[float, int, list]:
    """Runs train ``chunks`` chunks of 1 s each through ``assign_free``; returns the clock, the most segments in
    flight at once and the starts ``(run, chunks done before)``, checking fairness and exclusion at each start."""
    done = dict.fromkeys(homes, 0)
    flying: dict[int, str] = {}
    ends: list[tuple[float, int]] = []
    clock, most, starts = 0.0, 0, []
    while True:
        views = [DeviceView(n, busy=n in flying.values()) for n in devices]
        status = {i: S.ONGOING if done[i] < chunks else S.COMPLETED for i in homes}
        runs = [PlacedRun(i, status[i], done[i], homes[i], in_flight=i in flying) for i in homes]
        for a in P.assign_free(views, runs):
            active = [done[i] for i in homes if status[i].in_rotation()]
            assert done[a.run_id] <= min(active) + 1, "fairness broken"
            assert not any(overlaps(a.device, f) for f in flying.values()), "overlapping segments"
            assert a.move_from is None and a.device == homes[a.run_id]
            flying[a.run_id] = a.device
            starts.append((a.run_id, done[a.run_id]))
            heapq.heappush(ends, (clock + 1.0, a.run_id))
        most = max(most, len(flying))
        if not ends:
            break
        clock, run = heapq.heappop(ends)
        del flying[run]
        done[run] += 1
    assert all(v == chunks for v in done.values())
    return clock, most, starts


def test_simulation_two_devices_the_gang_waits_its_turn_and_is_never_starved() -> None:
    clock, most, starts = _simulate(TWO, {1: G01, 2: "cpu:0", 3: "cpu:1"})
    assert most == 2 and clock == 12.0  # 6 chunks of the gang alone, 6 of the two singles side by side
    # the singles run ahead while a part is free (each start within one chunk of the gang), then wait: both
    # parts idle and the gang trains until it has caught up: G, (A B) x3, G x3, (A B) x3, G x2
    gang = [i for i, (run, _) in enumerate(starts) if run == 1]
    assert gang == [0, 7, 8, 9, 16, 17]


def test_simulation_four_devices_the_gang_and_two_singles_train_at_once() -> None:
    clock, most, _ = _simulate(FOUR, {1: G01, 2: "cpu:2", 3: "cpu:3"})
    assert (clock, most) == (6.0, 3)


# --- the loop, with a fake executor ---


def _fair(schedule: list[SegmentRecord], runs: int) -> list[str]:
    done = dict.fromkeys(range(1, runs + 1), 0)
    out = []
    for rec in sorted(schedule, key=lambda x: x.start):
        floor = min(done.values())
        if rec.segments_done > floor + 1:
            out.append(f"run {rec.run_id} started chunk {rec.segments_done} while a run had done {floor}")
        done[rec.run_id] = max(done[rec.run_id], rec.segments_done + 1)
    return out


def _clashes(schedule: list[SegmentRecord]) -> list[tuple[SegmentRecord, SegmentRecord]]:
    """Segments on devices sharing a part that trained at the same time."""
    return [
        (a, b)
        for i, a in enumerate(schedule)
        for b in schedule[i + 1 :]
        if overlaps(a.device, b.device) and a.start < b.end and b.start < a.end
    ]


def _most_at_once(schedule: list[SegmentRecord]) -> int:
    return max(sum(1 for b in schedule if b.start <= a.start < b.end) for a in schedule)


def _gang_and_singles(
    devices: tuple[str, ...], sps: float, arbiter: DeviceArbiter | None = None, owner: str = "g"
):
    fake = FakeDevices(devices, num_chunks=4, seconds_per_step=dict.fromkeys(devices, sps))
    rec = Recorder()
    sched = Scheduler(fake, listener=rec, idle_poll_s=0.002, arbiter=arbiter or DeviceArbiter(), owner=owner)
    sched.add_run(1, GangSpec(rows=32, batch=4))  # 8 steps, 4 chunks of 2
    sched.add_run(2, FakeSpec(rows=32, batch=4))
    sched.add_run(3, FakeSpec(rows=32, batch=4))
    return sched, fake, rec


def test_loop_two_devices_a_gang_and_two_singles_take_turns_fairly() -> None:
    sched, fake, rec = _gang_and_singles(TWO, 0.005)
    states: list[dict[str, str]] = []
    first = rec.on_run

    def watch(snap):  # on the scheduler thread, right after a segment starts
        first(snap)
        if snap.on_device and not states:
            states.append(sched.device_states())

    rec.on_run = watch
    sched.start()
    assert sched.wait(timeout=30)
    sched.close(5)
    snaps = sched.snapshot()
    assert [s.status for s in snaps] == [S.COMPLETED] * 3 and [s.segments_done for s in snaps] == [4] * 3
    assert [s.device for s in snaps] == [G01, "cpu:0", "cpu:1"]
    assert len(fake.schedule) == 12 and fake.violations == []
    assert _fair(fake.schedule, 3) == [] and _clashes(fake.schedule) == []
    assert [x.device for x in fake.schedule if x.run_id == 1] == [G01] * 4
    assert states == [{"cpu:0": "training run 1", "cpu:1": "training run 1"}]  # the gang goes first (run 1)


def test_loop_four_devices_the_gang_and_two_singles_train_at_once() -> None:
    sched, fake, _ = _gang_and_singles(FOUR, 0.02)
    sched.start()
    assert sched.wait(timeout=30)
    sched.close(5)
    assert [s.device for s in sched.snapshot()] == [G01, "cpu:2", "cpu:3"]
    assert [s.status for s in sched.snapshot()] == [S.COMPLETED] * 3
    assert fake.violations == [] and _clashes(fake.schedule) == [] and _fair(fake.schedule, 3) == []
    assert _most_at_once(fake.schedule) == 3


def test_two_experiments_share_the_parts_without_deadlock_or_overlap() -> None:
    arb = DeviceArbiter()
    one, fake1, _ = _gang_and_singles(TWO, 0.003, arb, "one")
    two, fake2, _ = _gang_and_singles(TWO, 0.003, arb, "two")
    one.start()
    two.start()
    assert one.wait(timeout=60) and two.wait(timeout=60)
    one.close(5)
    two.close(5)
    assert {s.status for s in one.snapshot() + two.snapshot()} == {S.COMPLETED}
    assert fake1.violations == [] == fake2.violations
    assert _clashes(fake1.schedule + fake2.schedule) == []  # never two segments on one part, any experiment
    assert arb.holders(G01) == [] and arb.waiting(G01) == []


def test_a_clone_of_a_gang_run_is_built_on_a_gang_and_trains() -> None:
    sched, fake, _ = _gang_and_singles(FOUR, 0.005)
    sched.start()
    assert sched.wait(timeout=30, chunks=1)
    ack = sched.submit(Op(OpKind.CLONE, run_id=1, payload={"spec": GangSpec(rows=32, batch=4)}))
    assert sched.wait(timeout=30)
    sched.close(5)
    child = sched.run_snapshot(ack.new_run_id)
    assert child is not None and child.status is S.COMPLETED and device_width(child.device) == 2
    assert fake.violations == [] and _clashes(fake.schedule) == []


def test_a_clone_needing_a_gang_fails_clearly_where_there_is_none() -> None:
    fake = FakeDevices(("d0", "d1"), num_chunks=4)
    sched = Scheduler(fake, listener=Recorder(), idle_poll_s=0.002, arbiter=DeviceArbiter(), owner="x")
    sched.add_run(1, FakeSpec(rows=32, batch=4))
    sched.start()
    ack = sched.submit(Op(OpKind.CLONE, run_id=1, payload={"spec": GangSpec(rows=32, batch=4)}))
    assert sched.wait(timeout=30)
    sched.close(5)
    child = sched.run_snapshot(ack.new_run_id)
    assert child is not None and child.status is S.FAILED
    assert "no live device of 2 parts" in (child.error or "")
    assert sched.run_snapshot(1).status is S.COMPLETED


def test_a_gang_whose_part_dies_moves_to_a_live_gang() -> None:
    sched, fake, rec = _gang_and_singles(FOUR, 0.01)
    killed = threading.Event()
    first = rec.on_run

    def kill_at_chunk_2(snap):
        first(snap)
        if not killed.is_set() and snap.run_id == 1 and snap.on_device and snap.segments_done == 2:
            killed.set()
            fake.kill("cpu:1")

    rec.on_run = kill_at_chunk_2
    sched.start()
    assert sched.wait(timeout=30)
    sched.close(5)
    assert killed.is_set()
    assert [s.status for s in sched.snapshot()] == [S.COMPLETED] * 3
    assert sched.run_snapshot(1).device == G23
    assert [m[:3] for m in fake.moves if m[0] == 1] == [(1, G01, G23)]
    assert all(device_width(src) == device_width(dst) for _, src, dst, _ in fake.moves)  # width kept
    assert [v for v in fake.violations if "dead" in v] == [] and _clashes(fake.schedule) == []
    assert sched.device_states()["cpu:1"] == "lost" and sched.device_states()["cpu:0"] == "idle"


def test_a_gang_run_with_no_live_gang_left_stays_interrupted_and_the_user_is_told() -> None:
    sched, fake, rec = _gang_and_singles(TWO, 0.01)
    killed = threading.Event()
    first = rec.on_run

    def kill_at_chunk_1(snap):
        first(snap)
        if not killed.is_set() and snap.run_id == 1 and snap.on_device and snap.segments_done == 1:
            killed.set()
            fake.kill("cpu:1")

    rec.on_run = kill_at_chunk_1
    sched.start()
    assert sched.wait(timeout=30)
    sched.close(5)
    snaps = {s.run_id: s for s in sched.snapshot()}
    assert snaps[1].status is S.INTERRUPTED and snaps[1].device == G01
    assert snaps[2].status is S.COMPLETED and snaps[3].status is S.COMPLETED and snaps[3].device == "cpu:0"
    assert sum("no live device of 2 parts" in n for n in rec.notes) == 1
    assert sched.halted is None


# --- the roster ---


class _OnlyGangs(FakeDevices):
    def width_of(self, spec: object) -> int:
        return int(getattr(spec, "width", 1)) if not isinstance(spec, str) else 0


def _roster(devices: tuple[str, ...]) -> tuple[DeviceRoster, SchedulerCore, FakeDevices]:
    fake = _OnlyGangs(devices)
    core = SchedulerCore(fake, Recorder(), DeviceSlots(fake.devices, DeviceArbiter(), "t", lambda: None))
    return DeviceRoster(core, lambda reason: None), core, fake


def test_roster_states_list_single_devices_and_the_parts_of_a_training_gang() -> None:
    roster, core, fake = _roster((G01, "cpu:2"))  # cpu:0 and cpu:1 only as a gang's parts
    assert roster.states() == {"cpu:0": "idle", "cpu:1": "idle", "cpu:2": "idle"}
    core.slots.start(G01, 5, _future())
    assert roster.states() == {"cpu:0": "training run 5", "cpu:1": "training run 5", "cpu:2": "idle"}
    assert [v.busy for v in roster.device_views()] == [True, False]
    core.slots.end(G01)
    fake.kill("cpu:0")
    assert roster.states() == {"cpu:0": "lost", "cpu:1": "lost", "cpu:2": "idle"}


def test_roster_places_new_runs_by_width_and_checks_the_executor_s_width() -> None:
    roster, _, fake = _roster(FOUR)
    assert roster.place_new() == "cpu:0" and roster.place_new(2) == G01
    assert roster.width_of(GangSpec()) == 2 and roster.width_of(FakeSpec()) == 1
    with pytest.raises(ValueError, match="width_of must return an int of 1 or more"):
        roster.width_of("bad")
    with pytest.raises(ValueError, match="no live device of 3 parts"):
        roster.place_new(3)
    for d in FOUR:
        fake.kill(d)
    assert roster.place_new(2) == G01  # none alive: the build fails with the executor's own error


class _Reviving(FakeDevices):
    """A gang that dies is restarted on new workers (``DevicePool.revive`` with a ``GangExecutor``)."""

    revived: list[str] = []

    def revive(self, device: str) -> bool:
        with self.lock:
            self.dead.discard(device)
        self.revived.append(device)
        return True


def test_a_dead_gang_is_revived_and_its_run_continues_there_from_its_checkpoint() -> None:
    fake = _Reviving(TWO, num_chunks=4, seconds_per_step=dict.fromkeys(TWO, 0.01))
    fake.revived = []
    rec = Recorder()
    sched = Scheduler(fake, listener=rec, idle_poll_s=0.002, arbiter=DeviceArbiter(), owner="r")
    sched.add_run(1, GangSpec(rows=32, batch=4))
    sched.add_run(2, FakeSpec(rows=32, batch=4))
    killed = threading.Event()
    first = rec.on_run

    def kill_gang_at_chunk_2(snap):
        first(snap)
        if not killed.is_set() and snap.run_id == 1 and snap.on_device and snap.segments_done == 2:
            killed.set()
            fake.kill(G01)  # one rank died: the gang (only) is lost

    rec.on_run = kill_gang_at_chunk_2
    sched.start()
    assert sched.wait(timeout=30)
    sched.close(5)
    assert killed.is_set() and fake.revived == [G01]
    assert [s.status for s in sched.snapshot()] == [S.COMPLETED, S.COMPLETED]
    assert sched.run_snapshot(1).device == G01
    assert [m[:3] for m in fake.moves if m[0] == 1] == [(1, G01, G01)]  # back onto the restarted gang
    assert any("its gang was restarted on new workers, and run(s) 1 continue there" in n for n in rec.notes)
    assert any(n.startswith(f"run 1 resumed on {G01} (new workers) at step") for n in rec.notes), rec.notes
    assert not any("no live device of 2 parts" in n for n in rec.notes)
    assert _clashes(fake.schedule) == [] and [v for v in fake.violations if "dead" in v] == []
