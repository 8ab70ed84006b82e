"""RemoteDevice (devices/_remote.py): what it hands to the kernel's callbacks itself, in order with its answers."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from rapidfire_nb.devices._remote import RemoteDevice
from rapidfire_nb.devices._replies import event_sinks
from rapidfire_nb.devices.shipping import unship
from rapidfire_nb.spec.bundles import TrainingCallbacks


class _Worker(RemoteDevice):
    """A worker whose "final" events never arrive (a Ray actor's drained late): only the answers come back."""

    def __init__(self, finals: list[tuple[int, Path]], saved: dict[int, str]) -> None:
        self.device, self._death, self._lock, self._positions = "cpu:1", None, threading.Lock(), {}
        self._sinks = event_sinks(TrainingCallbacks(on_final=lambda rid, path: finals.append((rid, path))))
        self.saved = saved
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def run_segment(self, run_id: int, stop_step: int) -> Any:
        raise AssertionError("not trained here")

    def close(self) -> None:
        pass

    def _invoke(self, method: str, payload: bytes) -> Any:
        args = unship(payload)
        self.calls.append((method, args))
        if method == "final_dir":
            return self.saved.get(args[0])
        return None


def test_a_finished_runs_final_folder_reaches_the_kernel_before_on_status_returns(tmp_path: Path) -> None:
    finals: list[tuple[int, Path]] = []
    worker = _Worker(finals, {2: str(tmp_path / "runs" / "2" / "final")})
    worker.on_status(2, "COMPLETED")
    assert finals == [(2, tmp_path / "runs" / "2" / "final")]
    assert [m for m, _ in worker.calls] == ["on_status", "final_dir"]


def test_other_statuses_and_runs_without_final_weights_hand_nothing_on(tmp_path: Path) -> None:
    finals: list[tuple[int, Path]] = []
    worker = _Worker(finals, {})
    worker.on_status(3, "STOPPED")  # its final save failed (a full disk): no folder to name
    worker.on_status(3, "ONGOING")
    worker.on_status(3, "DELETED")
    assert finals == []
    assert [m for m, _ in worker.calls] == ["on_status", "final_dir", "on_status", "on_status"]
