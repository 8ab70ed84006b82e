"""Where the training thread waits: its context switches and CPU, rapidfire_nb against sequential plain TRL.

Wall-clock ratios on a 2-core machine spread widely from one repeat to the next; what a thread *does* spreads far
less. This script trains the ``overhead.py`` tiny case (4 LoRA configs x 32 steps, batch 4, an eval at every
chunk end) once per side, each side in its own process, and reads from ``/proc/self/task/<tid>/`` how often each
thread of the training phase gave up the CPU on its own (``voluntary_ctxt_switches``: it blocked, e.g. on the GIL
or a futex) or was preempted (``nonvoluntary_ctxt_switches``), and its CPU seconds (``stat`` fields 14-15).

Sequential plain TRL's training thread (the main thread) blocks ~0 times (0-14 in runs here): nothing else in the
process wants the GIL. rapidfire_nb's device thread blocks hundreds of times per experiment, ~80% of them in
CPython's ``take_gil`` (``perf record -e sched:sched_switch --call-graph dwarf``, 2026-12-02). Each block is
short: ``perf sched timehist`` put the device thread off the CPU for only 0.16 s over a whole tiny rf child,
so the CPU column, not the block count, is where a slower step shows (benchmarks/README.md says what the
extra CPU was and how it was removed). ``--no-checkpoints`` shows the checkpoint writer's share
(``checkpoint_every`` larger than the run).

    .venv/bin/python benchmarks/thread_blocks.py                  # both sides, 3 repeats (~1 min)
    .venv/bin/python benchmarks/thread_blocks.py --no-checkpoints

Numbers, not a pass/fail: fewer device-thread blocks or less device-thread CPU show here before they show
reliably in wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

TICKS = os.sysconf("SC_CLK_TCK")


def thread_counters() -> dict[int, tuple[int, int, float]]:
    """``{tid: (voluntary switches, involuntary switches, CPU seconds)}`` of every thread of this process."""
    out: dict[int, tuple[int, int, float]] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            status = Path(f"/proc/self/task/{tid}/status").read_text()
            stat = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended between the listing and the read
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        out[int(tid)] = (
            int(fields["voluntary_ctxt_switches"]),
            int(fields["nonvoluntary_ctxt_switches"]),
            (int(stat[11]) + int(stat[12])) / TICKS,
        )
    return out


def _delta(
    a: dict[int, tuple[int, int, float]], b: dict[int, tuple[int, int, float]]
) -> dict[int, tuple[int, int, float]]:
    zero = (0, 0, 0.0)
    return {t: tuple(y - x for x, y in zip(a.get(t, zero), v, strict=True)) for t, v in b.items()}  # type: ignore[misc]


def _role(name: str) -> str:
    from overhead_child import thread_role

    if name == "MainThread":
        return "main"
    role = thread_role(name)
    return "other Python threads (TensorBoard's writer...)" if role == "other" else role


def child(side: str, checkpoint_every: int) -> dict[str, Any]:
    """Train the tiny case once on ``side`` (``rf`` or ``base``) and return the training phase's counters."""
    import overhead_child as oc

    w = oc.workload("tiny", 32, 4, 4, 4, True)
    if side == "base":
        import transformers

        train = transformers.Trainer.train
        spans: list[dict[int, tuple[int, int, float]]] = []
        walls: list[float] = []

        def counted_train(self: Any, *args: Any, **kwargs: Any) -> Any:
            before, t = thread_counters(), time.perf_counter()
            try:
                return train(self, *args, **kwargs)
            finally:
                walls.append(time.perf_counter() - t)
                spans.append(_delta(before, thread_counters()))

        transformers.Trainer.train = counted_train  # type: ignore[method-assign]
        oc._child_base(w, {"n_configs": 4})
        total: dict[int, list[float]] = {}
        for span in spans:
            for tid, values in span.items():
                acc = total.setdefault(tid, [0, 0, 0.0])
                for i, v in enumerate(values):
                    acc[i] += v
        names = {t.native_id: t.name for t in threading.enumerate()}
        threads = {tid: (names.get(tid), v) for tid, v in total.items()}
        wall = sum(walls)
    else:
        from rapidfire_nb import Experiment

        exp = Experiment(
            "blocks", experiment_path=tempfile.mkdtemp(prefix="rf-blocks-"), overwrite=True, quiet=True
        )
        marks: dict[str, Any] = {}

        def at_start() -> None:  # the training phase starts when the scheduler does
            while exp.session is None or exp.session.started_at is None:
                time.sleep(0.002)
            marks["before"], marks["t"] = thread_counters(), time.perf_counter()

        watcher = threading.Thread(target=at_start, daemon=True)
        watcher.start()
        exp.run_fit(
            w["search"],
            w["create"],
            w["train"],
            w["eval"],
            num_chunks=4,
            seed=oc.SEED,
            checkpoint_every=checkpoint_every,
        )
        after, wall = thread_counters(), time.perf_counter() - marks["t"]
        names = {t.native_id: t.name for t in threading.enumerate()}
        exp.end()
        threads = {tid: (names.get(tid), v) for tid, v in _delta(marks["before"], after).items()}
    by_role: dict[str, list[float]] = {}
    for name, (vol, invol, cpu) in threads.values():
        role = _role(name) if name is not None else "native threads (OpenMP worker...)"  # unknown to Python
        acc = by_role.setdefault(role, [0, 0, 0.0])
        acc[0], acc[1], acc[2] = acc[0] + vol, acc[1] + invol, acc[2] + cpu
    return {"wall_s": wall, "roles": by_role}


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--repeats", type=_positive, default=3, help="repeats per side, alternating order (default 3)"
    )
    ap.add_argument(
        "--no-checkpoints",
        action="store_true",
        help="rf with checkpoint_every larger than the run: no checkpoints",
    )
    ap.add_argument("--child", choices=["rf", "base"], help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint-every", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(a.child, a.checkpoint_every)))
        return
    env = dict(os.environ, CI="true")
    env.pop("OMP_WAIT_POLICY", None)  # as users have it
    every = 1000 if a.no_checkpoints else 1
    results: dict[str, list[dict[str, Any]]] = {"base": [], "rf": []}
    for r in range(a.repeats):
        for side in ("base", "rf") if r % 2 == 0 else ("rf", "base"):
            out = subprocess.run(
                [sys.executable, __file__, "--child", side, "--checkpoint-every", str(every)],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            ).stdout
            results[side].append(json.loads(out.split("RESULT ", 1)[1]))
    print(
        f"tiny case (4 configs x 32 steps, eval every chunk), training phase only; {a.repeats} repeat(s), medians; "
        f"rf checkpoint_every={every}{' (no checkpoints during the run)' if a.no_checkpoints else ''}"
    )
    print(f"{'side':6s} {'thread':48s} {'blocked (vol.)':>15s} {'preempted':>10s} {'CPU s':>7s}")
    for side, label in (("base", "sequential plain TRL"), ("rf", "rapidfire_nb")):
        walls = [x["wall_s"] for x in results[side]]
        print(
            f"{side:6s} {label} — wall {statistics.median(walls):.2f} s ({', '.join(f'{w:.2f}' for w in walls)})"
        )
        roles = sorted({k for x in results[side] for k in x["roles"]})
        for role in roles:
            vals = [x["roles"].get(role, [0, 0, 0.0]) for x in results[side]]
            if max(v[0] + v[1] for v in vals) == 0 and max(v[2] for v in vals) < 0.01:
                continue
            med = [statistics.median(v[i] for v in vals) for i in range(3)]
            print(f"{'':6s} {role:48s} {med[0]:15.0f} {med[1]:10.0f} {med[2]:7.2f}")


if __name__ == "__main__":
    main()
