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

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_scheduler import Op, OpAck, OpKind, RunSnapshot, RunStatus, Scheduler
from kernel_scheduler.ops import OP_ID_PATTERN, OP_ID_RULE, new_op_id

from ..errors import ExperimentError, OpError, StorageError, storage_error
from ..frontend import in_kernel
from .clones import final_state_missing, prepare_clone
from .inputs import FitInputs
from .ownership import other_writer
from .recorder import Recorder
from .reporter import Reporter
from .resources import check_clone_fits

__all__ = ["ENDED_MESSAGE", "FitSession", "require_session"]

ENDED_MESSAGE = (
    "the experiment was ended (experiment.end()) before its kernel took this op; to continue, re-run the "
    "notebook's Experiment(...) and run_fit(...) cells, then send it again"
)


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
        stops: run id -> why it stopped, from the stored ops log (read as the session is built).
    """

    scheduler: Scheduler
    executor: Any
    recorder: Recorder
    tracker: Any
    inputs: FitInputs
    store: Any
    started_at: float = field(default_factory=time.time)
    continued: dict[int, int] = field(default_factory=dict)
    stops: dict[int, Any] = field(default_factory=dict)
    closed: bool = False  # close() was called: nothing trains or writes any more
    finished_before: dict[int, int] = field(
        default_factory=dict
    )  # run id -> its step, finished before run_fit
    _halt_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def halted(self) -> str | None:
        """Why training stopped for good (a write to disk failed), or None."""
        return self.scheduler.halted

    def storage_failed(self, failure: StorageError) -> None:
        """A write to disk failed (the store, a checkpoint, final weights): stop training, lose nothing. Any thread.

        The segment in flight ends at its boundary; every ONGOING run becomes INTERRUPTED (resumable exactly from
        its latest complete chunk checkpoint: the atomic writes keep it whole); one message says what failed and
        how to continue (free space, then ``run_fit`` again with the same arguments).
        """
        with self._halt_lock:
            if self.scheduler.halted is not None:
                return
            active = [s.run_id for s in self.scheduler.snapshot() if s.status.in_rotation()]
            folder = Path(self.store.path).parent
            if not Path(self.store.path).exists():  # not a full disk: the experiment's record itself is gone
                message = (
                    f"{failure}. The experiment folder {folder} was removed while training: training stops "
                    f"(runs {active} are INTERRUPTED) and nothing more can be saved there. Restore the folder "
                    "from a backup to continue, or run_fit(...) into a new experiment to train again"
                )
            else:
                message = (
                    f"{failure}. Training stops here and nothing is lost: runs {active} are INTERRUPTED and each "
                    "continues exactly from its latest complete chunk checkpoint. Free space on that disk, then "
                    "call run_fit(...) again with the same arguments"
                )
            self.scheduler.halt(message)
        self.recorder.reporter.say(message)

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
        reason: str | None = None,
    ) -> OpAck:
        """Check an op and hand it to the scheduler; returns its acknowledgement at once. A stop may name its own
        ``reason`` (at most 200 characters, e.g. the panel's ``"stop all but best 2 by eval_loss"``): the run's
        ``stop_reason`` and the ops log's payload and message say it instead of ``stopped by the user (panel)``.

        Raises:
            OpError: unknown op kind, unknown parent run, a change a warm start cannot take, a warm clone of a run
                that finished before this ``run_fit`` (its final state is not kept), an ``op_id`` that is
                not a non-empty string, or one already used by another request (another kind or run; the same
                request again gets its ack, also one answered by an earlier kernel: the ops log).
            ConfigError: a clone whose changes are invalid, or whose run would not fit the disk or the device
                (:func:`~.resources.check_clone_fits`; the op is not queued).
        """
        try:
            kind_e = OpKind(kind)
        except ValueError:
            raise OpError(f"unknown op {kind!r}; use stop, resume, delete or clone") from None
        if reason is not None and (
            kind_e is not OpKind.STOP or not isinstance(reason, str) or len(reason) > 200
        ):
            raise OpError(f"reason: only a stop names one, a text of at most 200 characters; got {reason!r}")
        if op_id is not None:
            self._check_op_id(op_id, kind_e, int(run_id), source)
        if kind_e is not OpKind.CLONE:
            payload = {"reason": reason} if reason else {}
            return self.scheduler.submit(
                Op(kind_e, int(run_id), op_id=op_id or new_op_id(), payload=payload, source=source)
            )
        # a finished parent's step: the floor of a continuation's max_steps
        parent_run = self.scheduler.run_snapshot(int(run_id))
        if warm_start and parent_run is not None:
            self._check_state_kept(parent_run)
        spec = parent_run.spec if parent_run is not None else None
        request = prepare_clone(spec, int(run_id), changes, warm_start, source, parent_run)
        check_clone_fits(request.spec, self.store, getattr(self.inputs, "devices", None), int(run_id))
        op = Op(kind_e, int(run_id), op_id=op_id or new_op_id(), payload=request.payload(), source=source)
        ack = self.scheduler.submit(op)
        if ack.new_run_id is not None and ack.state != "rejected":
            self.recorder.record_clone(ack.new_run_id, int(run_id), request)
            self.recorder.record_editable(self.specs())
        return ack

    def _check_state_kept(self, parent: RunSnapshot) -> None:
        """Refuse a warm clone of a run that finished before this ``run_fit`` and has not trained since when its
        final state (adapter, optimizer, step), kept on disk as its last checkpoint, is not there."""
        step = self.finished_before.get(parent.run_id)
        if (
            step is None
            or step != parent.step
            or parent.status not in (RunStatus.COMPLETED, RunStatus.STOPPED)
        ):
            return
        why = final_state_missing(self.store.experiment_dir, parent.run_id, step)
        if why is None:
            return
        raise OpError(
            f"run {parent.run_id} finished before this run_fit (at step {step}), and a warm clone continues a run "
            f"from its final state, which is not on disk: {why}; clone it cold (warm_start=False) with the same "
            "changes, or continue a run that finishes in this session"
        )

    def _check_op_id(self, op_id: Any, kind: OpKind, run_id: int, source: str) -> None:
        """Raise OpError when ``op_id`` is not a non-empty string, or names another request: one this kernel (or an
        earlier one: the ops log) answered, or one posted through the server and not read yet."""
        if not isinstance(op_id, str) or not OP_ID_PATTERN.fullmatch(op_id):  # REST's rule too
            raise OpError(f"{OP_ID_RULE}, or left out; got {type(op_id).__name__} {op_id!r}")
        earlier = self.scheduler.ack(op_id)
        if earlier is not None:
            used = (earlier.kind, earlier.run_id, earlier.state)
        elif source != "inbox" and self.store is not None:  # posted through the server, not taken yet
            row = self.store.posted_op(op_id)
            used = (row["kind"], row["run_id"], "posted through the server") if row is not None else None
        else:
            used = None
        if used is not None and used[:2] != (kind.value, run_id):
            raise OpError(
                f"op id {op_id!r} was already used by the {used[0]} of run {used[1]} ({used[2]}); an op id names "
                "one request: leave op_id out or use a new one"
            )

    def inbox_ops(self) -> list[Op]:
        """The ops posted through the server since the last call (clones are submitted here at once)."""
        ops: list[Op] = []
        try:
            rows = self.store.take_inbox_ops()
        except Exception as exc:
            failure = storage_error(exc, str(self.store.path))
            if failure is None:
                raise
            self.storage_failed(failure)
            return ops
        for row in rows:
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
                else:  # a stop's own reason, checked by the server as submit checks one from the comm
                    reason = payload.get("reason") if kind == "stop" else None
                    own = {"reason": reason} if isinstance(reason, str) and 0 < len(reason) <= 200 else {}
                    ops.append(
                        Op(OpKind(kind), int(row["run_id"]), op_id=row["op_id"], payload=own, source="inbox")
                    )
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

        False also once training stopped for good (:attr:`halted`: every device's worker died, or a write to disk
        failed): the runs left then did not train, whatever the condition says.

        On Ctrl-C every active run is stopped at the end of its current chunk. In a kernel this returns False once
        they are parked (a second Ctrl-C returns at once). In a script it then re-raises ``KeyboardInterrupt``
        (exit status 130) after saying how to continue; a second Ctrl-C raises at once.

        Raises:
            KeyboardInterrupt: in a script (not a kernel), once the runs are parked.
        """
        sched = self.scheduler
        try:
            done = sched.wait(timeout=timeout, chunks=chunks)
            # the store shows what was reported; the trackers too once nothing is left to train (wait(chunks=k)
            # returns to a user about to steer runs: their tracker writes can come in their window)
            self.recorder.flush(timeout, trackers=chunks is None)
            return done and sched.halted is None  # halted: runs were left untrained (the reason was said)
        except KeyboardInterrupt:
            active = [s.run_id for s in sched.snapshot() if s.status.in_rotation()]
            if (
                active
            ):  # after the end (flushing the trackers) nothing is training: say nothing about stopping
                reporter.say(
                    f"interrupted: stopping runs {active} at the end of their current chunk "
                    "(press interrupt again to " + ("return now)" if in_kernel() else "quit now)")
                )
            for rid in active:
                sched.submit(Op(OpKind.STOP, rid, source="api"))
            try:
                sched.wait()
                self.recorder.flush()
            except KeyboardInterrupt:
                if not in_kernel():
                    raise
            if in_kernel():
                return False
            self.recorder.flush()  # the store and the trackers hold what they reported (on their threads) and
            self.executor.flush()  # the checkpoints the recorder handed over since are on disk before the end
            text = self._how_to_continue(active, reporter)
            exit_130_if_uncaught()
            raise KeyboardInterrupt(text) from None

    def _how_to_continue(self, active: list[int], reporter: Reporter) -> str:
        """Say (and return) what a script stopped by Ctrl-C left behind and how to continue it."""
        snaps = self.snapshots()
        stopped = [rid for rid in active if snaps[rid].status is RunStatus.STOPPED]
        if not stopped:
            text = "interrupted: no run was left training"
        else:
            steps = ", ".join(
                f"run {rid} at step {snaps[rid].step}/{snaps[rid].total_steps}" for rid in stopped
            )
            text = (
                f"interrupted: {steps} STOPPED (checkpoints and weights saved). To continue, run the script "
                f"again with experiment.resume({stopped}) and experiment.wait() after run_fit (run_fit alone "
                "keeps STOPPED runs stopped)"
            )
        reporter.say(text)
        return text

    @contextlib.contextmanager
    def hold_device(self, what: str, reporter: Reporter) -> Iterator[None]:
        """Hold the device (the process-wide arbiter) on the calling thread for a block that builds or loads
        models: it waits for the chunk training now (of any experiment of this process) to end, saying so."""

        def waiting(holders: list[str]) -> None:
            reporter.say(
                f"waiting for the device to {what}: {', '.join(holders)} holds it (one chunk of any experiment "
                "of this process trains at a time, so that every run stays exact)"
            )

        with self.scheduler.arbiter.acquire(f"{self.scheduler.owner} ({what})", on_wait=waiting):
            yield

    def load_model(self, run_id: int, reporter: Reporter) -> tuple[Any, Any]:
        """``(model, tokenizer)`` with run ``run_id``'s trained weights (see ``Experiment.load_model``).

        Holds the device while it saves and loads (it waits for a chunk in flight to end).

        Raises:
            ExperimentError: no such run, it is training right now, or it has no saved final weights.
        """
        spec = self.spec(run_id)
        if spec is None:
            raise ExperimentError(f"run {run_id} does not exist (runs: {sorted(self.specs())})")
        if self.scheduler.on_device() == run_id:
            raise ExperimentError(f"run {run_id} is training right now; stop it or wait for its chunk to end")
        if self.executor.has_run(run_id):
            with self.hold_device(f"load run {run_id}", reporter):
                return self.executor.load_model(run_id)  # type: ignore[no-any-return]
        row = self.store.get_run(run_id) or {}  # ended in an earlier process: its final weights are on disk
        final = row.get("checkpoint_dir")
        if not final or not Path(final).is_dir():
            raise ExperimentError(
                f"run {run_id} ({row.get('status', 'unknown')}) has no saved final weights; only "
                "runs that completed or were stopped have them"
            )
        with self.hold_device(f"load run {run_id}", reporter):
            return self.executor.load_model(run_id, spec=spec, final_dir=Path(final))  # type: ignore[no-any-return]

    def end(self) -> None:
        """``Experiment.end`` after ``wait()``: mark the experiment ended, answer the inbox ops nobody will take, close.

        ``store.mark_ended`` sets meta ``ended_at`` and takes the untaken inbox ops in one transaction, so an op the
        server posts is either answered here (rejected, saying how to continue) or refused by the server (409). An op
        the scheduler took from the inbox just before is applied by one more wait.
        """
        try:
            for row in self.store.mark_ended():
                self.store.add_op(
                    row["op_id"],
                    str(row.get("kind")),
                    row.get("run_id"),
                    row.get("payload"),
                    source="inbox",
                    state="rejected",
                    message=ENDED_MESSAGE,
                )
        except Exception as exc:  # a full disk: said, never a raw sqlite error from end()
            failure = storage_error(exc, str(self.store.path))
            if failure is None:
                raise
            self.recorder.reporter.say(
                f"{failure}; the experiment ends here, its runs resume from their checkpoints"
            )
        self.scheduler.wait()
        self.close()

    def close(self) -> None:
        """Stop the scheduler thread, release every run, write what is recorded, close the tracker (after
        ``wait()``).

        Releasing unwinds each run's parked ``train()``: it holds the device meanwhile (another experiment's chunk
        is not trained at the same time). The recorder is flushed first: it hands the last checkpoints to the
        executor's writer.
        """

        self.closed = True

        def close_executor() -> None:
            with self.scheduler.arbiter.acquire(f"{self.scheduler.owner} (end)"):
                self.executor.close()

        steps = (
            self.scheduler.close,
            self.recorder.flush,
            close_executor,
            self.recorder.close,
            self.tracker.close,
        )
        for close in steps:
            try:
                close()
            except Exception as exc:  # e.g. a full disk while TensorBoard flushes: said, never raised here
                failure = storage_error(exc, str(self.store.experiment_dir))
                if failure is None:
                    raise
                self.recorder.reporter.say(str(failure))


def exit_130_if_uncaught() -> None:
    """Make an uncaught ``KeyboardInterrupt`` end this script the way an interrupted program must: killed by
    SIGINT (exit status 130 in a shell), once its traceback is printed.

    CPython does this itself at exit, but an exit handler that runs Python code again loses it (torch._dynamo's,
    imported by transformers, does: such scripts exit 1). A ``KeyboardInterrupt`` the script catches is not
    affected. Installed once per process; it wraps whatever ``sys.excepthook`` is.
    """
    previous = sys.excepthook
    if getattr(previous, "_rapidfire_exit_130", False):
        return

    def excepthook(tp: type[BaseException], value: BaseException, tb: Any) -> None:
        previous(tp, value, tb)
        if not issubclass(tp, KeyboardInterrupt):
            return
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)

    excepthook._rapidfire_exit_130 = True  # type: ignore[attr-defined]
    sys.excepthook = excepthook


def require_session(session: FitSession | None, ended: bool, name: str, lock: Any, store: Any) -> FitSession:
    """The live session IC Ops go to.

    Raises:
        ExperimentError: the experiment was ended, or nothing trains in this process (the message says where it
            trains, or to call run_fit first).
    """
    if ended:
        raise ExperimentError(
            f"experiment {name!r} was ended (experiment.end()); this object accepts no IC Ops. To continue it, run "
            f"Experiment({name!r}) and run_fit(...) again (finished runs are not trained again), then the op"
        )
    if session is None:
        other = other_writer(lock, store)
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
    return session
