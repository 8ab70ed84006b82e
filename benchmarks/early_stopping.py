"""Early stopping against training every config to the end, on the tiny model or SmolLM2 (not a timed test).

8 SFT LoRA configs (4 learning rates x 2 LoRA ranks), ``num_chunks=8``, one epoch of the training rows, an eval
set evaluated at every chunk end (rapidfire_nb) or at the last step (plain TRL):

(a) sequential plain TRL: each config ``SFTTrainer(...).train()`` to the end, one after the other;
(b) rapidfire_nb without early stopping;
(c) rapidfire_nb with ``SuccessiveHalving(metric="eval_loss", reduction_factor=2)``;
(d) ``RFOptuna`` over the same 8 points (``List`` knobs), budget 8, 4 trials at once, hyperband pruner.

``--model tiny`` (default): the tests' tiny Llama, 64 rows of ``tiny_sft_dataset`` at batch 4 (16 optimizer steps
per run, 2 per chunk), 16 eval rows, ``max_length=64``. ``--model smollm2``: SmolLM2-135M-Instruct (fp32, loaded
as the main job does, ``create_smollm2``) on the main job's construction FAQ (``load_construction_faq``, rows
formatted by ``faq_to_chat``, eval = held-out questions), sizes in ``CASES`` (printed at the start).

For each case it prints the time until the final winner is known (a, b: when the last run ends; c, d: when the
last run other than the winner stopped or ended), the optimizer steps trained in all, the winner and its final
eval_loss against (a)'s best; then (b)'s ranking at every chunk end (the same numbers plain TRL would evaluate
there: rapidfire_nb trains exactly what plain TRL trains) and each prune's reason::

    .venv/bin/python benchmarks/early_stopping.py                      # tiny, ~4 min on a loaded 2-core machine
    .venv/bin/python benchmarks/early_stopping.py --rows 32            # smaller: 8 steps per run
    .venv/bin/python benchmarks/early_stopping.py --model smollm2      # SmolLM2 on the FAQ (see CASES for sizes)
    .venv/bin/python benchmarks/early_stopping.py --model smollm2 --rows 16 --no-optuna   # a quick check
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SEED = 42
NUM_CHUNKS = 8


@dataclass(frozen=True)
class Case:
    """One model's workload: 8 configs = ``learning_rates`` x ``ranks``, one epoch of ``rows`` at ``batch``."""

    name: str
    model_name: str
    learning_rates: tuple[float, ...]
    ranks: tuple[int, ...]
    rows: int
    eval_rows: int  # tiny: rows; smollm2: held-out questions (their rows are the eval set)
    batch: int
    max_length: int
    eval_batch: int
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")
    model_kwargs: dict[str, Any] = field(default_factory=dict)

    def steps(self, rows: int) -> int:
        return rows // self.batch


CASES = {
    "tiny": Case(
        name="tiny",
        model_name="tiny",
        learning_rates=(3e-3, 1e-3, 3e-4, 1e-4),
        ranks=(4, 16),
        rows=64,
        eval_rows=16,
        batch=4,
        max_length=64,
        eval_batch=8,  # the Trainer's default
    ),
    # Sizes for a 2-core CPU: 32 rows at batch 2 = 16 optimizer steps per run (2 per chunk), 8 held-out questions
    # (8 rows) in one eval batch, max_length 128 as the main job (3 of 16 rows are longer). Measured with one
    # thread: a step ~6.5 s and an eval of 16 rows ~27 s at load 7-9; a whole (a) run of 16 steps ~50 s at load 2.
    # The learning rates bracket the best one for these LoRA runs, so the top three configs stay close and swap
    # places between chunks (the per-chunk ranking the benchmark prints shows it).
    "smollm2": Case(
        name="smollm2",
        model_name="SmolLM2-135M-Instruct",
        learning_rates=(1e-2, 3e-3, 1e-3, 3e-4),
        ranks=(4, 16),
        rows=32,
        eval_rows=8,
        batch=2,
        max_length=128,
        eval_batch=16,
        model_kwargs={"dtype": "float32"},
    ),
}


def _to_chat(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "prompt": [{"role": "user", "content": row["question"]}],
        "completion": [{"role": "assistant", "content": row["answer"]}],
    }


def _tiny_data(n: int, seed: int) -> Any:
    from datasets import Dataset

    from rapidfire_nb.testing import tiny_sft_dataset

    rows = tiny_sft_dataset(n, seed=seed)
    return Dataset.from_dict(
        {
            "question": [p[0]["content"] for p in rows["prompt"]],
            "answer": [c[0]["content"] for c in rows["completion"]],
        }
    )


def workload(case: Case, rows: int) -> tuple[Any, Any, Callable[..., Any], Callable[..., Any]]:
    """``(train, eval, create_model_fn, formatting_func)`` of ``case`` with ``rows`` training rows."""
    if case.name == "tiny":
        from rapidfire_nb.testing import tiny_create_model

        return _tiny_data(rows, 0), _tiny_data(case.eval_rows, 1), tiny_create_model, _to_chat
    # the main job's model, data and formatting (examples/sft_customer_support.py)
    from rapidfire_nb.data import create_smollm2, faq_to_chat, load_construction_faq, smollm2_path

    smollm2_path()  # converted once into the user cache, before any timing
    train, evald = load_construction_faq(n_train=rows, n_eval=case.eval_rows, seed=SEED)
    return train, evald, create_smollm2, faq_to_chat


def _lora(case: Case, r: int) -> Any:
    from rapidfire_nb.automl import RFLoraConfig

    return RFLoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules=list(case.target_modules))


def _training_args(case: Case, steps: int, learning_rate: Any) -> Any:
    from rapidfire_nb.automl import RFSFTConfig

    return RFSFTConfig(
        learning_rate=learning_rate,
        per_device_train_batch_size=case.batch,
        per_device_eval_batch_size=case.eval_batch,
        num_train_epochs=1,
        max_length=case.max_length,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=steps,  # plain TRL evaluates once, at its last step (rapidfire_nb at every chunk end too)
    )


def _model_config(case: Case, steps: int, fmt: Callable[..., Any], lora: Any, learning_rate: Any) -> Any:
    from rapidfire_nb.automl import RFModelConfig

    extra = {"model_type": "causal_lm", "model_kwargs": dict(case.model_kwargs)} if case.model_kwargs else {}
    return RFModelConfig(
        model_name=case.model_name,
        peft_config=lora,
        training_args=_training_args(case, steps, learning_rate),
        formatting_func=fmt,
        **extra,
    )


def _group(case: Case, steps: int, fmt: Callable[..., Any]) -> Any:
    from rapidfire_nb.automl import List, RFGridSearch

    configs = [
        _model_config(case, steps, fmt, _lora(case, r), lr) for lr in case.learning_rates for r in case.ranks
    ]
    return RFGridSearch(configs=List(configs), trainer_type="SFT")


def _optuna_search(case: Case, steps: int, fmt: Callable[..., Any]) -> Any:
    """(d): the same 8-point space as List knobs, searched by RFOptuna (budget 8, 4 at once, hyperband)."""
    from rapidfire_nb.automl import List, RFOptuna

    config = _model_config(
        case,
        steps,
        fmt,
        List([_lora(case, r) for r in case.ranks]),
        List(list(case.learning_rates)),
    )
    return RFOptuna(config, "SFT", n_initial=4, budget=8, pruner="hyperband", seed=SEED)


def _label(leaf: Any) -> str:
    h = leaf.hparams()
    return f"lr={h.get('learning_rate')} r={h.get('lora.r')}"


def plain_trl(
    case: Case, train: Any, evald: Any, steps: int, out: Path, create: Callable[..., Any], fmt: Any
) -> dict[str, Any]:
    """(a): every config trained to the end with a plain SFTTrainer, one after the other."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import SFTTrainer

    from rapidfire_nb.spec import build_lora_config, build_training_args

    t0 = time.perf_counter()
    finals, total = {}, 0
    for i, leaf in enumerate(_group(case, steps, fmt).expand(SEED), start=1):
        args, _ = build_training_args(leaf, output_dir=str(out / f"plain-{i}"), default_seed=SEED)
        model, tok = create(leaf.model_config_dict())
        trainer = SFTTrainer(
            model=model,
            args=args,
            train_dataset=train.map(fmt, remove_columns=train.column_names),
            eval_dataset=evald.map(fmt, remove_columns=evald.column_names),
            processing_class=tok,
            peft_config=build_lora_config(leaf),
        )
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
        trainer.train()
        total += int(trainer.state.global_step)
        finals[i] = [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h][-1]
        print(
            f"  (a) run {i} ({_label(leaf)}): eval_loss {finals[i]:.4f} at {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
        del trainer, model
    wall = time.perf_counter() - t0
    best = min(finals, key=finals.__getitem__)
    return {
        "known_s": wall,
        "end_s": wall,
        "steps": total,
        "winner": best,
        "final": finals[best],
        "finals": finals,
    }


def rapidfire(
    case: Case,
    train: Any,
    evald: Any,
    steps: int,
    out: Path,
    create: Callable[..., Any],
    fmt: Any,
    halving: bool,
    optuna: bool = False,
    packing: bool | str = "auto",
) -> dict[str, Any]:
    """(b), (c), (d) or (e): one rapidfire_nb experiment, without early stopping, with successive halving, with
    RFOptuna, or with successive halving and every run in one pack (``packing=True``)."""
    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import SuccessiveHalving

    name = "optuna" if optuna else ("es-packed" if packing is True else "es") if halving else "all"
    exp = Experiment(name, experiment_path=out)
    exp.quiet = True
    group = _optuna_search(case, steps, fmt) if optuna else _group(case, steps, fmt)
    policy = SuccessiveHalving(metric="eval_loss", mode="min", reduction_factor=2) if halving else None
    t0, wall0 = time.perf_counter(), time.time()
    exp.run_fit(
        group, create, train, evald, num_chunks=NUM_CHUNKS, seed=SEED, early_stopping=policy, packing=packing
    )
    end = time.perf_counter() - t0
    info, results, ops = exp.get_runs_info(), exp.get_results(), exp.ops()
    last_point: dict[int, float] = {}  # run id -> the wall time of its last logged metric
    for point in exp.metrics_since(0)[0]:
        rid = int(point["run_id"])
        last_point[rid] = max(last_point.get(rid, 0.0), float(point["wall_time"]))
    exp.end()
    evals = results.dropna(subset=["eval_loss"])
    done = info[info.status == "COMPLETED"]
    finals = {int(rid): float(evals[evals.run_id == rid].eval_loss.iloc[-1]) for rid in done.run_id}
    best = min(finals, key=finals.__getitem__)
    pruned = ops[ops.source == "early_stopping"] if len(ops) else ops
    # the winner is known once every other run has stopped (a prune) or ended (its last metric)
    others = []
    for rid in info.run_id:
        rid = int(rid)
        if rid == best:
            continue
        stops = pruned[pruned.run_id == rid].applied_at if len(pruned) else []
        others.append((float(max(stops)) if len(stops) else last_point.get(rid, wall0 + end)) - wall0)
    known = max(others) if (halving or optuna) and others else end
    labels = {int(r.run_id): _label_hparams(r.config) for r in info.itertuples()}
    chunks = {int(rid): list(df.eval_loss) for rid, df in evals.groupby("run_id")}
    return {
        "known_s": min(known, end),
        "end_s": end,
        "steps": int(info.completed_steps.sum()),
        "winner": best,
        "final": finals[best],
        "pruned": {int(r.run_id): r.message for r in pruned.itertuples()} if halving or optuna else {},
        "labels": labels,
        "chunks": chunks,
    }


def _label_hparams(config: Any) -> str:
    import json

    data = json.loads(config) if isinstance(config, str) else dict(config or {})
    lora = data.get("lora") or {}
    return f"lr={(data.get('training') or {}).get('learning_rate')} r={lora.get('r')}"


def report(rows: dict[str, dict[str, Any]], labels: dict[int, str]) -> str:
    a = rows["a"]
    lines = [
        "| case | winner known (s) | all done (s) | optimizer steps | winner | its final eval_loss | vs (a)'s best |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    names = {
        "a": "(a) sequential plain TRL",
        "b": "(b) rapidfire_nb",
        "c": "(c) rapidfire_nb + SuccessiveHalving(η=2)",
        "d": "(d) RFOptuna(budget=8, 4 at once, hyperband)",
        "e": "(e) = (c) with packing=True (one pack)",
    }
    for key, r in rows.items():
        rel = (r["final"] - a["final"]) / a["final"] * 100
        lines.append(
            f"| {names[key]} | {r['known_s']:.1f} | {r['end_s']:.1f} | {r['steps']} ({r['steps'] / a['steps']:.2f}×) "
            f"| run {r['winner']} ({r.get('labels', labels).get(r['winner'], '?')}) | {r['final']:.4f} | {rel:+.2f}% |"
        )
    c = rows["c"]
    rel = (c["final"] - a["final"]) / a["final"] * 100
    ok = {
        "steps": c["steps"] / a["steps"] <= 0.35,
        "sooner": a["known_s"] / c["known_s"] >= 3,
        "winner": c["winner"] == a["winner"] or abs(rel) <= 2,
    }
    same = "(a)'s best" if c["winner"] == a["winner"] else f"{rel:+.2f}% from (a)'s best"
    lines.append("")
    lines.append(
        f"(c) trains {c['steps'] / a['steps']:.2f}× the optimizer steps of (a) (target ≤ 0.35×: "
        f"{'met' if ok['steps'] else 'MISSED'}), knows its winner {a['known_s'] / c['known_s']:.1f}× sooner "
        f"(target ≥ 3×: {'met' if ok['sooner'] else 'MISSED'}; all done {a['end_s'] / c['end_s']:.1f}× sooner), "
        f"its winner is {same} (target: (a)'s best or within 2%: {'met' if ok['winner'] else 'MISSED'})"
    )
    lines.append(
        "(a)'s final eval_loss per run: " + ", ".join(f"{k}: {v:.4f}" for k, v in a["finals"].items())
    )
    return "\n".join(lines)


def ranking(chunks: dict[int, list[float]], labels: dict[int, str], winner: int) -> str:
    """(b)'s eval_loss ranking at every chunk end, and where the final winner stood."""
    lines = ["(b)'s eval_loss ranking at each chunk end (best first; * = the final winner):"]
    n = min(len(v) for v in chunks.values())
    for k in range(n):
        order = sorted(chunks, key=lambda rid: chunks[rid][k])
        cells = ", ".join(f"{'*' if rid == winner else ''}{rid} {chunks[rid][k]:.4f}" for rid in order)
        lines.append(f"  chunk {k + 1}: {cells}  (winner ranked {order.index(winner) + 1} of {len(order)})")
    lines.append("  runs: " + ", ".join(f"{rid}: {labels.get(rid, '?')}" for rid in sorted(chunks)))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(CASES), default="tiny", help="the workload (default tiny)")
    parser.add_argument(
        "--rows", type=int, default=None, help="training rows (default: the case's; one epoch)"
    )
    parser.add_argument("--no-optuna", action="store_true", help="leave out (d) RFOptuna")
    parser.add_argument(
        "--packing", action="store_true", help="add (e): (c) with packing=True (on CPU 'auto' does not pack)"
    )
    ns = parser.parse_args()
    case = CASES[ns.model]
    rows_n = ns.rows or case.rows
    steps = case.steps(rows_n)
    if steps < NUM_CHUNKS:
        parser.error(
            f"--rows {rows_n}: at batch {case.batch} that is {steps} steps, fewer than {NUM_CHUNKS} chunks"
        )
    train, evald, create, fmt = workload(case, rows_n)
    print(
        f"model {case.model_name}: {len(train)} train rows, batch {case.batch} ({steps} optimizer steps per run, "
        f"{steps / NUM_CHUNKS:g} per chunk, num_chunks={NUM_CHUNKS}), {len(evald)} eval rows (eval batch "
        f"{case.eval_batch}), max_length {case.max_length}; learning rates {case.learning_rates} x LoRA ranks "
        f"{case.ranks} on {list(case.target_modules)}; torch threads {_threads()}; load average {_load()}",
        flush=True,
    )
    labels = {i: _label(leaf) for i, leaf in enumerate(_group(case, steps, fmt).expand(SEED), start=1)}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        rows = {"a": plain_trl(case, train, evald, steps, out, create, fmt)}
        print(f"(a) done at {time.perf_counter() - t0:.0f} s; load average {_load()}", flush=True)
        cases: dict[str, dict[str, Any]] = {
            "b": {"halving": False},
            "c": {"halving": True},
            "d": {"halving": False, "optuna": True},
            "e": {"halving": True, "packing": True},
        }
        for key, kw in cases.items():
            if (key == "d" and ns.no_optuna) or (key == "e" and not ns.packing):
                continue
            rows[key] = rapidfire(case, train, evald, steps, out, create, fmt, **kw)
            print(f"({key}) done at {time.perf_counter() - t0:.0f} s; load average {_load()}", flush=True)
    print()
    print(report(rows, labels))
    if "b" in rows:
        print(ranking(rows["b"]["chunks"], labels, rows["a"]["winner"]))
    for key in ("c", "d", "e"):
        for rid, message in sorted(rows.get(key, {}).get("pruned", {}).items()):
            print(f"  ({key}) run {rid} ({rows[key]['labels'].get(rid, '?')}): {message}")
    print(f"benchmark wall time {time.perf_counter() - t0:.0f} s; load average {_load()}")


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _load() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


if __name__ == "__main__":
    main()
