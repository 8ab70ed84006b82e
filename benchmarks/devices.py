"""Several CPU workers against one process: 4 SFT LoRA configs trained with ``run_fit(devices=2)`` on 2 cores.

The cases (each measurement a child process of its own, pinned to the same ``--cores`` CPUs, default 2):

* **a** ``devices=None`` (the kernel process trains) with ``torch.set_num_threads(1)``: 1 worker, 1 thread;
* **b** the same with 2 threads: 1 worker using both cores;
* **c** ``devices=2``: 2 CPU worker processes of ``cores // 2`` = 1 torch thread each (their start-up, importing
  torch and TRL, counts in the total; it is also shown on its own);
* **d** (reference line) sequential plain TRL with 2 threads: ``SFTTrainer(...).train()`` per config.

The workload is ``overhead.py``'s (``overhead_child.workload``): 2 learning rates x 2 LoRA configs, one epoch of
``--steps`` optimizer steps, eval at every chunk end (``eval_steps`` = the chunk length, so plain TRL evaluates
at the same steps), on the tests' tiny Llama and/or SmolLM2-135M-Instruct (fp32, the tech-support rows).

Per case: the total (``Experiment(...)`` up to ``end()`` returning; d: the first model load up to the last
``save_model``), the time until every config has its first eval (the latest of each run's earliest
``eval_loss`` wall time in the store), and from ``run_fit`` to the first logged training step. The targets
(issue): c / a <= 0.6x and c / b <= 1.0x in total time. Exactness: the largest |difference| of the final adapters
of c (and d) against a, over all runs; it must be 0.0.

Usage (from the repository root)::

    .venv/bin/python benchmarks/devices.py                          # tiny + SmolLM2, 3 repeats tiny, 1 SmolLM2
    .venv/bin/python benchmarks/devices.py --model tiny --steps 8 --repeats 1   # smoke run (~1-2 min)
    .venv/bin/python benchmarks/devices.py --model smollm2 --repeats 2 --cases a,b,c

Writes the report to ``--out`` (default ``benchmarks/results/devices.txt``) and the raw numbers next to it
(``.json``). Timings on a machine shared with other work mean little: read the load average in the header.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # overhead_child, however this file is run

SEED = 42
CASES = {
    "a": "devices=None, 1 thread (kernel process)",
    "b": "devices=None, 2 threads (kernel process)",
    "c": "devices=2 (2 CPU workers x 1 thread)",
    "d": "sequential plain TRL, 2 threads",
}
DEFAULTS = {
    "tiny": {"steps": 32, "batch": 4, "repeats": 3},
    "smollm2": {"steps": 16, "batch": 1, "repeats": 1},
}


# ====================================================================== child
def _first_evals(points: list[dict[str, Any]]) -> tuple[dict[int, float], float | None]:
    """``({run: earliest eval_loss wall time}, earliest training-step wall time)`` from store metric rows."""
    first: dict[int, float] = {}
    first_step: float | None = None
    for p in points:
        if p["name"] == "eval_loss":
            first[p["run_id"]] = min(first.get(p["run_id"], float("inf")), p["wall_time"])
        elif p["name"] == "loss":
            first_step = p["wall_time"] if first_step is None else min(first_step, p["wall_time"])
    return first, first_step


def _child_rf(w: dict[str, Any], a: argparse.Namespace, out: dict[str, Any], adapters: Path) -> None:
    from rapidfire_nb import Experiment
    from rapidfire_nb.devices import local

    ready: list[float] = []
    if a.child == "c":  # benchmark-side timer: when each worker said it is ready (torch + TRL imported)
        original = local.WorkerExecutor.__init__

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            self._ready.add_done_callback(lambda _f: ready.append(time.time()))

        local.WorkerExecutor.__init__ = init  # type: ignore[method-assign]
    root = tempfile.mkdtemp(prefix="rf-devices-")
    try:
        t0 = time.time()
        exp = Experiment("devices", experiment_path=root, overwrite=True)
        exp.quiet = True
        exp.run_fit(
            w["search"],
            w["create"],
            w["train"],
            w["eval"],
            num_chunks=a.num_chunks,
            seed=SEED,
            devices=2 if a.child == "c" else None,
        )
        t_fit = time.time()
        exp.end()
        t_end = time.time()
        info = exp.get_runs_info()
        points, _ = exp.store.metrics_since(0)
        first, first_step = _first_evals(points)
        for row in info.itertuples():
            shutil.copy(
                Path(row.checkpoint_dir) / "adapter_model.safetensors",
                adapters / f"run-{row.run_id}.safetensors",
            )
        out.update(
            total_s=t_end - t0,
            fit_s=t_fit - t0,
            first_eval_all_s=(max(first.values()) - t0) if len(first) == len(info) else None,
            first_step_s=(first_step - t0) if first_step is not None else None,
            workers_ready_s=(max(ready) - t0) if ready else None,
            statuses=sorted(set(info.status)),
            devices=sorted({str(d) for d in info.device}) if "device" in info else [],
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _child_plain(w: dict[str, Any], out: dict[str, Any], adapters: Path) -> None:
    """Sequential plain TRL: the 4 leaves one after the other, each loading its model as a user would."""
    from overhead_child import _clock_callback, _formatted
    from trl import SFTTrainer

    from rapidfire_nb.spec import build_lora_config, build_training_args

    root = Path(tempfile.mkdtemp(prefix="rf-devices-plain-"))
    try:
        t0 = time.time()
        train, evald = _formatted(w)
        first: list[float | None] = []
        first_step = None
        for i, leaf in enumerate(w["search"].expand(SEED), start=1):
            args, _notes = build_training_args(leaf, output_dir=str(root / f"run{i}"), default_seed=SEED)
            model, tok = w["create"](leaf.model_config_dict())
            clock = _clock_callback()
            trainer = SFTTrainer(
                model=model,
                args=args,
                train_dataset=train,
                eval_dataset=evald,
                processing_class=tok,
                peft_config=build_lora_config(leaf),
                callbacks=[clock],
            )
            t_train = time.time()
            trainer.train()
            trainer.save_model()
            first_step = first_step or t_train
            first.append(clock.first_eval)
            shutil.copy(root / f"run{i}" / "adapter_model.safetensors", adapters / f"run-{i}.safetensors")
            del trainer, model, tok
        out.update(
            total_s=time.time() - t0,
            first_eval_all_s=(first[-1] - t0) if first and first[-1] is not None else None,
            first_step_s=(first_step - t0) if first_step is not None else None,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def child_main(a: argparse.Namespace) -> None:
    """Train one case once and write its numbers to ``a.result`` (JSON), its final adapters to ``a.adapters``."""
    t_imp = time.time()
    import torch

    torch.set_num_threads(a.threads)
    import trl  # noqa: F401
    from overhead_child import workload

    import rapidfire_nb  # noqa: F401

    w = workload(a.model, a.steps, a.batch, a.num_chunks, 4, True)
    out: dict[str, Any] = {
        "case": a.child,
        "prep_s": time.time() - t_imp,
        "torch_threads": torch.get_num_threads(),
        "cpus": sorted(os.sched_getaffinity(0)),
    }
    if a.child == "c":
        from rapidfire_nb.devices.resolve import resolve_devices

        out["worker_threads"] = resolve_devices(2, "local", 0, len(os.sched_getaffinity(0))).threads
    adapters = Path(a.adapters)
    adapters.mkdir(parents=True, exist_ok=True)
    if a.child == "d":
        _child_plain(w, out, adapters)
    else:
        _child_rf(w, a, out, adapters)
    Path(a.result).write_text(json.dumps(out))


# ====================================================================== parent
def _run_child(
    case: str, model: str, a: argparse.Namespace, steps: int, batch: int, work: Path, tag: str
) -> dict[str, Any]:
    threads = 1 if case in ("a", "c") else 2
    result, adapters = work / f"{tag}.json", work / tag
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}  # as users have it
    env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU benchmark on any machine
    env["OMP_NUM_THREADS"] = str(threads)  # as the workers of c get it
    env.setdefault("HF_HUB_OFFLINE", "1")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", case, "--model", model]
    cmd += ["--steps", str(steps), "--batch", str(batch), "--num-chunks", str(a.num_chunks)]
    cmd += ["--threads", str(threads), "--result", str(result), "--adapters", str(adapters)]
    cpus = a.cpu_set
    log = work / f"{tag}.log"
    with open(log, "w") as fh:
        proc = subprocess.run(
            cmd,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )
    if proc.returncode != 0 or not result.exists():
        tail = log.read_text()[-3000:]
        raise SystemExit(f"child {tag} failed (exit {proc.returncode}); log {log}:\n{tail}")
    data = json.loads(result.read_text())
    data["adapters"] = str(adapters)
    return data


def _adapter_diff(left: str, right: str) -> float:
    """Largest |difference| over every run's final adapter tensors of two children (the same run ids)."""
    from safetensors.torch import load_file

    worst = 0.0
    names = sorted(p.name for p in Path(left).glob("run-*.safetensors"))
    if not names or names != sorted(p.name for p in Path(right).glob("run-*.safetensors")):
        return float("nan")
    for name in names:
        x, y = load_file(str(Path(left) / name)), load_file(str(Path(right) / name))
        if sorted(x) != sorted(y):
            return float("nan")
        for key, value in x.items():
            worst = max(worst, (value.float() - y[key].float()).abs().max().item())
    return worst


def _median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _fmt(value: float | None, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:.2f}{unit}"


def report_model(model: str, steps: int, batch: int, reps: list[dict[str, dict[str, Any]]]) -> list[str]:
    """The lines of one model's block: per case the medians, the target ratios, the exactness check."""
    cases = [c for c in CASES if all(c in r for r in reps)]
    lines = [
        f"== {model}: 4 SFT LoRA configs x {steps} steps, batch {batch}, eval at every chunk end; "
        f"{len(reps)} repeat(s) ==",
        f"  {'case':<44} {'total (s)':>10} {'every config has an eval (s)':>29} {'to first step (s)':>18}",
    ]
    for c in cases:
        tot = [r[c]["total_s"] for r in reps]
        lines.append(
            f"  {c}) {CASES[c]:<41} {_fmt(_median(tot)):>10} "
            f"{_fmt(_median([r[c]['first_eval_all_s'] for r in reps])):>29} "
            f"{_fmt(_median([r[c].get('first_step_s') for r in reps])):>18}"
            f"   per repeat {', '.join(f'{t:.2f}' for t in tot)}"
        )
    if "c" in cases:
        ready = _median([r["c"].get("workers_ready_s") for r in reps])
        threads = reps[0]["c"].get("worker_threads")
        lines.append(
            f"  c) worker start-up (run_fit -> both workers ready: torch + TRL imported, datasets loaded): "
            f"{_fmt(ready, ' s')}; {threads} torch thread(s) per worker"
        )

    def ratio(num: str, den: str, key: str) -> float | None:
        vals = [
            r[num][key] / r[den][key]
            for r in reps
            if r[num].get(key) is not None and r[den].get(key)  # both measured, non-zero
        ]
        return statistics.median(vals) if vals else None

    lines.append("  ratios (median of per-repeat ratios; lower is better):")
    for num, den, target in (("c", "a", 0.6), ("c", "b", 1.0), ("b", "a", None), ("c", "d", None)):
        if num in cases and den in cases:
            for key, what in (("total_s", "total"), ("first_eval_all_s", "every config has an eval")):
                value = ratio(num, den, key)
                mark = ""
                if target is not None and key == "total_s" and value is not None:
                    mark = f"  <= {target:.2f}x  {'OK' if value <= target else 'MISSED'}"
                lines.append(f"    {num} / {den}  {what:<26} {_fmt(value, 'x'):>8}{mark}")
    for other in ("c", "d"):
        if other in cases and "a" in cases:
            worst = max(r[other]["adapter_diff_vs_a"] for r in reps)
            ok = "OK" if worst == 0.0 else "NOT EXACT"
            lines.append(
                f"  exactness: max |final adapter {other} - a| over all runs and repeats = {worst:.2e}  {ok}"
            )
    return lines


def _header(a: argparse.Namespace, load0: tuple[float, ...], load1: tuple[float, ...]) -> list[str]:
    import importlib.metadata as md

    vers = ", ".join(f"{p} {md.version(p)}" for p in ("torch", "transformers", "trl", "peft"))
    return [
        f"rapidfire_nb devices benchmark — {time.strftime('%Y-%m-%d %H:%M:%S')}",
        f"command: python {' '.join(sys.argv)}",
        f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {vers}",
        f"children pinned to CPUs {a.cpu_set or 'all (not pinned)'}; OMP_WAIT_POLICY unset; "
        "OMP_NUM_THREADS = the case's threads; each measurement in its own child process, order reversed every "
        "other repeat",
        f"load average 1 min: {load0[0]:.1f} at start, {load1[0]:.1f} at end (other work on the machine adds noise)",
    ]


def _steps_batch(model: str, a: argparse.Namespace) -> tuple[int, int]:
    steps = a.steps or DEFAULTS[model]["steps"]
    if steps % a.num_chunks:
        raise SystemExit(f"--steps {steps} is not a multiple of --num-chunks {a.num_chunks}")
    return steps, a.batch or DEFAULTS[model]["batch"]


def parent_main(a: argparse.Namespace) -> None:
    models = ["tiny", "smollm2"] if a.model == "both" else [a.model]
    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad or "a" not in cases:
        raise SystemExit(f"--cases: a comma list of {', '.join(CASES)} that includes a (the reference)")
    allowed = sorted(os.sched_getaffinity(0))
    if a.cores and a.cores > len(allowed):
        raise SystemExit(f"--cores {a.cores}: only {len(allowed)} CPUs are available")
    a.cpu_set = set(allowed[: a.cores]) if a.cores else None
    if "smollm2" in models:
        from rapidfire_nb.data import smollm2_path

        smollm2_path()  # converted once into the user cache, never inside a timed child
    load0 = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="rf-devices-bench-"))
    t_start = time.time()
    blocks: list[str] = []
    raw: dict[str, Any] = {}
    for model in models:
        steps, batch = _steps_batch(model, a)
        repeats = a.repeats or DEFAULTS[model]["repeats"]
        reps: list[dict[str, dict[str, Any]]] = []
        for rep in range(repeats):
            order = cases if rep % 2 == 0 else cases[::-1]
            rep_data = {c: _run_child(c, model, a, steps, batch, work, f"{model}-{c}-{rep}") for c in order}
            for c in cases:  # exactness against a, then the adapters go (SmolLM2's: ~70 MB a child)
                rep_data[c]["adapter_diff_vs_a"] = _adapter_diff(
                    rep_data["a"]["adapters"], rep_data[c]["adapters"]
                )
            for c in cases:
                shutil.rmtree(rep_data[c].pop("adapters"), ignore_errors=True)
            reps.append(rep_data)
            print(
                f"{model}: repeat {rep + 1}/{repeats} done ({time.time() - t_start:.0f} s so far)", flush=True
            )
        blocks += report_model(model, steps, batch, reps) + [""]
        raw[model] = {"steps": steps, "batch": batch, "repeats": reps}
    lines = _header(a, load0, os.getloadavg()) + [""] + blocks
    lines.append(f"benchmark wall time: {time.time() - t_start:.0f} s; child logs in {work}")
    text = "\n".join(lines)
    print(text)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    out.with_suffix(".json").write_text(json.dumps(raw, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("tiny", "smollm2", "both"), default="both")
    ap.add_argument("--cases", default="a,b,c,d", help="which of a,b,c,d (default all; a is the reference)")
    ap.add_argument("--steps", type=int, help="optimizer steps per run (default tiny 32, smollm2 16)")
    ap.add_argument("--batch", type=int, help="per_device_train_batch_size (default tiny 4, smollm2 1)")
    ap.add_argument(
        "--repeats", type=int, help="repeats per model, median reported (default tiny 3, smollm2 1)"
    )
    ap.add_argument("--num-chunks", type=int, default=4)
    ap.add_argument("--cores", type=int, default=2, help="pin every child to this many CPUs (0: no pinning)")
    ap.add_argument("--out", default=str(HERE / "results" / "devices.txt"))
    # child side (internal)
    ap.add_argument("--child", choices=tuple(CASES), help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--adapters", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        a.model = a.model if a.model != "both" else "tiny"
        child_main(a)
    else:
        parent_main(a)


if __name__ == "__main__":
    main()
