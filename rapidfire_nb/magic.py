"""``%rapidfire``: the IC Ops and views of rapidfire_nb from a notebook cell.

Load with ``%load_ext rapidfire_nb``. Usage::

    %rapidfire                         status table of the current experiment
    %rapidfire panel                   display the live panel (full history)
    %rapidfire list                    experiments in the store (the experiments root)
    %rapidfire stop 2 3                stop runs 2 and 3 at the end of their current chunk
    %rapidfire resume 2                put run 2 back into the rotation
    %rapidfire delete 4                delete run 4
    %rapidfire clone 1 --warm learning_rate=5e-5     warm-start clone of run 1 with a new learning rate
    %rapidfire clone 1 lora.r=16       cold clone (fresh adapter) with another LoRA rank
    %rapidfire continue 1 max_steps=80 a new run continuing finished run 1 to 80 steps (= clone 1 --warm max_steps=80)
    %rapidfire tensorboard             start (or reuse) TensorBoard on this experiment's logs, inline
    %rapidfire -e NAME ...             address another experiment

``key=value`` values are parsed as Python literals (``ast.literal_eval``), never evaluated as code; a value
that is not a literal is kept as a string. The current experiment is the one most recently created or
trained in this kernel.
"""

from __future__ import annotations

import ast
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from kernel_scheduler import OP_KINDS

from . import meta_keys
from .errors import ConfigError, ExperimentError, OpError
from .view.text import chunks_note, status_label

if TYPE_CHECKING:
    from .experiment import Experiment

__all__ = ["RapidfireMagics", "load_ipython_extension", "parse_changes"]

USAGE = (
    "%rapidfire [-e NAME] [status | panel | list | stop IDS | resume IDS | delete IDS | "
    "clone ID [--warm] key=value ... | continue ID max_steps=N ... | tensorboard]"
)


#: The op kinds given run ids only (``stop 2 3``); clone takes a run id and changes (kernel_scheduler.op_kinds).
_ID_OPS = tuple(info.name for info in OP_KINDS.values() if not info.takes_changes)


def parse_changes(items: list[str]) -> dict[str, Any]:
    """``["learning_rate=5e-5", "lora.r=16"]`` -> ``{"learning_rate": 5e-05, "lora.r": 16}`` (literals only)."""
    changes: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UsageError(f"expected key=value, got {item!r}\nusage: {USAGE}")
        try:
            value: Any = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        changes[key.strip()] = value
    return changes


def _ids(items: list[str]) -> list[int]:
    ids = []
    for x in items:
        try:
            ids.append(int(x))
        except ValueError:
            raise UsageError(
                f"{x!r} is not a run id: a run id is a whole number, as shown by %rapidfire and in the panel "
                f"(1, 2, ...)\nusage: {USAGE}"
            ) from None
    if not ids:
        raise UsageError(f"give at least one run id\nusage: {USAGE}")
    return ids


@magics_class
class RapidfireMagics(Magics):
    """The ``%rapidfire`` line magic."""

    @magic_arguments()
    @argument("-e", "--experiment", default=None, help="experiment name (default: the current one)")
    @argument("--warm", action="store_true", help="clone: warm start from the parent's latest chunk boundary")
    @argument(
        "command",
        nargs="?",
        default="status",
        help="status | panel | list | stop | resume | delete | clone | continue | tensorboard",
    )
    @argument("args", nargs="*", help="run ids, or for clone: ID key=value ...")
    @line_magic
    def rapidfire(self, line: str) -> Any:
        """Control and inspect rapidfire_nb experiments (see the module docstring for every command)."""
        a = _parse(line)
        cmd = a.command
        try:
            if cmd == "list":
                return _list_experiments()
            exp = _find_experiment(a.experiment)
            if cmd == "status":
                return _status(exp)
            if cmd == "panel":
                return exp.panel()
            if cmd in _ID_OPS:
                acks = [exp.submit_op(cmd, rid, source="magic") for rid in _ids(a.args)]
                for ack in acks:
                    print(f"[rapidfire] {ack.kind} run {ack.run_id}: {ack.state} — {ack.message}")
                return None
            if cmd == "continue":  # a warm clone: a finished run's final state, trained to the new max_steps
                cmd, a.warm = "clone", True
            if cmd == "clone":
                if not a.args:
                    raise UsageError(f"clone needs a run id\nusage: {USAGE}")
                parent = _ids(a.args[:1])[0]
                new_id = exp.clone_modify(
                    parent, parse_changes(a.args[1:]), warm_start=a.warm, source="magic"
                )
                how = "warm start from its latest chunk boundary or final state" if a.warm else "from scratch"
                print(
                    f"[rapidfire] run {new_id} created from run {parent} ({how}); it joins the rotation at the next chunk boundary"
                )
                return None
            if cmd == "tensorboard":
                return _tensorboard(exp)
        except (ConfigError, ExperimentError, OpError) as exc:
            raise UsageError(str(exc)) from None
        raise UsageError(f"unknown command {cmd!r}\nusage: {USAGE}")


class _Args:
    def __init__(self, command: str, args: list[str], experiment: str | None, warm: bool) -> None:
        self.command, self.args, self.experiment, self.warm = command, args, experiment, warm


def _parse(line: str) -> _Args:
    """Parse the magic's line; options may stand anywhere (``clone 1 --warm lr=1e-4``)."""
    try:
        tokens = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"{exc}\nusage: {USAGE}") from None
    rest: list[str] = []
    experiment = None
    warm = False
    it = iter(tokens)
    for tok in it:
        if tok == "--warm":
            warm = True
        elif tok in ("-e", "--experiment"):
            experiment = next(it, None)
            if experiment is None:
                raise UsageError(f"-e needs an experiment name\nusage: {USAGE}")
        elif tok.startswith("--experiment="):
            experiment = tok.split("=", 1)[1]
        elif tok.startswith("-") and not _is_number(tok):
            raise UsageError(f"unknown option {tok!r}\nusage: {USAGE}")
        else:
            rest.append(tok)
    command = rest[0] if rest else "status"
    if warm and command not in ("clone", "continue"):
        raise UsageError(f"--warm only applies to clone\nusage: {USAGE}")
    return _Args(command, rest[1:], experiment, warm)


def _is_number(tok: str) -> bool:
    try:
        float(tok)
    except ValueError:
        return False
    return True


def _find_experiment(name: str | None) -> Experiment:
    from . import experiment as experiment_mod

    exp: Experiment | None
    if name is None:
        exp = experiment_mod.current_experiment()
        if exp is None:
            raise UsageError("no experiment in this kernel yet: create Experiment(name) or use -e NAME")
        return exp
    exp = experiment_mod.live_experiment(name)
    if exp is not None:
        return exp
    from .paths import experiment_dir

    roots = _roots()
    for root in roots:
        if (experiment_dir(root, name) / "store.sqlite").exists():
            with (
                experiment_mod.registry.keep_current()
            ):  # opened to read it: it must not become the current one
                return experiment_mod.Experiment(name, experiment_path=root)
    raise UsageError(f"no experiment named {name!r} under {' or '.join(str(r) for r in roots)}")


def _roots() -> list[Path]:
    """Where ``%rapidfire`` looks for experiments: the roots of this kernel's experiments (their
    ``experiment_path``; the current one's first), then ``$RF_HOME`` (else the user data dir)."""
    from .experiment import registry
    from .paths import experiments_root

    return list(dict.fromkeys([*registry.live_roots(), experiments_root()]))


#: The status table's first columns (what fits a ~1000 px output); the hyperparameters follow. ``device`` is
#: there only when the experiment trains on several devices (``run_fit(devices=...)``; get_runs_info's column),
#: ``sharding`` (fsdp / ddp / None) only when some run trains over several devices (``num_gpus``), ``pack`` only when some run trains packed (``run_fit(packing=...)``), ``run_name`` only when a run has a name
#: (next to the id, the index).
_STATUS_FIRST = [
    "run_name",
    "status",
    "device",
    "sharding",
    "pack",
    "loss",
    "eval_loss",
    "step",
    "chunks",
    "epoch",
]


def _status(exp: Experiment) -> Any:
    """``get_runs_info()`` for reading: indexed by run id, metrics first, steps and chunks as ``done/total``, a run
    early stopping pruned as ``PRUNED`` (its status stays STOPPED: the panel's mark), no config or checkpoint path
    (the API's table has them), the error / stop_reason columns only when a run failed / stopped (the reason whole),
    each run's device after its status when the experiment trains on several devices, its pack (``None``: alone)
    when some run trains packed.
    With an early-stopping policy or a search, its line is printed first (``[rapidfire] Optuna: 3 of 6 trials asked
    · 1 pruned · 2 running``, :func:`rapidfire_nb.view.early_stopping_text`), and a line for each run whose chunks
    are not a whole number of epochs' (:func:`rapidfire_nb.view.text.chunks_note`: its max_steps ends inside one)."""
    snap = exp.panel_snapshot()
    line = snap.get("early_stopping")
    if line:  # trials asked / budget, or the rung policy's pruned runs and next rung
        print(f"[rapidfire] {line}")
    runs = {r["run_id"]: r for r in snap.get("runs") or [] if r.get("status") != "DELETED"}
    for rid, run in sorted(runs.items()):
        note = chunks_note(run, snap.get("num_chunks"))
        if note:
            print(f"[rapidfire] run {rid}: {note}")
    df = exp.get_runs_info()
    pruned = [bool((runs.get(rid) or {}).get("pruned")) for rid in df.run_id]
    df["status"] = [status_label({"status": st, "pruned": p}) for st, p in zip(df.status, pruned)]
    if "chunks_done" in df.columns:
        df["chunks_done"] = [_chunks(runs.get(rid), done) for rid, done in zip(df.run_id, df.chunks_done)]
        df = df.rename(columns={"chunks_done": "chunks"})
    df = df.drop(columns=["config", "checkpoint_dir"], errors="ignore")
    for col in ("error", "stop_reason"):  # shown only when a run failed / was stopped
        if col in df.columns and df[col].isna().all():
            df = df.drop(columns=[col])
    if {"completed_steps", "total_steps"} <= set(df.columns):
        df.insert(
            1,
            "step",  # "–" while a run's budget is unknown (a clone not built yet), as the panel shows it
            [
                f"{int(c or 0)}/{int(t)}" if t and t == t else "–"
                for c, t in zip(df.completed_steps, df.total_steps)
            ],
        )
        df = df.drop(columns=["completed_steps", "total_steps"])
    first = [c for c in _STATUS_FIRST if c in df.columns]
    rest = [c for c in df.columns if c not in first and c != "run_id"]
    return df.set_index("run_id")[first + rest]


def _chunks(run: dict[str, Any] | None, done: Any) -> str:
    """``done/total`` chunks of a run over all its epochs (``done`` alone when the total is not known)."""
    done = int(done) if isinstance(done, (int, float)) and done == done else 0
    total = (run or {}).get("num_segments")
    return f"{done}/{total}" if isinstance(total, int) and total > 0 else str(done)


def _list_experiments() -> Any:
    """One row per experiment under :func:`_roots` (a :class:`~.experiment.frames.ListFrame`: shown without an
    index; a ``root`` column when experiments live under more than one root)."""
    import pandas as pd

    from .experiment.frames import ListFrame
    from .paths import experiment_dir, list_experiments
    from .store import Store

    roots = _roots()
    rows = []
    for root, name in ((r, n) for r in roots for n in list_experiments(r)):
        with Store(experiment_dir(root, name), read_only=True) as store:
            runs = store.runs()
            meta = store.meta()
        counts: dict[str, int] = {}
        for r in runs:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        rows.append(
            {
                "experiment": name,
                "runs": len(runs),
                "trainer_type": meta.get(meta_keys.TRAINER_TYPE),
                "statuses": ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
                "created_at": _local_time(pd, meta.get(meta_keys.CREATED_AT)),
                "root": str(root),
            }
        )
    columns = ["experiment", "runs", "trainer_type", "statuses", "created_at"]
    return ListFrame(rows, columns=columns + (["root"] if len({r["root"] for r in rows}) > 1 else []))


def _local_time(pd: Any, unix_s: Any) -> Any:
    """A unix time as a pandas Timestamp in the local time zone, to the second (None when missing)."""
    if not isinstance(unix_s, (int, float)):
        return None
    from datetime import datetime

    local = datetime.now().astimezone().tzinfo
    return pd.to_datetime(unix_s, unit="s", utc=True).tz_convert(local).floor("s")


def _tensorboard(exp: Experiment) -> None:
    logdir = exp.path / "tensorboard"
    logdir.mkdir(parents=True, exist_ok=True)
    from tensorboard import notebook

    _use_this_environments_tensorboard()
    # notebook.start takes one string and splits it with shlex (comments on): quote the path, which may hold
    # spaces (macOS's "Application Support") or shell characters
    notebook.start(shlex.join(["--logdir", str(logdir), "--host", "127.0.0.1"]))
    return None


def _use_this_environments_tensorboard() -> None:
    """Point ``TENSORBOARD_BINARY`` at the ``tensorboard`` script next to this Python, unless it is set or that
    script is missing. TensorBoard's notebook helper otherwise runs whatever ``tensorboard`` is first on ``PATH``,
    which is missing (or another environment's) when a kernel runs from a virtual environment that is not
    activated."""
    if os.environ.get("TENSORBOARD_BINARY"):
        return
    script = Path(sys.executable).parent / ("tensorboard.exe" if os.name == "nt" else "tensorboard")
    if script.is_file():
        os.environ["TENSORBOARD_BINARY"] = str(script)


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%rapidfire`` (called by ``%load_ext rapidfire_nb``)."""
    ipython.register_magics(RapidfireMagics)
