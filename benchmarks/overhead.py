"""Overhead of rapidfire_nb against plain sequential TRL: 4 SFT LoRA configs x 4 chunks, same work both ways.

One invocation measures, per model (the tiny random Llama and SmolLM2-135M-Instruct):

* **rapidfire_nb**: ``Experiment(...).run_fit(RFGridSearch(...), create_model_fn, train, eval, num_chunks=4)``
  followed by ``experiment.end()`` (as a script user writes it), 2 learning rates x 2 LoRA configs = 4 runs.
* **sequential plain TRL**: the same 4 expanded leaf configs, one after the other, each as a user would write
  it: ``model, tok = create_model_fn(leaf.model_config_dict())`` (SmolLM2: from the converted safetensors
  folder), ``SFTTrainer(model, args, train_dataset, eval_dataset, processing_class, peft_config).train()``,
  ``trainer.save_model()``; ``args``/``peft_config`` come from
  ``rapidfire_nb.spec.build_training_args(leaf, ...)``/``build_lora_config(leaf)``.

Evaluation: every leaf sets ``eval_strategy="steps"`` with ``eval_steps`` = the chunk length, so both sides
evaluate at exactly the same steps (the end of every chunk; rapidfire_nb's own end-of-chunk evaluation is
skipped there because the config's cadence already evaluated). ``--no-eval`` runs both without an eval set.

Each side runs in its own child process (``python overhead.py --child ...``) so that peak RSS does not mix;
the parent reads each child's peak RSS from ``os.wait4`` (``ru_maxrss`` of exactly that child). Times are
wall-clock, measured inside the child after imports and data loading (the SmolLM2 conversion, done once per
machine, is done before any timing). Pairs alternate their order (rf first, then baseline first, ...) and the
report shows medians over ``--repeats``. A last child trains rapidfire_nb with 1 config, for the memory of
N runs against one run.

Usage (from the repository root)::

    .venv/bin/python benchmarks/overhead.py                      # tiny + smollm2, defaults (~10 min)
    .venv/bin/python benchmarks/overhead.py --models tiny --steps 8 --repeats 1   # quick smoke run
    .venv/bin/python benchmarks/overhead.py --profile            # + a cProfile of one rf child per model
    .venv/bin/python benchmarks/overhead.py --with-trackers mlflow,trackio   # rf side also on MLflow + Trackio

Writes the report to ``benchmarks/results/latest.txt`` (and the raw numbers to ``latest.json``).
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
REPO = HERE.parent
RESULTS = HERE / "results"

TARGET_TOTAL = 1.05
TARGET_SWITCH = 0.02
EVAL_BATCH = 8
EVAL_ROWS = 8  # one eval batch: evaluation is the same work on both sides, so keep it small
SEED = 42

# Per-model defaults: steps per run (= one epoch: the train set has steps x batch rows), train batch size and
# repeats. SmolLM2 uses batch 1 (the main job uses 4) so that 4 configs x 32 steps (8 steps/chunk) on both
# sides fit the ~10-minute budget on 2 shared cores; a cheaper step makes rapidfire_nb's fixed per-chunk and
# per-step costs weigh more, not less.
DEFAULTS = {
    "tiny": {"steps": 32, "batch": 4, "repeats": 3},
    "smollm2": {"steps": 32, "batch": 1, "repeats": 1},
}


# ====================================================================== child side
def _profile_all_threads(out_path: Path) -> Any:
    """Profile every thread started from now on (and the main thread) with cProfile; dump merged stats at exit."""
    import atexit
    import cProfile
    import pstats
    import threading

    profiles: list[cProfile.Profile] = []
    original_run = threading.Thread.run

    def run(self: threading.Thread) -> None:
        prof = cProfile.Profile()
        profiles.append(prof)
        prof.enable()
        try:
            original_run(self)
        finally:
            prof.disable()

    threading.Thread.run = run  # type: ignore[method-assign]
    main = cProfile.Profile()
    profiles.append(main)
    main.enable()

    def dump() -> None:
        main.disable()
        stats = None
        for p in profiles:
            try:
                p.create_stats()
                stats = pstats.Stats(p) if stats is None else stats.add(p)
            except (TypeError, ValueError):  # a profile that recorded nothing
                pass
        if stats is None:
            return
        stats.dump_stats(str(out_path))
        with open(out_path.with_suffix(".txt"), "w") as fh:
            for key in ("tottime", "cumulative"):
                fh.write(
                    f"==== top 45 by {key} (all threads; a parked worker's wait counts as its time) ====\n"
                )
                pstats.Stats(str(out_path), stream=fh).sort_stats(key).print_stats(45)

    atexit.register(dump)
    return dump


def _workload(
    model: str, steps: int, batch: int, num_chunks: int, n_configs: int, with_eval: bool
) -> dict[str, Any]:
    """Data, create_model_fn and the RFGridSearch config group of one benchmark model."""
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    n_train = steps * batch  # one epoch of `steps` optimizer steps: 4 chunks of steps/4 steps each
    if model == "tiny":
        from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset

        train, evald = tiny_sft_dataset(n_train, seed=0), tiny_sft_dataset(EVAL_ROWS, seed=1)
        create, name, fmt, model_kwargs = tiny_create_model, "tiny", None, {}
    elif model == "smollm2":
        from rapidfire_nb.data import create_smollm2, load_tech_support, smollm2_path, to_chat

        smollm2_path()  # convert once per machine (cached); never inside the timed part
        train, evald = load_tech_support(n_train=n_train, n_eval=EVAL_ROWS, seed=SEED)
        create, name, fmt, model_kwargs = (
            create_smollm2,
            "SmolLM2-135M-Instruct",
            to_chat,
            {"dtype": "float32"},
        )
    else:
        raise SystemExit(f"unknown model {model!r}; use tiny or smollm2")
    chunk = steps // num_chunks
    loras = [
        RFLoraConfig(r=8, lora_alpha=16, lora_dropout=0.1, target_modules=["q_proj", "v_proj"], bias="none"),
        RFLoraConfig(
            r=32,
            lora_alpha=64,
            lora_dropout=0.1,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            bias="none",
        ),
    ]
    lrs = [1e-3, 1e-4]
    if n_configs == 1:
        loras, lrs = loras[:1], lrs[:1]
    elif n_configs != 4:
        raise SystemExit("--configs must be 1 or 4")
    eval_args: dict[str, Any] = (
        {"eval_strategy": "steps", "eval_steps": chunk, "per_device_eval_batch_size": EVAL_BATCH}
        if with_eval
        else {"eval_strategy": "no"}
    )
    configs = [
        RFModelConfig(
            model_name=name,
            peft_config=List(loras) if len(loras) > 1 else loras[0],
            training_args=RFSFTConfig(
                learning_rate=lr,
                per_device_train_batch_size=batch,
                max_steps=steps,
                max_length=128,
                logging_steps=1,
                **eval_args,
            ),
            model_type="causal_lm",
            model_kwargs=dict(model_kwargs),
            formatting_func=fmt,
        )
        for lr in lrs
    ]
    search = RFGridSearch(configs=List(configs) if len(configs) > 1 else configs[0], trainer_type="SFT")
    return {
        "train": train,
        "eval": evald if with_eval else None,
        "create": create,
        "search": search,
        "fmt": fmt,
        "chunk": chunk,
    }


class _Costs:
    """Light timers around rapidfire_nb's own work (benchmark-side wrappers; library code is not changed).

    Each entry sums wall seconds of the outermost wrapped call per thread. Missing attributes (the library
    changed) are skipped, so the benchmark keeps working; the report then lacks that line.
    """

    def __init__(self) -> None:
        import threading

        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._local = threading.local()
        self._resolved_at: float | None = None
        self.handoff_s = 0.0
        self.handoffs = 0

    def wrap(self, owner: Any, attr: str, label: str) -> None:
        fn = getattr(owner, attr, None)
        if fn is None or not callable(fn):
            return
        costs = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(costs._local, "depth", 0)
            costs._local.depth = depth + 1
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                costs._local.depth = depth
                if depth == 0:
                    costs.seconds[label] = costs.seconds.get(label, 0.0) + time.perf_counter() - t
                    costs.calls[label] = costs.calls.get(label, 0) + 1

        setattr(owner, attr, timed)

    def install(self) -> None:
        import rapidfire_nb.store as store_mod
        import rapidfire_nb.training.checkpoint as ckpt_mod
        import rapidfire_nb.training.executor as ex_mod
        import rapidfire_nb.training.worker as worker_mod

        for name in (
            "add_metrics",
            "upsert_run",
            "set_meta",
            "update_meta",
            "latest_metrics",
            "beat",
            "take_inbox_ops",
            "add_op",
            "update_op",
        ):
            self.wrap(store_mod.Store, name, "store (SQLite)")
        try:
            import rapidfire_nb.tracking.tensorboard as tb_mod

            for name in ("log_scalars", "log_hparams"):
                self.wrap(tb_mod.TensorBoardTracker, name, "TensorBoard")
        except ImportError:
            pass
        self.wrap(ckpt_mod, "write_snapshot", "checkpoint write (background thread)")
        self.wrap(ex_mod, "snapshot_trainer", "boundary snapshot (in memory)")
        self.wrap(ex_mod.TorchExecutor, "_activate", "adapter activation")
        self.wrap(ex_mod.TorchExecutor, "save_final", "final save (save_pretrained)")
        # Hand-off gap: from a segment's Future resolving (worker parks) to the next worker resuming.
        worker = worker_mod.RunWorker
        resolve, enter = getattr(worker, "_resolve", None), getattr(worker, "_enter", None)
        if resolve is None or enter is None:
            return
        costs = self

        def timed_resolve(this: Any, result: Any) -> None:
            costs._resolved_at = time.perf_counter()  # before: the next worker may start at once
            resolve(this, result)

        def timed_enter(this: Any) -> None:
            if costs._resolved_at is not None:
                costs.handoff_s += time.perf_counter() - costs._resolved_at
                costs.handoffs += 1
                costs._resolved_at = None
            enter(this)

        worker._resolve = timed_resolve  # type: ignore[method-assign]
        worker._enter = timed_enter  # type: ignore[method-assign]


def _child_rf(w: dict[str, Any], num_chunks: int, out: dict[str, Any]) -> None:
    from rapidfire_nb import Experiment

    costs = _Costs()
    costs.install()

    root = tempfile.mkdtemp(prefix="rf-bench-")
    try:
        t0 = time.time()
        exp = Experiment("overhead", experiment_path=root, overwrite=True)
        exp.run_fit(w["search"], w["create"], w["train"], w["eval"], num_chunks=num_chunks, seed=SEED)
        t_fit = time.time()
        exp.end()
        t_end = time.time()
        points, _ = exp.store.metrics_since(0)
        first_eval: dict[int, float] = {}
        losses: dict[int, dict[int, float]] = {}
        for p in points:
            if p["name"] == "eval_loss":
                first_eval[p["run_id"]] = min(first_eval.get(p["run_id"], float("inf")), p["wall_time"])
            elif p["name"] == "loss":
                losses.setdefault(p["run_id"], {})[p["step"]] = p["value"]
        started = exp.session.started_at or t0
        out.update(
            total_s=t_end - t0,
            setup_s=started - t0,  # Experiment + validation + model load + 4 trainer builds
            train_s=t_fit - started,  # scheduler start -> run_fit returns (training, evals, final saves)
            end_s=t_end - t_fit,  # experiment.end(): checkpoint flush, thread joins
            switch_s=float(exp.session.executor.switch_seconds),
            first_eval_all_s=(max(first_eval.values()) - t0) if len(first_eval) == out["n_configs"] else None,
            runs=len(exp.run_snapshots()),
            losses={str(k): v for k, v in losses.items()},
            costs=costs.seconds,
            cost_calls=costs.calls,
            handoff_s=costs.handoff_s,
            handoffs=costs.handoffs,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _child_base(w: dict[str, Any], out: dict[str, Any]) -> None:
    import gc

    from transformers import TrainerCallback
    from trl import SFTTrainer

    from rapidfire_nb.spec import build_lora_config, build_training_args

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.first_eval: float | None = None
            self.losses: dict[int, float] = {}

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any) -> None:
            logs = logs or {}
            if "eval_loss" in logs and self.first_eval is None:
                self.first_eval = time.time()
            if "loss" in logs:
                self.losses[state.global_step] = float(logs["loss"])

    leaves = w["search"].expand(SEED)
    root = tempfile.mkdtemp(prefix="rf-bench-base-")
    try:
        t0 = time.time()
        train, evald, fmt = w["train"], w["eval"], w["fmt"]
        if fmt is not None:  # what a plain-TRL user does once: map the rows to prompt/completion
            train = train.map(fmt, remove_columns=train.column_names)
            evald = evald.map(fmt, remove_columns=evald.column_names) if evald is not None else None
        first_eval: list[float | None] = []
        losses: dict[str, dict[int, float]] = {}
        setup = fit = save = excluded = 0.0
        excluded_before_last = 0.0
        for i, leaf in enumerate(leaves, start=1):
            ta = time.time()
            args, _notes = build_training_args(
                leaf, output_dir=str(Path(root) / f"run{i}"), default_seed=SEED
            )
            peft_config = build_lora_config(leaf)
            model, tok = w["create"](leaf.model_config_dict())
            clock = Clock()
            trainer = SFTTrainer(
                model=model,
                args=args,
                train_dataset=train,
                eval_dataset=evald,
                processing_class=tok,
                peft_config=peft_config,
                callbacks=[clock],
            )
            tb = time.time()
            trainer.train()
            tc = time.time()
            trainer.save_model()  # the adapter + tokenizer, as rapidfire_nb saves each finished run
            td = time.time()
            setup, fit, save = setup + tb - ta, fit + tc - tb, save + td - tc
            first_eval.append(clock.first_eval)
            losses[str(i)] = clock.losses
            excluded_before_last = excluded
            # Free the run before the next one (lowest peak RSS for the baseline). gc.collect() takes 0.4-0.7 s
            # here and a user need not call it, so its time is left out of the baseline's times.
            te = time.time()
            del trainer, model, tok
            gc.collect()
            excluded += time.time() - te
        t_end = time.time()
        last = first_eval[-1]
        out.update(
            total_s=t_end - t0 - excluded,
            setup_s=setup,
            train_s=fit,
            save_s=save,
            gc_excluded_s=excluded,
            first_eval_all_s=(last - t0 - excluded_before_last) if last is not None else None,
            runs=len(leaves),
            losses=losses,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def child_main(a: argparse.Namespace) -> None:
    if a.profile_out:
        _profile_all_threads(Path(a.profile_out))
    t_imp = time.time()
    import torch
    import trl  # noqa: F401

    import rapidfire_nb  # noqa: F401

    _import_trackers()
    w = _workload(a.model, a.steps, a.batch, a.num_chunks, a.configs, not a.no_eval)
    out: dict[str, Any] = {
        "side": a.child,
        "model": a.model,
        "steps": a.steps,
        "n_configs": a.configs,
        "prep_s": time.time() - t_imp,
        "torch_threads": torch.get_num_threads(),
    }
    if a.child == "rf":
        _child_rf(w, a.num_chunks, out)
    else:
        _child_base(w, out)
    import resource

    out["self_maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Path(a.result).write_text(json.dumps(out))


# ====================================================================== trackers beside TensorBoard (issue 15)
_TRACKER_FOLDER: list[Path] = []


def _tracker_option(ap: argparse.ArgumentParser) -> None:
    """``--with-trackers mlflow,trackio``: the rapidfire_nb side also tracks with these backends."""
    ap.add_argument(
        "--with-trackers",
        default="",
        metavar="mlflow,trackio",
        help="the rapidfire_nb side also tracks with these backends beside TensorBoard (RF_<NAME>_ENABLED=true "
        "in its environment): MLflow into one SQLite store migrated before any timing, Trackio into a temporary "
        "TRACKIO_DIR; their packages are imported before timing, as torch and TRL. Compare the rf totals with a "
        "run without this option",
    )


def _tracker_env(a: argparse.Namespace) -> dict[str, str]:
    """The environment of a child for ``--with-trackers`` (empty without it); migrates the MLflow store once."""
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


def _import_trackers() -> None:
    """In a child, before timing: the tracker packages its environment turns on (a first import takes seconds)."""
    if os.environ.get("RF_MLFLOW_ENABLED") == "true":
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
        import mlflow.tracking  # noqa: F401
    if os.environ.get("RF_TRACKIO_ENABLED") == "true":
        import trackio  # noqa: F401


# ====================================================================== parent side
def _spawn(
    side: str,
    model: str,
    steps: int,
    batch: int,
    a: argparse.Namespace,
    configs: int,
    log_dir: Path,
    tag: str,
    profile_out: Path | None = None,
) -> dict[str, Any]:
    result = log_dir / f"{tag}.json"
    log = log_dir / f"{tag}.log"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        side,
        "--model",
        model,
        "--steps",
        str(steps),
        "--batch",
        str(batch),
        "--num-chunks",
        str(a.num_chunks),
        "--configs",
        str(configs),
        "--result",
        str(result),
    ]
    if a.no_eval:
        cmd.append("--no-eval")
    if profile_out is not None:
        cmd += ["--profile-out", str(profile_out)]
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    if a.omp_wait_policy != "inherit":
        env["OMP_WAIT_POLICY"] = a.omp_wait_policy.upper()
    env.update(_tracker_env(a))
    t0 = time.time()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=str(REPO), env=env)
        try:
            _pid, status, usage = os.wait4(proc.pid, 0)
        except KeyboardInterrupt:
            proc.kill()
            raise
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.time() - t0
    if proc.returncode != 0 or not result.exists():
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"child {tag} failed (exit {proc.returncode}); log {log}:\n{tail}")
    out = json.loads(result.read_text())
    out["peak_rss_mb"] = usage.ru_maxrss / 1024  # Linux: KiB
    out["child_wall_s"] = wall
    print(
        f"    {tag}: total {out['total_s']:.1f} s, peak RSS {out['peak_rss_mb']:.0f} MB "
        f"(child wall {wall:.1f} s)",
        flush=True,
    )
    return out


def _med(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def _loss_diff(rf: dict[str, Any], base: dict[str, Any]) -> float | None:
    """Max |loss_rf - loss_base| over every logged (run, step): a check that both sides did the same work."""
    worst = 0.0
    found = False
    for run, curve in base["losses"].items():
        other = rf["losses"].get(run, {})
        for step, v in curve.items():
            if str(step) in other or int(step) in other:
                w = other.get(str(step), other.get(int(step)))
                worst = max(worst, abs(float(w) - float(v)))
                found = True
    return worst if found else None


def _report_model(
    model: str,
    steps: int,
    batch: int,
    a: argparse.Namespace,
    pairs: list[tuple[dict, dict, str]],
    one: dict[str, Any] | None,
) -> list[str]:
    chunk = steps // a.num_chunks
    tot = [rf["total_s"] / b["total_s"] for rf, b, _ in pairs]
    tr = [rf["train_s"] / b["train_s"] for rf, b, _ in pairs]
    fe = [
        rf["first_eval_all_s"] / b["first_eval_all_s"]
        for rf, b, _ in pairs
        if rf.get("first_eval_all_s") and b.get("first_eval_all_s")
    ]
    sw = [rf["switch_s"] / rf["train_s"] for rf, _, _ in pairs]
    rss = [rf["peak_rss_mb"] / b["peak_rss_mb"] for rf, b, _ in pairs]
    diffs = [_loss_diff(rf, b) for rf, b, _ in pairs]
    med_tot, med_sw = _med(tot), _med(sw)
    evals = "at every chunk end on both sides" if not a.no_eval else "off on both sides"
    title = (
        f"== {model}: 4 SFT LoRA configs x {a.num_chunks} chunks, {steps} steps/run ({chunk} steps/chunk), "
        f"batch {batch}, eval {evals}, {len(pairs)} repeat(s), orders {', '.join(o for _, _, o in pairs)} =="
    )
    lines = [title]
    lines.append(f"  {'metric':<44} {'median':>8}   {'per repeat':<28} target")
    ok_tot = "OK" if med_tot is not None and med_tot <= TARGET_TOTAL else "MISSED"
    ok_sw = "OK" if med_sw is not None and med_sw <= TARGET_SWITCH else "MISSED"
    lines.append(
        f"  {'total time ratio (rapidfire_nb / sequential)':<44} {_fmt(med_tot):>8}   "
        f"{', '.join(_fmt(x) for x in tot):<28} <= {TARGET_TOTAL:.2f}x  {ok_tot}"
    )
    lines.append(
        f"  {'time until every config has an eval (ratio)':<44} {_fmt(_med(fe)):>8}   "
        f"{', '.join(_fmt(x) for x in fe):<28} (lower is better)"
    )
    lines.append(
        f"  {'chunk-switch time / rf training time':<44} {_fmt(med_sw, '.2%'):>8}   "
        f"{', '.join(_fmt(x, '.2%') for x in sw):<28} <= {TARGET_SWITCH:.0%}  {ok_sw}"
    )
    lines.append(
        f"  {'peak RSS ratio (rapidfire_nb / sequential)':<44} {_fmt(_med(rss)):>8}   "
        f"{', '.join(_fmt(x) for x in rss):<28}"
    )
    lines.append(
        f"  {'training-phase time ratio (train() only)':<44} {_fmt(_med(tr)):>8}   "
        f"{', '.join(_fmt(x) for x in tr):<28}"
    )
    lines.append("  absolute medians (s):")
    for key, what in (
        ("total_s", "total"),
        ("setup_s", "setup (model load + trainer builds)"),
        ("train_s", "training phase"),
        ("first_eval_all_s", "every config has an eval"),
    ):
        lines.append(
            f"    {what:<42} rf {_fmt(_med([rf.get(key) for rf, _, _ in pairs]), '8.2f')}   "
            f"sequential {_fmt(_med([b.get(key) for _, b, _ in pairs]), '8.2f')}"
        )
    lines.append(
        f"    {'rf chunk switches + snapshots':<42} rf {_fmt(_med([rf['switch_s'] for rf, _, _ in pairs]), '8.3f')}"
        f"   ({(a.num_chunks - 1) * 4} boundaries + {a.num_chunks * 4} activations)"
    )
    lines.append(
        f"    {'rf experiment.end()':<42} rf {_fmt(_med([rf['end_s'] for rf, _, _ in pairs]), '8.2f')}   "
        f"sequential save_model {_fmt(_med([b['save_s'] for _, b, _ in pairs]), '8.2f')}"
    )
    lines.append(
        f"    {'peak RSS (MB)':<42} rf {_fmt(_med([rf['peak_rss_mb'] for rf, _, _ in pairs]), '8.0f')}   "
        f"sequential {_fmt(_med([b['peak_rss_mb'] for _, b, _ in pairs]), '8.0f')}"
    )
    labels = sorted({k for rf, _, _ in pairs for k in rf.get("costs", {})})
    if labels or any(rf.get("handoffs") for rf, _, _ in pairs):
        lines.append("  where rapidfire_nb's own time goes (rf child, medians; s, calls):")
        hand = _med([rf.get("handoff_s") for rf, _, _ in pairs])
        lines.append(
            f"    {'hand-off gaps (worker parked -> next resumes)':<50} {_fmt(hand, '8.3f')}  "
            f"x{pairs[0][0].get('handoffs', 0)}  critical path, not in switch time"
        )
        for k in labels:
            v = _med([rf.get("costs", {}).get(k) for rf, _, _ in pairs])
            n = pairs[0][0].get("cost_calls", {}).get(k, 0)
            lines.append(f"    {k:<50} {_fmt(v, '8.3f')}  x{n}")
    if one is not None:
        n_peak = _med([rf["peak_rss_mb"] for rf, _, _ in pairs])
        assert n_peak is not None
        lines.append(
            f"  memory of N runs vs one run (rapidfire_nb, peak RSS): 4 runs {n_peak:.0f} MB / 1 run "
            f"{one['peak_rss_mb']:.0f} MB = {n_peak / one['peak_rss_mb']:.2f}x "
            f"(+{n_peak - one['peak_rss_mb']:.0f} MB for 3 more runs)"
        )
    md = max((d for d in diffs if d is not None), default=None)
    lines.append(
        f"  same work check: max |train loss rf - sequential| over all runs and steps = {_fmt(md, '.2e')}"
    )
    return lines


def parent_main(a: argparse.Namespace) -> None:
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    started = time.time()
    log_dir = Path(tempfile.mkdtemp(prefix="rf-overhead-"))
    prof_dir = Path(a.out).parent / "profiles" if a.profile else None
    if prof_dir is not None:
        prof_dir.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    report: list[str] = []
    raw: dict[str, Any] = {"argv": sys.argv[1:], "models": {}}
    for model in models:
        dflt = DEFAULTS.get(model, DEFAULTS["tiny"])
        steps, batch, repeats = (
            a.steps or dflt["steps"],
            a.batch or dflt["batch"],
            a.repeats or dflt["repeats"],
        )
        if steps % a.num_chunks:
            raise SystemExit(f"--steps ({steps}) must be a multiple of --num-chunks ({a.num_chunks})")
        print(f"[{model}] {repeats} repeat(s) of rf + sequential, {steps} steps/run", flush=True)
        pairs: list[tuple[dict, dict, str]] = []
        for r in range(repeats):
            order = ("rf", "base") if r % 2 == 0 else ("base", "rf")
            got = {s: _spawn(s, model, steps, batch, a, 4, log_dir, f"{model}-{s}-{r}") for s in order}
            pairs.append((got["rf"], got["base"], "rf>seq" if order[0] == "rf" else "seq>rf"))
        one = None if a.skip_memory else _spawn("rf", model, steps, batch, a, 1, log_dir, f"{model}-rf1")
        if a.profile:
            assert prof_dir is not None
            _spawn(
                "rf",
                model,
                steps,
                batch,
                a,
                4,
                log_dir,
                f"{model}-rf-profiled",
                profile_out=prof_dir / f"rf-{model}.prof",
            )
        raw["models"][model] = {
            "pairs": [{"rf": rf, "base": b, "order": o} for rf, b, o in pairs],
            "rf_1_config": one,
        }
        report += _report_model(model, steps, batch, a, pairs, one) + [""]
    load1 = os.getloadavg()
    import importlib.metadata as md

    vers = ", ".join(f"{p} {md.version(p)}" for p in ("torch", "transformers", "trl", "peft"))
    head = [
        f"rapidfire_nb overhead benchmark — {time.strftime('%Y-%m-%d %H:%M:%S')}",
        f"command: python benchmarks/overhead.py {' '.join(sys.argv[1:])}".rstrip(),
        f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {vers}",
        f"load average 1 min: {load0[0]:.1f} at start, {load1[0]:.1f} at end (other work on the machine adds noise)",
        "each side in its own child process; ratios are medians over repeats of rf/sequential pairs, order alternated",
        f"OMP_WAIT_POLICY of both sides: {a.omp_wait_policy if a.omp_wait_policy != 'inherit' else os.environ.get('OMP_WAIT_POLICY', 'unset (libgomp default: active)')}",
        "",
    ]
    tail = [f"benchmark wall time: {time.time() - started:.0f} s; child logs in {log_dir}"]
    if a.profile:
        tail.append(f"profiles: {prof_dir}/rf-<model>.txt (cProfile, all threads)")
    text = "\n".join(head + report + tail)
    print()
    print(text)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    out.with_suffix(".json").write_text(json.dumps(raw, indent=1, default=str) + "\n")
    print(f"\nwritten to {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--models", default="tiny,smollm2", help="comma-separated: tiny, smollm2 (default both)")
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help="optimizer steps per run = one epoch of steps x batch rows (default 32: 8 steps/chunk)",
    )
    ap.add_argument(
        "--batch",
        type=int,
        default=None,
        help="per_device_train_batch_size of every config (default: tiny 4, smollm2 1)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="rf/sequential pairs per model, order alternated (default: tiny 3, smollm2 1)",
    )
    ap.add_argument("--num-chunks", type=int, default=4)
    ap.add_argument("--no-eval", action="store_true", help="both sides without an eval set")
    ap.add_argument("--skip-memory", action="store_true", help="skip the 1-config rf run (memory N vs 1)")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also run one cProfiled rf child per model (all threads) into benchmarks/results/profiles/",
    )
    ap.add_argument(
        "--omp-wait-policy",
        default="passive",
        choices=("passive", "active", "inherit"),
        help="OMP_WAIT_POLICY of both children (default passive; see README: with libgomp's default "
        "spin-waiting, torch in the main thread of a loaded machine is up to 10-100x slower on "
        "small ops than in a worker thread, which would credit rapidfire_nb's worker threads "
        "with a speed-up it did not earn); 'inherit' leaves the environment as it is",
    )
    ap.add_argument("--out", default=str(RESULTS / "latest.txt"))
    _tracker_option(ap)
    # child-only
    ap.add_argument("--child", choices=("rf", "base"), help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--configs", type=int, default=4, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--profile-out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child_main(a)
    else:
        parent_main(a)


if __name__ == "__main__":
    main()
