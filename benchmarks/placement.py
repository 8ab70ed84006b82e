"""How long one placement decision takes at 64 runs x 8 devices (the target: under 1 ms; not a timed test).

The views: 64 runs in rotation spread over 8 devices, at ``segments_done`` 3 or 4 (one chunk apart), 3 devices
busy with a segment in flight, a few runs stopped or waiting, measured step times on half of them. It times
``FairPlacement.next_for`` for a free device with nothing of its own (the slowest path: a takeover over every
device's runs), ``assign_free`` (every free device at once), and ``place_new``, and prints the median and the
90th percentile of each in microseconds::

    .venv/bin/python benchmarks/placement.py               # 200 calls each
    .venv/bin/python benchmarks/placement.py --calls 2000
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernel_scheduler import DeviceView, FairPlacement, PlacedRun, RunStatus  # noqa: E402

RUNS, DEVICES = 64, 8


def views(seed: int = 0) -> tuple[list[DeviceView], list[PlacedRun]]:
    rng = random.Random(seed)
    names = [f"cuda:{i}" for i in range(DEVICES)]
    busy = set(names[1:4])
    devices = [DeviceView(n, busy=n in busy) for n in names]
    runs = []
    for i in range(1, RUNS + 1):
        home = names[1 + (i % (DEVICES - 1))]  # cuda:0 has no runs of its own: it must take one over
        status = RunStatus.STOPPED if i % 16 == 0 else RunStatus.ONGOING
        in_flight = home in busy and not any(r.in_flight and r.device == home for r in runs)
        runs.append(
            PlacedRun(
                i,
                status,
                segments_done=rng.choice((3, 4)),
                device=home,
                ready=i % 21 != 0,
                in_flight=in_flight and status is RunStatus.ONGOING,
                remaining_steps=rng.randint(10, 200),
                seconds_per_step=rng.uniform(0.1, 0.5) if i % 2 else None,
            )
        )
    return devices, runs


def time_us(fn: Callable[[], object], calls: int) -> tuple[float, float]:
    for _ in range(10):  # warm-up
        fn()
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1000)
    samples.sort()
    return statistics.median(samples), samples[int(0.9 * (len(samples) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200, help="timed calls per decision (default 200)")
    args = ap.parse_args()
    devices, runs = views()
    p = FairPlacement()
    takeover = p.next_for("cuda:0", devices, runs)
    assert takeover is not None and takeover.move_from is not None, takeover
    cases: list[tuple[str, Callable[[], object]]] = [
        ("next_for (takeover)", lambda: p.next_for("cuda:0", devices, runs)),
        ("next_for (own run)", lambda: p.next_for("cuda:5", devices, runs)),
        (f"assign_free ({len(p.assign_free(devices, runs))} devices)", lambda: p.assign_free(devices, runs)),
        ("place_new", lambda: p.place_new(devices, runs)),
    ]
    print(f"{RUNS} runs x {DEVICES} devices, {args.calls} calls each (target: under 1000 us a decision)")
    for name, fn in cases:
        median, p90 = time_us(fn, args.calls)
        print(f"  {name:<24} median {median:7.1f} us   p90 {p90:7.1f} us")


if __name__ == "__main__":
    main()
