"""The child side of ``overhead.py``: one process trains one side (rapidfire_nb or sequential plain TRL) once.

``overhead.py`` starts ``python overhead.py --child rf|base ...`` once per measurement; this module builds the
workload (data, ``create_model_fn``, the 4 configs), trains it, and writes the child's times, losses and cost
timers as JSON. Each side runs in a process of its own so that its OpenMP thread teams are only its own (see
benchmarks/README.md, "OpenMP: the settings, and why each side runs in its own process").
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

EVAL_BATCH = 8
EVAL_ROWS = 8  # one eval batch: evaluation is the same work on both sides, so keep it small
SEED = 42

#: the "fast steps" model: a tiny Llama of hidden size 256 (4 layers, 8 heads, MLP 512) on the tiny tokenizer
FAST_MODEL = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8, "intermediate_size": 512}
FAST_NAME = "tiny-llama-h256-l4"


# ====================================================================== workloads
def fast_create_model(model_config: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """``create_model_fn`` of the "fast steps" case: a random Llama of :data:`FAST_MODEL` sizes (seed 0).

    The same weights in every process and on every call (drawn inside ``fork_rng``: the caller's RNG is unchanged).
    """
    from rapidfire_nb.testing import tiny_model, tiny_tokenizer

    sizes = {**FAST_MODEL, "num_key_value_heads": FAST_MODEL["num_attention_heads"]}
    return tiny_model(seed=0, sizes=sizes), tiny_tokenizer()


def _model_inputs(model: str, n_train: int) -> tuple[Any, Any, Any, str, Any, dict[str, Any]]:
    """``(train rows, eval rows, create_model_fn, model_name, formatting_func, model_kwargs)`` of one model."""
    if model in ("tiny", "fast"):
        from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset

        train, evald = tiny_sft_dataset(n_train, seed=0), tiny_sft_dataset(EVAL_ROWS, seed=1)
        if model == "tiny":
            return train, evald, tiny_create_model, "tiny", None, {}
        return train, evald, fast_create_model, FAST_NAME, None, {}
    if model == "smollm2":
        from rapidfire_nb.data import create_smollm2, load_tech_support, smollm2_path, to_chat

        smollm2_path()  # convert once per machine (cached); never inside the timed part
        train, evald = load_tech_support(n_train=n_train, n_eval=EVAL_ROWS, seed=SEED)
        return train, evald, create_smollm2, "SmolLM2-135M-Instruct", to_chat, {"dtype": "float32"}
    raise SystemExit(f"unknown model {model!r}; use tiny, fast or smollm2")


def workload(
    model: str, steps: int, batch: int, num_chunks: int, n_configs: int, with_eval: bool
) -> dict[str, Any]:
    """Data, create_model_fn and the RFGridSearch config group of one benchmark model.

    The train set is exactly one epoch of ``steps`` optimizer steps (``steps x batch`` rows); the 4 configs are
    2 learning rates (1e-3, 1e-4) x 2 LoRA configs (r=8 on q/v; r=32 on q/k/v/o), ``logging_steps=1``.
    """
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    train, evald, create, name, fmt, model_kwargs = _model_inputs(model, steps * batch)
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
    }


# ====================================================================== cost timers (rf child)
def thread_role(name: str) -> str:
    """Which of rapidfire_nb's threads a thread name is: device, recorder, checkpoints, scheduler, trackers or
    other."""
    if name.startswith("rapidfire-device"):
        return "device"
    for role in ("recorder", "checkpoints", "scheduler", "trackers"):
        if name == f"rapidfire-{role}":
            return role
    return "other"


class Costs:
    """Light timers around rapidfire_nb's own work (benchmark-side wrappers; library code is not changed).

    Each entry sums the wall seconds of the outermost call of one label per thread, keyed ``"<label>|<thread role>"``
    (:func:`thread_role`): what runs on the device thread is on the training's critical path, the recorder and
    checkpoint threads are background work. A missing attribute (the library changed) is skipped, so the
    benchmark keeps working; the report then lacks that line.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.final_saves: list[tuple[float, float]] = []  # (start, seconds) of each final save
        self.resumes: list[float] = []  # perf_counter of each HandoffClock.resumed()
        self._local = threading.local()

    def wrap(self, owner: Any, attr: str, label: str, on_done: Any = None) -> None:
        fn = getattr(owner, attr, None)
        if fn is None or not callable(fn):
            return
        costs = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            depths = costs._local.__dict__.setdefault("depths", {})
            depth = depths.get(label, 0)
            depths[label] = depth + 1
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                depths[label] = depth
                if depth == 0:
                    dt = time.perf_counter() - t
                    key = f"{label}|{thread_role(threading.current_thread().name)}"
                    costs.seconds[key] = costs.seconds.get(key, 0.0) + dt
                    costs.calls[key] = costs.calls.get(key, 0) + 1
                    if on_done is not None:
                        on_done(t, dt)

        setattr(owner, attr, timed)

    def install(self) -> None:
        import rapidfire_nb.experiment.recorder as rec_mod
        import rapidfire_nb.store as store_mod
        import rapidfire_nb.training.checkpoint as ckpt_mod
        import rapidfire_nb.training.executor as ex_mod
        import rapidfire_nb.training.worker as worker_mod

        for name in (
            "add_metrics",
            "upsert_run",
            "set_meta",
            "update_meta",
            "get_meta",
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
        self.wrap(rec_mod.Recorder, "_write_batch", "recorder batches (store + TensorBoard)")
        self.wrap(ckpt_mod, "write_snapshot", "checkpoint write")
        self.wrap(ckpt_mod.Snapshotter, "take", "boundary snapshot (Snapshotter.take)")
        self.wrap(ex_mod.TorchExecutor, "_on_boundary", "boundary (snapshot + checkpoint hand-over)")
        self.wrap(ex_mod.TorchExecutor, "_activate", "adapter activation")
        self.wrap(ex_mod.TorchExecutor, "_on_log", "per-step metrics into the recorder's queue")
        self.wrap(
            ex_mod.TorchExecutor,
            "_save_final",
            "final save (save_pretrained)",
            on_done=lambda t, dt: self.final_saves.append((t, dt)),
        )
        resumed = getattr(worker_mod.HandoffClock, "resumed", None)
        if resumed is not None:
            costs = self

            def timed_resumed(this: Any) -> None:
                resumed(this)
                costs.resumes.append(time.perf_counter())

            worker_mod.HandoffClock.resumed = timed_resumed  # type: ignore[method-assign]

    def saves_in_handoffs(self) -> tuple[float, int]:
        """``(seconds, count)`` of the final saves made between two segments (the scheduler's boundary work
        inside a hand-off; the last run's save comes after its last segment)."""
        last = max(self.resumes, default=float("-inf"))
        inside = [dt for t, dt in self.final_saves if t < last]
        return sum(inside), len(inside)


def profile_all_threads(out_path: Path) -> None:
    """Profile every thread started from now on (and the main thread) with cProfile; dump merged stats at exit.

    The runs' ``train()`` greenlets all run on the device thread, so their time is that thread's.
    """
    import atexit
    import cProfile
    import pstats

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
                    f"==== top 45 by {key} (all threads; a waiting thread's wait counts as its time) ====\n"
                )
                pstats.Stats(str(out_path), stream=fh).sort_stats(key).print_stats(45)

    atexit.register(dump)


# ====================================================================== the two sides
def notebook_cell_torch() -> None:
    """What a notebook's earlier cell does on the kernel's main thread: one torch op on CPU (a 512x512 product).

    It gives the main thread an OpenMP team of its own, as loading or inspecting a model in a cell does; the
    ``rfN`` side measures rapidfire_nb after it (``rapidfire_nb/training/openmp.py`` says why it matters).
    """
    import torch

    a = torch.randn(512, 512)
    float((a @ a).sum())


def _child_rf(
    w: dict[str, Any],
    num_chunks: int,
    checkpoint_every: int,
    out: dict[str, Any],
    main_torch: bool = False,
    every_gc: bool = False,
) -> None:
    from rapidfire_nb import Experiment

    if main_torch:
        notebook_cell_torch()
    if every_gc:  # the like-for-like reference: every run's train() start does TRL's full gc.collect()
        from rapidfire_nb.training.garbage import TrainStartCollections

        TrainStartCollections.wrap = lambda self, accelerator: None  # type: ignore[method-assign]
    costs = Costs()
    costs.install()
    root = tempfile.mkdtemp(prefix="rf-bench-")
    try:
        t0 = time.time()
        exp = Experiment("overhead", experiment_path=root, overwrite=True)
        exp.run_fit(
            w["search"],
            w["create"],
            w["train"],
            w["eval"],
            num_chunks=num_chunks,
            seed=SEED,
            checkpoint_every=checkpoint_every,
        )
        t_fit = time.time()
        exp.end()
        t_end = time.time()
        first_eval, losses = _rf_curves(exp)
        session = exp.session
        assert session is not None
        started = session.started_at or t0
        executor = session.executor
        saves = costs.saves_in_handoffs()
        out.update(
            total_s=t_end - t0,
            setup_s=started - t0,  # Experiment + validation + model load + 4 trainer builds
            train_s=t_fit - started,  # scheduler start -> run_fit returns (training, evals, final saves)
            end_s=t_end - t_fit,  # experiment.end(): checkpoint flush, thread joins
            switch_s=float(executor.switch_seconds),
            handoff_s=float(executor.handoffs.seconds),
            handoffs=int(executor.handoffs.count),
            saves_in_handoffs_s=saves[0],
            saves_in_handoffs=saves[1],
            recorder_write_s=float(getattr(session.recorder, "write_seconds", 0.0)),
            first_eval_all_s=(max(first_eval.values()) - t0) if len(first_eval) == out["n_configs"] else None,
            runs=len(exp.run_snapshots()),
            losses={str(k): v for k, v in losses.items()},
            costs=costs.seconds,
            cost_calls=costs.calls,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _rf_curves(exp: Any) -> tuple[dict[int, float], dict[int, dict[int, float]]]:
    """``(first eval wall time per run, {run: {step: train loss}})`` from the experiment's store."""
    points, _ = exp.store.metrics_since(0)
    first_eval: dict[int, float] = {}
    losses: dict[int, dict[int, float]] = {}
    for p in points:
        if p["name"] == "eval_loss":
            first_eval[p["run_id"]] = min(first_eval.get(p["run_id"], float("inf")), p["wall_time"])
        elif p["name"] == "loss":
            losses.setdefault(p["run_id"], {})[p["step"]] = p["value"]
    return first_eval, losses


def _clock_callback() -> Any:
    from transformers import TrainerCallback

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

    return Clock()


def _formatted(w: dict[str, Any]) -> tuple[Any, Any]:
    """What a plain-TRL user does once: map the rows to prompt/completion with the formatting function."""
    train, evald, fmt = w["train"], w["eval"], w["fmt"]
    if fmt is not None:
        train = train.map(fmt, remove_columns=train.column_names)
        evald = evald.map(fmt, remove_columns=evald.column_names) if evald is not None else None
    return train, evald


def _child_base(w: dict[str, Any], out: dict[str, Any]) -> None:
    """Sequential plain TRL: the 4 leaves one after the other, each loading its model as a user would."""
    import gc

    from trl import SFTTrainer

    from rapidfire_nb.spec import build_lora_config, build_training_args

    leaves = w["search"].expand(SEED)
    root = tempfile.mkdtemp(prefix="rf-bench-base-")
    try:
        t0 = time.time()
        train, evald = _formatted(w)
        first_eval: list[float | None] = []
        losses: dict[str, dict[int, float]] = {}
        setup = fit = save = excluded = excluded_before_last = 0.0
        for i, leaf in enumerate(leaves, start=1):
            ta = time.time()
            args, _notes = build_training_args(
                leaf, output_dir=str(Path(root) / f"run{i}"), default_seed=SEED
            )
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
        last = first_eval[-1]
        out.update(
            total_s=time.time() - t0 - excluded,
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
    """Train one side once (``a.child``: ``rf`` or ``base``) and write its numbers to ``a.result`` (JSON)."""
    import os

    if a.profile_out:
        profile_all_threads(Path(a.profile_out))
    t_imp = time.time()
    import torch
    import trl  # noqa: F401

    import rapidfire_nb  # noqa: F401

    if os.environ.get("RF_MLFLOW_ENABLED") == "true":  # tracker packages (seconds to import) before timing
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
        import mlflow.tracking  # noqa: F401
    if os.environ.get("RF_TRACKIO_ENABLED") == "true":
        import trackio  # noqa: F401
    w = workload(a.model, a.steps, a.batch, a.num_chunks, a.configs, not a.no_eval)
    out: dict[str, Any] = {
        "side": a.child,
        "model": a.model,
        "steps": a.steps,
        "num_chunks": a.num_chunks,
        "n_configs": a.configs,
        "prep_s": time.time() - t_imp,
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
    }
    if a.child == "rf":
        _child_rf(w, a.num_chunks, a.checkpoint_every, out, main_torch=a.main_torch, every_gc=a.every_gc)
    else:
        _child_base(w, out)
    import resource

    out["self_maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Path(a.result).write_text(json.dumps(out))
