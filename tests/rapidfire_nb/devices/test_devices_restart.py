"""A kernel training on 2 CPU workers is killed (SIGKILL): its workers die with it, and a new kernel continues
every run from its checkpoint on 2 new workers, ending exact against plain TRL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.helpers import adapter_from_folder, max_abs_diff, qa_dataset, train_plain_trl

REPO = Path(__file__).resolve().parents[3]
SEED = 7

CHILD = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {repo!r})
    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model
    from tests.helpers import qa_dataset
    from tests.helpers import slow_create_model
    from tests.rapidfire_nb.devices.test_devices_restart import group

    exp = Experiment("restart", experiment_path={root!r})
    exp.run_fit(group(), slow_create_model, qa_dataset(24, seed=0), qa_dataset(6, seed=1), num_chunks=4,
                seed={seed}, devices=2, background=True)
    pool = exp.session.executor
    with open({pids!r} + ".tmp", "w") as f:
        json.dump([pool.member(d).pid for d in pool.devices], f)
    import os
    os.replace({pids!r} + ".tmp", {pids!r})
    exp.wait()
    """
)


def group():  # noqa: ANN201 - imported by the child script too
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
    from tests.helpers import qa_to_chat

    return RFGridSearch(
        configs=List(
            [
                RFModelConfig(
                    model_name="tiny",
                    formatting_func=qa_to_chat,
                    peft_config=RFLoraConfig(r=r, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
                    training_args=RFSFTConfig(
                        learning_rate=1e-3, per_device_train_batch_size=2, num_train_epochs=1, max_length=48
                    ),
                )
                for r in (2, 4)
            ]
        ),
        trainer_type="SFT",
    )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_kernel_takes_its_workers_with_it_and_a_new_one_continues_exact(tmp_path: Path) -> None:
    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model

    pids_file = tmp_path / "pids.json"
    script = CHILD.format(repo=str(REPO), root=str(tmp_path), seed=SEED, pids=str(pids_file))
    child = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 240
        runs = tmp_path / "restart" / "runs"
        while (
            time.monotonic() < deadline
        ):  # both runs have a complete checkpoint: the kill comes mid-training
            done = (
                [p for p in runs.glob("*/checkpoint-*") if (p / "COMPLETE").exists()] if runs.is_dir() else []
            )
            if len({p.parent.name for p in done}) == 2 and pids_file.exists():
                break
            assert child.poll() is None, "the child ended before it was killed"
            time.sleep(0.05)
        else:
            raise AssertionError("no checkpoint of both runs within 240 s")
        workers = json.loads(pids_file.read_text())
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    gone_by = time.monotonic() + 15
    while any(_alive(p) for p in workers) and time.monotonic() < gone_by:
        time.sleep(0.1)
    assert not any(_alive(p) for p in workers), "a worker outlived its kernel"

    train, evald = qa_dataset(24, seed=0), qa_dataset(6, seed=1)
    exp = Experiment("restart", experiment_path=tmp_path)
    exp.run_fit(group(), tiny_create_model, train, evald, num_chunks=4, seed=SEED, devices=2)
    info = exp.get_runs_info().set_index("run_id")
    continued = dict(exp.session.continued)
    exp.end()
    assert list(info.status) == ["COMPLETED", "COMPLETED"]
    assert sorted(continued) == [1, 2] and min(continued.values()) > 0  # from their checkpoints, not from 0
    for rid, leaf in enumerate(group().expand(SEED), start=1):
        ref = train_plain_trl(leaf, tiny_create_model, train, evald, SEED, tmp_path / f"plain-{rid}")
        assert max_abs_diff(adapter_from_folder(info.loc[rid, "checkpoint_dir"]), ref.final) == 0.0, (
            f"run {rid}"
        )
