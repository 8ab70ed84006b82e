"""FSDP2 gangs (issue 36): memory per rank and time per step of one SmolLM2-135M-Instruct run sharded over a gang
of 2 ranks (``fsdp="full_shard auto_wrap"``), LoRA and full fine-tuning, against the same run on one device; and
the max |difference| of the gang's final weights to the one-device run's (the same global batch).

Each side is a process of its own (two, for the gang), one after the other:

* **gang**: ``python -m torch.distributed.run --nproc_per_node 2 benchmarks/fsdp.py --child gang ...``. Each rank
  joins the gang (``rapidfire_nb.training.sharding.join_gang``: gloo on the CPU, NCCL on CUDA) and trains the run
  through ``rapidfire_nb.training.executor.TorchExecutor`` chunk by chunk (one ``run_segment`` per chunk), as
  ``tests/rapidfire_nb/training/_gang_child.py`` drives a rank and as each worker process of
  ``run_fit(devices=2)`` does, without the kernel around it. The run's config is what
  ``RFModelConfig(num_gpus=2, training_args=RFSFTConfig(fsdp="full_shard auto_wrap", fsdp_config=
  {"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}, ...))`` expands to; per-device batch ``--batch``.
* **one device**: plain TRL ``SFTTrainer(...).train()`` of the same config without ``num_gpus``/``fsdp``, in one
  process, per-device batch 2 x ``--batch`` (the same global batch: the same rows in the same steps).

The CPUs are shared alike: each rank gets ``OMP_NUM_THREADS`` = cores / 2, the one process all cores (``--cores``,
default the CPUs this process may use). Model fp32, ``max_length`` ``--max-length``, ``gradient_checkpointing=False``,
one epoch of ``steps x global batch`` rows of the construction FAQ (``load_construction_faq``, CC BY 4.0,
``faq_to_chat``), LoRA r=8 alpha 16 on q/v (lr 1e-3), full fine-tuning lr 5e-5, AdamW, seed 42.

Measured per process (each gang rank, and the one-device process):

* **held bytes**: what the rank holds for its run: parameters (``local_parameter_bytes``: a sharded parameter
  counts its local shard; LoRA's frozen base is sharded too), gradients (the local size of every ``.grad`` right
  before the optimizer step, ``on_pre_optimizer_step``) and optimizer state (the local size of every tensor in
  the optimizer's state, AdamW's two moments and step counts, after a step);
* **peak RSS** (``resource.getrusage(RUSAGE_SELF).ru_maxrss``: everything the process touched, Python, torch and
  TRL, the whole model as ``create_model_fn`` loads it before ``fully_shard``, the layers FSDP all-gathers for
  forward and backward, activations) and the RSS at the end; on CUDA ``torch.cuda.max_memory_allocated``;
* **time per step**: the median of ``on_step_begin`` -> ``on_step_end`` (forward, backward, the collectives, the
  optimizer step; CUDA synchronized; chunk boundaries are between steps and not in it), and the training wall time
  (first step to last, boundaries included);
* the final weights (gang: the gathered ``runs/1/final`` folder rank 0 writes; one device: ``save_pretrained``):
  max |difference| over every tensor, and the max |difference| of the per-step losses.

Usage::

    .venv/bin/python benchmarks/fsdp.py                  # SmolLM2, LoRA + full, 8 steps (~5 min on 2 quiet cores)
    .venv/bin/python benchmarks/fsdp.py --smoke          # the tiny model, 4 steps (~1.5 min)
    .venv/bin/python benchmarks/fsdp.py --kinds lora --steps 16 --batch 4

The report is printed and written to ``--out`` (default ``benchmarks/results/fsdp_<model>.txt``), the raw records
beside it (``.json``). ``benchmarks/gpu_check.py`` section ``fsdp`` runs :func:`measure` on 2 GPUs (NCCL).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
RESULTS = ROOT / "benchmarks" / "results"
SEED = 42
KINDS = {"lora": "LoRA (r=8 on q/v)", "full": "full fine-tuning"}
WEIGHTS = {"lora": "adapter_model.safetensors", "full": "model.safetensors"}
LAYER = "LlamaDecoderLayer"
MB = 2**20


# ====================================================================== the run (children)
def workload(model: str, rows: int) -> dict[str, Any]:
    """``create`` (a create_model_fn), ``train`` rows (before formatting), ``fmt`` and the model ``name``."""
    if model == "tiny":
        from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset

        return {
            "create": tiny_create_model,
            "train": tiny_sft_dataset(rows, seed=0),
            "fmt": None,
            "name": "tiny",
        }
    from rapidfire_nb.data import SMOLLM2_NAME, create_smollm2, faq_to_chat, load_construction_faq

    train, _ = load_construction_faq(n_train=rows, n_eval=8, seed=SEED)
    return {"create": create_smollm2, "train": train, "fmt": faq_to_chat, "name": SMOLLM2_NAME}


def leaf_of(w: dict[str, Any], kind: str, gang: bool, batch: int, max_length: int) -> Any:
    """The run's ``LeafConfig``: over a gang of 2 with FSDP (per-device ``batch``), or on one device (2 x batch)."""
    from rapidfire_nb.spec import LeafConfig

    training: dict[str, Any] = {
        "per_device_train_batch_size": batch if gang else 2 * batch,
        "num_train_epochs": 1,
        "learning_rate": 1e-3 if kind == "lora" else 5e-5,
        "max_length": max_length,
        "logging_steps": 1,
        "gradient_checkpointing": False,
        "bf16": False,
        "fp16": False,
        "seed": SEED,
    }
    if gang:
        training["fsdp"] = "full_shard auto_wrap"
        training["fsdp_config"] = {"transformer_layer_cls_to_wrap": [LAYER]}
    lora = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0}
    return LeafConfig(
        trainer_type="SFT",
        model_name=w["name"],
        formatting_func=w["fmt"],
        lora=lora if kind == "lora" else None,
        training=training,
        num_gpus=2 if gang else None,
    )


def _local_bytes(tensors: Any) -> int:
    """Bytes of ``tensors`` this process holds (a DTensor: its local shard)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total


def probe_callback() -> Any:
    """A ``TrainerCallback`` recording held bytes (parameters, gradients, optimizer state) and step times."""
    import torch
    from transformers import TrainerCallback

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    class Probe(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.params = self.grads = self.optim = 0
            self.steps: list[float] = []
            self.first = self.last = 0.0
            self._t = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            sync()
            self._t = time.perf_counter()
            self.first = self.first or self._t
            self.params = max(self.params, _local_bytes(kw["model"].parameters()))

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            grads = [p.grad for p in kw["model"].parameters() if p.grad is not None]
            self.grads = max(self.grads, _local_bytes(grads))

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            sync()
            self.last = time.perf_counter()
            self.steps.append(self.last - self._t)
            opt = kw["optimizer"]
            inner = getattr(opt, "optimizer", opt)
            tensors = [v for s in inner.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
            self.optim = max(self.optim, _local_bytes(tensors))

    return Probe()


def _record(probe: Any, losses: list[float]) -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    rss_now = 0.0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                rss_now = int(line.split()[1]) / 1024
    return {
        "params": probe.params,
        "grads": probe.grads,
        "optim": probe.optim,
        "step_s": probe.steps,
        "train_s": probe.last - probe.first,
        "losses": losses,
        "rss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux: KiB
        "rss_end_mb": rss_now,
        "cuda_peak_mb": torch.cuda.max_memory_allocated() / MB if cuda else None,
        "device": torch.cuda.get_device_name() if cuda else f"CPU, {torch.get_num_threads()} torch thread(s)",
    }


def _losses(trainer: Any) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def gang_rank(w: dict[str, Any], kind: str, a: argparse.Namespace, out: Path) -> dict[str, Any]:
    """This rank's share of the run, trained chunk by chunk by a ``TorchExecutor`` (as ``_gang_child.py``)."""
    from rapidfire_nb.spec.bundles import GroupSettings, TrainingCallbacks
    from rapidfire_nb.training.executor import TorchExecutor

    group = GroupSettings("SFT", w["create"], num_chunks=a.chunks, seed=SEED)
    ex = TorchExecutor(group, w["train"], None, out / "exp", TrainingCallbacks())
    try:
        start = ex.add_run(1, leaf_of(w, kind, True, a.batch, a.max_length))
        trainer = ex.runs[1].worker.trainer
        probe = probe_callback()
        trainer.add_callback(probe)
        done = start.segments_done
        while done < start.plan.num_segments:
            result = ex.run_segment(1, start.plan.boundary(done)).result(3600)
            if result.error is not None:
                raise RuntimeError(f"segment {done} failed: {result.error}")
            done += 1
        record = _record(probe, _losses(trainer))
        ex.on_status(1, "COMPLETED")  # gathers the final weights; rank 0 writes runs/1/final
        ex.flush()
        record.update(segments=start.plan.num_segments, final_dir=str(ex.final_dir(1)))
        return record
    finally:
        ex.close()


def one_device(w: dict[str, Any], kind: str, a: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The same run on one device: plain TRL ``trainer.train()`` with the global batch on one device."""
    from peft import get_peft_model
    from transformers import set_seed
    from trl import SFTTrainer

    from rapidfire_nb.spec import build_lora_config, build_training_args

    leaf = leaf_of(w, kind, False, a.batch, a.max_length)
    args, _ = build_training_args(leaf, output_dir=str(out / "trainer"), default_seed=SEED)
    model, tok = w["create"](leaf.model_config_dict())
    if kind == "lora":
        set_seed(args.seed)  # as TRL does before get_peft_model
        model = get_peft_model(model, build_lora_config(leaf))
    train = w["train"]
    if w["fmt"] is not None:
        train = train.map(w["fmt"], remove_columns=train.column_names)
    probe = probe_callback()
    trainer = SFTTrainer(model=model, args=args, train_dataset=train, processing_class=tok, callbacks=[probe])
    trainer.train()
    record = _record(probe, _losses(trainer))
    model.save_pretrained(str(out / "one"))
    record["final_dir"] = str(out / "one")
    return record


def child_main(a: argparse.Namespace) -> None:
    """One side (``--child gang`` under torchrun, or ``one``): each kind in turn; records to ``<out>/<kind>/``."""
    import gc

    import torch

    gang = None
    if a.child == "gang":
        from rapidfire_nb.training.sharding import join_gang

        gang = join_gang()  # what a gang's WorkerHost does at its start
        if gang is None:
            raise SystemExit("--child gang runs under torch.distributed.run (WORLD_SIZE=2)")
    w = workload(a.model, a.steps * 2 * a.batch)
    for kind in a.kinds.split(","):
        out = Path(a.out) / kind
        out.mkdir(parents=True, exist_ok=True)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        if gang is not None:
            record = gang_rank(w, kind, a, out)
            (out / f"rank{gang.rank}.json").write_text(json.dumps(record))
        else:
            (out / "one.json").write_text(json.dumps(one_device(w, kind, a, out)))
    if gang is not None:
        from rapidfire_nb.training.sharding import leave_gang

        leave_gang()


# ====================================================================== the parent
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(side: str, kinds: str, sizes: dict[str, Any], out: Path, timeout: float) -> float:
    """Run one side's process(es) for ``kinds``; returns its wall seconds. Raises with the log's tail on failure."""
    cores = sizes["cores"]
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    }
    env.update(HF_HUB_OFFLINE="1", RF_GANG_TIMEOUT_S="300", PYTHONUNBUFFERED="1")
    env["OMP_NUM_THREADS"] = str(max(1, cores // 2) if side == "gang" else cores)
    if sizes.get("cpu_only"):
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif side == "one":  # one GPU: plain TRL would wrap the model in DataParallel over every visible GPU
        env["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    cmd = [sys.executable]
    if side == "gang":
        cmd += ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1"]
        cmd += ["--master_port", str(_free_port())]
    cmd += [str(Path(__file__).resolve()), "--child", side, "--kinds", kinds, "--model", sizes["model"]]
    for key in ("steps", "batch", "max_length", "chunks"):
        cmd += [f"--{key.replace('_', '-')}", str(sizes[key])]
    cmd += ["--out", str(out)]
    log = out / f"{side}-{kinds.replace(',', '-')}.log"
    out.mkdir(parents=True, exist_ok=True)
    t = time.time()
    with open(log, "w") as fh:  # a session of its own: a timeout ends the launcher and both ranks
        proc = subprocess.Popen(
            cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=str(ROOT), start_new_session=True
        )
        try:
            proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise RuntimeError(
                f"{side} ({kinds}) ran past {timeout:.0f} s (killed); {log}:\n{log.read_text()[-2000:]}"
            ) from None
    if proc.returncode != 0:
        raise RuntimeError(
            f"{side} ({kinds}) failed (exit {proc.returncode}); {log}:\n{log.read_text()[-4000:]}"
        )
    return time.time() - t


def weights_diff(left: str, right: str, name: str) -> tuple[float, int, str]:
    """``(max |difference|, tensors compared, note)`` of the two folders' ``name`` safetensors over their common
    tensors. A tensor only one folder has is named in the note; a tied ``lm_head.weight`` that only one side wrote
    is compared with the other side's ``embed_tokens.weight`` (and counted)."""
    from safetensors.torch import load_file

    x, y = load_file(str(Path(left) / name)), load_file(str(Path(right) / name))
    pairs = [(x[k], y[k]) for k in sorted(set(x) & set(y))]
    notes = []
    for have, lack, side in ((x, y, "gang"), (y, x, "one device")):
        for k in sorted(set(have) - set(lack)):
            embed = [e for e in lack if e.endswith("embed_tokens.weight")]
            if k.endswith("lm_head.weight") and len(embed) == 1:
                pairs.append((have[k], lack[embed[0]]))
                notes.append(f"only the {side} folder has {k} (compared with the other's {embed[0]}: tied)")
            else:
                notes.append(f"only the {side} folder has {k}")
    if not pairs:
        raise RuntimeError(f"{name}: no tensor in common")
    worst = max(float((a.float() - b.float()).abs().max()) for a, b in pairs)
    return worst, len(pairs), "; ".join(notes)


def measure(
    kinds: list[str], sizes: dict[str, Any], work: Path, together: bool, deadline: float
) -> dict[str, Any]:
    """Both sides of every kind; ``together``: one process per side runs all kinds (fewer start-ups, as
    gpu_check needs; the CPU peak RSS is then the maximum so far); every process ends by ``deadline`` (a
    ``time.time()``) or is killed with its ranks. Returns ``{kind: {"one", "ranks", "diff",
    "tensors", "loss_diff"}}`` and the sides' wall seconds under ``"_wall"``."""
    groups = [",".join(kinds)] if together else kinds
    wall: dict[str, float] = {}
    for group in groups:
        for side in ("gang", "one"):
            wall[f"{side}:{group}"] = _spawn(side, group, sizes, work, deadline - time.time())
    got: dict[str, Any] = {"_wall": wall}
    for kind in kinds:
        one = json.loads((work / kind / "one.json").read_text())
        ranks = [json.loads((work / kind / f"rank{r}.json").read_text()) for r in (0, 1)]
        diff, n, note = weights_diff(ranks[0]["final_dir"], one["final_dir"], WEIGHTS[kind])
        losses = zip(ranks[0]["losses"], one["losses"], strict=True)
        loss_diff = max(abs(x - y) for x, y in losses)
        got[kind] = {
            "one": one,
            "ranks": ranks,
            "diff": diff,
            "tensors": n,
            "loss_diff": loss_diff,
            "note": note,
        }
    return got


def _mb(n: int) -> str:
    """Bytes as MB, two decimals below 10 MB (a LoRA adapter's gradients), one above."""
    return f"{n / MB:.2f}" if n < 10 * MB else f"{n / MB:.1f}"


def _row(label: str, r: dict[str, Any], base: dict[str, Any], cuda: bool) -> str:
    held, held0 = r["params"] + r["grads"] + r["optim"], base["params"] + base["grads"] + base["optim"]
    step, step0 = statistics.median(r["step_s"]), statistics.median(base["step_s"])
    cells = [
        f"{label:<14}",
        f"{_mb(r['params']):>9}",
        f"{_mb(r['grads']):>8}",
        f"{_mb(r['optim']):>8}",
        f"{_mb(held):>8}",
        f"{held / held0:>6.2f}x",
        f"{r['rss_peak_mb']:>8.0f}",
        f"{r['rss_peak_mb'] / base['rss_peak_mb']:>5.2f}x",
        f"{r['rss_end_mb']:>7.0f}",
    ]
    if cuda:
        cells.append(f"{r['cuda_peak_mb']:>9.0f} {r['cuda_peak_mb'] / base['cuda_peak_mb']:>5.2f}x")
    cells += [f"{step:>7.2f}", f"{step / step0:>5.2f}x", f"{r['train_s']:>7.1f}"]
    return " ".join(cells)


def report_kind(kind: str, got: dict[str, Any], sizes: dict[str, Any]) -> list[str]:
    """The table of one kind: the one device, each rank, the ratios to the one device (same run), the diffs."""
    one, ranks = got["one"], got["ranks"]
    cuda = one["cuda_peak_mb"] is not None
    b, steps = sizes["batch"], len(one["step_s"])
    head = (
        f"{'':<14} {'params MB':>9} {'grads MB':>8} {'optim MB':>8} {'held MB':>8} {'/1dev':>7} "
        f"{'peak RSS':>8} {'/1dev':>6} {'end RSS':>7}"
    )
    if cuda:
        head += f" {'CUDA peak':>9} {'/1dev':>6}"
    head += f" {'step s':>7} {'/1dev':>6} {'train s':>7}"
    lines = [
        f"== {KINDS[kind]}: {sizes['name']} fp32, {steps} steps of global batch {2 * b} (gang: 2 ranks x {b}; one "
        f"device: 1 x {2 * b}), max_length {sizes['max_length']}, gang in {ranks[0]['segments']} chunks ==",
        head,
        _row("one device", one, one, cuda),
    ]
    lines += [_row(f"gang rank {i}", r, one, cuda) for i, r in enumerate(ranks)]
    lines += [
        f"  devices: one = {one['device']}; ranks = {ranks[0]['device']}",
        f"  max |final weights gang - one device| = {got['diff']:.3e} over {got['tensors']} tensors "
        f"({WEIGHTS[kind]}); max |loss difference| per step = {got['loss_diff']:.3e}",
        *([f"  note: {got['note']}"] if got.get("note") else []),
        f"  step s per step: one {', '.join(f'{s:.2f}' for s in one['step_s'])}; rank 0 "
        f"{', '.join(f'{s:.2f}' for s in ranks[0]['step_s'])}",
    ]
    return lines


LEGEND = [
    "held MB = parameters + gradients + optimizer state this process holds for the run (a sharded tensor: its",
    "local shard); peak RSS / end RSS = the process' ru_maxrss / VmRSS at the end (MB: Python, torch, the whole",
    "model loaded before fully_shard, FSDP's all-gathered layers, activations); step s = median on_step_begin ->",
    "on_step_end (chunk boundaries excluded); train s = first step to last, boundaries included. /1dev = this row",
    "over the one-device row of the same run, measured in the same benchmark run.",
]


def _header(a: argparse.Namespace, sizes: dict[str, Any], load0: tuple[float, ...]) -> list[str]:
    import importlib.metadata as md

    vers = ", ".join(f"{p} {md.version(p)}" for p in ("torch", "transformers", "trl", "peft", "accelerate"))
    return [
        f"rapidfire_nb FSDP2 gang benchmark — {time.strftime('%Y-%m-%d %H:%M:%S')}",
        f"command: python {' '.join(sys.argv)}",
        f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {vers}",
        "gang: torch.distributed.run --nproc_per_node 2, each rank a TorchExecutor training the run chunk by chunk "
        f"(as _gang_child.py), OMP_NUM_THREADS={max(1, sizes['cores'] // 2)} per rank; one device: plain TRL "
        f"SFTTrainer.train() in one process, OMP_NUM_THREADS={sizes['cores']}",
        f"load average (1, 5, 15 min) at start: {', '.join(f'{x:.2f}' for x in load0)} "
        "(other work on the machine slows both sides and makes times noise)",
    ]


def parent_main(a: argparse.Namespace) -> None:
    kinds = [k.strip() for k in a.kinds.split(",") if k.strip()]
    if not kinds or any(k not in KINDS for k in kinds):
        raise SystemExit(f"--kinds: a comma list of {', '.join(KINDS)}")
    model = "tiny" if a.smoke else "smollm2"
    steps = a.steps or (4 if a.smoke else 8)
    sizes = {"model": model, "steps": steps, "batch": a.batch, "max_length": a.max_length, "chunks": a.chunks}
    sizes.update(cores=a.cores or len(os.sched_getaffinity(0)), cpu_only=a.cpu_only)
    if model == "smollm2":
        from rapidfire_nb.data import SMOLLM2_NAME, smollm2_path

        smollm2_path()  # converted once into the user cache, never inside a timed child
        sizes["name"] = SMOLLM2_NAME
    else:
        sizes["name"] = "tiny Llama (hidden 64, 2 layers)"
    load0 = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="rf-fsdp-bench-"))
    t0 = time.time()
    try:
        got = measure(kinds, sizes, work, together=False, deadline=t0 + a.timeout)
    except BaseException:
        print(
            f"fsdp benchmark failed; its work folder (logs, records, weights) is kept: {work}",
            file=sys.stderr,
        )
        raise
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    lines = _header(a, sizes, load0) + [""]
    for kind in kinds:
        lines += report_kind(kind, got[kind], sizes) + [""]
    lines += LEGEND
    load1 = os.getloadavg()
    lines.append(
        f"load average at end: {', '.join(f'{x:.2f}' for x in load1)}; benchmark wall time {time.time() - t0:.0f} s "
        f"(processes: {', '.join(f'{k} {v:.0f} s' for k, v in got['_wall'].items())})"
    )
    text = "\n".join(lines)
    print(text)
    out = Path(a.out or RESULTS / f"fsdp_{model}.txt")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    out.with_suffix(".json").write_text(json.dumps({"sizes": sizes, **got}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="the tiny model, 4 steps (a quick check)")
    ap.add_argument("--kinds", default="lora,full", help="comma list of lora, full (default both)")
    ap.add_argument("--steps", type=int, help="optimizer steps (default 8; --smoke 4)")
    ap.add_argument("--batch", type=int, default=2, help="per-rank batch (one device: 2x; default 2)")
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--chunks", type=int, default=2, help="the gang run's chunks (run_segment calls)")
    ap.add_argument("--cores", type=int, default=0, help="CPU threads in all (default: the usable CPUs)")
    ap.add_argument("--cpu-only", action="store_true", help="hide any GPU (CUDA_VISIBLE_DEVICES='')")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds for the whole benchmark")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs, final weights)")
    ap.add_argument("--out", help="report file (default benchmarks/results/fsdp_<model>.txt)")
    ap.add_argument("--child", choices=("gang", "one"), help=argparse.SUPPRESS)
    ap.add_argument("--model", default="smollm2", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child_main(a)
    else:
        parent_main(a)


if __name__ == "__main__":
    main()
