"""A fake panel source: the real scheduler over a fake executor, simulated metrics, the real snapshot builder.

:class:`FakeSource` implements the panel-source contract of ``docs/ARCHITECTURE.md`` (``panel_snapshot``,
``metrics_since``, ``submit_op``) without torch: a real :class:`kernel_scheduler.Scheduler` (its rotation, its
op rules and messages) drives a :class:`~rapidfire_nb.testing.fakes.FakeExecutor` in manual mode; each
:meth:`FakeSource.step` advances the run on the device by ``steps_per_tick`` optimizer steps, logging
TRL-named metrics, and ends its segment at the chunk boundary. The snapshot comes from
:func:`rapidfire_nb.view.kernel_snapshot`, as the kernel's does. Every :meth:`~FakeSource.step` and
:meth:`~FakeSource.submit_op` returns once the scheduler thread has acted on it, so tests see fixed states.

Run ``python -m rapidfire_nb.testing.fake_source`` to watch the text progress of a short fake experiment.
"""

from __future__ import annotations

import math
import random
import threading
import time
from typing import TYPE_CHECKING, Any

from kernel_scheduler import DeviceArbiter, Op, OpAck, OpKind, RunStatus, Scheduler, new_op_id
from rapidfire_nb import meta_keys
from rapidfire_nb.testing.fakes import TIMEOUT, FakeExecutor, FakeSpec, Recorder
from rapidfire_nb.view import KernelState, StoreRows, kernel_snapshot
from rapidfire_nb.view.clock import TrainingClock

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["FakeSource", "OOM_ERROR"]

OOM_ERROR = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.19 GiB total "
    "capacity; 77.02 GiB already allocated)"
)
_LRS, _RANKS, _BATCHES = [1e-4, 3e-4, 5e-5, 2e-4, 1e-3, 2e-5], [8, 16, 8, 32], [4, 8]


class FakeSource:
    """A simulated experiment of ``num_runs`` runs differing in learning rate, LoRA rank and batch size.

    Args:
        num_runs: runs created at start (ids 1..num_runs).
        total_steps: optimizer steps per run (one epoch).
        num_chunks: chunks per epoch.
        steps_per_tick: optimizer steps the run on the device makes per :meth:`step`.
        tick_s: seconds between two steps of the background thread.
        eval_every: steps between two ``eval_loss`` points.
        fail: ``(run id, step)``: that run fails (FAILED, with an out-of-memory error) at that optimizer step
            (``None``: half way); ``None``: no run fails.
        experiment: the experiment name shown in the header.
        seed: seeds the simulated noise.
        start: step in a background thread (else call :meth:`step` yourself).
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
        fail: tuple[int, int | None] | None = None,
        experiment: str = "fake-sft",
        seed: int = 0,
        start: bool = True,
    ) -> None:
        self.experiment, self.num_chunks, self.total_steps = experiment, num_chunks, total_steps
        self.steps_per_tick, self.tick_s, self.eval_every, self._seed = (
            steps_per_tick,
            tick_s,
            eval_every,
            seed,
        )
        self.started_at = time.time()
        self._lock = threading.RLock()  # one step or op at a time
        self._points_lock = threading.Lock()
        self._points: list[dict[str, Any]] = []
        self._latest: dict[int, dict[str, float]] = {}
        self._live: dict[int, int] = {}  # latest logged step per run
        self._start_loss: dict[int, float] = {}  # a warm clone starts from its parent's loss
        self._clock = TrainingClock()  # training time, as the kernel's recorder keeps it
        self._fake = FakeExecutor(num_chunks=num_chunks, mode="manual")
        self._log = Recorder()  # the ops log, and the scheduler loop turns
        # its own device: a source left open (its fake segment never resolved) holds up no other scheduler
        self._sched = Scheduler(self._fake, listener=self._log, idle_poll_s=0.05, arbiter=DeviceArbiter())
        fail_run, fail_at = fail if fail is not None else (None, None)
        for i in range(num_runs):
            hp = {
                "model_name": "HuggingFaceTB/SmolLM2-135M-Instruct",
                "learning_rate": _LRS[i % len(_LRS)],
                "lora.r": _RANKS[i % len(_RANKS)],
                "lora.lora_alpha": 32,
                "per_device_train_batch_size": _BATCHES[i % len(_BATCHES)],
            }
            at = (fail_at or total_steps // 2) if fail_run == i + 1 else None
            self._sched.add_run(i + 1, self._spec(hp, at))
        self._sched.start()
        self._settle(0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fake-source", daemon=True)
        if start:
            self._thread.start()

    def _spec(self, hparams: dict[str, Any], fail_at_step: int | None = None) -> FakeSpec:
        batch = int(hparams.get("per_device_train_batch_size", 4)) * int(
            hparams.get("gradient_accumulation_steps", 1)
        )
        return FakeSpec(
            rows=self.total_steps * batch,
            batch=batch,
            max_steps=self.total_steps,
            fail_at_step=fail_at_step,
            hparams=hparams,
        )

    # -- lifecycle ----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the background thread and the scheduler (both joined)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(TIMEOUT)
        if self._fake.inflight is not None:
            self._fake.resolve()
        self._sched.close(timeout=TIMEOUT)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.step()

    # -- the contract ---------------------------------------------------------------------------------------
    def panel_snapshot(self) -> dict[str, Any]:
        """The panel's snapshot: :func:`rapidfire_nb.view.kernel_snapshot` of the scheduler's state."""
        snaps = self._observe()
        rows = [
            {
                "run_id": s.run_id,
                "status": s.status.value,
                "hparams": s.spec.hparams,
                "parent_id": s.parent_id,
                "warm_start": s.warm_start,
            }
            for s in snaps
        ]
        keys = list(dict.fromkeys(k for r in rows for k in r["hparams"]))
        columns = [k for k in keys if len({repr(r["hparams"].get(k)) for r in rows}) > 1]
        with self._points_lock:
            latest = {rid: dict(m) for rid, m in self._latest.items()}
            names = sorted({p["name"] for p in self._points})
        with self._log.cond:
            ops = [dict(o) for o in self._log.ops_log.values()]
        kernel = KernelState(
            started_at=self.started_at,
            num_chunks=self.num_chunks,
            hparam_columns=columns,
            runs=snaps,
            on_device=self._sched.on_device(),
            live_steps=dict(self._live),
        )
        with self._points_lock:
            clock = self._clock.to_meta()
        meta = {meta_keys.CREATED_AT: self.started_at, meta_keys.METRIC_NAMES: names, meta_keys.CLOCK: clock}
        rows_ = StoreRows(meta=meta, runs=rows, latest=latest, ops=ops)
        return kernel_snapshot(self.experiment, rows_, kernel)

    def metrics_since(self, cursor: int) -> tuple[list[dict[str, Any]], int]:
        """Metric points after ``cursor`` (an index into the points logged so far) and the new cursor."""
        with self._points_lock:
            return [dict(p) for p in self._points[cursor:]], len(self._points)

    def submit_op(
        self,
        kind: str,
        run_id: int,
        op_id: str | None = None,
        changes: dict[str, Any] | None = None,
        warm_start: bool = False,
        source: str = "panel",
        reason: str | None = None,
    ) -> OpAck:
        """Submit an op to the scheduler (a clone gets the parent's hyperparameters with ``changes``; a stop may name
        its ``reason``)."""
        try:
            okind = OpKind(kind)
        except ValueError:
            return OpAck(op_id or new_op_id(), run_id, kind, "rejected", f"unknown op {kind!r}")
        payload: dict[str, Any] = {"reason": reason} if reason and okind is OpKind.STOP else {}
        parent = self._sched.run_snapshot(int(run_id))
        if okind is OpKind.CLONE and parent is not None:
            payload = {
                "spec": self._spec({**parent.spec.hparams, **(changes or {})}),
                "changes": dict(changes or {}),
                "warm_start": bool(warm_start),
            }
        with self._lock:
            beats = self._log.beats
            ack = self._sched.submit(
                Op(okind, int(run_id), op_id=op_id or new_op_id(), payload=payload, source=source)
            )
            self._settle(beats)
        return ack

    # -- simulation ----------------------------------------------------------------------------------------
    def step(self) -> None:
        """Advance the run on the device by ``steps_per_tick`` steps; end its segment at its boundary."""
        with self._lock:
            flight = self._fake.inflight
            if flight is None:
                return
            run_id, stop = flight[0], flight[1]
            spec = self._fake.specs[run_id]
            for _ in range(self.steps_per_tick):
                step = max(self._live.get(run_id, 0), self._fake.steps[run_id]) + 1
                if spec.fail_at_step is not None and step >= spec.fail_at_step:
                    self._end_segment(OOM_ERROR)
                    return
                self._log_step(run_id, step, spec)
                self._live[run_id] = step
                if step >= stop:
                    self._end_segment(None)
                    return

    def _end_segment(self, error: str | None) -> None:
        beats = self._log.beats
        self._fake.resolve(error)
        self._settle(beats)

    def _settle(self, beats: int) -> None:
        """Return once the scheduler thread made two turns since ``beats`` and its state is at rest."""
        target = beats + 2
        while True:
            self._wait_turns(target)
            flight = self._fake.inflight
            if (flight is not None and self._sched.on_device() == flight[0]) or self._sched.is_idle():
                self._observe()
                return
            target = self._log.beats + 1

    def _observe(self) -> list[Any]:
        """The scheduler's snapshots, fed to the training clock (as the recorder does on every run event)."""
        snaps = self._sched.snapshot()
        now = time.time()
        with self._points_lock:
            for snap in snaps:
                self._clock.observe(snap.run_id, snap.status, now)
        return snaps

    def _wait_turns(self, target: int) -> None:
        with self._log.cond:
            if not self._log.cond.wait_for(lambda: self._log.beats >= target, TIMEOUT):
                raise RuntimeError("the fake source's scheduler made no progress")

    def _log_step(self, run_id: int, step: int, spec: FakeSpec) -> None:
        snap = self._sched.run_snapshot(run_id)
        rng = random.Random(self._seed * 1_000_003 + run_id * 10_007 + step)
        lr, rank = float(spec.hparams.get("learning_rate", 1e-4)), float(spec.hparams.get("lora.r", 8))
        if run_id not in self._start_loss:
            parent = snap.parent_id if snap is not None and snap.warm_start else None
            self._start_loss[run_id] = self._latest.get(parent, {}).get("loss", 2.4) if parent else 2.4
        start = self._start_loss[run_id]
        speed, frac = 3.0 * math.sqrt(lr / 1e-4), step / self.total_steps
        floor = 0.55 + 0.12 * 8 / rank + (0.3 if lr >= 1e-3 else 0.0)
        loss = max(0.05, floor + (start - floor) * math.exp(-speed * frac) + rng.gauss(0, 0.04))
        values = {
            "loss": loss,
            "learning_rate": lr * (1 - (step - 1) / self.total_steps),
            "grad_norm": abs(1.8 * math.exp(-2 * frac) + rng.gauss(0, 0.15)) + 0.2,
            "mean_token_accuracy": min(0.99, 0.35 + 0.5 * (1 - math.exp(-speed * frac)) + rng.gauss(0, 0.01)),
            "entropy": max(0.1, 1.6 * math.exp(-1.5 * frac) + rng.gauss(0, 0.03)),
        }
        if step % self.eval_every == 0 or step == self.total_steps:
            values["eval_loss"] = loss + 0.08 + abs(rng.gauss(0, 0.015))
            values["eval_mean_token_accuracy"] = min(0.99, 0.32 + 0.48 * (1 - math.exp(-speed * frac)))
        now = time.time()
        with self._points_lock:
            self._points += [
                {
                    "run_id": run_id,
                    "step": step,
                    "samples_seen": step * spec.batch,
                    "name": k,
                    "value": float(v),
                    "wall_time": now,
                }
                for k, v in values.items()
            ]
            self._latest.setdefault(run_id, {}).update(
                {k: values[k] for k in ("loss", "eval_loss") if k in values}
            )

    @property
    def runs(self) -> dict[int, dict[str, Any]]:
        """Current runs as snapshot dicts, by run id."""
        return {r["run_id"]: r for r in self.panel_snapshot()["runs"]}


def _main() -> None:  # pragma: no cover - demo
    from rapidfire_nb.panel.progress import TextProgress

    with (
        FakeSource(3, total_steps=40, steps_per_tick=2, tick_s=0.02, fail=(3, None)) as src,
        TextProgress(src),
    ):
        while any(RunStatus(r["status"]).in_rotation() for r in src.runs.values()):
            time.sleep(0.2)
        time.sleep(0.6)


if __name__ == "__main__":  # pragma: no cover
    _main()
