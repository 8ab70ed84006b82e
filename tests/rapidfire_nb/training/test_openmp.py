"""The main thread's OpenMP team is released so that the device thread's team spins at full speed.

A libgomp team lives as long as its thread; the main thread of a notebook has one once a cell ran torch code,
and with it the process's OpenMP threads outnumber 2 CPUs, which throttles the device thread's team (1.35-1.55x
slower training here). ``run_fit``, ``wait()``, the status reads a polling loop calls and, in IPython, the end of
every execution while an experiment trains free the calling thread's team. The real checks run in a fresh interpreter (the team of this test process's main
thread is shared with every other test): its OpenMP worker thread must exit, and torch must still compute right.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from rapidfire_nb.training.openmp import loaded_libgomp, release_thread_team

ROOT = Path(__file__).resolve().parents[3]

MAPS = """\
7f00-7f10 r-xp 00000000 08:01 11 /venv/lib/python3.11/site-packages/torch/lib/libgomp.so.1
7f10-7f20 r--p 00010000 08:01 11 /venv/lib/python3.11/site-packages/torch/lib/libgomp.so.1
7f20-7f30 r-xp 00000000 08:01 12 /venv/lib/python3.11/site-packages/scikit_learn.libs/libgomp-a34b3233.so.1.0.0
7f30-7f40 r-xp 00000000 08:01 13 /usr/lib/x86_64-linux-gnu/libgomp_fake.txt
7f40-7f50 rw-p 00000000 00:00 0
7f50-7f60 r-xp 00000000 08:01 14 /usr/lib/x86_64-linux-gnu/libc.so.6
7f60-7f70 r-xp 00000000 08:01 15 /opt/llvm/lib/libomp.so
"""


def test_loaded_libgomp_lists_each_mapped_copy_once() -> None:
    assert loaded_libgomp(MAPS) == [
        "/venv/lib/python3.11/site-packages/torch/lib/libgomp.so.1",
        "/venv/lib/python3.11/site-packages/scikit_learn.libs/libgomp-a34b3233.so.1.0.0",
    ]
    assert loaded_libgomp("") == []


def test_a_kept_thread_keeps_its_team() -> None:
    from rapidfire_nb.training.openmp import keep_team_on_this_thread

    answers: list[int] = []

    def device_like() -> None:
        keep_team_on_this_thread()
        answers.append(release_thread_team())
        keep_team_on_this_thread(False)

    t = threading.Thread(target=device_like)
    t.start()
    t.join()
    assert answers == [0]


def test_release_without_a_team_is_harmless() -> None:
    assert release_thread_team() in (0, 1, 2)  # this process: torch's libgomp, maybe another wheel's
    assert release_thread_team() == release_thread_team()  # again: the same runtimes answer, nothing breaks


def _run(code: str, timeout: float = 600) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("OMP_WAIT_POLICY", None)
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


PRELUDE = """
import json, os, threading
import torch
torch.set_num_threads(2)  # a team of 2 (the CI machine may have 1 core; the team is what is checked)

def native():  # threads Python does not know: OpenMP's workers among them
    known = {t.native_id for t in threading.enumerate()}
    return {int(t) for t in os.listdir("/proc/self/task")} - known

def still_alive(team, wait=10.0):  # a released worker leaves its barrier, then exits: /proc lists it till then
    import time
    deadline = time.monotonic() + wait
    while team & native() and time.monotonic() < deadline:
        time.sleep(0.01)
    return team & native()

def product():
    a = torch.arange(512 * 512, dtype=torch.float32).reshape(512, 512) / 512**2
    return float((a @ a).trace())
"""


def test_release_frees_the_calling_threads_team_and_torch_still_computes() -> None:
    got = _run(
        PRELUDE
        + """
from rapidfire_nb.training.openmp import loaded_libgomp, release_thread_team
before = native()
first = product()
team = native() - before  # the main thread's team: its worker thread
asked = release_thread_team()
left = still_alive(team)
again = product()  # a new team, the same numbers
print(json.dumps({"team": len(team), "asked": asked, "left": len(left), "same": first == again,
                  "libgomp": len(loaded_libgomp())}))
"""
    )
    assert got["libgomp"] >= 1
    assert got["team"] == 1 and got["asked"] >= 1
    assert got["left"] == 0
    assert got["same"] is True


def test_run_fit_and_every_cell_while_training_release_the_main_threads_team() -> None:
    """In IPython (as in a notebook): a cell ran torch before ``run_fit``; another runs torch while it trains."""
    got = _run(
        PRELUDE
        + """
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.user_ns.update(native=native, product=product, still_alive=still_alive)
def cell(code):
    result = shell.run_cell(code)
    assert result.success, result.error_in_exec or result.error_before_exec
cell("before = native(); product(); team1 = native() - before")  # a cell that looked at a model
cell('''
import tempfile
from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset
group = RFGridSearch(RFModelConfig(model_name="tiny",
    peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    training_args=RFSFTConfig(learning_rate=List([1e-3, 1e-4]), per_device_train_batch_size=2,
                              num_train_epochs=4, max_length=32)), trainer_type="SFT")
exp = Experiment("omp", experiment_path=tempfile.mkdtemp(), quiet=True)
exp.run_fit(group, tiny_create_model, tiny_sft_dataset(64, seed=0), None, num_chunks=8, seed=1,
            background=True)
after_run_fit = len(still_alive(team1))
exp.wait(chunks=1)
''')
cell("before = native(); product(); team2 = native() - before; training = exp.training")
result = {"team1": len(shell.user_ns["team1"]), "after_run_fit": shell.user_ns["after_run_fit"],
          "team2": len(shell.user_ns["team2"]), "after_cell": len(still_alive(shell.user_ns["team2"]))}
# a polling loop in the same cell as the torch op: its first status read frees the team
cell("before = native(); product(); team3 = native() - before; training = exp.training; "
     "polled = len(still_alive(team3))")
result.update(training=shell.user_ns["training"], team3=len(shell.user_ns["team3"]), polled=shell.user_ns["polled"])
cell("exp.wait(); exp.end()")
result["statuses"] = sorted({s.status.value for s in shell.user_ns["exp"].run_snapshots()})
print(json.dumps(result))
"""
    )
    assert got["team1"] == 1 and got["after_run_fit"] == 0
    assert got["training"] is True, "the experiment ended before the third cell: train longer"
    assert got["team2"] == 1 and got["after_cell"] == 0
    assert got["team3"] == 1 and got["polled"] == 0
    assert got["statuses"] == ["COMPLETED"]
