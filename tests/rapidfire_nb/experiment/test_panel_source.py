"""rapidfire_nb.experiment.panel_source: the duplicate-config note of clone_modify, freezing panels at end()."""

from __future__ import annotations

import types
from typing import Any

from kernel_scheduler import RunSnapshot, RunStatus
from rapidfire_nb.experiment import panel_source


class Spec:
    def __init__(self, key: str) -> None:
        self.key = key

    def fingerprint(self) -> str:
        return self.key


def _snap(run_id: int, key: str, status: RunStatus = RunStatus.ONGOING) -> RunSnapshot:
    return RunSnapshot(run_id, status, 0, 8, 0, 4, (1, 1), 0, False, None, False, None, Spec(key))


def test_same_config_names_the_other_runs_with_the_clones_config() -> None:
    snaps = [_snap(1, "a"), _snap(2, "b"), _snap(3, "a", RunStatus.DELETED), _snap(4, "a")]
    session = types.SimpleNamespace(scheduler=types.SimpleNamespace(snapshot=lambda: snaps))
    assert panel_source.same_config(session, 4) == [1]  # a DELETED twin does not count
    assert panel_source.same_config(session, 2) == []
    assert panel_source.same_config(None, 4) == []


def test_freeze_panels_freezes_widgets_and_closes_text_progress() -> None:
    calls: list[str] = []

    class Widget:
        def freeze(self) -> None:
            calls.append("freeze")

    class Text:
        def close(self) -> None:
            calls.append("close")

    class Broken:
        def freeze(self) -> Any:
            raise RuntimeError("boom")

    panel_source.freeze_panels([Widget(), Broken(), Text()])  # a failing panel does not stop the others
    assert calls == ["freeze", "close"]
