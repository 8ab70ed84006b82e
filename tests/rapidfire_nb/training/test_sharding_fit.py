"""``run_fit(devices=2)`` with a config of ``num_gpus=2`` and ``fsdp``: the whole path (the gang's two worker
processes started by the device layer, each a ``WorkerHost`` that joined the gang, the scheduler's chunks).

* It ends bit-identical to a plain TRL ``trainer.train()`` sharded the same way under ``torch.distributed.run``;
  ``load_model`` gives the gathered adapter on a fresh base, without FSDP. A one-device run trains beside it (the
  gang and it take turns on the two devices) and ends equal to plain TRL; every view names the gang.
* Stop and resume, and a warm clone with equal settings, end as the undisturbed run.
* A warm clone of a gang run that finished before this ``run_fit`` (``end()``, the experiment continued) starts
  from its final state on disk, each rank its own share, and ends equal to the run trained undisturbed for the
  longer budget.
* ``kill -9`` of one rank after the first chunk: the gang is restarted on new workers, the run continues from its
  latest checkpoint and ends equal to the undisturbed run.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import child_pids
from tests.rapidfire_nb.training._gang_launch import WEIGHTS
from tests.rapidfire_nb.training._gang_launch import check as _check
from tests.rapidfire_nb.training._gang_launch import max_diff as _max_diff
from tests.rapidfire_nb.training._gang_launch import spawn as _spawn

ROWS = 96  # 24 steps in 4 chunks of 6: the kill lands inside the second chunk


def _group(beside: bool = False) -> Any:
    """Run 1: a LoRA run sharded over a gang of 2; with ``beside``, run 2: a LoRA run on one device."""
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    config = RFModelConfig(  # the config of _gang_child.spec("lora", gang=True)
        model_name="tiny",
        num_gpus=2,
        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
        training_args=RFSFTConfig(
            learning_rate=1e-3,
            per_device_train_batch_size=2,
            num_train_epochs=1,
            logging_steps=1,
            seed=3,
            fsdp="full_shard auto_wrap",
            fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]},
        ),
    )
    one_device = RFModelConfig(
        model_name="tiny",
        peft_config=RFLoraConfig(r=2, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
        training_args=RFSFTConfig(
            learning_rate=5e-4, per_device_train_batch_size=4, num_train_epochs=1, logging_steps=1, seed=3
        ),
    )
    return RFGridSearch(configs=List([config, *([one_device] if beside else [])]), trainer_type="SFT")


def _fit(root: Path, name: str, kill: bool, beside: bool = False) -> dict[str, Any]:
    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset

    before = child_pids()
    exp = Experiment(name, experiment_path=root)
    notes: list[str] = []
    exp.on_message(notes.append)
    exp.progress_lines = False
    exp.run_fit(
        _group(beside),
        tiny_create_model,
        tiny_sft_dataset(ROWS),
        None,
        num_chunks=4,
        seed=0,
        devices=2,
        background=True,
    )
    killed = None
    if kill:  # one rank, once the first boundary checkpoint is complete (every rank's share on disk)
        run_dir = root / name / "runs" / "1"
        deadline = time.monotonic() + 120
        while not list(run_dir.glob("checkpoint-*/COMPLETE")) and time.monotonic() < deadline:
            time.sleep(0.01)
        killed = max(child_pids() - before)
        os.kill(killed, signal.SIGKILL)
    assert exp.wait(timeout=300)
    info = exp.get_runs_info().set_index("run_id")
    model = exp.load_model(1)[0] if not kill else None
    views = None if kill else _views(exp, name)
    exp.end()
    return {
        "info": info,
        "notes": notes,
        "model": model,
        "killed": killed,
        "left": child_pids() - before,
        "views": views,
    }


def _views(exp: Any, name: str) -> dict[str, Any]:
    """What a user sees of the finished gang run: the panel's snapshot, the static copy, %rapidfire status and the
    server page (from the store)."""
    from rapidfire_nb import magic
    from rapidfire_nb.panel.static import static_bundle
    from rapidfire_nb.view import StoreRows, store_snapshot

    snap = exp.panel_snapshot()
    return {
        "panel": snap,
        "static": static_bundle(snap, exp.metrics_since(0)[0])["text/html"],
        "status": magic._status(exp),
        "page": store_snapshot(name, StoreRows.read(exp.store), writer_alive=True),
    }


@pytest.fixture(scope="module")
def calm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("gangfit")
    return {"root": root, **_fit(root, "calm", kill=False, beside=True)}


def _final(result: dict[str, Any]) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(Path(result["info"].loc[1, "checkpoint_dir"]) / WEIGHTS["lora"]))


def test_run_fit_trains_a_sharded_gang_exactly(calm: dict[str, Any]) -> None:
    from safetensors.torch import load_file

    info = calm["info"]
    assert info.loc[1, "status"] == "COMPLETED" and info.loc[1, "chunks_done"] == 4
    assert info.loc[1, "completed_steps"] == 24
    assert info.loc[1, "device"] == "cpu:0+cpu:1" and info.loc[1, "sharding"] == "fsdp"
    assert any("gangs on cpu:0+cpu:1" in n for n in calm["notes"])
    assert not calm["left"]  # end() leaves no rank behind
    ours = _final(calm)
    loaded = {n: p for n, p in calm["model"].named_parameters() if "lora_" in n}
    assert len(loaded) == len(ours) == 8 and not any("DTensor" in type(p).__name__ for p in loaded.values())
    ref = calm["root"] / "ref"
    _check(_spawn("plain", ref, rows=ROWS))
    assert _max_diff(ours, load_file(str(ref / "lora" / "plain" / WEIGHTS["lora"]))) == 0.0


def test_a_one_device_run_trains_beside_the_gang_and_equals_plain_trl(calm: dict[str, Any]) -> None:
    from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset
    from tests.helpers import adapter_from_folder, max_abs_diff, train_plain_trl

    info = calm["info"]
    assert info.loc[2, "status"] == "COMPLETED" and info.loc[2, "chunks_done"] == 4
    assert info.loc[2, "device"] in ("cpu:0", "cpu:1") and info.loc[2, "sharding"] is None
    leaf = _group(beside=True).expand(0)[1]
    ref = train_plain_trl(leaf, tiny_create_model, tiny_sft_dataset(ROWS), None, 0, calm["root"] / "plain-2")
    assert max_abs_diff(adapter_from_folder(info.loc[2, "checkpoint_dir"]), ref.final) == 0.0


def test_every_view_names_the_gang_s_devices_and_its_sharding(calm: dict[str, Any]) -> None:
    views = calm["views"]
    panel, page = views["panel"]["runs"][0], views["page"]["runs"][0]
    assert (panel["device"], panel["sharding"]) == ("cpu:0+cpu:1", "fsdp")  # the live panel's row
    assert (page["device"], page["sharding"]) == ("cpu:0+cpu:1", "fsdp")  # the server page, from the store
    assert [d["name"] for d in views["panel"]["devices"]] == [
        "cpu:0",
        "cpu:1",
    ]  # the header: the gang's parts
    assert [d["name"] for d in views["page"]["devices"]] == ["cpu:0", "cpu:1"]
    assert "cpu:0+cpu:1 · fsdp" in views["static"]  # the static copy's Device cell
    status = views["status"]  # %rapidfire status
    assert list(status.columns[:3]) == ["status", "device", "sharding"]
    assert (status.loc[1, "device"], status.loc[1, "sharding"]) == ("cpu:0+cpu:1", "fsdp")


def test_a_killed_rank_takes_its_gang_down_and_the_run_resumes_exactly(calm: dict[str, Any]) -> None:
    killed = _fit(calm["root"], "killed", kill=True)
    assert killed["killed"] is not None and not killed["left"]
    info = killed["info"]
    assert info.loc[1, "status"] == "COMPLETED" and info.loc[1, "completed_steps"] == 24, info.loc[1, "error"]
    assert any("its gang was restarted" in n for n in killed["notes"]), killed["notes"]
    assert any("run 1 resumed on cpu:0+cpu:1 (new workers) at step" in n for n in killed["notes"]), killed[
        "notes"
    ]
    assert _max_diff(_final(killed), _final(calm)) == 0.0


def test_stop_resume_and_a_warm_clone_of_a_sharded_run_are_exact(calm: dict[str, Any]) -> None:
    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset

    exp = Experiment("ops", experiment_path=calm["root"])
    exp.progress_lines = False
    exp.run_fit(
        _group(),
        tiny_create_model,
        tiny_sft_dataset(ROWS),
        None,
        num_chunks=4,
        seed=0,
        devices=2,
        background=True,
    )
    assert exp.wait(timeout=120, chunks=1)
    exp.stop(1)
    deadline = time.monotonic() + 60
    while exp.run_snapshot(1).status.name != "STOPPED" and time.monotonic() < deadline:  # type: ignore[union-attr]
        time.sleep(0.02)
    assert exp.run_snapshot(1).status.name == "STOPPED"  # type: ignore[union-attr]
    twin = exp.clone_modify(1, {"run_name": "twin"}, warm_start=True)  # the same hyperparameters, warm
    exp.resume(1)
    assert exp.wait(timeout=300)
    info = exp.get_runs_info().set_index("run_id")
    exp.end()
    assert list(info["status"]) == ["COMPLETED", "COMPLETED"] and list(info["sharding"]) == ["fsdp", "fsdp"]
    stopped = {"info": info}
    assert _max_diff(_final(stopped), _final(calm)) == 0.0  # stopped and resumed: as undisturbed
    clone_dir = calm["root"] / "ops" / "runs" / str(twin)
    warm = sorted(p.name for p in clone_dir.glob("warm-start-from-run-1-step-*"))  # it started warm, mid-way
    assert len(warm) == 1 and int(warm[0].rsplit("-", 1)[1]) >= 6, warm
    assert (clone_dir / "gang-rank1" / warm[0] / "COMPLETE").is_file()  # rank 1's share of the warm start
    clone = load_final(Path(info.loc[twin, "checkpoint_dir"]))
    assert _max_diff(clone, _final(calm)) == 0.0  # from the parent's boundary with its own (equal) settings


def load_final(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(folder / WEIGHTS["lora"]))


PARENT_STEPS, LONGER = 12, 24  # a constant learning rate: the first 12 steps of both runs are the same


def _continued_group() -> Any:
    """Run 1: the gang run of ``_group`` with a constant learning rate, ``max_steps=PARENT_STEPS``; run 2: the same
    with ``max_steps=LONGER`` (what a continuation of run 1 to ``LONGER`` steps must equal)."""
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    def config(steps: int) -> Any:
        return RFModelConfig(
            model_name="tiny",
            num_gpus=2,
            peft_config=RFLoraConfig(
                r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0
            ),
            training_args=RFSFTConfig(
                learning_rate=1e-3,
                lr_scheduler_type="constant",
                per_device_train_batch_size=2,
                max_steps=steps,
                logging_steps=1,
                seed=3,
                fsdp="full_shard auto_wrap",
                fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]},
            ),
        )

    return RFGridSearch(configs=List([config(PARENT_STEPS), config(LONGER)]), trainer_type="SFT")


def _open(root: Path) -> Any:
    """``Experiment("disk")`` on ``root`` and its ``run_fit`` of ``_continued_group`` (a restart's: the same group)."""
    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset

    exp = Experiment("disk", experiment_path=root)
    exp.progress_lines = False
    group, rows = _continued_group(), tiny_sft_dataset(ROWS)
    exp.run_fit(group, tiny_create_model, rows, None, num_chunks=4, seed=0, devices=2, background=True)
    return exp


def test_a_warm_clone_of_a_gang_run_finished_before_this_run_fit_continues_it_exactly(tmp_path: Path) -> None:
    """The parent finished in an earlier ``run_fit`` (``end()``, then the experiment continued): each rank of the
    clone's gang copies its own share of the parent's final state from disk; the clone ends equal to the run
    trained undisturbed for the longer budget."""
    from tests.helpers import result_series

    first = _open(tmp_path)
    assert first.wait(timeout=300)
    first.end()
    again = _open(tmp_path)  # runs 1 and 2 are COMPLETED from the store: no trainer built for them
    twin = again.clone_modify(1, {"max_steps": LONGER}, warm_start=True)
    assert again.wait(timeout=300)
    info = again.get_runs_info().set_index("run_id")
    loss = {rid: dict(result_series(again.get_results(), rid, "loss")) for rid in (2, twin)}
    again.end()
    assert info.loc[twin, "status"] == "COMPLETED", info.loc[twin, "error"]
    assert (info.loc[twin, "completed_steps"], info.loc[twin, "sharding"]) == (LONGER, "fsdp")
    clone_dir = tmp_path / "disk" / "runs" / str(twin)
    warm = f"warm-start-from-run-1-step-{PARENT_STEPS}"  # from the parent's final step, each rank its share
    assert (clone_dir / warm / "COMPLETE").is_file() and (
        clone_dir / "gang-rank1" / warm / "COMPLETE"
    ).is_file()
    assert sorted(loss[twin]) == list(range(PARENT_STEPS + 1, LONGER + 1))  # it trained on from step 13
    assert loss[twin] == {s: v for s, v in loss[2].items() if s > PARENT_STEPS}
    clone, longer = (
        load_final(Path(info.loc[twin, "checkpoint_dir"])),
        load_final(Path(info.loc[2, "checkpoint_dir"])),
    )
    assert _max_diff(clone, longer) == 0.0
