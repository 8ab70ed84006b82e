"""``Experiment(name)`` on store files a user can end up with: damaged, empty, missing, read-only, linked (issue 12).

No training: the stores are written directly, as a kernel leaves them. The read-only case runs in a child process
without privileges (as root: every capability dropped with ``setpriv``; root may write any folder).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rapidfire_nb import Experiment
from rapidfire_nb.errors import ConfigError, ExperimentError
from rapidfire_nb.store import DamagedStoreError, Store

ROOT = Path(__file__).resolve().parents[3]


def _stored_experiment(folder: Path) -> None:
    """A finished one-run experiment as a kernel leaves it: its row, two metric points, final weights on disk."""
    with Store(folder) as store:
        store.update_meta({"name": folder.name, "created_at": 1.0, "num_chunks": 2, "ended_at": 2.0})
        store.upsert_run(
            1, status="COMPLETED", hparams={"learning_rate": 1e-3}, total_steps=4, completed_steps=4
        )
        store.add_metrics([{"run_id": 1, "step": s, "name": "loss", "value": 1.0 / s} for s in (1, 2)])
    final = folder / "runs" / "1" / "final"
    final.mkdir(parents=True)
    (final / "adapter_model.safetensors").write_bytes(b"trained weights")


@pytest.mark.parametrize("content", [b"not a database at all " * 50, b"SQLite format 3\x00" + b"\xff" * 200])
def test_a_damaged_store_names_the_file_and_the_ways_on(tmp_path: Path, content: bytes) -> None:
    db = tmp_path / "exp" / "store.sqlite"
    db.parent.mkdir()
    db.write_bytes(content)
    with pytest.raises(DamagedStoreError) as info:
        Experiment("exp", experiment_path=tmp_path)
    message = str(info.value)
    assert str(db) in message and "damaged" in message and "overwrite=True" in message, message
    assert isinstance(info.value, ExperimentError)
    assert db.read_bytes() == content  # left as it is
    fresh = Experiment("exp", experiment_path=tmp_path, overwrite=True)  # the way on it names
    assert fresh.store.runs() == []
    fresh.end()


@pytest.mark.parametrize("store_state", ["empty", "missing"])
def test_a_lost_store_next_to_run_folders_is_not_a_new_experiment(tmp_path: Path, store_state: str) -> None:
    folder = tmp_path / "exp"
    _stored_experiment(folder)
    db = folder / "store.sqlite"
    if store_state == "empty":
        db.write_bytes(b"")
    else:
        db.unlink()
    with pytest.raises(ExperimentError) as info:
        Experiment("exp", experiment_path=tmp_path)
    message = str(info.value)
    assert f"{db} is {'empty (0 bytes)' if store_state == 'empty' else 'missing'}" in message, message
    assert "1 earlier run(s) (1)" in message and "overwrite=True" in message and "backup" in message
    assert (folder / "runs" / "1" / "final" / "adapter_model.safetensors").read_bytes() == b"trained weights"
    assert not db.exists() or db.stat().st_size == 0  # nothing was set up in it


def test_an_empty_store_in_a_folder_without_runs_is_a_new_experiment(tmp_path: Path) -> None:
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "store.sqlite").write_bytes(b"")
    exp = Experiment("exp", experiment_path=tmp_path)
    assert exp.store.get_meta("name") == "exp"
    exp.end()


def test_a_store_linked_out_of_the_root_is_refused_by_the_kernel(tmp_path: Path) -> None:
    other = tmp_path / "other-root" / "theirs"
    _stored_experiment(other)
    (tmp_path / "root" / "mine").mkdir(parents=True)
    (tmp_path / "root" / "mine" / "store.sqlite").symlink_to(other / "store.sqlite")
    with pytest.raises(ConfigError, match="outside the experiments root"):
        Experiment("mine", experiment_path=tmp_path / "root")


_CHILD = """
import json, sys
from rapidfire_nb import Experiment
out = {}
exp = Experiment("exp", experiment_path=sys.argv[1])
out["losses"] = exp.get_results()["loss"].tolist()
out["status"] = exp.get_runs_info()["status"].tolist()
out["snapshot_runs"] = len(exp.panel_snapshot()["runs"])
from rapidfire_nb.server.manager import ExperimentsManager  # a server run by this user reads it too
out["server_runs"] = len(ExperimentsManager(sys.argv[1]).snapshot("exp")["runs"])
for name, call in [("run_fit", lambda: exp.run_fit(None, None, None)), ("stop", lambda: exp.stop(1)),
                   ("overwrite", lambda: Experiment("exp", experiment_path=sys.argv[1], overwrite=True))]:
    try:
        call()
        out[name] = "no error"
    except Exception as exc:
        out[name] = f"{type(exc).__name__}: {exc}"
exp.end()
try:
    Experiment("new-one", experiment_path=sys.argv[1])
    out["new"] = "no error"
except Exception as exc:
    out["new"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def _without_privileges() -> list[str]:
    """The command prefix that makes the child unable to write read-only folders: as root, drop every capability
    (root's CAP_DAC_OVERRIDE writes any folder); otherwise nothing."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip(
            "running as root without setpriv (util-linux): cannot make a folder read-only for a child"
        )
    return [setpriv, "--bounding-set=-all", "--inh-caps=-all", "--"]


def test_a_read_only_experiment_opens_for_reading_and_refuses_training(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _stored_experiment(root / "exp")
    for folder, _, files in os.walk(root):
        os.chmod(folder, 0o555)
        for f in files:
            os.chmod(Path(folder) / f, 0o444)
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.run(
            [*_without_privileges(), sys.executable, "-c", _CHILD, str(root)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out["losses"] == [1.0, 0.5] and out["status"] == ["COMPLETED"] and out["snapshot_runs"] == 1
        assert out["server_runs"] == 1
        for call in ("run_fit", "stop", "overwrite"):
            assert out[call].startswith("ExperimentError: experiment 'exp' is read-only here"), out[call]
            assert "results can be read" in out[call] and "experiment_path" in out[call]
        assert out["new"].startswith("ExperimentError: cannot create the experiment folder"), out["new"]
        assert sorted(p.name for p in (root / "exp").iterdir()) == ["runs", "store.sqlite"]  # nothing written
    finally:
        for folder, _, _ in os.walk(root):
            os.chmod(folder, 0o755)


def test_a_store_that_is_a_folder_or_an_experiment_that_is_a_file_says_so(tmp_path: Path) -> None:
    (tmp_path / "dir-store" / "store.sqlite").mkdir(parents=True)
    with pytest.raises(ExperimentError, match=r"store\.sqlite is not a file \(a folder\)"):
        Experiment("dir-store", experiment_path=tmp_path)
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(ExperimentError, match="cannot create the experiment folder .*a-file: File exists"):
        Experiment("a-file", experiment_path=tmp_path)
    with pytest.raises(ExperimentError, match="cannot create the experiment folder .*Not a directory"):
        Experiment("exp", experiment_path=tmp_path / "a-file")
