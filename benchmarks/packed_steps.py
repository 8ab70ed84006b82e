"""Packed steps (issue 38): k LoRA runs of one pack trained with one forward/backward over the shared base per
micro-batch (``run_fit(packing=True)``), against the same runs time-sliced (``packing=False``) and against k
separate plain ``SFTTrainer(...).train()`` calls one after the other.

The runs of a pack differ only in what a pack allows (here: learning rate and LoRA rank/alpha; every run r on
q/k/v/o, dropout 0.05) and see the same batches (same seed, batch size and max length): ``k`` of
``LRS``/``RANKS``. Cases (``--models``):

* **tiny**: the tests' tiny Llama (``rapidfire_nb.testing.tiny_create_model``: hidden 64, 2 layers) on
  ``tiny_sft_dataset`` rows; ``--tiny-steps`` steps (default 32) of batch 8, 4 chunks.
* **smollm2**: SmolLM2-135M-Instruct (fp32) on construction-FAQ rows (``load_construction_faq``, CC BY 4.0,
  ``faq_to_chat``), ``--smollm2-steps`` steps (default 8) of batch 4, 2 chunks.

Both with ``max_length`` 64, ``gradient_checkpointing=False`` set explicitly (TRL turns it on by default and a
pack does not fuse under it; rapidfire_nb switches it off on CPU anyway), no eval set. The train set is one epoch
(steps x batch rows), so every run trains on every row once. Sides, each in a child process of its own (OpenMP
teams and caches do not mix), in an order that alternates over ``--repeats`` (rotated each repeat):

* **plain**: for each of the k leaf configs, ``create_model_fn(...)``, ``SFTTrainer(model, args, train,
  processing_class, peft_config).train()`` and ``save_model()`` (``args``/``peft_config`` from
  ``rapidfire_nb.spec.build_training_args`` / ``build_lora_config``, as ``benchmarks/overhead.py`` does).
* **sliced**: ``Experiment(...).run_fit(group, ..., num_chunks=C, packing=False)`` + ``end()``.
* **packed**: the same with ``packing=True`` (the pack's fused and alone passes are counted and printed).

Printed per side: wall time (model loads, trainers, training, saving: what each side costs its user), training
tokens/s (k x the epoch's tokens, each row's tokenized length cut at ``max_length``, / wall time), the process's
peak RSS (``getrusage(RUSAGE_SELF).ru_maxrss``) and on CUDA ``torch.cuda.max_memory_allocated``; the max
|difference| of each side's final adapters to plain TRL's (0.0 expected on CPU fp32); then the ratios
packed/sliced and packed/plain of tokens/s (above 1: packed is faster). ``--dpo``: 4 LoRA DPO runs (beta 0.05-0.5,
the same learning rates and ranks) on each model, sliced vs packed (DPO's shared reference on in both), and
sliced with ``RAPIDFIRE_DPO_SHARED_REFERENCE=0`` (every run computes its own reference, plain TRL's way):
preference pairs/s and adapters compared to the sliced side.

Issue 38's prototype predicted on this 2-core CPU: ~1.0x packed/separate on the tiny model, ~0.84x on SmolLM2
(a CPU's GEMMs are compute-bound already at these sizes); on a GPU (launch-bound small models) 2-4x.

    .venv/bin/python benchmarks/packed_steps.py            # tiny + SmolLM2, k = 2, 4, 8, DPO (~20 min on 2 quiet cores)
    .venv/bin/python benchmarks/packed_steps.py --quick    # tiny only, k = 2, 4, fewer steps, tiny DPO (~2 min)
    .venv/bin/python benchmarks/packed_steps.py --models smollm2 --ks 4 --repeats 2

The report is printed and written to ``--out`` (default ``benchmarks/results/packed_steps_latest.txt``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
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
LRS = (1e-3, 5e-4, 2e-3, 2e-4, 1e-4, 3e-3, 7e-4, 3e-4)
RANKS = (8, 16, 4, 32, 8, 16, 4, 32)
BETAS = (0.05, 0.1, 0.2, 0.5)
QKVO = ["q_proj", "k_proj", "v_proj", "o_proj"]
SFT_SIDES = ("plain", "sliced", "packed")
DPO_SIDES = ("unshared", "sliced", "packed")


# ====================================================================== the workload (children)
def workload(model: str, kind: str, rows: int) -> dict[str, Any]:
    """``create`` (a create_model_fn), ``train`` rows, ``fmt`` (formatting_func or None), ``name``."""
    if model == "tiny":
        from rapidfire_nb.testing import tiny_create_model, tiny_dpo_dataset, tiny_sft_dataset

        train = tiny_dpo_dataset(rows, seed=3) if kind == "DPO" else tiny_sft_dataset(rows, seed=0)
        return {"create": tiny_create_model, "train": train, "fmt": None, "name": "tiny", "kwargs": {}}
    from rapidfire_nb.data import create_smollm2, faq_to_chat, load_construction_faq, load_faq_preferences

    create_smollm2()  # converted and in the page cache before timing
    if kind == "DPO":
        train, _ = load_faq_preferences(n_train=rows, n_eval=8, seed=SEED, rejected="shuffle")
        fmt = None
    else:
        train, _ = load_construction_faq(n_train=rows, n_eval=8, seed=SEED)
        fmt = faq_to_chat
    name = "SmolLM2-135M-Instruct"
    return {
        "create": create_smollm2,
        "train": train,
        "fmt": fmt,
        "name": name,
        "kwargs": {"dtype": "float32"},
    }


def group_of(
    w: dict[str, Any], kind: str, k: int, steps: int, batch: int, max_length: int, **extra: Any
) -> Any:
    """k LoRA configs of one pack: learning rate ``LRS[i]``, rank ``RANKS[i]`` (alpha 2r), DPO beta ``BETAS[i]``;
    ``extra``: more training arguments for every run (e.g. ``bf16=False``)."""
    from rapidfire_nb.automl import List, RFDPOConfig, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    configs = []
    for i in range(k):
        common = {
            "learning_rate": LRS[i],
            "per_device_train_batch_size": batch,
            "max_steps": steps,
            "max_length": max_length,
            "logging_steps": 1,
            "eval_strategy": "no",
            "gradient_checkpointing": False,
            **extra,
        }
        args = RFDPOConfig(beta=BETAS[i % 4], **common) if kind == "DPO" else RFSFTConfig(**common)
        lora = RFLoraConfig(r=RANKS[i], lora_alpha=2 * RANKS[i], lora_dropout=0.05, target_modules=QKVO)
        configs.append(
            RFModelConfig(
                model_name=w["name"],
                peft_config=lora,
                training_args=args,
                model_kwargs=dict(w["kwargs"]),
                formatting_func=w["fmt"],
            )
        )
    return RFGridSearch(configs=List(configs), trainer_type=kind)


def epoch_tokens(dataset: Any, max_length: int) -> int:
    """Tokens of one epoch of a TRL-prepared train set: each row's ``input_ids`` cut at ``max_length`` (SFT), or
    prompt+chosen and prompt+rejected each cut at ``max_length`` (DPO)."""
    cols = dataset.column_names
    if "input_ids" in cols:
        return sum(min(len(ids), max_length) for ids in dataset["input_ids"])
    suffix = "_ids" if "prompt_ids" in cols else "_input_ids"  # TRL 1.x / older
    prompt, chosen, rejected = (dataset[f"{c}{suffix}"] for c in ("prompt", "chosen", "rejected"))
    return sum(
        min(len(p) + len(c), max_length) + min(len(p) + len(r), max_length)
        for p, c, r in zip(prompt, chosen, rejected)
    )


def _plain(w: dict[str, Any], group: Any, tmp: str, max_length: int) -> dict[str, Any]:
    """k plain ``SFTTrainer(...).train()`` + ``save_model()``, one after the other; adapters and epoch tokens."""
    from peft import get_peft_model_state_dict
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import SFTTrainer

    from rapidfire_nb.spec import build_lora_config, build_training_args

    adapters, tokens, training = {}, 0, 0.0
    for rid, leaf in enumerate(group.expand(SEED), start=1):
        args, _ = build_training_args(leaf, output_dir=f"{tmp}/plain-{rid}", default_seed=SEED)
        model, tok = w["create"](leaf.model_config_dict())
        train = w["train"]
        if leaf.formatting_func is not None:
            train = train.map(leaf.formatting_func, remove_columns=train.column_names)
        trainer = SFTTrainer(
            model=model,
            args=args,
            train_dataset=train,
            processing_class=tok,
            peft_config=build_lora_config(leaf),
        )
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
        t0 = time.perf_counter()
        trainer.train()
        training += time.perf_counter() - t0
        trainer.save_model()
        adapters[rid] = {
            k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(trainer.model).items()
        }
        tokens = epoch_tokens(trainer.train_dataset, max_length)
        del trainer, model
        gc.collect()
    return {"adapters": adapters, "epoch_tokens": tokens, "training": training}


def _rapidfire(
    w: dict[str, Any], group: Any, tmp: str, max_length: int, chunks: int, packing: bool
) -> dict[str, Any]:
    """``run_fit(packing=...)`` + ``end()`` (timed apart from reading the adapters); adapters, tokens, pack counts."""
    from peft import get_peft_model_state_dict

    from rapidfire_nb import Experiment

    training = _time_segments()
    exp = Experiment(f"packed-steps-{'packed' if packing else 'sliced'}", experiment_path=tmp, overwrite=True)
    exp.quiet = True
    exp.run_fit(group, w["create"], w["train"], None, num_chunks=chunks, seed=SEED, packing=packing)
    t1 = time.perf_counter()
    ex = exp.session.executor
    runs = ex.runs
    adapters = {
        int(rid): {
            k: v.detach().cpu().clone()
            for k, v in get_peft_model_state_dict(run.worker.trainer.model, adapter_name=run.adapter).items()
        }
        for rid, run in runs.items()
    }
    tokens = epoch_tokens(next(iter(runs.values())).worker.trainer.train_dataset, max_length)
    packs = ex.packs
    fused = [(d.fused_steps, d.alone_steps) for d in packs._drivers.values()] if packs is not None else []
    info = exp.get_runs_info()
    statuses = sorted(set(info.status))
    pack_column = [None if p != p else p for p in info["pack"]] if "pack" in info else []  # NaN -> None
    t2 = time.perf_counter()
    exp.end()
    return {
        "adapters": adapters,
        "epoch_tokens": tokens,
        "fused": fused,
        "packed_segments": packs.packed_segments if packs is not None else 0,
        "statuses": statuses,
        "pack_column": pack_column,
        "untimed": t2 - t1,
        "training": training[0],
    }


def _time_segments() -> list[float]:
    """Sum the seconds of every ``TorchExecutor.run_segment`` (a run's chunk, or a pack's packed segment: the
    training between two boundaries, chunk switches included) into the returned cell. The scheduler waits for
    each segment before it asks for the next (``training/host.py``), so the segments do not overlap."""
    from rapidfire_nb.training.executor import TorchExecutor

    _SEGMENT_SECONDS[0] = 0.0
    original = TorchExecutor.run_segment
    if getattr(original, "_timed", False):  # patched by an earlier call in this process
        return _SEGMENT_SECONDS

    def timed(self: Any, run_id: int, stop_step: int) -> Any:
        t0 = time.perf_counter()
        fut = original(self, run_id, stop_step)
        fut.add_done_callback(lambda _f: _add_segment(time.perf_counter() - t0))
        return fut

    timed._timed = True  # type: ignore[attr-defined]
    TorchExecutor.run_segment = timed  # type: ignore[method-assign]
    return _SEGMENT_SECONDS


_SEGMENT_SECONDS = [0.0]


def _add_segment(seconds: float) -> None:
    _SEGMENT_SECONDS[0] += seconds


def train_side(
    side: str, w: dict[str, Any], group: Any, tmp: str, max_length: int, chunks: int
) -> dict[str, Any]:
    """Train ``group`` one way: ``side`` "plain", "sliced" or "packed". Returns ``adapters`` ({run id: {name:
    tensor}}), ``seconds`` (wall, CUDA synchronized), ``training`` (seconds in ``train()`` / in segments),
    ``epoch_tokens`` and, for rapidfire_nb, the pack counters."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t0 = time.perf_counter()
    if side == "plain":
        got = _plain(w, group, tmp, max_length)
    else:
        got = _rapidfire(w, group, tmp, max_length, chunks, packing=side == "packed")
    sync()
    got["seconds"] = time.perf_counter() - t0 - got.pop("untimed", 0.0)
    return got


def child(a: argparse.Namespace) -> None:
    """One side: writes seconds, tokens, peak memory and pack counts to ``a.result`` (adapters to ``.pt``)."""
    import torch

    cuda = torch.cuda.is_available()
    rows = a.steps * a.batch
    w = workload(a.model, a.kind, rows)
    group = group_of(w, a.kind, a.k, a.steps, a.batch, a.max_length)
    with tempfile.TemporaryDirectory(prefix="rf-packed-steps-") as tmp:
        got = train_side(a.child, w, group, tmp, a.max_length, a.chunks)
    torch.save(got.pop("adapters"), a.result + ".pt")
    got.update(
        rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux: KiB
        cuda_mb=torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
        device=torch.cuda.get_device_name(0) if cuda else f"CPU, {torch.get_num_threads()} threads",
        torch=torch.__version__,
    )
    Path(a.result).write_text(json.dumps(got))


# ====================================================================== the parent
def _side(a: argparse.Namespace, case: dict[str, Any], side: str, work: str, tag: str) -> dict[str, Any]:
    out = os.path.join(work, f"{tag}.json")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    if side == "unshared":
        env["RAPIDFIRE_DPO_SHARED_REFERENCE"] = "0"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "sliced" if side == "unshared" else side]
    cmd += ["--result", out, "--model", case["model"], "--kind", case["kind"], "--k", str(case["k"])]
    cmd += ["--steps", str(case["steps"]), "--batch", str(case["batch"]), "--chunks", str(case["chunks"])]
    cmd += ["--max-length", str(a.max_length)]
    log = os.path.join(work, f"{tag}.log")
    with open(log, "w") as fh:
        done = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT))
    if done.returncode != 0 or not Path(out).exists():
        tail = Path(log).read_text(errors="replace")[-3000:]
        raise SystemExit(f"child {tag} failed (exit {done.returncode}); log {log}:\n{tail}")
    got: dict[str, Any] = json.loads(Path(out).read_text())
    got["adapters"] = out + ".pt"
    return got


def max_difference(x: str, y: str) -> float:
    """The largest |difference| between two sides' final adapters (files of :func:`child`), over every run."""
    import torch

    return adapters_difference(torch.load(x), torch.load(y))


def adapters_difference(ax: dict[int, dict[str, Any]], ay: dict[int, dict[str, Any]]) -> float:
    """The largest |difference| between two ``{run id: {tensor name: tensor}}`` (same runs and names, asserted)."""
    assert sorted(ax) == sorted(ay), f"other runs: {sorted(ax)} vs {sorted(ay)}"
    worst = 0.0
    for rid in ax:
        assert sorted(ax[rid]) == sorted(ay[rid]), f"run {rid}: other adapter tensors"
        worst = max(worst, max(float((ax[rid][k].float() - ay[rid][k].float()).abs().max()) for k in ax[rid]))
    return worst


def run_case(a: argparse.Namespace, case: dict[str, Any], work: str, say: Any) -> dict[str, dict[str, Any]]:
    """Every side of one case over ``--repeats`` (order rotated each repeat); the best (fastest) of each side."""
    sides = DPO_SIDES if case["kind"] == "DPO" else SFT_SIDES
    got: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    for i in range(a.repeats):
        order = sides[i % len(sides) :] + sides[: i % len(sides)]
        order = order if i % 2 == 0 else tuple(reversed(order))
        for side in order:
            tag = f"{case['model']}-{case['kind']}-k{case['k']}-{side}-{i}"
            out = _side(a, case, side, work, tag)
            got[side].append(out)
            bad = [x for x in out.get("statuses", ["COMPLETED"]) if x != "COMPLETED"]
            say(
                f"    repeat {i + 1} {side:8s}: {out['seconds']:7.1f} s, peak RSS {out['rss_mb']:6.0f} MiB, load "
                f"{os.getloadavg()[0]:.1f}{_pack_text(out)}"
                + (f"; RUN STATUSES {out['statuses']}" if bad else "")
            )
    return {s: min(v, key=lambda o: o["seconds"]) for s, v in got.items()}


def _pack_text(out: dict[str, Any]) -> str:
    if not out.get("fused") and not out.get("packed_segments"):
        return ""
    return f", packed segments {out['packed_segments']}, (fused, alone) passes per pack {out['fused']}"


def _memory(out: dict[str, Any]) -> str:
    cuda = f" / {out['cuda_mb']:.0f}" if out.get("cuda_mb") is not None else ""
    return f"{out['rss_mb']:.0f}{cuda}"


def _ratios(
    best: dict[str, dict[str, Any]], pairs: tuple[tuple[str, str], ...]
) -> dict[str, tuple[float, float]]:
    """``{"a/b": (wall-time throughput ratio, training-time throughput ratio)}``: above 1, side a is faster."""
    return {
        f"{x}/{y}": (best[y]["seconds"] / best[x]["seconds"], best[y]["training"] / best[x]["training"])
        for x, y in pairs
    }


def _ratio_text(ratios: dict[str, tuple[float, float]]) -> str:
    return ", ".join(f"{n} {w:.3f}x (training {t:.3f}x)" for n, (w, t) in ratios.items())


def report_sft(
    case: dict[str, Any], best: dict[str, dict[str, Any]], say: Any
) -> dict[str, tuple[float, float]]:
    """The SFT case's table and ratios; returns the ratios."""
    tokens = case["k"] * best["plain"]["epoch_tokens"]
    same = all(best[s]["epoch_tokens"] == best["plain"]["epoch_tokens"] for s in best)
    mem = "peak RSS / CUDA MiB" if best["plain"].get("cuda_mb") is not None else "peak RSS MiB"
    say(
        f"    {'side':8s} {'wall s':>7s} {'tokens/s':>9s} {'training s':>10s} {'tokens/s':>9s} {mem:>19s} "
        f"{'max |diff| to plain':>20s}"
    )
    for side in SFT_SIDES:
        o = best[side]
        diff = "-" if side == "plain" else f"{max_difference(o['adapters'], best['plain']['adapters']):.3g}"
        say(
            f"    {side:8s} {o['seconds']:7.1f} {tokens / o['seconds']:9.0f} {o['training']:10.1f} "
            f"{tokens / o['training']:9.0f} {_memory(o):>19s} {diff:>20s}"
        )
    ratios = _ratios(best, (("packed", "sliced"), ("packed", "plain"), ("sliced", "plain")))
    say(
        f"    tokens/s ratios: {_ratio_text(ratios)}; peak RSS packed/sliced "
        f"{best['packed']['rss_mb'] / best['sliced']['rss_mb']:.2f}x"
        + (_cuda_ratio(best) if best["plain"].get("cuda_mb") is not None else "")
        + ("" if same else "; EPOCH TOKENS DIFFER between sides")
    )
    say(f"    epoch: {best['plain']['epoch_tokens']} tokens per run, {tokens} for the {case['k']} runs")
    return ratios


def _cuda_ratio(best: dict[str, dict[str, Any]]) -> str:
    return f", CUDA peak packed/sliced {best['packed']['cuda_mb'] / best['sliced']['cuda_mb']:.2f}x"


def report_dpo(
    case: dict[str, Any], best: dict[str, dict[str, Any]], say: Any
) -> dict[str, tuple[float, float]]:
    """The DPO case's table (pairs/s) and ratios; adapters compared to the sliced side."""
    pairs = case["k"] * case["steps"] * case["batch"]
    say(
        f"    {'side':8s} {'wall s':>7s} {'pairs/s':>8s} {'training s':>10s} {'pairs/s':>8s} {'peak MiB':>12s} "
        f"{'max |diff| to sliced':>21s}"
    )
    for side in DPO_SIDES:
        o = best[side]
        diff = "-" if side == "sliced" else f"{max_difference(o['adapters'], best['sliced']['adapters']):.3g}"
        say(
            f"    {side:8s} {o['seconds']:7.1f} {pairs / o['seconds']:8.2f} {o['training']:10.1f} "
            f"{pairs / o['training']:8.2f} {_memory(o):>12s} {diff:>21s}"
        )
    ratios = _ratios(best, (("packed", "sliced"), ("sliced", "unshared"), ("packed", "unshared")))
    say(f"    pairs/s ratios: {_ratio_text(ratios)}")
    return ratios


def cases_of(a: argparse.Namespace) -> list[dict[str, Any]]:
    sizes = {"tiny": (a.tiny_steps, 8, 4), "smollm2": (a.smollm2_steps, 4, 2)}
    out = []
    for model in a.models.split(","):
        steps, batch, chunks = sizes[model]
        for k in (int(x) for x in a.ks.split(",")):
            out.append(
                {"model": model, "kind": "SFT", "k": k, "steps": steps, "batch": batch, "chunks": chunks}
            )
        if a.dpo:
            dpo_steps = steps if model == "tiny" else max(2, steps // 2)
            out.append(
                {"model": model, "kind": "DPO", "k": 4, "steps": dpo_steps, "batch": batch, "chunks": 2}
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,smollm2", help="comma list of tiny, smollm2")
    ap.add_argument("--ks", default="2,4,8", help="comma list of pack sizes (runs per pack, at most 8)")
    ap.add_argument(
        "--tiny-steps", type=int, default=32, help="optimizer steps per run, tiny model (batch 8)"
    )
    ap.add_argument("--smollm2-steps", type=int, default=8, help="optimizer steps per run, SmolLM2 (batch 4)")
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument(
        "--no-dpo", dest="dpo", action="store_false", help="skip the DPO cases (k=4 on each model)"
    )
    ap.add_argument("--repeats", type=int, default=1, help="rounds of every side (order rotated each round)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="tiny only, k = 2 and 4, 8 steps (unless given): a smoke run (~3 min)",
    )
    ap.add_argument(
        "--out", default=str(RESULTS / "packed_steps_latest.txt"), help="also write the report here"
    )
    for name in ("--child", "--result", "--model", "--kind"):
        ap.add_argument(name, default=None, help=argparse.SUPPRESS)
    for name in ("--k", "--steps", "--batch", "--chunks"):
        ap.add_argument(name, type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a)
        return
    if a.quick:  # only what was left at its default
        d = ap.parse_args([])
        a.models = "tiny" if a.models == d.models else a.models
        a.ks = "2,4" if a.ks == d.ks else a.ks
        a.tiny_steps = 8 if a.tiny_steps == d.tiny_steps else a.tiny_steps
    run_all(a, " ".join(sys.argv[1:]))


def run_all(a: argparse.Namespace, argv: str) -> None:
    import torch

    lines: list[str] = []

    def say(text: str) -> None:  # the report file is rewritten at every line: a stopped run keeps its cases
        print(text, flush=True)
        lines.append(text)
        if a.out:
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text("\n".join(lines) + "\n")

    say(
        f"benchmarks/packed_steps.py {argv} — {time.strftime('%Y-%m-%d %H:%M')} UTC, torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs, CUDA {torch.cuda.is_available()}; load {os.getloadavg()[0]:.2f} at start"
    )
    summary: list[str] = []
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="rf-packed-steps-") as work:
        for case in cases_of(a):
            name = f"{case['model']} {case['kind']} k={case['k']}"
            say(
                f"== {name}: {case['steps']} steps x batch {case['batch']}, max_length {a.max_length}, "
                f"{case['chunks']} chunks (load {os.getloadavg()[0]:.2f})"
            )
            best = run_case(a, case, work, say)
            ratios = (report_dpo if case["kind"] == "DPO" else report_sft)(case, best, say)
            summary.append(f"  {name:18s} {_ratio_text(ratios)}")
    say(f"summary (throughput ratios, above 1: the first is faster; best of {a.repeats}):")
    for line in summary:
        say(line)
    say(f"total {time.time() - t0:.0f} s; load {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
