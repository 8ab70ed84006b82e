"""What made memory grow with every chunk switch (issue 12, item 18; measured with benchmarks/memory.py).

Before: 8 runs x 8 chunks x 3 epochs of the tiny model grew RSS ~0.1 MB per chunk switch. Found: every chunk-end
evaluation left its eval dataloader registered with the trainer's accelerator; snapshots queued for the checkpoint
writer faster than it wrote them; glibc's dynamic mmap threshold moved large transient blocks into fragmented
arenas. These tests pin the first two. The third is gone with the runs' own threads: since every run trains on
one device thread, glibc's defaults keep RSS as flat as the fixed 1 MB threshold did (+2.7 MB over 23 rounds
both ways, 2026-12-02), and the fixed threshold cost 0.4-1 ms of page faults per tiny step, so it was removed.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rapidfire_nb import Experiment
from rapidfire_nb.automl import RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.testing import tiny_create_model
from rapidfire_nb.training import checkpoint
from tests.helpers import qa_dataset, qa_to_chat


def test_chunk_end_evaluations_release_their_dataloaders() -> None:
    group = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]),
            training_args=RFSFTConfig(
                learning_rate=1e-3, per_device_train_batch_size=2, max_steps=8, max_length=32
            ),
            formatting_func=qa_to_chat,
        ),
        "SFT",
    )
    exp = Experiment("eval-dataloaders")
    exp.quiet = True
    exp.run_fit(group, tiny_create_model, qa_dataset(8), qa_dataset(2, seed=1), num_chunks=4, seed=0)
    trainer = exp.session.executor.runs[1].worker.trainer  # type: ignore[union-attr]
    assert len(exp.get_results().eval_loss.dropna()) >= 4, "evaluated at every chunk end"
    # was 1 + one per evaluation: every eval dataloader (and the eval Dataset view it holds) stayed referenced
    assert len(trainer.accelerator._dataloaders) == 1
    exp.end()


def test_the_checkpoint_writer_keeps_one_waiting_snapshot_per_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    started, release = threading.Event(), threading.Event()
    written: list[tuple[int, int]] = []

    def slow_write(snap: Any, target: Path) -> None:
        started.set()
        release.wait(10)
        written.append((snap.run_id, snap.step))
        target.mkdir(parents=True)

    monkeypatch.setattr(checkpoint, "write_snapshot", slow_write)
    writer = checkpoint.CheckpointWriter()
    writer.submit(SimpleNamespace(run_id=1, step=1, layout=None), tmp_path / "1")  # type: ignore[arg-type]
    assert started.wait(10)  # step 1 is being written: the disk is slower than the chunk switches
    for step in (2, 3, 4):
        writer.submit(SimpleNamespace(run_id=1, step=step, layout=None), tmp_path / "1")  # type: ignore[arg-type]
    writer.submit(SimpleNamespace(run_id=2, step=2, layout=None), tmp_path / "2")  # type: ignore[arg-type]
    release.set()
    writer.flush()
    writer.close()
    assert written == [(1, 1), (1, 4), (2, 2)], "steps 2 and 3 were replaced before being written"
    assert writer.replaced == 2
    assert writer.written == {1: tmp_path / "1" / "checkpoint-4", 2: tmp_path / "2" / "checkpoint-2"}
    assert sorted(p.name for p in (tmp_path / "1").iterdir()) == ["checkpoint-4"], "only the latest is kept"
