"""The device roster (kernel_scheduler.roster) without a thread: placement views, lost devices, held runs."""

from __future__ import annotations

from kernel_scheduler import DeviceArbiter, RunStatus, SchedulerListener, plan_chunks
from kernel_scheduler.core import SchedulerCore
from kernel_scheduler.roster import DeviceRoster
from kernel_scheduler.runs import Run
from kernel_scheduler.slots import DeviceSlots
from rapidfire_nb.testing.fake_devices import FakeDevices
from rapidfire_nb.testing.fakes import FakeSpec


class Notes(SchedulerListener):
    def __init__(self) -> None:
        self.notes: list[str] = []
        self.runs: list[tuple[int, RunStatus]] = []

    def on_note(self, text: str) -> None:
        self.notes.append(text)

    def on_run(self, snap: object) -> None:
        self.runs.append((snap.run_id, snap.status))  # type: ignore[attr-defined]


def _roster(devices: tuple[str, ...]) -> tuple[DeviceRoster, SchedulerCore, FakeDevices, Notes, list[str]]:
    fake = FakeDevices(devices)
    notes = Notes()
    core = SchedulerCore(fake, notes, DeviceSlots(fake.devices, DeviceArbiter(), "test", lambda: None))
    halts: list[str] = []
    return DeviceRoster(core, halts.append), core, fake, notes, halts


def _run(
    core: SchedulerCore, run_id: int, device: str, done: int = 0, status: RunStatus = RunStatus.ONGOING
) -> Run:
    run = Run(run_id, FakeSpec(rows=32, batch=4), status=status, device=device)
    run.plan = plan_chunks(32, 4, 4, 8)
    run.segments_done = done
    core.runs[run_id] = run
    return run


def test_one_device_trains_the_run_furthest_behind_and_new_runs_go_there() -> None:
    roster, core, _, _, _ = _roster(("d0",))
    _run(core, 1, "d0", done=2)
    _run(core, 2, "d0", done=1)
    _run(core, 3, "d0", done=1, status=RunStatus.STOPPED)
    assert roster.choose() == 2
    assert roster.place_new() == "d0"
    assert roster.states() == {"d0": "idle"}


def test_a_single_device_that_died_halts_training_with_the_reason() -> None:
    roster, core, fake, notes, halts = _roster(("d0",))
    run = _run(core, 1, "d0", done=1)
    fake.dead.add("d0")
    roster.find_lost()
    assert (run.status, run.lost) == (RunStatus.INTERRUPTED, True)
    assert notes.notes == ["the worker of d0 died and no device is left: training stops"]
    assert halts and halts[0].startswith("every device's worker died (d0)")
    assert roster.states() == {"d0": "lost"}


def test_runs_of_a_dead_device_move_to_a_live_one() -> None:
    roster, core, fake, notes, halts = _roster(("d0", "d1"))
    lost = _run(core, 1, "d0", done=1)
    _run(core, 2, "d1", done=1)
    fake.dead.add("d0")
    roster.find_lost()
    assert (lost.status, lost.lost, lost.moving) == (RunStatus.INTERRUPTED, True, True)
    assert core.slots.pending("d1") and not halts
    assert notes.notes == [
        "the worker of d0 died; run 1 continues from its latest checkpoint on another device"
    ]
    roster.find_lost()  # told once
    assert len(notes.notes) == 1


def test_runs_wait_at_a_rung_only_with_several_devices() -> None:
    for devices, held in ((("d0",), set()), (("d0", "d1"), {1})):
        roster, core, _, _, _ = _roster(devices)
        _run(core, 1, "d0", done=2)
        _run(core, 2, devices[-1], done=1)
        roster.waits_at = lambda chunks: chunks == 2
        assert roster.held_at_rungs() == held
        assert [p.ready for p in roster.placed()] == [1 not in held, True]
