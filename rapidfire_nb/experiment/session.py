"""One ``run_fit`` session: what it wires together, built on the caller's thread, then driven by the scheduler.

:func:`.start.open_session` builds a :class:`FitSession` from checked inputs and the restore plan (it makes the
executor (the training layer), registers every run with the scheduler (new, finished, continued from its
checkpoint, or failed), records the group, starts the tracker). :class:`FitSession` is what the
facade delegates to afterwards: IC Ops, snapshots, the ops inbox, closing.

Threads: the caller's thread builds the session and, until ``scheduler.start()``, is its only user. Afterwards
the scheduler thread owns all run state (each run's status, progress and spec live in the scheduler); other
threads call :meth:`FitSession.submit` (which only checks and enqueues) and read frozen snapshots. The session's
own fields are set once, at construction.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_scheduler import Op, OpAck, OpKind, RunSnapshot, Scheduler
from kernel_scheduler.ops import new_op_id

from ..errors import ExperimentError, OpError
from .clones import prepare_clone
from .inputs import FitInputs
from .ownership import other_writer
from .recorder import Recorder
from .reporter import Reporter

__all__ = ["FitSession", "require_session"]


@dataclass
class FitSession:
    """What one ``run_fit`` wires: scheduler, executor, recorder, tracker and the group's settings.

    Attributes:
        scheduler: owns every run's state (thread ``rapidfire-scheduler``).
        executor: the training layer (``rapidfire_nb.training``'s TorchExecutor).
        recorder: the scheduler listener writing the store and the tracker.
        tracker: TensorBoard (or a null tracker).
        inputs: the checked ``run_fit`` arguments.
        started_at: unix seconds when training started.
        continued: run id -> the step it continues from (runs restored from a checkpoint).
    """

    scheduler: Scheduler
    executor: Any
    recorder: Recorder
    tracker: Any
    inputs: FitInputs
    store: Any
    started_at: float = field(default_factory=time.time)
    continued: dict[int, int] = field(default_factory=dict)

    @property
    def num_chunks(self) -> int:
        return self.inputs.num_chunks

    @property
    def columns(self) -> list[str]:
        """The hyperparameter columns shown in tables (differing in the group, plus those clones changed)."""
        return self.recorder.columns

    # ------------------------------------------------------------------ reading (any thread)
    def snapshots(self) -> dict[int, RunSnapshot]:
        """Frozen views of every run, by run id."""
        return {s.run_id: s for s in self.scheduler.snapshot()}

    def spec(self, run_id: int) -> Any:
        """Run ``run_id``'s spec (None when there is no such run)."""
        snap = self.scheduler.run_snapshot(int(run_id))
        return snap.spec if snap is not None else None

    def specs(self) -> dict[int, Any]:
        return {s.run_id: s.spec for s in self.scheduler.snapshot()}

    # ------------------------------------------------------------------ IC Ops (any thread)
    def submit(
        self,
        kind: str,
        run_id: int,
        op_id: str | None = None,
        changes: Mapping[str, Any] | None = None,
        warm_start: bool = False,
        source: str = "api",
    ) -> OpAck:
        """Check an op and hand it to the scheduler; returns its acknowledgement at once.

        Raises:
            OpError: unknown op kind, unknown parent run, or a change a warm start cannot take.
            ConfigError: a clone whose changes are invalid (the op is not queued).
        """
        try:
            kind_e = OpKind(kind)
        except ValueError:
            raise OpError(f"unknown op {kind!r}; use stop, resume, delete or clone") from None
        if kind_e is not OpKind.CLONE:
            return self.scheduler.submit(Op(kind_e, int(run_id), op_id=op_id or new_op_id(), source=source))
        request = prepare_clone(self.spec(int(run_id)), int(run_id), changes, warm_start, source)
        op = Op(kind_e, int(run_id), op_id=op_id or new_op_id(), payload=request.payload(), source=source)
        ack = self.scheduler.submit(op)
        if ack.new_run_id is not None and ack.state != "rejected":
            self.recorder.record_clone(ack.new_run_id, int(run_id), request)
            self.recorder.record_editable(self.specs())
        return ack

    def inbox_ops(self) -> list[Op]:
        """The ops posted through the server since the last call (clones are submitted here at once)."""
        ops = []
        for row in self.store.take_inbox_ops():
            payload = row.get("payload") or {}
            kind = row.get("kind")
            try:
                if kind == "clone":
                    self.submit(
                        "clone",
                        int(row["run_id"]),
                        op_id=row["op_id"],
                        changes=payload.get("changes"),
                        warm_start=bool(payload.get("warm_start")),
                        source="inbox",
                    )
                else:
                    ops.append(Op(OpKind(kind), int(row["run_id"]), op_id=row["op_id"], source="inbox"))
            except Exception as exc:
                self.store.add_op(
                    row["op_id"],
                    str(kind),
                    row.get("run_id"),
                    payload,
                    source="inbox",
                    state="rejected",
                    message=str(exc),
                )
        return ops

    def wait(self, timeout: float | None, chunks: int | None, reporter: Reporter) -> bool:
        """``Experiment.wait``: block until the condition holds (True) or ``timeout`` seconds pass (False).

        On Ctrl-C every active run is stopped at the end of its current chunk and this returns False once they are
        parked; a second Ctrl-C returns at once.
        """
        sched = self.scheduler
        try:
            return sched.wait(timeout=timeout, chunks=chunks)
        except KeyboardInterrupt:
            active = [s.run_id for s in sched.snapshot() if s.status.in_rotation()]
            reporter.say(
                f"interrupted: stopping runs {active} at the end of their current chunk "
                "(press interrupt again to return now)"
            )
            for rid in active:
                sched.submit(Op(OpKind.STOP, rid, source="api"))
            try:
                sched.wait()
            except KeyboardInterrupt:
                pass
            return False

    def load_model(self, run_id: int) -> tuple[Any, Any]:
        """``(model, tokenizer)`` with run ``run_id``'s trained weights (see ``Experiment.load_model``).

        Raises:
            ExperimentError: no such run, it is training right now, or it has no saved final weights.
        """
        spec = self.spec(run_id)
        if spec is None:
            raise ExperimentError(f"run {run_id} does not exist (runs: {sorted(self.specs())})")
        if self.scheduler.on_device() == run_id:
            raise ExperimentError(f"run {run_id} is training right now; stop it or wait for its chunk to end")
        if self.executor.has_run(run_id):
            return self.executor.load_model(run_id)  # type: ignore[no-any-return]
        row = self.store.get_run(run_id) or {}  # ended in an earlier process: its final weights are on disk
        final = row.get("checkpoint_dir")
        if not final or not Path(final).is_dir():
            raise ExperimentError(
                f"run {run_id} ({row.get('status', 'unknown')}) has no saved final weights; only "
                "runs that completed or were stopped have them"
            )
        return self.executor.load_model(run_id, spec=spec, final_dir=Path(final))  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop the scheduler thread, release every run and close the tracker (after ``wait()``)."""
        self.scheduler.close()
        self.executor.close()
        self.tracker.close()


def require_session(session: FitSession | None, ended: bool, name: str, lock: Any, store: Any) -> FitSession:
    """The live session IC Ops go to.

    Raises:
        ExperimentError: the experiment was ended, or nothing trains in this process (the message says where it
            trains, or to call run_fit first).
    """
    if session is None:
        other = other_writer(lock, store) if not ended else None
        if other is not None:
            raise ExperimentError(
                f"experiment {name!r} is being trained by process {other}; apply IC Ops there (its panel, "
                "%rapidfire, or the /rapidfire/ page of its Jupyter server)"
            )
        if store.runs():
            raise ExperimentError(
                f"experiment {name!r} is not training in this kernel: call run_fit with the same arguments first "
                "(it continues the interrupted runs), then use IC Ops"
            )
        raise ExperimentError("no training in this experiment yet: call run_fit first")
    if ended:
        raise ExperimentError(
            f"experiment {name!r} was ended; IC Ops are no longer accepted. To continue it: "
            f"Experiment({name!r}), then run_fit(...) with the same arguments, then experiment.resume(run_id)"
        )
    return session
