"""The device arbiter: leases first come first served, and schedulers of one process taking turns on it.

The schedulers here drive fake executors that share one :class:`FakeDevice`, which records any executor call
of one experiment made while another experiment's segment is in flight.
"""

from __future__ import annotations

import threading
import time

import pytest

from kernel_scheduler import DeviceArbiter, Op, OpKind, RunStatus
from rapidfire_nb.testing.fakes import TIMEOUT, FakeDevice, FakeSpec, Harness


# ------------------------------------------------------------------------------------------------ the arbiter
def test_a_free_device_is_granted_at_once_and_the_next_request_waits_its_turn() -> None:
    arb = DeviceArbiter()
    woken: list[str] = []
    a = arb.request("A", on_grant=lambda: woken.append("A"))
    b = arb.request("B", on_grant=lambda: woken.append("B"))
    c = arb.request("C", on_grant=lambda: woken.append("C"))
    assert a.granted and not b.granted and not c.granted
    assert woken == []  # granted at once: no callback
    assert arb.holders() == ["A"] and arb.waiting() == ["B", "C"]
    a.release()
    assert b.granted and not c.granted and woken == ["B"]
    b.release()
    assert c.granted and woken == ["B", "C"]
    c.release()
    assert arb.holders() == [] and arb.waiting() == []


def test_withdrawing_a_waiting_request_skips_it_and_release_is_idempotent() -> None:
    arb = DeviceArbiter()
    a, b, c = arb.request("A"), arb.request("B"), arb.request("C")
    b.release()  # withdrawn before its turn
    a.release()
    a.release()  # a second release changes nothing
    assert not b.granted and c.granted and arb.holders() == ["C"]
    c.release()
    assert not c.granted


def test_acquire_blocks_until_the_holder_releases_and_says_who_holds_it() -> None:
    arb = DeviceArbiter()
    held = arb.request("exp-A")
    seen: list[list[str]] = []
    got = threading.Event()

    def cell() -> None:
        with arb.acquire("exp-B", on_wait=seen.append):
            got.set()

    t = threading.Thread(target=cell)
    t.start()
    assert not got.wait(0.05)
    held.release()
    assert got.wait(TIMEOUT)
    t.join(TIMEOUT)
    assert seen == [["exp-A"]] and arb.holders() == []


def test_acquire_times_out_and_withdraws_its_request() -> None:
    arb = DeviceArbiter()
    held = arb.request("exp-A")
    with pytest.raises(TimeoutError, match="not free within"):
        arb.acquire("exp-B", timeout=0.01)
    assert arb.waiting() == []
    held.release()
    assert arb.holders() == []


def test_slots_per_device_and_devices_are_independent() -> None:
    arb = DeviceArbiter(slots={"gpu0": 2})
    a, b, c = (
        arb.request("A", device="gpu0"),
        arb.request("B", device="gpu0"),
        arb.request("C", device="gpu0"),
    )
    other = arb.request("D", device="gpu1")
    assert a.granted and b.granted and not c.granted and other.granted
    a.release()
    assert c.granted and arb.holders("gpu0") == ["B", "C"]


def test_a_failing_on_grant_callback_does_not_wedge_the_arbiter() -> None:
    arb = DeviceArbiter()
    a = arb.request("A")

    def boom() -> None:
        raise RuntimeError("waker broke")

    b = arb.request("B", on_grant=boom)
    a.release()
    assert b.granted
    b.release()
    assert arb.request("C").granted


# ------------------------------------------------------------------------------------------------ schedulers
def _specs() -> list[FakeSpec]:
    return [FakeSpec(rows=16, batch=4), FakeSpec(rows=12, batch=2, epochs=2)]


def test_two_experiments_take_turns_on_the_device_and_train_as_they_would_alone() -> None:
    alone = Harness(_specs(), num_chunks=2, mode="thread")
    assert alone.sched.wait(timeout=TIMEOUT)
    alone.close()

    arb, device = DeviceArbiter(), FakeDevice()
    a = Harness(_specs(), num_chunks=2, mode="thread", arbiter=arb, device=device, name="A", start=False)
    b = Harness(_specs(), num_chunks=2, mode="thread", arbiter=arb, device=device, name="B", start=False)
    gate = arb.request(
        "gate"
    )  # the device is taken until both schedulers wait for it (a thread may start late)
    a.sched.start()
    b.sched.start()
    clone = b.sched.submit(
        Op(OpKind.CLONE, 1, payload={"spec": FakeSpec(rows=8, batch=4)})
    )  # a boundary action
    deadline = time.monotonic() + TIMEOUT
    while len(arb.waiting()) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    gate.release()
    try:
        assert a.sched.wait(timeout=TIMEOUT) and b.sched.wait(timeout=TIMEOUT)
    finally:
        a.close()
        b.close()
    assert device.violations == []
    assert a.fake.violations == [] and b.fake.violations == []
    assert a.fake.calls == alone.fake.calls  # the same segments, in the same order, as alone
    assert [c for c in b.fake.calls if c[0] != clone.new_run_id] == alone.fake.calls
    owners = [name for name, _, _ in device.segments]
    assert owners.count("A") == len(a.fake.calls) and owners.count("B") == len(b.fake.calls)
    # both had work from the start: they alternated instead of one finishing first
    assert owners[:4] in (["A", "B", "A", "B"], ["B", "A", "B", "A"]), owners
    assert arb.holders() == [] and arb.waiting() == []


def test_a_scheduler_waiting_for_the_device_keeps_applying_ops_and_beating() -> None:
    arb, device = DeviceArbiter(), FakeDevice()
    a = Harness(
        [FakeSpec(rows=16, batch=4)], mode="manual", arbiter=arb, device=device, name="A", start=False
    )
    b = Harness(_specs(), mode="manual", arbiter=arb, device=device, name="B", start=False)
    a.sched.start()
    try:
        assert a.fake.wait_inflight() == (1, 2)  # A trains its first chunk and holds the device
        b.sched.start()
        b.rec.wait_beats(5)  # B's loop turns while it waits
        ack = b.sched.submit(Op(OpKind.STOP, 2))
        deadline = time.monotonic() + TIMEOUT
        while b.sched.ack(ack.op_id).state != "applied" and time.monotonic() < deadline:  # type: ignore[union-attr]
            b.rec.wait_beats(1)
        assert b.sched.ack(ack.op_id).state == "applied"  # type: ignore[union-attr]
        assert b.status(2) is RunStatus.STOPPED
        assert b.fake.events == [("add_run", 1, None), ("add_run", 2, None)]  # no executor call yet
        assert arb.waiting() == ["B"]
        a.fake.resolve()  # A's chunk ends: A gives the device back, B gets it
        assert b.fake.wait_inflight() == (1, 2)
        assert ("on_status", 2, "STOPPED") in b.fake.events  # the boundary action ran once B held the device
        assert a.fake.inflight is None
        b.fake.resolve()
        assert a.fake.wait_inflight() == (1, 4)  # and back to A
    finally:
        a.close()
        b.close()
    assert device.violations == []
    assert arb.holders() == [] and arb.waiting() == []


def test_a_cell_holding_the_device_pauses_the_schedulers_between_chunks() -> None:
    arb = DeviceArbiter()
    h = Harness([FakeSpec(rows=16, batch=4)], num_chunks=4, mode="manual", arbiter=arb)
    try:
        h.fake.wait_inflight()
        got = threading.Event()
        release = threading.Event()

        def cell() -> None:
            with arb.acquire("a cell (e.g. load_model)"):
                got.set()
                release.wait(TIMEOUT)

        t = threading.Thread(target=cell)
        t.start()
        assert not got.wait(0.05)  # the segment in flight is not interrupted
        h.fake.resolve()
        assert got.wait(TIMEOUT)
        h.rec.wait_beats(5)
        assert h.fake.inflight is None  # no next chunk while the cell holds the device
        release.set()
        t.join(TIMEOUT)
        assert h.fake.wait_inflight() == (1, 2)
    finally:
        h.close()


def test_closing_a_scheduler_gives_the_device_back_or_withdraws_its_request() -> None:
    arb = DeviceArbiter()
    a = Harness([FakeSpec(rows=16, batch=4)], mode="manual", arbiter=arb, name="A")
    b = Harness([FakeSpec(rows=16, batch=4)], mode="manual", arbiter=arb, name="B")
    a.fake.wait_inflight()
    b.rec.wait_beats(3)
    assert arb.holders() == ["A"] and arb.waiting() == ["B"]
    b.close()
    assert arb.waiting() == []
    a.fake.resolve()
    a.sched.close(timeout=TIMEOUT)
    assert arb.holders() == []
