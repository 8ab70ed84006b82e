"""Child process of ``test_crash_resume.py``: trains the 3-run tiny experiment, optionally freezing at one moment.

Usage: ``python _crash_child.py <experiments_root> <experiment_name> [<mode>:<k> <marker_file>]``

With a mode, the child freezes (sleeps) at the k-th occurrence *in this process* of:

* ``step``      -- inside an optimizer step: right after a training ``compute_loss`` (forward done, no backward);
* ``ckptfile``  -- inside a checkpoint write: after ``adapter_model.safetensors`` was written into the
                   temporary folder, before the other files and the ``COMPLETE`` marker;
* ``ckptmark``  -- inside a checkpoint write: the ``COMPLETE`` marker is in the temporary folder, the rename
                   onto ``checkpoint-<step>`` has not happened;
* ``ckptdone``  -- right after a checkpoint folder was renamed into place (older checkpoint not yet removed);
* ``boundary``  -- between chunks: right after the store recorded a chunk boundary (``chunks_done``).

It writes ``<marker_file>`` first (with a JSON description) so the parent knows when to SIGKILL it.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

torch.set_num_threads(1)  # same arithmetic in every process (reference and restarts)


def _records_written() -> None:
    """Let the recorder thread write what it holds (run statuses), as it would have within ~0.2 s, so that a kill
    early in training finds the runs ONGOING in the store even on a loaded machine (its thread runs at nice +10)."""
    from rapidfire_nb.experiment.registry import current_experiment

    session = getattr(current_experiment(), "session", None)
    if session is not None:
        session.recorder.flush(30)


def _freeze(marker: str, info: dict) -> None:
    with open(marker + ".tmp", "w") as f:
        json.dump(info, f)
    os.replace(marker + ".tmp", marker)
    time.sleep(600)  # the parent SIGKILLs us here
    os._exit(3)  # pragma: no cover - the parent should have killed us


def _install(mode: str, k: int, marker: str) -> None:
    count = [0]

    def hit(info: dict) -> None:
        count[0] += 1
        if count[0] == k:
            _freeze(marker, {"mode": mode, "k": k, **info})

    if mode == "step":
        from trl import SFTTrainer

        orig = SFTTrainer.compute_loss

        def compute_loss(self, *a, **kw):
            out = orig(self, *a, **kw)
            if self.model.training:  # not the chunk-end evaluation, which also calls compute_loss
                if count[0] + 1 == k:
                    _records_written()
                hit({"global_step": int(self.state.global_step), "lr": self.args.learning_rate})
            return out

        SFTTrainer.compute_loss = compute_loss
    elif mode == "ckptfile":
        from rapidfire_nb.training import checkpoint

        orig_save = checkpoint.save_file

        def save_file(tensors, filename, *a, **kw):
            orig_save(tensors, filename, *a, **kw)
            hit({"file": str(filename)})

        checkpoint.save_file = save_file
    elif mode == "ckptmark":
        from rapidfire_nb import _atomic

        orig_text = _atomic.atomic_write_text

        def atomic_write_text(path, text, *a, **kw):
            orig_text(path, text, *a, **kw)
            p = os.fspath(path)
            if os.path.basename(p) == _atomic.COMPLETE_MARKER and os.path.basename(
                os.path.dirname(p)
            ).startswith(".checkpoint-"):
                hit({"file": p})

        _atomic.atomic_write_text = atomic_write_text
    elif mode == "ckptdone":
        from rapidfire_nb.training import checkpoint

        orig_write = checkpoint.write_snapshot

        def write_snapshot(snap, target):
            orig_write(snap, target)
            hit({"target": str(target)})

        checkpoint.write_snapshot = write_snapshot
    elif mode == "boundary":
        from rapidfire_nb.store import Store

        orig_upsert = Store.upsert_run
        seen: dict[int, int] = {}

        def upsert_run(self, run_id, **fields):
            orig_upsert(self, run_id, **fields)
            if "epoch" not in fields:  # not the scheduler's progress update (_add_run, checkpoint paths)
                return
            done = int(fields.get("chunks_done") or 0)
            if done > seen.setdefault(run_id, done):  # the store just recorded a finished chunk
                seen[run_id] = done
                hit({"run_id": run_id, "chunks_done": done})

        Store.upsert_run = upsert_run
    elif mode == "complete":
        from rapidfire_nb.store import Store
        from rapidfire_nb.training.executor import TorchExecutor

        def final_save_too_late(self, run_id):
            time.sleep(600)  # the kill comes first: the run is COMPLETED in the store without final weights

        TorchExecutor._save_final = final_save_too_late
        orig_complete = Store.upsert_run

        def upsert_completed(self, run_id, **fields):
            orig_complete(self, run_id, **fields)
            # the store has COMPLETED; the trackers have not heard it yet
            if fields.get("status") == "COMPLETED":
                hit({"run_id": run_id})

        Store.upsert_run = upsert_completed
    else:
        raise SystemExit(f"unknown mode {mode!r}")


def main() -> None:
    root, name = sys.argv[1], sys.argv[2]
    if len(sys.argv) > 3:
        mode, k = sys.argv[3].split(":")
        _install(mode, int(k), sys.argv[4])

    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
    from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset

    train = tiny_sft_dataset(24, seed=0)
    ev = tiny_sft_dataset(4, seed=1)
    cfgs = List(
        [
            RFModelConfig(
                model_name="tiny",
                peft_config=RFLoraConfig(
                    r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"]
                ),
                training_args=RFSFTConfig(
                    learning_rate=lr,
                    per_device_train_batch_size=bs,
                    gradient_accumulation_steps=ga,
                    num_train_epochs=2,
                    warmup_steps=2,
                    weight_decay=0.01,
                    max_length=64,
                    logging_steps=1,
                ),
            )
            for lr, bs, ga in ((1e-3, 3, 1), (5e-4, 2, 3), (2e-4, 3, 1))
        ]
    )
    exp = Experiment(name, experiment_path=root)
    exp.run_fit(
        RFGridSearch(cfgs, "SFT"), tiny_create_model, train, ev, num_chunks=4, seed=11, background=False
    )
    exp.end()


if __name__ == "__main__":
    main()
