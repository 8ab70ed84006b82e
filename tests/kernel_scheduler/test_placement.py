"""Multi-device placement (kernel_scheduler.placement): sticky runs, fairness across devices, takeover, new runs."""

from __future__ import annotations

import heapq
import random

import pytest

from kernel_scheduler import Assignment, DeviceView, FairPlacement, PlacedRun, RunStatus

S = RunStatus
P = FairPlacement()


def r(
    run_id: int,
    device: str | None,
    done: int = 0,
    *,
    status: RunStatus = S.ONGOING,
    ready: bool = True,
    in_flight: bool = False,
    remaining: int = 0,
    sps: float | None = None,
) -> PlacedRun:
    return PlacedRun(run_id, status, done, device, ready, in_flight, remaining, sps)


def devs(*names: str, busy: tuple[str, ...] = (), dead: tuple[str, ...] = ()) -> list[DeviceView]:
    return [DeviceView(n, alive=n not in dead, busy=n in busy) for n in names]


# --- next_for: sticky, furthest behind, the invariant ---


def test_sticky_each_device_trains_its_own_runs() -> None:
    runs = [r(1, "A"), r(2, "B"), r(3, "A")]
    assert P.next_for("B", devs("A", "B"), runs) == Assignment(2, "B")
    assert P.next_for("A", devs("A", "B"), runs) == Assignment(1, "A")


def test_run_one_chunk_behind_is_preferred() -> None:
    runs = [r(1, "A", 2), r(2, "A", 1), r(3, "A", 2)]
    assert P.next_for("A", devs("A"), runs) == Assignment(2, "A")


def test_ties_by_run_id() -> None:
    runs = [r(4, "A", 1), r(2, "A", 1), r(3, "A", 1)]
    assert P.next_for("A", devs("A"), runs) == Assignment(2, "A")


def test_invariant_four_runs_on_two_devices() -> None:
    # run 4 trains chunk 0 on B; runs 1-3 have done chunk 0 (segments_done 1)
    d = devs("A", "B", busy=("B",))
    in_flight = r(4, "B", 0, in_flight=True)
    # runs 1-3 may start chunk 1: A trains its own first
    assert P.next_for("A", d, [r(1, "A", 1), r(2, "A", 1), r(3, "B", 1), in_flight]) == Assignment(1, "A")
    # A's own runs already did chunk 1 (done 2 = floor 0 + 2): not allowed; run 3 (B busy) may start chunk 1
    runs = [r(1, "A", 2), r(2, "A", 2), r(3, "B", 1), in_flight]
    assert P.next_for("A", d, runs) == Assignment(3, "A", move_from="B")
    # nobody may start chunk 2 while run 4 is still in chunk 0
    assert P.next_for("A", d, [r(1, "A", 2), r(2, "A", 2), r(3, "B", 2), in_flight]) is None


def test_in_flight_run_counts_with_its_segments_done_before_the_segment_ends() -> None:
    # run 1 is in flight at 0: run 2 at 2 may not start even though run 1 is nearly done with chunk 0
    runs = [r(1, "A", 0, in_flight=True), r(2, "B", 2)]
    assert P.next_for("B", devs("A", "B", busy=("A",)), runs) is None
    assert P.next_for("B", devs("A", "B", busy=("A",)), [r(1, "A", 1, in_flight=True), r(2, "B", 2)]) == (
        Assignment(2, "B")
    )


def test_busy_or_dead_device_gets_nothing() -> None:
    runs = [r(1, "A"), r(2, "B")]
    assert P.next_for("A", devs("A", "B", busy=("A",)), runs) is None
    assert P.next_for("A", devs("A", "B", dead=("A",)), runs) is None


def test_unknown_device_and_duplicates_raise() -> None:
    with pytest.raises(ValueError, match="unknown device 'C'"):
        P.next_for("C", devs("A", "B"), [r(1, "A")])
    with pytest.raises(ValueError, match="listed twice"):
        P.next_for("A", devs("A", "A"), [r(1, "A")])
    with pytest.raises(ValueError, match="run 1 is listed twice"):
        P.assign_free(devs("A"), [r(1, "A"), r(1, "A")])


# --- takeover ---


def test_no_takeover_from_a_free_live_device() -> None:
    runs = [r(3, "B"), r(4, "B")]
    assert P.next_for("A", devs("A", "B"), runs) is None


def test_takeover_from_a_busy_device() -> None:
    runs = [r(3, "B", in_flight=True), r(4, "B")]
    assert P.next_for("A", devs("A", "B", busy=("B",)), runs) == Assignment(4, "A", move_from="B")


def test_takeover_from_a_dead_device() -> None:
    runs = [r(3, "B"), r(4, "B")]
    assert P.next_for("A", devs("A", "B", dead=("B",)), runs) == Assignment(3, "A", move_from="B")


def test_run_on_a_device_not_listed_counts_as_dead() -> None:
    assert P.next_for("A", devs("A"), [r(3, "gone")]) == Assignment(3, "A", move_from="gone")


def test_never_takes_a_run_in_flight() -> None:
    runs = [r(3, "B", in_flight=True)]
    assert P.next_for("A", devs("A", "B", busy=("B",)), runs) is None
    assert (
        P.next_for("A", devs("A", "B", dead=("B",)), runs) is None
    )  # died mid-segment: the caller ends it first


def test_own_runs_before_takeover_even_when_further_ahead() -> None:
    runs = [r(1, "A", 1), r(3, "B", 0, in_flight=True), r(4, "B", 0)]
    assert P.next_for("A", devs("A", "B", busy=("B",)), runs) == Assignment(1, "A")


def test_takeover_furthest_behind_then_most_waiting_then_run_id() -> None:
    d = devs("A", "B", "C", busy=("B", "C"))
    base = [r(10, "B", 0, in_flight=True), r(11, "C", 0, in_flight=True)]
    # furthest behind wins over the busier device
    assert P.next_for("A", d, [*base, r(2, "B", 0), r(3, "C", 1), r(4, "C", 1)]) == Assignment(2, "A", "B")
    # at equal segments_done: from the device with the most runs waiting
    assert P.next_for("A", d, [*base, r(2, "B", 1), r(3, "C", 1), r(4, "C", 1)]) == Assignment(3, "A", "C")
    # then by run id
    assert P.next_for("A", d, [*base, r(5, "B", 1), r(3, "C", 1)]) == Assignment(3, "A", "C")


def test_unplaced_run_goes_to_a_device_with_nothing_else() -> None:
    d = devs("A", "B")
    assert P.next_for("A", d, [r(1, "A", 1), r(2, None, 0)]) == Assignment(1, "A")
    assert P.next_for("B", d, [r(1, "A", 1), r(2, None, 0)]) == Assignment(2, "B")


# --- statuses and readiness ---


def test_runs_not_in_rotation_are_ignored() -> None:
    runs = [
        r(1, "A", 0, status=S.STOPPED),
        r(2, "A", 0, status=S.COMPLETED),
        r(3, "A", 0, status=S.FAILED),
        r(4, "A", 0, status=S.INTERRUPTED),
        r(5, "A", 0, status=S.DELETED),
        r(6, "A", 3),
        r(7, "A", 4, status=S.NEW),
    ]
    # the parked run at 0 neither trains nor holds the others back
    assert P.next_for("A", devs("A"), runs) == Assignment(6, "A")
    assert P.next_for("A", devs("A"), runs[:5]) is None


def test_late_joiner_alone_may_train() -> None:
    runs = [r(1, "A", 5), r(2, "B", 5), r(3, "C", 5), r(9, "B", 0, status=S.NEW)]
    assert P.assign_free(devs("A", "B", "C"), runs) == [Assignment(9, "B")]
    # ... until it has caught up to one chunk behind
    assert P.assign_free(devs("A", "B", "C"), [*runs[:3], r(9, "B", 4)]) == [
        Assignment(1, "A"),
        Assignment(9, "B"),
        Assignment(3, "C"),
    ]


def test_clone_not_ready_does_not_hold_the_others_back() -> None:
    runs = [r(1, "A", 5), r(9, "A", 0, ready=False)]
    assert P.next_for("A", devs("A"), runs) == Assignment(1, "A")


# --- assign_free ---


def test_assign_free_every_free_device_then_takeover_from_a_device_given_a_run() -> None:
    runs = [r(1, "A"), r(2, "A"), r(3, "C", in_flight=True)]
    # A trains 1; B has nothing and takes 2 from A, now busy; C is busy
    assert P.assign_free(devs("A", "B", "C", busy=("C",)), runs) == [
        Assignment(1, "A"),
        Assignment(2, "B", move_from="A"),
    ]


def test_assign_free_takeover_waits_for_every_device_own_pass() -> None:
    # B comes first but has nothing: it takes A's second run only once A has been given its first
    runs = [r(1, "A", 0), r(2, "A", 0)]
    assert P.assign_free(devs("B", "A"), runs) == [Assignment(1, "A"), Assignment(2, "B", move_from="A")]
    assert P.next_for("B", devs("B", "A"), runs) is None  # alone, B may not take from a free A


def test_assign_free_nothing_to_do() -> None:
    assert P.assign_free(devs("A", "B"), []) == []
    assert P.assign_free(devs("A", "B", busy=("A", "B")), [r(1, "A"), r(2, "B")]) == []


def _floor(runs: list[PlacedRun]) -> int:
    return min(x.segments_done for x in runs if x.ready and x.status.in_rotation())


def test_assign_free_never_twice_and_only_allowed_runs_randomized() -> None:
    rng = random.Random(7)
    names = ["A", "B", "C", "D"]
    statuses = [S.ONGOING, S.ONGOING, S.ONGOING, S.NEW, S.STOPPED, S.COMPLETED]
    for _ in range(500):
        d = [DeviceView(n, alive=rng.random() > 0.15, busy=rng.random() < 0.3) for n in names]
        runs = [
            r(
                i,
                rng.choice([*names, None]),
                rng.randint(0, 3),
                status=rng.choice(statuses),
                ready=rng.random() > 0.1,
                in_flight=rng.random() < 0.2,
            )
            for i in range(1, rng.randint(0, 12) + 1)
        ]
        out = P.assign_free(d, runs)
        assert len({a.run_id for a in out}) == len(out)
        assert len({a.device for a in out}) == len(out)
        by_id = {x.run_id: x for x in runs}
        by_name = {x.name: x for x in d}
        for a in out:
            run, dev = by_id[a.run_id], by_name[a.device]
            assert dev.alive and not dev.busy
            assert run.status.in_rotation() and run.ready and not run.in_flight
            assert run.segments_done <= _floor(runs) + 1
            assert a.move_from == (run.device if run.device != a.device else None)
            if a.move_from is not None:  # taken only from a busy or dead (or unknown) home
                home = by_name.get(a.move_from)
                assert home is None or not home.alive or home.busy or a.move_from in {b.device for b in out}
        # every free live device with own work gets its own run, as next_for says
        for dev in d:
            single = P.next_for(dev.name, d, runs)
            if single is not None and by_id[single.run_id].device == dev.name:
                assert single in out


# --- place_new and relocate ---


def test_place_new_by_remaining_work() -> None:
    # A: one long run (100 steps), B: two short ones (30 + 30): B has less left
    runs = [r(1, "A", remaining=100), r(2, "B", remaining=30), r(3, "B", remaining=30)]
    assert P.place_new(devs("A", "B"), runs) == "B"


def test_place_new_with_measured_step_times() -> None:
    # same steps, but B measured 2 s/step: 120 s against A's 100 s
    runs = [
        r(1, "A", remaining=100, sps=1.0),
        r(2, "B", remaining=30, sps=2.0),
        r(3, "B", remaining=30, sps=2.0),
    ]
    assert P.place_new(devs("A", "B"), runs) == "A"


def test_place_new_device_mean_then_overall_mean_then_one_second() -> None:
    # run 3 unmeasured takes B's mean (2 s): B = 30*2 + 30*2 = 120 > A = 100
    runs = [r(1, "A", remaining=100, sps=1.0), r(2, "B", remaining=30, sps=2.0), r(3, "B", remaining=30)]
    assert P.place_new(devs("A", "B"), runs) == "A"
    # C has nothing measured: the mean over all (1.5 s): 80 * 1.5 = 120 > A = 100 (B = 60 + 60 = 120)
    runs = [r(1, "A", remaining=100, sps=1.0), r(2, "B", remaining=60, sps=2.0), r(4, "C", remaining=80)]
    assert P.place_new(devs("A", "B", "C"), runs) == "A"
    # nothing measured anywhere: 1 s per step, steps decide
    assert P.place_new(devs("A", "B"), [r(1, "A", remaining=10), r(2, "B", remaining=9)]) == "B"


def test_place_new_ties_by_device_order_and_only_runs_in_rotation_count() -> None:
    assert P.place_new(devs("B", "A"), []) == "B"
    runs = [r(1, "A", remaining=100, status=S.STOPPED), r(2, "A", remaining=100, status=S.COMPLETED)]
    runs.append(r(3, "B", remaining=1))
    assert P.place_new(devs("B", "A"), runs) == "A"


def test_place_new_skips_dead_devices_and_raises_without_any() -> None:
    assert P.place_new(devs("A", "B", dead=("A",)), [r(1, "B", remaining=50)]) == "B"
    with pytest.raises(ValueError, match="no device is alive"):
        P.place_new(devs("A", dead=("A",)), [])
    with pytest.raises(ValueError, match="no device is alive"):
        P.place_new([], [])


def test_dead_device_runs_relocated_to_least_loaded() -> None:
    runs = [
        r(1, "A", remaining=10),
        r(5, "C", remaining=10),
        r(6, "C", remaining=10, status=S.INTERRUPTED),
        r(7, "C", status=S.COMPLETED),  # finished: stays
        r(8, "C", in_flight=True),  # still in flight: the caller ends that segment first
    ]
    d = devs("A", "B", "C", dead=("C",))
    # 5 -> B (0 s); then A and B both have 10 s: A first. 6 is INTERRUPTED: moved, but adds no work
    assert P.relocate(d, runs) == [Assignment(5, "B", move_from="C"), Assignment(6, "A", move_from="C")]
    assert P.relocate(devs("A", "B", "C"), runs) == []
    # a device no longer listed counts as dead
    assert P.relocate(devs("A", "B"), runs) == P.relocate(d, runs)
    with pytest.raises(ValueError, match="no device is alive"):
        P.relocate(devs("C", dead=("C",)), runs)


def test_dead_device_runs_taken_over_by_next_for() -> None:
    runs = [r(1, "A"), r(5, "C"), r(6, "C")]
    d = devs("A", "B", "C", dead=("C",))
    assert P.next_for("A", d, runs) == Assignment(1, "A")
    assert P.next_for("B", d, runs) == Assignment(5, "B", move_from="C")
    assert P.assign_free(d, runs) == [Assignment(1, "A"), Assignment(5, "B", move_from="C")]


# --- simulation: a fake clock, one device twice as slow ---


@pytest.mark.parametrize("n_devices", [2, 4])
def test_simulation_fair_and_everyone_finishes(n_devices: int) -> None:
    n_runs, n_chunks, steps = 8, 8, 4
    names = [f"d{i}" for i in range(n_devices)]
    step_s = {n: 1.0 for n in names}
    step_s[names[-1]] = 2.0  # one device twice as slow
    done = {i: 0 for i in range(1, n_runs + 1)}
    home: dict[int, str | None] = dict.fromkeys(done)
    measured: dict[int, float | None] = dict.fromkeys(done)
    status = dict.fromkeys(done, S.NEW)
    flying: dict[int, str] = {}  # run -> device

    def views() -> tuple[list[DeviceView], list[PlacedRun]]:
        d = [DeviceView(n, busy=n in flying.values()) for n in names]
        runs = [
            PlacedRun(
                i,
                status[i],
                done[i],
                home[i],
                in_flight=i in flying,
                remaining_steps=(n_chunks - done[i]) * steps,
                seconds_per_step=measured[i],
            )
            for i in done
        ]
        return d, runs

    for i in done:  # new runs placed where the least work remains
        home[i] = P.place_new(*views())
    assert sorted(home.values()) == sorted(names * (n_runs // n_devices))

    clock, moves = 0.0, 0
    segments_on = dict.fromkeys(names, 0)
    ends: list[tuple[float, int, int]] = []  # (end time, device index, run)
    while True:
        d, runs = views()
        for a in P.assign_free(d, runs):
            active = [done[i] for i in done if status[i].in_rotation()]  # in-flight runs included
            assert done[a.run_id] <= min(active) + 1, "fairness invariant broken at a start"
            assert a.device not in flying.values() and a.run_id not in flying
            if a.move_from is not None:
                assert a.move_from in flying.values()  # taken over only from a busy device
                moves += 1
            home[a.run_id] = a.device
            status[a.run_id] = S.ONGOING
            flying[a.run_id] = a.device
            segments_on[a.device] += 1
            heapq.heappush(ends, (clock + steps * step_s[a.device], names.index(a.device), a.run_id))
        if not ends:
            break
        clock, _, run = heapq.heappop(ends)
        measured[run] = step_s[flying.pop(run)]
        done[run] += 1
        if done[run] == n_chunks:
            status[run] = S.COMPLETED

    assert all(v == n_chunks for v in done.values())
    assert all(s is S.COMPLETED for s in status.values())
    assert sum(segments_on.values()) == n_runs * n_chunks
    assert all(n > 0 for n in segments_on.values()), segments_on
    # the fast devices did more than the slow one
    assert segments_on[names[0]] > segments_on[names[-1]]
    # little idling: the total time within 1.15x of the ideal (all work spread by speed; 1.01x and 1.04x today)
    capacity = sum(1 / s for s in step_s.values())
    assert clock <= 1.15 * n_runs * n_chunks * steps / capacity
    assert moves <= n_runs  # sticky: 64 segments, 4 (2 devices) and 7 (4 devices) moves today
