"""Shared helpers for engine tests: the plain-TRL reference run, adapter comparison, schedule recording.

The reference is what a user would write without rapidfire_nb: the SAME TRL config (built by
``rapidfire_nb.spec.build``, so CPU adaptation is identical), the SAME ``peft.LoraConfig``, the rows mapped
through the run's ``formatting_func`` with ``Dataset.map``, and ``SFTTrainer(...).train()`` in one go.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

TOL = 1e-6
"""The exactness bar of the issue: max abs difference on CPU in fp32."""


def slow_create_model(model_config: dict) -> tuple:  # type: ignore[type-arg]
    """The tiny model (:func:`rapidfire_nb.testing.tiny_create_model`), each forward 0.1 s slower (same numbers,
    so plain TRL with the tiny model stays the reference): a test that must meet a run mid-training (a killed
    worker or kernel) always does, however fast the machine trains the few steps between two looks."""
    import time

    from rapidfire_nb.testing import tiny_create_model

    model, tok = tiny_create_model(model_config)
    model.register_forward_pre_hook(lambda module, args: time.sleep(0.1))
    return model, tok


# ------------------------------------------------------------------------------------------------ data
def qa_dataset(n: int, seed: int = 0, tag: bool = False) -> Any:
    """``question``/``answer`` string rows (the tiny SFT rows before formatting).

    Args:
        n: number of rows.
        seed: seed of ``tiny_sft_dataset``.
        tag: prefix each question with ``"Row <i>: "`` so a trained batch can be traced back to its rows.
    """
    from datasets import Dataset

    from rapidfire_nb.testing import tiny_sft_dataset

    rows = tiny_sft_dataset(n, seed=seed)
    questions = [p[0]["content"] for p in rows["prompt"]]
    if tag:
        questions = [f"Row {i}: {q}" for i, q in enumerate(questions)]
    answers = [c[0]["content"] for c in rows["completion"]]
    return Dataset.from_dict({"question": questions, "answer": answers})


def qa_to_chat(row: dict[str, Any]) -> dict[str, Any]:
    """The formatting_func of the engine tests: question/answer -> conversational prompt/completion."""
    return {
        "prompt": [{"role": "user", "content": row["question"]}],
        "completion": [{"role": "assistant", "content": row["answer"]}],
    }


def formatted(ds: Any, formatting_func: Callable[[dict], dict] | None) -> Any:
    """What a plain-TRL user does with a row formatting function: ``ds.map(fn)`` keeping only its columns."""
    if ds is None or formatting_func is None:
        return ds
    return ds.map(formatting_func, remove_columns=ds.column_names)


# ------------------------------------------------------------------------------------------------ adapters
def adapter_state(model: Any, adapter_name: str | None = None) -> dict[str, Any]:
    """A detached copy of a PeftModel's adapter weights (PEFT's saved key names)."""
    from peft import get_peft_model_state_dict

    kwargs = {} if adapter_name is None else {"adapter_name": adapter_name}
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model, **kwargs).items()}


def adapter_from_folder(folder: str | Path) -> dict[str, Any]:
    """The adapter weights saved in ``folder/adapter_model.safetensors``."""
    from safetensors.torch import load_file

    return load_file(str(Path(folder) / "adapter_model.safetensors"))


def max_abs_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Max abs difference over two state dicts with the SAME keys and shapes (asserted)."""
    assert sorted(a) == sorted(b), (
        f"different tensors: only in first {sorted(set(a) - set(b))[:4]}, "
        f"only in second {sorted(set(b) - set(a))[:4]}"
    )
    assert a, "empty state dict"
    worst = 0.0
    for k, value in a.items():
        assert value.shape == b[k].shape, f"{k}: shape {tuple(value.shape)} != {tuple(b[k].shape)}"
        worst = max(worst, (value.float() - b[k].float()).abs().max().item())
    return worst


# ------------------------------------------------------------------------------------------------ reference
@dataclass
class Reference:
    """A plain-TRL run: adapter weights before/after ``train()``, its ``log_history``, ``total_flos`` and config."""

    initial: dict[str, Any]
    final: dict[str, Any]
    log_history: list[dict[str, Any]]
    args: Any
    lora: Any
    total_flos: float = 0.0

    def series(self, name: str) -> list[tuple[int, float]]:
        """``[(step, value)]`` of one logged metric (TRL's names: ``loss``, ``eval_loss``, ``learning_rate``)."""
        return [(int(h["step"]), float(h[name])) for h in self.log_history if name in h]


def train_plain_trl(
    leaf: Any,
    create_model_fn: Callable[[dict], Any],
    train_dataset: Any,
    eval_dataset: Any,
    default_seed: int,
    output_dir: str | Path,
) -> Reference:
    """Train ``leaf`` with a plain ``SFTTrainer(...).train()`` (no chunks), as a user would without rapidfire_nb."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import SFTTrainer

    from rapidfire_nb.spec import build_lora_config, build_training_args

    args, _notes = build_training_args(leaf, output_dir=str(output_dir), default_seed=default_seed)
    lora = build_lora_config(leaf)
    model, tokenizer = create_model_fn(leaf.model_config_dict())
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=formatted(train_dataset, leaf.formatting_func),
        eval_dataset=formatted(eval_dataset, leaf.formatting_func),
        processing_class=tokenizer,
        peft_config=lora,
    )
    trainer.remove_callback(PrinterCallback)  # keep the test output readable; no effect on training
    trainer.remove_callback(ProgressCallback)
    initial = adapter_state(trainer.model)
    trainer.train()
    return Reference(
        initial=initial,
        final=adapter_state(trainer.model),
        log_history=list(trainer.state.log_history),
        args=args,
        lora=lora,
        total_flos=float(trainer.state.total_flos),
    )


# ------------------------------------------------------------------------------------------------ results
def result_series(results: Any, run_id: int, name: str) -> list[tuple[int, float]]:
    """``[(step, value)]`` of one metric of one run from ``Experiment.get_results()``."""
    if name not in results.columns:
        return []
    rows = results[(results.run_id == run_id)].dropna(subset=[name]).sort_values("step")
    return [(int(s), float(v)) for s, v in zip(rows.step, rows[name])]


def metric_points(exp: Any, name: str) -> list[dict[str, Any]]:
    """Every raw metric row of ``name`` in the experiment's store (duplicates visible, unlike the pivot)."""
    points, _ = exp.store.metrics_since(0)
    return [p for p in points if p["name"] == name]


# ------------------------------------------------------------------------------------------------ recording
@dataclass
class SegmentRecord:
    """What the scheduler asked the executor to train, in order, and what each segment reported."""

    calls: list[tuple[int, int]] = field(default_factory=list)  # (run_id, stop_step)
    results: dict[int, list[Any]] = field(default_factory=dict)  # run_id -> [SegmentResult]
    lock: threading.Lock = field(default_factory=threading.Lock)

    def order(self) -> list[int]:
        return [rid for rid, _ in self.calls]

    def stops(self, run_id: int) -> list[int]:
        return [stop for rid, stop in self.calls if rid == run_id]


@contextmanager
def record_segments(mp: pytest.MonkeyPatch) -> Iterator[SegmentRecord]:
    """Record every ``TorchExecutor.run_segment`` call (the schedule) and its ``SegmentResult``."""
    from rapidfire_nb.training.executor import TorchExecutor

    rec = SegmentRecord()
    original = TorchExecutor.run_segment

    def spy(self: Any, run_id: int, stop_step: int) -> Any:
        with rec.lock:
            rec.calls.append((run_id, stop_step))
        fut = original(self, run_id, stop_step)

        def done(f: Any, rid: int = run_id) -> None:
            with rec.lock:
                rec.results.setdefault(rid, []).append(f.result())

        fut.add_done_callback(done)
        return fut

    mp.setattr(TorchExecutor, "run_segment", spy)
    yield rec


_RUN_DIR = re.compile(r"[/\\]runs[/\\](\d+)[/\\]trainer$")
_ROW_TAG = re.compile(r"Row (\d+):")


@dataclass
class BatchRecord:
    """Row indices each run trained on, per optimizer step (traced from the ``Row <i>:`` tags of the text)."""

    steps: dict[int, list[list[int]]] = field(default_factory=dict)  # run_id -> [[row, ...] per step]

    def rows(self, run_id: int, first_step: int, last_step: int) -> list[int]:
        """Rows of optimizer steps ``first_step+1 .. last_step`` (1-based steps), in training order."""
        return [r for step_rows in self.steps[run_id][first_step:last_step] for r in step_rows]


@contextmanager
def record_batches(mp: pytest.MonkeyPatch) -> Iterator[BatchRecord]:
    """Record the rows of every training step of every rapidfire_nb run (wraps ``Trainer.get_batch_samples``).

    Only trainers whose ``output_dir`` is a run folder (``.../runs/<id>/trainer``) are recorded.
    """
    from transformers import Trainer

    rec = BatchRecord()
    original = Trainer.get_batch_samples

    def spy(self: Any, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
        batch_samples, num_items = original(self, epoch_iterator, num_batches, device)
        m = _RUN_DIR.search(str(self.args.output_dir))
        if m and self.model.training:
            tok = self.processing_class
            rows = []
            for batch in batch_samples:
                for ids in batch["input_ids"]:
                    text = tok.decode(ids, skip_special_tokens=True)
                    found = _ROW_TAG.findall(text)
                    assert len(found) == 1, f"cannot trace a trained sequence to one row: {text!r}"
                    rows.append(int(found[0]))
            rec.steps.setdefault(int(m.group(1)), []).append(rows)
        return batch_samples, num_items

    mp.setattr(Trainer, "get_batch_samples", spy)
    yield rec


def worker_threads() -> set[str]:
    """Names of the live training threads of rapidfire_nb (one device thread per executor)."""
    return {
        t.name for t in threading.enumerate() if t.name.startswith(("rapidfire-device", "rapidfire-run-"))
    }


def child_pids() -> set[int]:
    """Pids of this process' live child processes (Linux /proc): what a test checks ``end()`` leaves behind."""
    me, out = os.getpid(), set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] != "Z":
                out.add(int(entry))
    return out
