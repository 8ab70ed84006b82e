"""A fake panel source: simulated runs advancing chunk by chunk, for panel tests and demos (no torch).

``FakeSource`` implements the panel-source contract of ``docs/ARCHITECTURE.md`` (``panel_snapshot``,
``metrics_since``, ``submit_op``) with a background thread that trains one run at a time, chunk by chunk in
furthest-behind-first order, logging TRL-named metrics (``loss``, ``eval_loss``, ``learning_rate``,
``grad_norm``, ...). Ops follow ``kernel_scheduler.ops.decide``: a stop/delete of the run on the device waits
for the end of its current chunk; anything else is applied at the fake's next tick.

Run ``python -m rapidfire_nb._fake_source`` to watch the text progress of a short fake experiment.
"""

from __future__ import annotations

import math
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernel_scheduler.ops import OpAck, OpKind, decide
from kernel_scheduler.status import RunStatus

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["FakeSource"]

_LRS = [1e-4, 3e-4, 5e-5, 2e-4, 1e-3, 2e-5]
_RANKS = [8, 16, 8, 32]
_BATCHES = [4, 8]


def legal_ops(status: RunStatus) -> list[str]:
    """The ops ``kernel_scheduler.ops.decide`` would not reject for a run in ``status``."""
    return [k.value for k in OpKind if decide(k, status, False, 0).verdict != "reject"]


@dataclass
class _Run:
    run_id: int
    hparams: dict[str, Any]
    total_steps: int
    status: RunStatus = RunStatus.NEW
    completed_steps: int = 0
    chunks_done: int = 0
    loss: float | None = None
    eval_loss: float | None = None
    error: str | None = None
    parent_id: int | None = None
    warm_start: bool = False
    start_loss: float = 2.4
    deferred: list[str] = field(default_factory=list)  # op ids waiting for this run's chunk boundary

    @property
    def batch(self) -> int:
        return int(self.hparams.get("per_device_train_batch_size", 4)) * int(
            self.hparams.get("gradient_accumulation_steps", 1)
        )


class FakeSource:
    """Simulated experiment with ``num_runs`` runs (see the module docstring).

    Args:
        num_runs: runs created at start (ids 1..num_runs), differing in lr, LoRA rank and batch size.
        total_steps: optimizer steps per run (one epoch).
        num_chunks: chunks per epoch.
        steps_per_tick: optimizer steps the run on the device makes per tick.
        tick_s: seconds between ticks of the background thread.
        eval_every: steps between two ``eval_loss`` points.
        fail_run: a run id that fails (status FAILED with an error) at ``fail_at_step``.
        fail_at_step: the step at which ``fail_run`` fails (default: half way).
        experiment: the experiment name shown in the header.
        seed: seeds the simulated noise.
        start: start the background thread now (else call :meth:`step` yourself).
    """

    def __init__(
        self,
        num_runs: int = 3,
        *,
        total_steps: int = 200,
        num_chunks: int = 4,
        steps_per_tick: int = 1,
        tick_s: float = 0.05,
        eval_every: int = 20,
        fail_run: int | None = None,
        fail_at_step: int | None = None,
        experiment: str = "fake-sft",
        seed: int = 0,
        start: bool = True,
    ) -> None:
        self.experiment = experiment
        self.num_chunks = num_chunks
        self.steps_per_tick = steps_per_tick
        self.tick_s = tick_s
        self.eval_every = eval_every
        self.fail_run = fail_run
        self.fail_at_step = fail_at_step if fail_at_step is not None else total_steps // 2
        self.started_at = time.time()
        self._seed = seed
        self._lock = threading.RLock()
        self._runs: dict[int, _Run] = {}
        self._points: list[dict[str, Any]] = []
        self._ops: list[dict[str, Any]] = []
        self._ops_by_id: dict[str, dict[str, Any]] = {}
        self._pending: list[str] = []
        self._on_device: int | None = None
        self._rngs: dict[int, random.Random] = {}
        self._next_id = 1
        for i in range(num_runs):
            self._add_run(
                {
                    "model_name": "HuggingFaceTB/SmolLM2-135M-Instruct",
                    "learning_rate": _LRS[i % len(_LRS)],
                    "lora.r": _RANKS[i % len(_RANKS)],
                    "lora.lora_alpha": 32,
                    "per_device_train_batch_size": _BATCHES[i % len(_BATCHES)],
                },
                total_steps,
            )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fake-source", daemon=True)
        if start:
            self._thread.start()

    # -- lifecycle ----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the background thread (joined)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.step()

    # -- the contract ---------------------------------------------------------------------------------------
    def panel_snapshot(self) -> dict[str, Any]:
        with self._lock:
            runs = list(self._runs.values())
            hparam_columns = self._hparam_columns()
            on_device = self._runs.get(self._on_device) if self._on_device is not None else None
            if on_device is not None:
                progress = (
                    f"chunk {min(on_device.chunks_done + 1, self.num_chunks)}/{self.num_chunks} of epoch 1"
                )
            elif any(r.status.in_rotation() for r in runs):
                progress = "waiting for the next chunk"
            else:
                progress = "idle: no run in rotation"
            return {
                "experiment": self.experiment,
                "started_at": self.started_at,
                "now": time.time(),
                "progress": progress,
                "on_device": self._on_device,
                "num_chunks": self.num_chunks,
                "hparam_columns": hparam_columns,
                "runs": [self._run_dict(r) for r in runs],
                "ops": [dict(op) for op in self._ops],
                "metric_names": sorted({p["name"] for p in self._points}),
            }

    def metrics_since(self, cursor: int) -> tuple[list[dict[str, Any]], int]:
        with self._lock:
            return [dict(p) for p in self._points[cursor:]], len(self._points)

    def submit_op(
        self,
        kind: str,
        run_id: int,
        op_id: str | None = None,
        changes: dict[str, Any] | None = None,
        warm_start: bool = False,
        source: str = "panel",
    ) -> OpAck:
        with self._lock:
            op_id = op_id or uuid.uuid4().hex
            if op_id in self._ops_by_id:
                old = self._ops_by_id[op_id]
                return OpAck(
                    op_id, old["run_id"], old["kind"], old["state"], old["message"], old.get("new_run_id")
                )
            try:
                okind = OpKind(kind)
            except ValueError:
                return OpAck(op_id, run_id, kind, "rejected", f"unknown op {kind!r}")
            run = self._runs.get(int(run_id))
            verdict = decide(okind, run.status if run else None, self._on_device == run_id, int(run_id))
            op: dict[str, Any] = {
                "op_id": op_id,
                "run_id": int(run_id),
                "kind": okind.value,
                "state": "queued",
                "message": "",
                "requested_at": time.time(),
                "applied_at": None,
                "source": source,
                "changes": dict(changes or {}),
                "warm_start": bool(warm_start),
            }
            if verdict.verdict == "reject":
                op["state"], op["message"] = "rejected", verdict.reason
            elif okind is OpKind.CLONE:
                op["new_run_id"] = self._next_id
                self._next_id += 1
                op["message"] = (
                    f"clone of run {run_id} requested — run {op['new_run_id']} joins the rotation "
                    "at the next chunk boundary"
                )
            elif verdict.verdict == "defer":
                op["message"] = (
                    f"{okind.value} requested for run {run_id} — applies at the end of its current chunk"
                )
            else:
                op["message"] = (
                    f"{okind.value} requested for run {run_id} — applies now (it is not on the device)"
                )
            self._ops.append(op)
            self._ops_by_id[op_id] = op
            if op["state"] == "queued":
                self._pending.append(op_id)
            return OpAck(op_id, int(run_id), okind.value, op["state"], op["message"], op.get("new_run_id"))

    # -- simulation --------------------------------------------------------------------------------------
    def step(self) -> None:
        """One tick: apply pending ops, then advance the run on the device by ``steps_per_tick`` steps."""
        with self._lock:
            self._apply_pending()
            if self._on_device is None:
                self._pick_next()
            run = self._runs.get(self._on_device) if self._on_device is not None else None
            if run is None:
                return
            boundary = self._boundary(run)
            for _ in range(self.steps_per_tick):
                if run.completed_steps >= boundary:
                    break
                self._train_step(run)
                if run.status is RunStatus.FAILED:
                    self._on_device = None
                    return
            if run.completed_steps >= boundary:
                self._end_chunk(run)

    @property
    def runs(self) -> dict[int, dict[str, Any]]:
        """Current runs as snapshot dicts, by run id (for tests)."""
        with self._lock:
            return {r.run_id: self._run_dict(r) for r in self._runs.values()}

    def _add_run(
        self,
        hparams: dict[str, Any],
        total_steps: int,
        *,
        run_id: int | None = None,
        parent: _Run | None = None,
        warm_start: bool = False,
    ) -> _Run:
        rid = run_id if run_id is not None else self._next_id
        self._next_id = max(self._next_id, rid + 1)
        run = _Run(
            rid, hparams, total_steps, parent_id=parent.run_id if parent else None, warm_start=warm_start
        )
        if parent is not None and warm_start and parent.loss is not None:
            run.start_loss = parent.loss
        self._runs[rid] = run
        self._rngs[rid] = random.Random(self._seed * 1000 + rid)
        return run

    def _hparam_columns(self) -> list[str]:
        keys: list[str] = []
        for r in self._runs.values():
            keys.extend(k for k in r.hparams if k not in keys)
        return [k for k in keys if len({repr(r.hparams.get(k)) for r in self._runs.values()}) > 1]

    def _run_dict(self, r: _Run) -> dict[str, Any]:
        ops = legal_ops(r.status)
        pending_kinds = {
            self._ops_by_id[o]["kind"]
            for o in self._pending + r.deferred
            if self._ops_by_id[o]["run_id"] == r.run_id
        }
        if pending_kinds & {"stop", "delete"}:
            ops = [o for o in ops if o not in ("stop", "delete", "resume")]
        return {
            "run_id": r.run_id,
            "status": r.status.value,
            "on_device": self._on_device == r.run_id,
            "hparams": dict(r.hparams),
            "completed_steps": r.completed_steps,
            "total_steps": r.total_steps,
            "chunks_done": r.chunks_done,
            "num_segments": self.num_chunks,
            "epoch": round(r.completed_steps / r.total_steps, 4),
            "samples_seen": r.completed_steps * r.batch,
            "loss": r.loss,
            "eval_loss": r.eval_loss,
            "error": r.error,
            "parent_id": r.parent_id,
            "warm_start": r.warm_start,
            "legal_ops": ops,
        }

    def _boundary(self, run: _Run) -> int:
        return min(run.total_steps, math.ceil((run.chunks_done + 1) * run.total_steps / self.num_chunks))

    def _pick_next(self) -> None:
        candidates = [r for r in self._runs.values() if r.status.in_rotation()]
        if not candidates:
            self._on_device = None
            return
        run = min(candidates, key=lambda r: (r.chunks_done, r.run_id))
        run.status = RunStatus.ONGOING
        self._on_device = run.run_id

    def _train_step(self, run: _Run) -> None:
        rng = self._rngs[run.run_id]
        run.completed_steps += 1
        step = run.completed_steps
        if run.run_id == self.fail_run and step >= self.fail_at_step:
            run.status = RunStatus.FAILED
            run.error = (
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB "
                "(GPU 0; 79.19 GiB total capacity; 77.02 GiB already allocated)"
            )
            return
        lr = float(run.hparams.get("learning_rate", 1e-4))
        rank = float(run.hparams.get("lora.r", 8))
        speed = 3.0 * math.sqrt(lr / 1e-4)
        floor = 0.55 + 0.12 * 8 / rank + (0.3 if lr >= 1e-3 else 0.0)
        frac = step / run.total_steps
        loss = floor + (run.start_loss - floor) * math.exp(-speed * frac) + rng.gauss(0, 0.04)
        run.loss = max(0.05, loss)
        samples = step * run.batch
        sched_lr = lr * (1 - (step - 1) / run.total_steps)
        pts = [
            ("loss", run.loss),
            ("learning_rate", sched_lr),
            ("grad_norm", abs(1.8 * math.exp(-2 * frac) + rng.gauss(0, 0.15)) + 0.2),
            (
                "mean_token_accuracy",
                min(0.99, 0.35 + 0.5 * (1 - math.exp(-speed * frac)) + rng.gauss(0, 0.01)),
            ),
            ("entropy", max(0.1, 1.6 * math.exp(-1.5 * frac) + rng.gauss(0, 0.03))),
        ]
        if step % self.eval_every == 0 or step == run.total_steps:
            run.eval_loss = run.loss + 0.08 + abs(rng.gauss(0, 0.015))
            pts += [
                ("eval_loss", run.eval_loss),
                ("eval_mean_token_accuracy", min(0.99, 0.32 + 0.48 * (1 - math.exp(-speed * frac)))),
            ]
        for name, value in pts:
            self._points.append(
                {
                    "run_id": run.run_id,
                    "step": step,
                    "samples_seen": samples,
                    "name": name,
                    "value": float(value),
                }
            )

    def _end_chunk(self, run: _Run) -> None:
        run.chunks_done += 1
        if run.completed_steps >= run.total_steps:
            run.status = RunStatus.COMPLETED
        self._on_device = None
        for op_id in run.deferred:
            self._apply(self._ops_by_id[op_id], run)
        run.deferred.clear()
        self._pick_next()

    def _apply_pending(self) -> None:
        pending, self._pending = self._pending, []
        for op_id in pending:
            op = self._ops_by_id[op_id]
            run = self._runs.get(op["run_id"])
            verdict = decide(
                OpKind(op["kind"]), run.status if run else None, self._on_device == op["run_id"], op["run_id"]
            )
            if verdict.verdict == "reject":
                op.update(state="rejected", message=verdict.reason, applied_at=time.time())
            elif verdict.verdict == "defer" and run is not None:
                run.deferred.append(op_id)
            elif run is not None:
                self._apply(op, run)

    def _apply(self, op: dict[str, Any], run: _Run) -> None:
        kind = OpKind(op["kind"])
        now = time.time()
        if kind is OpKind.STOP:
            run.status = RunStatus.STOPPED
            message = f"run {run.run_id} stopped after {run.chunks_done} chunk(s)"
        elif kind is OpKind.RESUME:
            run.status = RunStatus.ONGOING
            message = f"run {run.run_id} resumed"
        elif kind is OpKind.DELETE:
            run.status = RunStatus.DELETED
            message = f"run {run.run_id} deleted"
        else:
            hparams = {**run.hparams, **op.get("changes", {})}
            child = self._add_run(
                hparams,
                run.total_steps,
                run_id=op.get("new_run_id"),
                parent=run,
                warm_start=bool(op.get("warm_start")),
            )
            message = f"run {child.run_id} created from run {run.run_id}" + (
                " (warm start)" if child.warm_start else ""
            )
        if self._on_device == run.run_id and run.status is not RunStatus.ONGOING:
            self._on_device = None
        op.update(state="applied", message=message, applied_at=now)


def _main() -> None:  # pragma: no cover - demo
    from rapidfire_nb.panel import TextProgress

    with FakeSource(3, total_steps=40, steps_per_tick=2, tick_s=0.02, fail_run=3) as src, TextProgress(src):
        while any(r["status"] in ("NEW", "ONGOING") for r in src.runs.values()):
            time.sleep(0.2)
        time.sleep(0.6)


if __name__ == "__main__":  # pragma: no cover
    _main()
