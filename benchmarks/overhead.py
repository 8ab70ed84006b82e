"""Overhead of rapidfire_nb against plain sequential TRL: 4 SFT LoRA configs, the same work both ways.

One invocation measures three cases (``--cases``):

* **fast**: "fast steps", a tiny Llama of hidden size 256 (4 layers, 8 heads, MLP 512; the tiny tokenizer),
  256 rows, batch 8, no eval set, 32 steps per run; rapidfire_nb with 8 steps per chunk (num_chunks=4) and
  with 32 (num_chunks=1, the no-switching reference). Steps take milliseconds, as a small LoRA step on a GPU.
* **tiny**: the tests' tiny Llama (hidden 64), batch 4, eval at every chunk end, 8 steps per chunk.
* **smollm2**: SmolLM2-135M-Instruct, batch 1, eval at every chunk end, 8 steps per chunk.

The two sides:

* **rapidfire_nb**: ``Experiment(...).run_fit(RFGridSearch(...), create_model_fn, train, eval, num_chunks=K)``
  followed by ``experiment.end()``, 2 learning rates x 2 LoRA configs = 4 runs.
* **sequential plain TRL**: the same 4 expanded leaf configs, one after the other, each as a user would write
  it: ``model, tok = create_model_fn(leaf.model_config_dict())``,
  ``SFTTrainer(model, args, train_dataset, eval_dataset, processing_class, peft_config).train()``,
  ``trainer.save_model()``; ``args``/``peft_config`` from ``rapidfire_nb.spec.build_training_args(leaf, ...)``
  / ``build_lora_config(leaf)``.

OpenMP: by default every child inherits this environment with ``OMP_WAIT_POLICY`` unset (as users have it);
sequential TRL and rapidfire_nb are also measured with ``OMP_WAIT_POLICY=passive``, and rapidfire_nb's ratio
is taken against the faster of sequential's two settings. Every measurement is a child process of its own
(``python overhead.py --child ...``): OpenMP thread teams must not mix between sides (benchmarks/README.md says
why). Each repeat runs every side once, the order reversed every other repeat; the report shows medians.

Usage (from the repository root)::

    .venv/bin/python benchmarks/overhead.py                       # all cases, defaults (~15 min quiet)
    .venv/bin/python benchmarks/overhead.py --cases tiny --steps 8 --repeats 1   # quick smoke run
    .venv/bin/python benchmarks/overhead.py --cases fast --profile  # + a cProfile of one rf child
    .venv/bin/python benchmarks/overhead.py --with-trackers mlflow,trackio   # rf side also on MLflow + Trackio
    .venv/bin/python benchmarks/overhead.py --cases smollm2 --pinned-pairs --control-repeats 2  # both sides at once,
                                                                     # one CPU and one thread each (~17 min)

Writes the report to ``benchmarks/results/latest.txt``, the raw numbers to ``latest.json`` and the blocks to paste
into README.md / benchmarks/README.md to ``latest.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling modules, however this file is run

import overhead_child  # noqa: E402
import overhead_report  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"

#: per case: model, steps per run (= one epoch: steps x batch rows), batch, repeats, eval set, the num_chunks=1
#: reference, the 1-config memory child, the total-time target, whether the per-switch target applies and whether
#: rapidfire_nb also runs with OMP_WAIT_POLICY=passive by default (not SmolLM2: the default run stays ~15 min).
#: SmolLM2 gets 5 repeats, its passive side only in the first ("passive_repeats"): one repeat misled (2026-12-03:
#: per-repeat ratios 1.121, 1.006, 0.988 on one machine, one after the other; 2026-12-02's single repeat read 1.100)
CASES: dict[str, dict[str, Any]] = {
    "fast": {
        "model": "fast",
        "title": "fast steps, tiny Llama (hidden 256, 4 layers, 8 heads, MLP 512)",
        "steps": 32,
        "batch": 8,
        "repeats": 5,
        "eval": False,
        "reference": True,
        "memory": False,
        "target": 1.05,
        "switch_target": True,
        "rf_passive": True,
        "notebook": True,
        "gc_reference": True,
    },
    "tiny": {
        "model": "tiny",
        "title": "tiny Llama of the tests (hidden 64, 2 layers)",
        "steps": 32,
        "batch": 4,
        "repeats": 5,
        "eval": True,
        "reference": False,
        "memory": True,
        "target": 1.05,
        "switch_target": True,
        "rf_passive": True,
        "notebook": True,
        "gc_reference": True,
    },
    "smollm2": {
        "model": "smollm2",
        "title": "SmolLM2-135M-Instruct",
        "steps": 32,
        "batch": 1,
        "repeats": 5,
        "passive_repeats": 1,
        "eval": True,
        "reference": False,
        "memory": True,
        "target": 1.02,
        "switch_target": False,
        "rf_passive": False,
        "notebook": False,
        "gc_reference": False,
    },
}
OPENMP_VARS = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT", "OMP_PROC_BIND", "MKL_NUM_THREADS")


# ====================================================================== children
def _child_env(passive: bool, a: argparse.Namespace) -> dict[str, str]:
    """The environment of one child: this one, offline, with the side's OpenMP wait policy."""
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif a.omp_wait_policy == "unset":
        env.pop("OMP_WAIT_POLICY", None)
    elif a.omp_wait_policy != "inherit":
        env["OMP_WAIT_POLICY"] = a.omp_wait_policy.upper()
    return env


_TRACKER_FOLDER: list[Path] = []


def _tracker_env(a: argparse.Namespace) -> dict[str, str]:
    """The rf child's extra environment for ``--with-trackers`` (empty without it); migrates MLflow's store once."""
    names = [n.strip().lower() for n in (a.with_trackers or "").split(",") if n.strip()]
    if not names:
        return {}
    if not _TRACKER_FOLDER:
        import atexit

        _TRACKER_FOLDER.append(Path(tempfile.mkdtemp(prefix="rf-bench-trackers-")))
        atexit.register(shutil.rmtree, _TRACKER_FOLDER[0], ignore_errors=True)
    folder = _TRACKER_FOLDER[0]
    env = {f"RF_{name.upper()}_ENABLED": "true" for name in names}
    if "mlflow" in names:
        env["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder / 'mlflow.db'}"
        if not (folder / "mlflow.db").exists():  # MLflow's migrations (seconds): once, not in a timed child
            code = "import sys; from mlflow.tracking import MlflowClient; MlflowClient(sys.argv[1]).search_experiments()"
            subprocess.run([sys.executable, "-c", code, env["MLFLOW_TRACKING_URI"]], check=True)
    if "trackio" in names:
        env["TRACKIO_DIR"] = str(folder / "trackio")
    return env


def user_omp(a: argparse.Namespace) -> str:
    """How the users' setting reads in the report, e.g. ``OMP_WAIT_POLICY unset``."""
    policy = _child_env(False, a).get("OMP_WAIT_POLICY")
    return "OMP_WAIT_POLICY unset" if policy is None else f"OMP_WAIT_POLICY={policy.lower()}"


def _spawn(c: dict[str, Any], side: str, a: argparse.Namespace, log_dir: Path, tag: str, **kw: Any) -> dict:
    """Run one child (``side`` a key of :data:`overhead_report.SIDES`) and return its numbers + peak RSS."""
    return _finish(_start(c, side, a, log_dir, tag, **kw))


def _start(
    c: dict[str, Any], side: str, a: argparse.Namespace, log_dir: Path, tag: str, **kw: Any
) -> dict[str, Any]:
    """Start one child; ``cpu=N`` pins it (every thread) to CPU N with one OpenMP/MKL thread (``--pinned-pairs``)."""
    result, log = log_dir / f"{tag}.json", log_dir / f"{tag}.log"
    is_rf, passive = overhead_report.SIDES[side]
    num_chunks = 1 if side == "rf1" else c["num_chunks"]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "rf" if is_rf else "base"]
    cmd += ["--model", c["model"], "--steps", str(c["steps"]), "--batch", str(c["batch"])]
    cmd += ["--num-chunks", str(num_chunks), "--configs", str(kw.get("configs", 4)), "--result", str(result)]
    cmd += ["--checkpoint-every", str(a.checkpoint_every)]
    if not c["eval"]:
        cmd.append("--no-eval")
    if side == "rfN":
        cmd.append("--main-torch")
    if side == "rfG":
        cmd.append("--every-gc")
    if kw.get("profile_out") is not None:
        cmd += ["--profile-out", str(kw["profile_out"])]
    env = _child_env(passive, a)
    if is_rf:
        env.update(_tracker_env(a))
    cpu = kw.get("cpu")
    if cpu is not None:
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    t0, stolen0 = time.time(), _stolen_seconds()
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            cmd,
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=str(REPO),
            env=env,
            preexec_fn=None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu})),
        )
    return {"proc": proc, "t0": t0, "stolen0": stolen0, "result": result, "log": log, "tag": tag}


def _finish(h: dict[str, Any], waited: tuple[int, Any, float] | None = None) -> dict[str, Any]:
    """Wait for a child of :func:`_start`; its numbers, peak RSS, CPU and stolen time (exits on a failed child).

    ``waited``: ``(status, rusage, time)`` when the caller has already reaped the child (``os.wait4(-1)``).
    """
    proc, t0, stolen0, result, log, tag = (h[k] for k in ("proc", "t0", "stolen0", "result", "log", "tag"))
    if waited is None:
        try:
            _pid, status, usage = os.wait4(proc.pid, 0)
        except KeyboardInterrupt:
            proc.kill()
            raise
        waited = (status, usage, time.time())
    status, usage, ended = waited
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    code, wall = proc.returncode, ended - t0
    if code != 0 or not result.exists():
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"child {tag} failed (exit {code}); log {log}:\n{tail}")
    out = json.loads(result.read_text())
    out["peak_rss_mb"] = usage.ru_maxrss / 1024  # Linux: KiB
    out["child_wall_s"] = wall
    out["cpu_s"] = usage.ru_utime + usage.ru_stime  # the whole child, every thread (spinning OpenMP included)
    stolen1 = _stolen_seconds()
    out["stolen_s"] = stolen1 - stolen0 if stolen0 is not None and stolen1 is not None else None
    print(
        f"    {tag}: total {out['total_s']:.2f} s, peak RSS {out['peak_rss_mb']:.0f} MB (child wall {wall:.1f} s)",
        flush=True,
    )
    return out


def _stolen_seconds() -> float | None:
    """CPU time the hypervisor gave to other guests so far, summed over this machine's CPUs (``/proc/stat``'s
    ``steal`` column, Linux; None elsewhere). On a shared VM it is what makes one child slower than the next."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _sides(c: dict[str, Any], a: argparse.Namespace) -> list[str]:
    """The children of one repeat, in the order of an even repeat (odd repeats run them in reverse)."""
    sides = ["rf", "seq"]
    if _child_env(False, a).get("OMP_WAIT_POLICY", "").lower() != "passive":  # else "passive" is the same
        sides += ["rfP"] if a.rf_passive == "all" or (a.rf_passive == "default" and c["rf_passive"]) else []
        sides += ["seqP"]
    if c["reference"] and c["num_chunks"] > 1:
        sides.append("rf1")
    if c["notebook"]:
        sides.append("rfN")
    if c["gc_reference"]:
        sides.append("rfG")
    return sides


def _warm_file_cache(model: str) -> None:
    """Read the model's files once, untimed, so that no side pays the first read from disk.

    SmolLM2's weights (~270 MB) come from disk on the first load after other work; with one repeat the side that
    runs first paid it alone (2026-12-02: rapidfire_nb's set-up took 13.2 s against 4.3 s warm).
    """
    if model != "smollm2":
        return  # the tiny models are built in memory
    from rapidfire_nb.data import smollm2_path

    for f in sorted(Path(smollm2_path()).rglob("*")):
        if f.is_file():
            with open(f, "rb") as fh:
                while fh.read(1 << 24):
                    pass


def run_case(
    c: dict[str, Any], a: argparse.Namespace, log_dir: Path, prof_dir: Path | None
) -> dict[str, Any]:
    """Every repeat of one case (+ the memory and profile children); the raw results."""
    if c.get("pinned"):
        return run_pinned_pairs(c, a, log_dir)
    sides, reps, orders = _sides(c, a), [], []
    users = [
        s for s in sides if not overhead_report.SIDES[s][1]
    ]  # the sides of the repeats after passive_repeats
    shown = sides if c["passive_repeats"] else users
    _warm_file_cache(c["model"])
    started = time.time()
    print(
        f"[{c['label']}] {c['repeats']} repeat(s) of {', '.join(shown)}; {c['steps']} steps/run"
        + (
            f" (the passive sides in the first {c['passive_repeats']} only)"
            if 0 < c["passive_repeats"] < c["repeats"] and users != sides
            else ""
        ),
        flush=True,
    )
    for r in range(c["repeats"]):
        these = sides if r < c["passive_repeats"] else users
        order = these if r % 2 == 0 else these[::-1]
        reps.append({s: _spawn(c, s, a, log_dir, f"{c['label']}-{s}-{r}") for s in order})
        orders.append(">".join(order))
        spent = time.time() - started
        left = spent / (r + 1) * (c["repeats"] - r - 1)
        print(
            f"  [{c['label']}] repeat {r + 1}/{c['repeats']} done, {spent:.0f} s so far, ~{left:.0f} s left",
            flush=True,
        )
    one = None
    if c["memory"] and not a.skip_memory:
        one = _spawn(c, "rf", a, log_dir, f"{c['label']}-rf-1config", configs=1)
    if prof_dir is not None:
        _spawn(
            c, "rf", a, log_dir, f"{c['label']}-rf-profiled", profile_out=prof_dir / f"rf-{c['label']}.prof"
        )
    return {"case": c, "repeats": reps, "orders": orders, "rf_1_config": one}


def _pair(c: dict[str, Any], a: argparse.Namespace, log_dir: Path, sides: dict[str, tuple[str, int]]) -> dict:
    """Run two children at the same time, ``label -> (side, cpu)``, each pinned to its CPU; both results."""
    started = {
        k: _start(c, side, a, log_dir, f"{c['label']}-{k}", cpu=cpu) for k, (side, cpu) in sides.items()
    }
    by_pid = {h["proc"].pid: k for k, h in started.items()}
    done: dict[str, Any] = {}
    try:
        while len(done) < len(started):  # whichever ends first: its wall time is its own
            pid, status, usage = os.wait4(-1, 0)
            if pid in by_pid:
                k = by_pid[pid]
                done[k] = _finish(started[k], (status, usage, time.time()))
    finally:  # one child failed (SystemExit) or Ctrl-C: the other does not train on alone
        for k, h in started.items():
            if k not in done and h["proc"].poll() is None:
                h["proc"].kill()
    return done


def run_pinned_pairs(c: dict[str, Any], a: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """``--pinned-pairs``: rf and sequential TRL at the same time, each pinned to its own CPU with one thread.

    Both sides of a pair live through the same moments of the host, so a slow stretch (a busy neighbour on a
    shared VM, which slowed identical work by up to 35% on 2026-12-03) slows both; the CPUs are swapped every
    repeat. ``--control-repeats n`` adds n pairs of sequential against sequential (the same work on both
    CPUs): the spread of their ratios is this layout's own precision on this machine. The side started first
    alternates every two repeats (``orders`` lists the start order); in each control pair the first-started
    child is the numerator.
    """
    cpus = sorted(os.sched_getaffinity(0))[:2]
    _warm_file_cache(c["model"])
    reps, orders, control = [], [], []
    print(
        f"[{c['label']}] {c['repeats']} pinned pair(s) rf | seq on CPUs {cpus}, one thread each"
        + (f", + {a.control_repeats} control pair(s) seq | seq" if a.control_repeats else ""),
        flush=True,
    )
    started = time.time()
    for r in range(c["repeats"]):
        # the CPUs swap every repeat, the side started first every two repeats
        x, y = cpus if r % 2 == 0 else cpus[::-1]
        pair = {f"rf-{r}": ("rf", x), f"seq-{r}": ("seq", y)}
        if (r // 2) % 2:
            pair = dict(reversed(pair.items()))
        got = _pair(c, a, log_dir, pair)
        reps.append({"rf": got[f"rf-{r}"], "seq": got[f"seq-{r}"]})
        orders.append("|".join(f"{side}@cpu{cpu}" for side, cpu in pair.values()))
        print(
            f"  [{c['label']}] pair {r + 1}/{c['repeats']} done, {time.time() - started:.0f} s so far",
            flush=True,
        )
    for r in range(a.control_repeats):
        x, y = cpus if r % 2 == 0 else cpus[::-1]
        got = _pair(c, a, log_dir, {f"ctlA-{r}": ("seq", x), f"ctlB-{r}": ("seq", y)})
        control.append({"cpus": [x, y], "totals": [got[f"ctlA-{r}"]["total_s"], got[f"ctlB-{r}"]["total_s"]]})
        print(f"  [{c['label']}] control pair {r + 1}/{a.control_repeats} done", flush=True)
    return {"case": c, "repeats": reps, "orders": orders, "rf_1_config": None, "control": control}


# ====================================================================== parent
def _cases(a: argparse.Namespace) -> list[dict[str, Any]]:
    """The selected cases with the command line's overrides applied."""
    out = []
    repeats = _per_case(a.repeats, "--repeats")
    passive_repeats = _per_case(a.passive_repeats, "--passive-repeats", minimum=0)
    if a.control_repeats < 0:
        raise SystemExit(f"--control-repeats: {a.control_repeats}; use 0 or more")
    if a.control_repeats and not a.pinned_pairs:
        raise SystemExit("--control-repeats: only with --pinned-pairs (it adds pairs to that layout)")
    if a.pinned_pairs and len(os.sched_getaffinity(0)) < 2:
        raise SystemExit(
            f"--pinned-pairs: needs 2 CPUs, one per side; this process may run on CPU(s) "
            f"{sorted(os.sched_getaffinity(0))} only"
        )
    for name in (n.strip() for n in a.cases.split(",") if n.strip()):
        if name not in CASES:
            raise SystemExit(f"--cases: unknown case {name!r}; use {', '.join(CASES)}")
        c = dict(CASES[name], label=name, user_omp=user_omp(a), num_chunks=a.num_chunks)
        if a.pinned_pairs:
            c.update(
                label=f"{name}-pinned", pinned=True, user_omp="1 thread on its own CPU, at the same time"
            )
        c["steps"] = a.steps or c["steps"]
        c["batch"] = a.batch or c["batch"]
        c["repeats"] = repeats.get(name, repeats.get("*", c["repeats"]))
        passive = c.get("passive_repeats", c["repeats"])  # a case without the key: every repeat
        c["passive_repeats"] = min(c["repeats"], passive_repeats.get(name, passive_repeats.get("*", passive)))
        c["eval"] = c["eval"] and not a.no_eval
        if c["steps"] % c["num_chunks"]:
            raise SystemExit(f"--steps ({c['steps']}) must be a multiple of --num-chunks ({c['num_chunks']})")
        out.append(c)
    return out


def _per_case(text: str | None, flag: str, minimum: int = 1) -> dict[str, int]:
    """``"3"`` -> every case 3; ``"fast=7,smollm2=2"`` -> those cases (the others keep their default).

    Raises:
        SystemExit: not a number, a number below ``minimum``, or a case name that is not in :data:`CASES`.
    """
    if not text:
        return {}
    try:
        if "=" not in text:
            got = {"*": int(text)}
        else:
            got = {k.strip(): int(v) for k, v in (part.split("=", 1) for part in text.split(","))}
    except ValueError:
        raise SystemExit(
            f"{flag}: use a number (every case) or case=number,... (e.g. fast=7,smollm2=2)"
        ) from None
    for name, n in got.items():
        if name != "*" and name not in CASES:
            raise SystemExit(f"{flag}: unknown case {name!r}; use {', '.join(CASES)}")
        if n < minimum:
            raise SystemExit(
                f"{flag}: {n} for {'every case' if name == '*' else name}; use {minimum} or more"
            )
    return got


def _header(a: argparse.Namespace, load0: tuple[float, ...], load1: tuple[float, ...]) -> list[str]:
    import importlib.metadata as md

    vers = ", ".join(f"{p} {md.version(p)}" for p in ("torch", "transformers", "trl", "peft"))
    here = os.environ.get("OMP_WAIT_POLICY")
    omp = f"users' setting: {user_omp(a)}"
    if a.omp_wait_policy == "unset":
        omp += " (the children's environment as users have it" + (
            f"; removed this shell's OMP_WAIT_POLICY={here})" if here else ")"
        )
    others = [f"{k}={os.environ[k]}" for k in OPENMP_VARS[1:] if k in os.environ]
    passive = (
        "OMP_NUM_THREADS=1 in every child (one thread on one CPU: no OpenMP team)"
        if a.pinned_pairs
        else "no separate passive sides (the users' setting is passive)"
        if user_omp(a).endswith("passive")
        else "'passive' sides set OMP_WAIT_POLICY=PASSIVE"
    )
    return [
        f"rapidfire_nb overhead benchmark — {time.strftime('%Y-%m-%d %H:%M:%S')}",
        f"command: python benchmarks/overhead.py {' '.join(sys.argv[1:])}".rstrip(),
        f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {vers}",
        f"load average 1 min: {load0[0]:.1f} at start, {load1[0]:.1f} at end (other work on the machine adds noise)",
        (
            "--pinned-pairs: each repeat runs rf and sequential at the same time, each child pinned to its own "
            "CPU with one thread (OMP_NUM_THREADS=1), CPUs swapped every repeat; ratios are medians of "
            "per-pair ratios"
            if a.pinned_pairs
            else "every measurement in its own child process; each repeat runs every side once, order reversed "
            "every other repeat; ratios are medians of per-repeat ratios"
        ),
        f"OpenMP: {omp}; {passive}" + (f"; also set here: {', '.join(others)}" if others else ""),
        "",
    ]


def _paste_block(head: list[str], summary: list[str], report: list[str]) -> str:
    fence = "```"
    return "\n".join(
        [
            "==== README.md, section 'Benchmark': paste this block ====",
            fence + "text",
            *head[:6],
            "",
            *summary,
            fence,
            "==== benchmarks/README.md, section 'Latest output': paste this block ====",
            fence + "text",
            *head,
            *summary,
            "",
            *report,
            fence,
        ]
    )


def parent_main(a: argparse.Namespace) -> None:
    cases = _cases(a)
    started, load0 = time.time(), os.getloadavg()
    log_dir = Path(tempfile.mkdtemp(prefix="rf-overhead-"))
    prof_dir = Path(a.out).parent / "profiles" if a.profile else None
    if prof_dir is not None:
        prof_dir.mkdir(parents=True, exist_ok=True)
    print(f"OpenMP for the users' setting: {user_omp(a)}; child logs in {log_dir}", flush=True)
    raw: dict[str, Any] = {"argv": sys.argv[1:], "cases": {}}
    for c in cases:
        raw["cases"][c["label"]] = run_case(c, a, log_dir, prof_dir)
    raw["head"] = _header(a, load0, os.getloadavg())
    raw["tail"] = [f"benchmark wall time: {time.time() - started:.0f} s; child logs in {log_dir}"]
    if a.profile:
        raw["tail"].append(f"profiles: {prof_dir}/rf-<case>.txt (cProfile, all threads)")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(raw, indent=1, default=str) + "\n")
    write_report(raw, out)


def render_report(raw: dict[str, Any]) -> tuple[list[str], str]:
    """The report of ``raw`` (what :func:`parent_main` measured) as lines, and the blocks to paste."""
    report: list[str] = []
    targets: list[tuple[str, str, float, float | None]] = []
    for got in raw["cases"].values():
        report += overhead_report.report_case(
            got["case"], got["repeats"], got["orders"], got["rf_1_config"], targets, got.get("control")
        )
        report.append("")
    head, tail = raw["head"], raw["tail"]
    summary = overhead_report.summary(targets)
    return head + summary + [""] + report + tail, _paste_block(head, summary, report + tail[:1])


def write_report(raw: dict[str, Any], out: Path) -> None:
    """Print the report of ``raw`` and write it to ``out`` (+ ``.md``: the blocks to paste)."""
    lines, paste = render_report(raw)
    text = "\n".join(lines)
    print("\n" + text)
    out.write_text(text + "\n")
    out.with_suffix(".md").write_text(paste + "\n")
    print(f"\n{paste}\n\nwritten to {out} (.json: raw numbers; .md: the blocks above)")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument(
        "--cases", "--models", default="fast,tiny,smollm2", help="comma-separated: fast, tiny, smollm2"
    )
    ap.add_argument(
        "--steps", type=int, help="optimizer steps per run = one epoch (default 32 in every case)"
    )
    ap.add_argument(
        "--batch", type=int, help="per_device_train_batch_size (default: fast 8, tiny 4, smollm2 1)"
    )
    ap.add_argument(
        "--repeats",
        help="repeats per case: a number for every case, or case=n,... (default 5 in every case)",
    )
    ap.add_argument(
        "--passive-repeats",
        help="run the passive sides (sequential and rapidfire_nb with OMP_WAIT_POLICY=passive) only in the first "
        "n repeats of a case: a number or case=n,... (default: every repeat; smollm2=1, its passive sequential "
        "side is ~1.4x slower and adds ~3 min per repeat; 'the faster setting' is then chosen from its medians)",
    )
    ap.add_argument("--num-chunks", type=int, default=4, help="chunks per epoch of the chunked rf side")
    ap.add_argument(
        "--checkpoint-every", type=int, default=1, help="run_fit(checkpoint_every=...) (default 1)"
    )
    ap.add_argument("--no-eval", action="store_true", help="every case without an eval set")
    ap.add_argument("--skip-memory", action="store_true", help="skip the 1-config rf child (memory N vs 1)")
    ap.add_argument(
        "--rf-passive",
        default="default",
        choices=("default", "all", "none"),
        help="which cases also run rapidfire_nb with OMP_WAIT_POLICY=passive (default: fast and tiny; SmolLM2 "
        "only with 'all', which adds ~1.5 min)",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="one more cProfiled rf child per case into benchmarks/results/profiles/",
    )
    ap.add_argument(
        "--omp-wait-policy",
        default="unset",
        choices=("unset", "inherit", "active", "passive"),
        help="OMP_WAIT_POLICY of the users'-setting children (default unset, as users have it; 'inherit' keeps "
        "this shell's). The passive sides always set PASSIVE",
    )
    ap.add_argument(
        "--pinned-pairs",
        action="store_true",
        help="run rf and sequential TRL at the same time, each pinned to its own CPU with one thread, CPUs "
        "swapped every repeat (needs 2 CPUs): a noisy shared host slows both sides of a pair alike. "
        "Not the users' setting (they train on every CPU); no passive, reference or memory children",
    )
    ap.add_argument(
        "--control-repeats",
        type=int,
        default=0,
        help="with --pinned-pairs: n more pairs of sequential against sequential, the layout's own precision",
    )
    ap.add_argument(
        "--out",
        help="report path, .json and .md beside it (default benchmarks/results/latest.txt; with --report-from: "
        "print only, unless given)",
    )
    ap.add_argument(
        "--with-trackers",
        default="",
        metavar="mlflow,trackio",
        help="the rapidfire_nb side also tracks with these backends beside TensorBoard (RF_<NAME>_ENABLED=true "
        "in its environment): MLflow into one SQLite store migrated before any timing, Trackio into a temporary "
        "TRACKIO_DIR; their packages are imported before timing. Compare the rf totals with a run without it",
    )
    ap.add_argument(
        "--report-from",
        metavar="JSON",
        help="only re-print the report of an earlier run's .json (no training)",
    )
    # child-only
    ap.add_argument("--child", choices=("rf", "base"), help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--configs", type=int, default=4, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--profile-out", help=argparse.SUPPRESS)
    ap.add_argument("--main-torch", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--every-gc", action="store_true", help=argparse.SUPPRESS)
    return ap


def main() -> None:
    a = _parser().parse_args()
    if a.child:
        overhead_child.child_main(a)
    elif a.report_from:
        report_from(a)
    else:
        if a.out is None:
            a.out = str(RESULTS / "latest.txt")
        parent_main(a)


def report_from(a: argparse.Namespace) -> None:
    """``--report-from JSON``: print an earlier run's report again; written only to ``--out`` when it is given.

    Raises:
        SystemExit: the file is missing, not JSON, or not a results file of this script (one line each).
    """
    path = Path(a.report_from)
    not_ours = (
        f"--report-from: {path} is not the .json of an overhead.py run (give the .json next to its .txt)"
    )
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise SystemExit(f"--report-from: cannot read {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise SystemExit(not_ours) from None
    if not isinstance(raw, dict) or not {"cases", "head", "tail"} <= set(raw):
        raise SystemExit(not_ours)
    try:
        if a.out is None:
            print("\n".join(render_report(raw)[0]))
        else:
            write_report(raw, Path(a.out))
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
        raise SystemExit(f"{not_ours} ({type(exc).__name__}: {exc})") from None


if __name__ == "__main__":
    main()
