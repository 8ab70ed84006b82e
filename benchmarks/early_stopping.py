"""Early stopping against training every config to the end, on the tiny model (not a timed test).

8 SFT LoRA configs (4 learning rates x 2 LoRA ranks), ``num_chunks=8``, one epoch of 64 rows at batch 4 (16
optimizer steps per run, 2 per chunk), an eval set of 16 rows:

(a) sequential plain TRL: each config ``SFTTrainer(...).train()`` to the end, one after the other;
(b) rapidfire_nb without early stopping;
(c) rapidfire_nb with ``SuccessiveHalving(metric="eval_loss", reduction_factor=2)``.

For each it prints the time until the final winner is known (a, b: when the last run ends; c: when the last
prune leaves one run in the rotation, and when that one ends), the optimizer steps trained in all, the winner and
its final eval_loss against (a)'s best::

    .venv/bin/python benchmarks/early_stopping.py            # ~3 min on a quiet 2-core machine
    .venv/bin/python benchmarks/early_stopping.py --rows 32  # smaller: 8 steps per run
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

LEARNING_RATES = (3e-3, 1e-3, 3e-4, 1e-4)
RANKS = (4, 16)
SEED = 42
NUM_CHUNKS = 8


def _to_chat(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "prompt": [{"role": "user", "content": row["question"]}],
        "completion": [{"role": "assistant", "content": row["answer"]}],
    }


def _data(n: int, seed: int) -> Any:
    from datasets import Dataset

    from rapidfire_nb.testing import tiny_sft_dataset

    rows = tiny_sft_dataset(n, seed=seed)
    return Dataset.from_dict(
        {
            "question": [p[0]["content"] for p in rows["prompt"]],
            "answer": [c[0]["content"] for c in rows["completion"]],
        }
    )


def _group(steps: int) -> Any:
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    configs = [
        RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(
                r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]
            ),
            training_args=RFSFTConfig(
                learning_rate=lr,
                per_device_train_batch_size=4,
                num_train_epochs=1,
                max_length=64,
                logging_steps=1,
                eval_strategy="steps",
                eval_steps=steps,  # plain TRL evaluates once, at its last step (rapidfire_nb at every chunk end too)
            ),
            formatting_func=_to_chat,
        )
        for lr in LEARNING_RATES
        for r in RANKS
    ]
    return RFGridSearch(configs=List(configs), trainer_type="SFT")


def _optuna_search(steps: int) -> Any:
    """(d): the same 8-point space as List knobs, searched by RFOptuna (budget 8, 4 at once, hyperband)."""
    from rapidfire_nb.automl import List, RFLoraConfig, RFModelConfig, RFOptuna

    base = _group(steps).configs[0]
    config = RFModelConfig(
        model_name="tiny",
        peft_config=List(
            [
                RFLoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
                for r in RANKS
            ]
        ),
        training_args=type(base.training_args)(
            **{**base.training_args.kwargs, "learning_rate": List(LEARNING_RATES)}
        ),
        formatting_func=_to_chat,
    )
    return RFOptuna(config, "SFT", n_initial=4, budget=8, pruner="hyperband", seed=SEED)


def _label(leaf: Any) -> str:
    h = leaf.hparams()
    return f"lr={h.get('learning_rate')} r={h.get('lora.r')}"


def plain_trl(train: Any, evald: Any, steps: int, out: Path) -> dict[str, Any]:
    """(a): every config trained to the end with a plain SFTTrainer, one after the other."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import SFTTrainer

    from rapidfire_nb.spec import build_lora_config, build_training_args
    from rapidfire_nb.testing import tiny_create_model

    t0 = time.perf_counter()
    finals, total = {}, 0
    for i, leaf in enumerate(_group(steps).expand(SEED), start=1):
        args, _ = build_training_args(leaf, output_dir=str(out / f"plain-{i}"), default_seed=SEED)
        model, tok = tiny_create_model(leaf.model_config_dict())
        fmt = leaf.formatting_func
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
    train: Any, evald: Any, steps: int, out: Path, halving: bool, search: Any = None
) -> dict[str, Any]:
    """(b), (c) or (d): one rapidfire_nb experiment, with or without successive halving (or ``search``)."""
    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import SuccessiveHalving
    from rapidfire_nb.testing import tiny_create_model

    exp = Experiment("optuna" if search is not None else "es" if halving else "all", experiment_path=out)
    exp.quiet = True
    policy = SuccessiveHalving(metric="eval_loss", mode="min", reduction_factor=2) if halving else None
    t0, wall0 = time.perf_counter(), time.time()
    exp.run_fit(
        _group(steps),
        tiny_create_model,
        train,
        evald,
        num_chunks=NUM_CHUNKS,
        seed=SEED,
        early_stopping=policy,
    )
    end = time.perf_counter() - t0
    info, results, ops = exp.get_runs_info(), exp.get_results(), exp.ops()
    exp.end()
    done = info[info.status == "COMPLETED"]
    finals = {
        int(rid): float(results[(results.run_id == rid)].dropna(subset=["eval_loss"]).eval_loss.iloc[-1])
        for rid in done.run_id
    }
    best = min(finals, key=finals.__getitem__)
    pruned = ops[ops.source == "early_stopping"] if len(ops) else ops
    known = float(pruned.applied_at.max()) - wall0 if halving and len(pruned) else end
    labels = {int(r.run_id): _label_hparams(r.config) for r in info.itertuples()}
    return {
        "known_s": known,
        "end_s": end,
        "steps": int(info.completed_steps.sum()),
        "winner": best,
        "final": finals[best],
        "pruned": {int(r.run_id): r.message for r in pruned.itertuples()} if halving else {},
        "labels": labels,
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
    }
    for key, r in rows.items():
        rel = (r["final"] - a["final"]) / a["final"] * 100
        lines.append(
            f"| {names[key]} | {r['known_s']:.1f} | {r['end_s']:.1f} | {r['steps']} ({r['steps'] / a['steps']:.2f}×) "
            f"| run {r['winner']} ({r.get('labels', labels).get(r['winner'], '?')}) | {r['final']:.4f} | {rel:+.2f}% |"
        )
    c = rows["c"]
    lines.append("")
    lines.append(
        f"(c) trains {c['steps'] / a['steps']:.2f}× the optimizer steps of (a) and knows its winner "
        f"{a['known_s'] / c['known_s']:.1f}× sooner (all done {a['end_s'] / c['end_s']:.1f}× sooner); "
        f"(a)'s final eval_loss per run: " + ", ".join(f"{k}: {v:.4f}" for k, v in a["finals"].items())
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=64, help="training rows (batch 4: rows/4 steps per run)")
    parser.add_argument("--no-optuna", action="store_true", help="leave out (d) RFOptuna")
    ns = parser.parse_args()
    steps = ns.rows // 4
    train, evald = _data(ns.rows, 0), _data(16, 1)
    labels = {i: _label(leaf) for i, leaf in enumerate(_group(steps).expand(SEED), start=1)}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        rows = {
            "a": plain_trl(train, evald, steps, out),
            "b": rapidfire(train, evald, steps, out, halving=False),
            "c": rapidfire(train, evald, steps, out, halving=True),
        }
        if not ns.no_optuna:
            rows["d"] = rapidfire(train, evald, steps, out, halving=True, search=_optuna_search(steps))
    print(report(rows, labels))
    for rid, message in sorted(rows["c"]["pruned"].items()):
        print(f"  run {rid} ({labels[rid]}): {message}")


if __name__ == "__main__":
    main()
