"""How much a background checkpoint writer slows training, by how the writer thread yields the CPU.

One process, the users' setting (every CPU, ``OMP_WAIT_POLICY`` unset, removed here before torch loads): a
training thread (as rapidfire_nb's device thread) runs SmolLM2-135M-Instruct LoRA steps (r=32 on q/k/v/o, AdamW,
one fixed batch of ``--tokens`` tokens) in segments of ``--steps`` steps, while a writer thread writes a real
boundary snapshot of that run (``Snapshotter.take`` + ``write_snapshot``, adapter + AdamW state, fsynced) every
``--period`` seconds, far denser than a real experiment writes (SmolLM2's overhead case: 12 checkpoints in ~50 s),
so that the writer's share stands out of the noise. The sides alternate segment by segment (order reversed every
repeat), so a host's slow stretches touch every side alike:

* ``none``: no writer (the reference);
* ``nice10``: the writer thread at nice +10 (``_priority.lower_thread_priority``, what rapidfire_nb does);
* ``nice19``: the writer thread at nice +19, the weakest ``nice``;
* ``idle``: the writer thread at Linux's ``SCHED_IDLE`` (tried for rapidfire_nb on 2026-12-04 and dropped: with
  the CPUs busy with other processes it stalled training, see ``_priority``'s docstring; ``--load 2`` shows it).

Printed per side: the median segment time and its ratio to ``none``, per repeat; the writer's median wall and CPU
milliseconds per checkpoint. A new writer thread is started for each segment (a thread leaves ``SCHED_IDLE`` only
with privileges).

::

    .venv/bin/python benchmarks/checkpoint_interference.py            # ~5 min on 2 CPUs
    .venv/bin/python benchmarks/checkpoint_interference.py --repeats 12 --out benchmarks/results/checkpoint_interference.txt
    .venv/bin/python benchmarks/checkpoint_interference.py --load 2 --repeats 3   # two other busy processes
"""

from __future__ import annotations

import os

OMP_BEFORE = os.environ.pop("OMP_WAIT_POLICY", None)  # the users' setting; before torch loads libgomp

import argparse  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

SIDES = ("none", "nice10", "nice19", "idle")


def _writer(
    snap: Any, folder: Path, side: str, period: float, stop: threading.Event, out: list[tuple[float, float]]
):
    from rapidfire_nb._priority import lower_thread_priority
    from rapidfire_nb.training.checkpoint import write_snapshot

    if side == "idle":
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))
    else:
        lower_thread_priority(int(side[4:]))
    while not stop.is_set():
        t0, c0 = time.perf_counter(), time.thread_time()
        write_snapshot(snap, folder)
        out.append((time.perf_counter() - t0, time.thread_time() - c0))
        stop.wait(period)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=8, help="segments per side (default 8)")
    parser.add_argument("--steps", type=int, default=6, help="training steps per segment (default 6)")
    parser.add_argument(
        "--period", type=float, default=0.5, help="seconds between two checkpoints (default 0.5)"
    )
    parser.add_argument("--tokens", type=int, default=128, help="tokens in the training batch (default 128)")
    parser.add_argument(
        "--load",
        type=int,
        default=0,
        help="other busy processes (`python -c 'while True: pass'`) beside the training, as on a shared machine "
        "(default 0)",
    )
    parser.add_argument("--out", help="also write the report to this file")
    a = parser.parse_args()
    if a.repeats < 1 or a.steps < 1 or a.period < 0 or a.tokens < 2 or a.load < 0:
        parser.error("--repeats and --steps: 1 or more; --period and --load: 0 or more; --tokens: 2 or more")

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, TrainerState, TrainingArguments

    from rapidfire_nb.data import smollm2_path
    from rapidfire_nb.training.checkpoint import Snapshotter
    from rapidfire_nb.training.rng import capture_rng

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(smollm2_path()),
        LoraConfig(
            r=32, lora_alpha=64, lora_dropout=0.1, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
        ),
    )
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    batch = torch.randint(
        0, model.config.vocab_size, (1, a.tokens), generator=torch.Generator().manual_seed(0)
    )

    def step() -> None:
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    step()  # AdamW state exists from here on
    trainer = types.SimpleNamespace(
        model=model,
        optimizer=optimizer,
        lr_scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
        state=TrainerState(global_step=1),
        args=TrainingArguments(
            output_dir=tempfile.mkdtemp(prefix="rf-ckpt-bench-"), report_to=[], use_cpu=True
        ),
    )
    snap = Snapshotter(1, trainer, "default").take(capture_rng())
    root = Path(tempfile.mkdtemp(prefix="rf-ckpt-bench-"))

    times: dict[str, list[float]] = {s: [] for s in SIDES}
    writes: dict[str, list[tuple[float, float]]] = {s: [] for s in SIDES}

    def train() -> None:  # the training thread: every segment of every side
        step()
        for rep in range(a.repeats):
            for side in SIDES if rep % 2 == 0 else SIDES[::-1]:
                stop = threading.Event()
                writer = None
                if side != "none":
                    args = (snap, root / side, side, a.period, stop, writes[side])
                    writer = threading.Thread(target=_writer, args=args, name="rapidfire-checkpoints")
                    writer.start()
                t0 = time.perf_counter()
                for _ in range(a.steps):
                    step()
                times[side].append(time.perf_counter() - t0)
                stop.set()
                if writer is not None:
                    writer.join()
            print(f"  repeat {rep + 1}/{a.repeats} done", flush=True)

    started = time.time()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.load)]
    try:
        worker = threading.Thread(target=train, name="rapidfire-device-1")
        worker.start()
        worker.join()
    finally:
        for p in busy:
            p.kill()
            p.wait()
        shutil.rmtree(root, ignore_errors=True)

    ref = statistics.median(times["none"])
    mb = sum(t.numel() * t.element_size() for t in snap.weights.values()) / 1e6
    lines = [
        f"checkpoint writer interference — {time.strftime('%Y-%m-%d %H:%M:%S')}",
        f"machine: {platform.platform()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} torch threads; OMP_WAIT_POLICY unset (was {OMP_BEFORE!r} in this shell)",
        f"SmolLM2-135M-Instruct, LoRA r=32 q/k/v/o ({mb:.1f} MB adapter + {2 * mb:.1f} MB AdamW state), batch of "
        f"{a.tokens} tokens; {a.repeats} segments of {a.steps} steps per side; a checkpoint every {a.period} s; "
        f"{a.load} other busy process(es)",
        f"{'side':<15} {'segment (s)':>11} {'ratio':>7}   {'per checkpoint: wall / CPU (ms)':<32} per repeat (s)",
    ]
    for side in SIDES:
        med = statistics.median(times[side])
        w = writes[side]
        per = (
            f"{statistics.median(x for x, _ in w) * 1e3:6.0f} / {statistics.median(c for _, c in w) * 1e3:4.0f}"
            f"  (x{len(w)})"
            if w
            else "-"
        )
        lines.append(
            f"{side:<15} {med:11.2f} {med / ref:7.3f}   {per:<32} {', '.join(f'{x:.2f}' for x in times[side])}"
        )
    lines.append(f"wall time {time.time() - started:.0f} s")
    report = "\n".join(lines)
    print(report)
    if a.out:
        Path(a.out).write_text(report + "\n")


if __name__ == "__main__":
    main()
