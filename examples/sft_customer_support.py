"""The main job: compare 4 SFT configs on SmolLM2-135M-Instruct with customer-support pairs.

2 learning rates x 2 LoRA settings = 4 runs, trained concurrently in 4 chunks on the chatterbot-corpus
``tech_support`` pairs (128 training rows, 24 eval rows). Prints the runs table with each run's eval loss,
names the best config and writes ``artifacts/sft_loss_curves.png``.

Run it with ``bash scripts/demo.sh`` (creates .venv and installs everything), or directly with
``.venv/bin/python examples/sft_customer_support.py [--max-steps N] [--experiment-path DIR]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rapidfire_nb import Experiment  # noqa: E402
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig  # noqa: E402
from rapidfire_nb.data import create_smollm2, load_tech_support, smollm2_path, to_chat  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--max-steps",
        type=int,
        default=16,
        help="optimizer steps per run (default 16 = one epoch of 128 rows at batch 8: 4 steps per chunk)",
    )
    ap.add_argument("--batch-size", type=int, default=8, help="per_device_train_batch_size (default 8)")
    ap.add_argument("--num-chunks", type=int, default=4)
    ap.add_argument("--experiment-path", default=None, help="experiments root (default: a temporary folder)")
    ap.add_argument("--out", default="artifacts/sft_loss_curves.png")
    a = ap.parse_args()

    t0 = time.time()
    folder = smollm2_path()  # converted once into the user cache dir, reused afterwards
    print(f"SmolLM2-135M-Instruct ready at {folder} ({time.time() - t0:.1f} s)")
    train_ds, eval_ds = load_tech_support(n_train=128, n_eval=24, seed=42)

    peft_configs = List(
        [
            RFLoraConfig(
                r=8, lora_alpha=16, lora_dropout=0.1, target_modules=["q_proj", "v_proj"], bias="none"
            ),
            RFLoraConfig(
                r=32,
                lora_alpha=64,
                lora_dropout=0.1,
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                bias="none",
            ),
        ]
    )
    config_set = List(
        [
            RFModelConfig(
                model_name="SmolLM2-135M-Instruct",
                peft_config=peft_configs,
                training_args=RFSFTConfig(
                    learning_rate=lr,
                    per_device_train_batch_size=a.batch_size,
                    max_steps=a.max_steps,
                    max_length=128,
                    fp16=True,
                    eval_strategy="no",
                    per_device_eval_batch_size=8,
                ),
                model_type="causal_lm",
                model_kwargs={"dtype": "float32", "use_cache": False},
                formatting_func=to_chat,
            )
            for lr in (1e-3, 1e-4)
        ]
    )
    root = a.experiment_path or tempfile.mkdtemp(prefix="rapidfire-demo-")
    experiment = Experiment(experiment_name="sft-customer-support", experiment_path=root, overwrite=True)
    t1 = time.time()
    experiment.run_fit(
        RFGridSearch(configs=config_set, trainer_type="SFT"),
        create_smollm2,
        train_ds,
        eval_ds,
        num_chunks=a.num_chunks,
        seed=42,
    )
    experiment.end()
    elapsed = time.time() - t1

    info = experiment.get_runs_info()
    cols = [c for c in info.columns if c not in ("config", "checkpoint_dir", "error")]
    print()
    print(info[cols].to_string(index=False))
    best = info.dropna(subset=["eval_loss"]).sort_values("eval_loss").iloc[0]

    def plain(v):
        return v.item() if hasattr(v, "item") else v

    hp = {
        c: plain(best[c])
        for c in cols
        if c
        not in (
            "run_id",
            "status",
            "completed_steps",
            "total_steps",
            "chunks_done",
            "epoch",
            "loss",
            "eval_loss",
        )
    }
    print(f"\nbest config: run {int(best.run_id)} {hp} — eval_loss {best.eval_loss:.4f}")
    print(f"trained {len(info)} runs in {elapsed:.0f} s; experiment folder: {experiment.path}")

    results = experiment.get_results()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    short = {
        "learning_rate": "lr",
        "lora.r": "r",
        "lora.lora_alpha": "alpha",
        "lora.target_modules": "modules",
    }
    for rid, df in results.groupby("run_id"):
        row = info.set_index("run_id").loc[rid]
        label = f"run {rid}: " + ", ".join(
            f"{short.get(k, k)}={len(row[k]) if k == 'lora.target_modules' else plain(row[k])}" for k in hp
        )
        tr = df.dropna(subset=["loss"]) if "loss" in df else df.iloc[0:0]
        ev = df.dropna(subset=["eval_loss"]) if "eval_loss" in df else df.iloc[0:0]
        (line,) = axes[0].plot(tr["samples_seen"], tr["loss"], label=label)
        axes[1].plot(ev["samples_seen"], ev["eval_loss"], marker="o", color=line.get_color(), label=label)
    for ax, title in zip(axes, ("train loss", "eval loss (end of each chunk)")):
        ax.set_xlabel("samples seen (training rows)")
        ax.set_ylabel("loss")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"loss curves written to {out}")


if __name__ == "__main__":
    main()
