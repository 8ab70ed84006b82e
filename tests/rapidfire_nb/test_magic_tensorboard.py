"""``%rapidfire tensorboard`` on an experiments folder whose path has spaces and shell characters (issue 12)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def test_tensorboard_logdir_with_spaces_and_shell_characters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from IPython.core.interactiveshell import InteractiveShell
    from tensorboard import manager

    from rapidfire_nb import Experiment

    root = tmp_path / "Application Support" / "it's a $HOME #1; (x) & y"
    exp = Experiment("tb-space", experiment_path=root)
    seen: list[list[str]] = []

    def fake_start(arguments: list[str], timeout: Any = None) -> Any:
        seen.append(list(arguments))
        return manager.StartFailed(exit_code=1, stdout="", stderr="(not started in this test)")

    monkeypatch.setattr(manager, "start", fake_start)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "rapidfire_nb")
    ip.run_line_magic("rapidfire", "tensorboard")
    logdir = exp.path / "tensorboard"
    assert seen == [["--logdir", str(logdir), "--host", "127.0.0.1"]]  # one argument, exactly the path
    assert logdir.is_dir()
