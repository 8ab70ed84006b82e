"""CPU seconds of the trackers, by thread and by backend call: one rapidfire_nb child of overhead.py's tiny case.

Wall times on a shared 2-core machine swing with the load; CPU seconds of each thread (``time.thread_time`` at
its end) and of each backend call (``time.thread_time`` around it) much less. Run it once without and once with
trackers and compare the ``rapidfire-recorder`` thread and the backends' own threads (Trackio's
``_local_batch_sender``)::

    .venv/bin/python benchmarks/tracker_cpu.py                          # TensorBoard only
    .venv/bin/python benchmarks/tracker_cpu.py --trackers mlflow,trackio

MLflow's SQLite store is migrated and both packages imported before the timed part (as in overhead.py).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]


def _measured(result: Path) -> dict[str, Any]:
    thread_cpu: dict[str, float] = collections.defaultdict(float)
    original_run = threading.Thread.run

    def run(self: threading.Thread) -> None:
        try:
            original_run(self)
        finally:  # "Thread-3 (_local_batch_sender)" -> "_local_batch_sender"
            thread_cpu[self.name.rsplit("(", 1)[-1].rstrip(")")] += time.thread_time()

    threading.Thread.run = run  # type: ignore[method-assign]
    calls: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])

    def wrap(cls: Any, name: str, label: str) -> None:
        fn = cls.__dict__.get(name)
        if fn is None:
            return

        def timed(*args: Any, **kwargs: Any) -> Any:
            c0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                calls[label][0] += time.thread_time() - c0
                calls[label][1] += 1

        setattr(cls, name, timed)

    import rapidfire_nb.tracking.mlflow_tracker as ml
    import rapidfire_nb.tracking.tensorboard as tb
    import rapidfire_nb.tracking.trackio_tracker as tr

    methods = (
        "__init__",
        "start_run",
        "set_status",
        "log_scalars",
        "log_hparams",
        "end_batch",
        "flush",
        "close",
    )
    for cls, label in (
        (tb.TensorBoardTracker, "tensorboard"),
        (ml.MlflowTracker, "mlflow"),
        (tr.TrackioTracker, "trackio"),
    ):
        for m in methods:
            wrap(cls, m, f"{label}.{m}")
    import overhead
    import overhead_child

    a = overhead._parser().parse_args(
        [
            "--child",
            "rf",
            "--model",
            "tiny",
            "--steps",
            "32",
            "--batch",
            "4",
            "--num-chunks",
            "4",
            "--configs",
            "4",
        ]
        + ["--result", str(result), "--checkpoint-every", "1"]
    )
    overhead_child.child_main(a)
    thread_cpu["MainThread (imports, setup, end)"] += time.thread_time()
    child = json.loads(result.read_text())
    return {
        "total_s": round(child["total_s"], 2),
        "load_avg": os.getloadavg(),
        "process_cpu_s": round(time.process_time(), 2),
        "thread_cpu_s": {k: round(v, 3) for k, v in sorted(thread_cpu.items())},
        "calls_cpu_s_and_count": {k: [round(v[0], 4), v[1]] for k, v in sorted(calls.items())},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--trackers", default="", help="comma-separated: mlflow, trackio (TensorBoard is always on)"
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(_measured(Path(tmp) / "child.json"), indent=1))
        return
    names = [n.strip().lower() for n in a.trackers.split(",") if n.strip()]
    folder = Path(tempfile.mkdtemp(prefix="rf-tracker-cpu-"))
    try:
        env = dict(os.environ, **{f"RF_{n.upper()}_ENABLED": "true" for n in names})
        if "mlflow" in names:
            env["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder / 'mlflow.db'}"
            code = "import sys; from mlflow.tracking import MlflowClient; MlflowClient(sys.argv[1]).search_experiments()"
            subprocess.run([sys.executable, "-c", code, env["MLFLOW_TRACKING_URI"]], check=True, env=env)
        if "trackio" in names:
            env["TRACKIO_DIR"] = str(folder / "trackio")
        print(f"load average at start: {os.getloadavg()}")
        subprocess.run([sys.executable, __file__, "--child"], check=True, env=env)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
