"""The Experiment's outputs after a finished run_fit: tables, folders, checkpoints, TensorBoard, load_model.

One module-scoped experiment: 2 learning rates x 2 LoRA ranks = 4 runs on the tiny model, 16 rows, batch 4
(4 steps), 4 chunks (boundaries at steps 1, 2, 3, 4), an eval set.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import adapter_from_folder, adapter_state, max_abs_diff, qa_dataset, qa_to_chat

SEED = 11
LRS = (1e-3, 1e-4)
RANKS = (4, 8)
STEPS = 4


def _group() -> Any:
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    loras = List(
        [
            RFLoraConfig(r=r, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"])
            for r in RANKS
        ]
    )
    configs = List(
        [
            RFModelConfig(
                model_name="tiny",
                peft_config=loras,
                formatting_func=qa_to_chat,
                training_args=RFSFTConfig(
                    learning_rate=lr, per_device_train_batch_size=4, num_train_epochs=1, max_length=32
                ),
            )
            for lr in LRS
        ]
    )
    return RFGridSearch(configs=configs, trainer_type="SFT")


@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model

    exp = Experiment("api", experiment_path=tmp_path_factory.mktemp("api"))
    exp.quiet = True
    exp.run_fit(_group(), tiny_create_model, qa_dataset(16), qa_dataset(4, seed=1), num_chunks=4, seed=SEED)
    trained = {
        rid: adapter_state(run.worker.trainer.model, adapter_name=run.adapter)
        for rid, run in exp.session.executor.runs.items()
    }
    loaded_before_end = exp.load_model(2)
    info, results = exp.get_runs_info(), exp.get_results()
    exp.end()
    return {"exp": exp, "info": info, "results": results, "trained": trained, "loaded": loaded_before_end}


def test_runs_info_columns(done: dict[str, Any]) -> None:
    assert list(done["info"].columns) == [
        "run_id",
        "status",
        "learning_rate",
        "lora.r",
        "completed_steps",
        "total_steps",
        "chunks_done",
        "epoch",
        "loss",
        "eval_loss",
        "checkpoint_dir",
        "error",
        "stop_reason",
        "config",  # the whole config last: the compared values come first
    ]


def test_runs_info_values(done: dict[str, Any]) -> None:
    import pandas as pd

    info = done["info"]
    assert list(info.run_id) == [1, 2, 3, 4]
    assert list(info.status) == ["COMPLETED"] * 4
    assert list(info.completed_steps) == [STEPS] * 4 and list(info.total_steps) == [STEPS] * 4
    assert list(info.chunks_done) == [4] * 4
    assert list(info.epoch) == [1.0] * 4
    assert all(info.error.map(pd.isna))
    results = done["results"]
    for _, row in info.iterrows():  # latest loss / eval_loss are the last logged ones
        mine = results[results.run_id == row.run_id].sort_values("step")
        assert row.loss == mine.dropna(subset=["loss"]).loss.iloc[-1]
        assert row.eval_loss == mine.dropna(subset=["eval_loss"]).eval_loss.iloc[-1]
        assert math.isfinite(row.loss) and math.isfinite(row.eval_loss)


def test_run_ids_follow_the_expansion_order(done: dict[str, Any]) -> None:
    info = done["info"]
    expected = [(lr, r) for lr in LRS for r in RANKS]
    assert list(zip(info.learning_rate, info["lora.r"])) == expected
    leaves = _group().expand(SEED)
    for rid, leaf in enumerate(leaves, start=1):
        config = info.loc[info.run_id == rid, "config"].iloc[0]
        config = json.loads(config) if isinstance(config, str) else config
        assert config == leaf.to_json(), f"run {rid}"
    # the same numbers in the store, the executor and the TensorBoard folders
    assert [r["run_id"] for r in done["exp"].store.runs()] == [1, 2, 3, 4]
    assert sorted(done["exp"].session.executor.runs) == [1, 2, 3, 4]
    assert sorted(p.name for p in (done["exp"].path / "tensorboard").iterdir()) == [
        f"run-{i}" for i in range(1, 5)
    ]


def test_results_long_form(done: dict[str, Any]) -> None:
    results = done["results"]
    assert list(results.columns[:3]) == ["run_id", "step", "samples_seen"]
    assert {"loss", "eval_loss", "learning_rate", "grad_norm"} <= set(results.columns[3:])
    for rid in range(1, 5):
        mine = results[results.run_id == rid].sort_values("step")
        assert list(mine.step) == [1, 2, 3, 4]
        assert list(mine.samples_seen) == [4, 8, 12, 16]
        assert mine.loss.notna().all() and mine.eval_loss.notna().all()  # eval at every chunk end
    lr_at_1 = results[results.step == 1].set_index("run_id").learning_rate
    assert lr_at_1[1] > lr_at_1[3]  # 1e-3 vs 1e-4 schedules


def test_checkpoint_dir_holds_final_adapter_and_tokenizer(done: dict[str, Any]) -> None:
    from transformers import AutoTokenizer

    from rapidfire_nb.testing import tiny_tokenizer

    info = done["info"].set_index("run_id")
    for rid in range(1, 5):
        folder = Path(info.loc[rid, "checkpoint_dir"])
        assert folder.is_dir()
        names = {p.name for p in folder.iterdir()}
        assert {
            "adapter_model.safetensors",
            "adapter_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
        } <= names
        adapter_config = json.loads((folder / "adapter_config.json").read_text())
        assert adapter_config["r"] == RANKS[(rid - 1) % 2]
        assert max_abs_diff(adapter_from_folder(folder), done["trained"][rid]) == 0.0
        tok = AutoTokenizer.from_pretrained(str(folder))
        assert tok("What is 3 plus 4?").input_ids == tiny_tokenizer()("What is 3 plus 4?").input_ids
    assert len({info.loc[rid, "checkpoint_dir"] for rid in range(1, 5)}) == 4


def test_only_the_latest_checkpoint_is_kept_a_finished_runs_final_state(done: dict[str, Any]) -> None:
    """Boundaries at steps 1, 2, 3 and the end at 4: a finished run keeps one checkpoint, its final state (what a
    continuation after ``end()`` or a restart starts from), and no boundary checkpoint before it."""
    import torch

    runs = done["exp"].path / "runs"
    for rid in range(1, 5):
        ckpts = sorted(p.name for p in (runs / str(rid)).glob("checkpoint-*"))
        assert ckpts == ["checkpoint-4"], f"run {rid}: {ckpts}"
        ckpt = runs / str(rid) / "checkpoint-4"
        names = {p.name for p in ckpt.iterdir()}
        assert {
            "COMPLETE",
            "optimizer.pt",
            "scheduler.pt",
            "rng_state.pth",
            "trainer_state.json",
            "adapter_model.safetensors",
            "adapter_config.json",
        } <= names
        assert json.loads((ckpt / "trainer_state.json").read_text())["global_step"] == 4
        assert torch.load(ckpt / "scheduler.pt", weights_only=False)["last_epoch"] == 4
        optimizer = torch.load(ckpt / "optimizer.pt", weights_only=False)
        assert len(optimizer["state"]) == len(done["trained"][rid])  # AdamW moments of every adapter tensor
        assert all(int(s["step"]) == 4 for s in optimizer["state"].values())
        assert {"python", "numpy", "cpu"} <= set(torch.load(ckpt / "rng_state.pth", weights_only=False))
        assert max_abs_diff(adapter_from_folder(ckpt), done["trained"][rid]) == 0.0  # the final adapter
        leftovers = [p.name for p in (runs / str(rid)).iterdir() if p.name.startswith(".")]
        assert leftovers == [], f"run {rid}: half-written folders left: {leftovers}"


def test_tensorboard_event_files(done: dict[str, Any]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    results = done["results"]
    for rid in range(1, 5):
        folder = done["exp"].path / "tensorboard" / f"run-{rid}"
        assert any(p.name.startswith("events.out.tfevents") for p in folder.iterdir())
        acc = EventAccumulator(str(folder))
        acc.Reload()
        assert {"train/loss", "eval/loss", "train/learning_rate"} <= set(acc.Tags()["scalars"])
        events = acc.Scalars("train/loss")
        mine = results[results.run_id == rid].sort_values("step")
        assert [e.step for e in events] == [1, 2, 3, 4]
        for e, expected in zip(events, mine.loss):
            assert e.value == pytest.approx(expected, rel=1e-6)  # TensorBoard stores float32
        assert [e.step for e in acc.Scalars("eval/loss")] == [1, 2, 3, 4]


def _generate(model: Any, tok: Any) -> Any:
    import torch

    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 3 plus 4?"}], tokenize=False, add_generation_prompt=True
    )
    enc = tok(text, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > enc["input_ids"].shape[1]
    return out


def test_load_model_gives_the_final_weights_ready_for_generate(done: dict[str, Any]) -> None:
    model, tok = done["loaded"]
    assert not model.training
    assert max_abs_diff(adapter_state(model), done["trained"][2]) == 0.0
    _generate(model, tok)


def test_load_model_after_end(done: dict[str, Any]) -> None:
    model, tok = done["exp"].load_model(3)
    assert max_abs_diff(adapter_state(model), done["trained"][3]) == 0.0
    assert max_abs_diff(adapter_state(model), done["trained"][1]) > 0.0
    _generate(model, tok)


def test_rerunning_a_finished_experiment_trains_nothing_and_says_so(done: dict[str, Any]) -> None:
    """The same cells in a new kernel (here: a new object after end()): nothing trains, the message says why."""
    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model

    old = done["exp"]
    exp = Experiment("api", experiment_path=old.root)
    assert exp is not old  # the old one was ended
    said: list[str] = []
    exp.on_message(said.append)
    exp.run_fit(_group(), tiny_create_model, qa_dataset(16), qa_dataset(4, seed=1), num_chunks=4, seed=SEED)
    text = "\n".join(said)
    assert "no run left to train (4 COMPLETED)" in text, text
    assert "runs × " not in text and "continuing" not in text, text
    assert {s.status.value for s in exp.run_snapshots()} == {"COMPLETED"}
    assert exp.get_results().equals(done["results"])
    # runs that ended in an earlier process load from their saved final weights
    model, tok = exp.load_model(2)
    assert max_abs_diff(adapter_state(model), done["trained"][2]) == 0.0
    exp.end()


def test_import_does_not_load_the_panel() -> None:
    """``import rapidfire_nb`` stays cheap: the live panel (anywidget) loads when a panel is shown."""
    code = "import sys, rapidfire_nb; print('anywidget' in sys.modules); sys.exit(1 if 'anywidget' in sys.modules else 0)"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_import_does_not_import_torch() -> None:
    code = (
        "import sys, rapidfire_nb, kernel_scheduler, rapidfire_nb.automl, rapidfire_nb.testing; "
        "bad = sorted(m for m in ('torch', 'transformers', 'trl', 'peft') if m in sys.modules); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
