"""RFOptuna: a config group searched with Optuna's ask-and-tell, pruned at chunk boundaries.

``run_fit(RFOptuna(configs, trainer_type, n_initial=8, budget=24, objective="minimize:eval_loss"), ...)`` trains
``n_initial`` trials at once; each reports its metric at every chunk end (``trial.report(value, chunk)``, so
trials are compared after the same rows, whatever their batch size), Optuna's pruner decides
(``trial.should_prune()``), and a new trial is asked whenever one is pruned, fails or completes while the budget
remains. The running trials are known to the sampler (TPE with ``constant_liar``), so new trials are not drawn as
if the running ones did not exist. The search space is the group's ``List``/``Range`` knobs. The study is stored
in the experiment folder (``optuna.db``, study name ``rapidfire``): ``optuna-dashboard sqlite:///.../optuna.db``
and ``optuna.visualization`` read it. Optuna is an optional extra (``pip install optuna``), imported when a
search is made.

The search is also the experiment's early-stopping policy (:class:`kernel_scheduler.EarlyStoppingPolicy`): its
prunes are stop ops from source ``early_stopping`` with the reason; a pruned run stays resumable.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kernel_scheduler import (
    ChunkResult,
    Decisions,
    EarlyStop,
    EarlyStoppingPolicy,
    NewRun,
    RunState,
    RunStatus,
)

from ..errors import ConfigError
from ..spec import LeafConfig
from .configs import MODEL_FIELDS, RFWrappedConfig
from .knobs import List, Range
from .search import _has_knob, _Search, make_leaf

__all__ = ["RFOptuna"]

_SAMPLERS = ("tpe", "cmaes", "random")
_PRUNERS = ("median", "hyperband", None)
_MAX_REPEATS = 20  # trials asked in a row that repeat a tried config before the search stops asking


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise ConfigError("RFOptuna needs Optuna: pip install optuna (the optional extra 'optuna')") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _objectives(objective: Any) -> list[tuple[str, str]]:
    """``"minimize:eval_loss, maximize:eval_accuracy"`` -> ``[("minimize", "eval_loss"), ...]``."""
    out = []
    for part in str(objective).split(",") if isinstance(objective, str) else [None]:
        direction, _, metric = (part or "").strip().partition(":")
        if direction not in ("minimize", "maximize") or not metric.strip():
            raise ConfigError(
                f"RFOptuna: objective must be 'minimize:<metric>' or 'maximize:<metric>' (several comma-separated), "
                f"e.g. objective='minimize:eval_loss', got {objective!r}"
            )
        out.append((direction, metric.strip()))
    return out


def _suggest(value: Any, trial: Any, path: str) -> Any:
    """``value`` with its knobs drawn by ``trial`` (``List`` -> categorical index, ``Range`` -> int/float)."""
    if isinstance(value, List):
        index = (
            trial.suggest_categorical(path, list(range(len(value.values)))) if len(value.values) > 1 else 0
        )
        return _suggest(value.values[index], trial, f"{path}[{index}]")
    if isinstance(value, Range):
        if value.dtype == "int":
            return trial.suggest_int(path, value.start, value.end, step=value.step or 1, log=value.log)
        return trial.suggest_float(path, value.start, value.end, step=value.step, log=value.log)
    if isinstance(value, RFWrappedConfig):
        return type(value)._from_recorded(
            {k: _suggest(v, trial, f"{path}.{k}") for k, v in value.kwargs.items()}
        )
    if not _has_knob(value):
        return value
    if isinstance(value, Mapping):
        return {k: _suggest(v, trial, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_suggest(item, trial, f"{path}[{i}]") for i, item in enumerate(value))
    return value


def _check(name: str, value: Any, allowed: Sequence[Any]) -> Any:
    if value not in allowed:
        raise ConfigError(f"RFOptuna: {name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


def _count(name: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ConfigError(f"RFOptuna: {name} must be an integer >= {least}, got {value!r}")
    return int(value)


class RFOptuna(_Search, EarlyStoppingPolicy):
    """An Optuna search over a config group, pruned at chunk boundaries (``rapidfireai``'s signature).

    Args:
        configs: an ``RFModelConfig``, a ``List`` of them or a list of them; its ``List``/``Range`` knobs are
            the search space.
        trainer_type: ``"SFT"``, ``"DPO"`` or ``"GRPO"``.
        n_initial: trials trained at once from the start (runs 1..n_initial).
        budget: trials in all (``>= n_initial``); default ``n_initial``.
        objective: ``"minimize:eval_loss"`` or ``"maximize:<metric>"``; several comma-separated for a
            multi-objective study (then nothing is pruned: Optuna prunes single-objective studies only).
        sampler: ``"tpe"`` (with ``constant_liar``: running trials count), ``"cmaes"`` (needs ``cmaes``) or
            ``"random"``.
        pruner: ``"hyperband"`` (Optuna's HyperbandPruner over the chunks of an epoch: running trials are
            compared at each rung), ``"median"`` (Optuna's MedianPruner: it compares with completed trials only,
            so it prunes from the second wave of trials on) or None (no pruning).
        seed: the sampler's seed (a restarted kernel's sampler is seeded ``seed + trials already in the study``,
            so it does not ask for the same configs again).
        granularity: ``"chunk"`` (report at every chunk end, step = chunks done) or ``"epoch"`` (at epoch ends).

    A trial that asks for exactly the config of an earlier trial (Optuna's samplers may: optuna/optuna#2021) is
    not trained twice: it is told the earlier trial's result (or PRUNED, or FAIL while that one still trains), a
    note says so, and the next trial is asked; it counts against the budget. After 20 such trials in a row the
    search stops asking (the space looks exhausted; a note says so). Among the ``n_initial`` trials asked at the
    start, a repeat trains (none has a result yet) and a note says so.

    Raises:
        ConfigError: a bad argument, or Optuna is not installed.
    """

    def __init__(
        self,
        configs: Any,
        trainer_type: str,
        n_initial: int = 4,
        budget: int | None = None,
        objective: str = "minimize:eval_loss",
        sampler: str = "tpe",
        pruner: str | None = "hyperband",
        seed: int = 42,
        granularity: str = "chunk",
    ) -> None:
        super().__init__(configs, trainer_type)
        self.n_initial = _count("n_initial", n_initial, 1)
        self.budget = self.n_initial if budget is None else _count("budget", budget, self.n_initial)
        self.objectives = _objectives(objective)
        self.sampler = _check("sampler", sampler, _SAMPLERS)
        self.pruner = _check("pruner", pruner, _PRUNERS)
        self.seed = _count("seed", seed, 0)
        self.granularity = _check("granularity", granularity, ("chunk", "epoch"))
        self.metric = self.objectives[0][1]  # what run_fit checks against the eval dataset
        self._optuna = _optuna()
        self._make_sampler()  # a missing cmaes fails here, not mid-training
        self.folder: Path | None = None
        self.num_chunks = 1
        self.study: Any = None
        self._trials: dict[int, Any] = {}  # run id -> its running optuna Trial
        self._waiting: list[Any] = []  # trials asked, not yet given a run id
        self._last: dict[int, float] = {}
        # trial number -> its state's name (RUNNING, PRUNED, ...), for progress()
        self._states: dict[int, str] = {}
        self._run_of: dict[int, int] = {}  # trial number -> its run id (for the notes)
        self._notes: list[str] = []  # notes from expand(), given with the first decisions

    # ------------------------------------------------------------------ config group
    def bind(self, folder: Path, num_chunks: int) -> None:
        """Where the study is stored (``folder/optuna.db``) and the chunks per epoch; called by ``run_fit``."""
        self.folder, self.num_chunks = Path(folder), num_chunks

    def expand(self, seed: int = 42) -> list[LeafConfig]:
        """The ``n_initial`` trials of the study as runs (a restarted kernel gets the stored ones back)."""
        optuna = self._optuna
        if self.study is None:
            storage = f"sqlite:///{self.folder / 'optuna.db'}" if self.folder is not None else None
            if self.folder is not None:
                self.folder.mkdir(parents=True, exist_ok=True)
            self.study = optuna.create_study(
                study_name="rapidfire",
                storage=storage,
                load_if_exists=True,
                sampler=self._make_sampler(),
                pruner=self._make_pruner(),
                directions=[d for d, _ in self.objectives],
            )
        stored = sorted(self.study.trials, key=lambda t: t.number)
        if stored:  # a restarted kernel: a sampler seeded as before would replay the configs it asked then
            self.study.sampler = self._make_sampler(seed_offset=len(stored))
        self._states.update({t.number: t.state.name for t in stored})
        leaves = []
        for i in range(self.n_initial):
            if i < len(stored):  # a restarted kernel: the same runs, from the stored trials' parameters
                leaves.append(self._leaf(optuna.trial.FixedTrial(stored[i].params)))
                if stored[i].state == optuna.trial.TrialState.RUNNING:
                    self._trials.setdefault(i + 1, optuna.trial.Trial(self.study, stored[i]._trial_id))
                continue
            trial = self.study.ask()
            self._states[trial.number] = "RUNNING"
            self._trials[i + 1] = trial
            leaves.append(self._leaf(trial))
            earlier = self._same_config(trial)
            if earlier is not None:  # both start now: neither has a result to give the other
                self._notes.append(
                    f"RFOptuna: trial {trial.number} (run {i + 1}) asked for the config of trial {earlier.number} "
                    f"(run {earlier.number + 1}) again; both train (n_initial={self.n_initial} trials start at "
                    "once; a smaller n_initial or a wider search space avoids it)"
                )
        self._run_of.update({t.number: i + 1 for i, t in enumerate(stored[: self.n_initial])})
        self._run_of.update({trial.number: run_id for run_id, trial in self._trials.items()})
        return leaves

    def restore_added(self, added: Mapping[int, Mapping[str, Any]]) -> dict[int, LeafConfig]:
        """A restarted kernel: the runs of the trials asked mid-experiment, rebuilt from their stored parameters.

        Args:
            added: run id -> the info its trial was added with (``{"source": "trial", "trial": <number>}``).

        Returns:
            run id -> its spec, for each run whose trial is in the study (``<experiment>/optuna.db``); a trial
            still RUNNING there is this search's again (reported and told as before). A RUNNING trial that no run
            holds (asked as the previous kernel died, before its run was recorded) is told FAIL: it counts
            against the budget, as every trial asked does.
        """
        optuna = self._optuna
        if self.study is None:
            return {}
        by_number = {t.number: t for t in self.study.trials}
        out: dict[int, LeafConfig] = {}
        for run_id, info in sorted(added.items()):
            number = info.get("trial")
            frozen = by_number.get(number) if isinstance(number, int) else None
            if frozen is None:
                continue
            out[run_id] = self._leaf(optuna.trial.FixedTrial(frozen.params))
            self._run_of[number] = run_id
            if frozen.state == optuna.trial.TrialState.RUNNING:
                self._trials.setdefault(run_id, optuna.trial.Trial(self.study, frozen._trial_id))
        held = {trial.number for trial in self._trials.values()} | {t.number for t in self._waiting}
        for number, frozen in sorted(by_number.items()):
            if frozen.state == optuna.trial.TrialState.RUNNING and number not in held:
                self.study.tell(number, state=optuna.trial.TrialState.FAIL)
                self._states[number] = "FAIL"
        return out

    def _leaf(self, trial: Any) -> LeafConfig:
        index = (
            trial.suggest_categorical("config", list(range(len(self.configs))))
            if len(self.configs) > 1
            else 0
        )
        config = self.configs[index]
        resolved = {name: _suggest(getattr(config, name), trial, name) for name in MODEL_FIELDS}
        return make_leaf(self.trainer_type, resolved, f"configs[{index}]")

    def _make_sampler(self, seed_offset: int = 0) -> Any:
        """The sampler, seeded with ``seed + seed_offset`` (the trials a restarted study holds already)."""
        samplers = self._optuna.samplers
        seed = self.seed + seed_offset
        if self.sampler == "tpe":
            return samplers.TPESampler(seed=seed, constant_liar=True, n_startup_trials=self.n_initial)
        if self.sampler == "random":
            return samplers.RandomSampler(seed=seed)
        try:
            import cmaes  # noqa: F401
        except ImportError:
            raise ConfigError(
                "RFOptuna: sampler='cmaes' needs the cmaes package: pip install cmaes"
            ) from None
        return samplers.CmaEsSampler(seed=seed)

    def _make_pruner(self) -> Any:
        pruners = self._optuna.pruners
        if self.pruner is None or len(self.objectives) > 1:
            return pruners.NopPruner()
        if (
            self.pruner == "median"
        ):  # Optuna compares with completed trials only: it prunes from the 2nd wave on
            return pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0)
        # brackets over the chunks of one epoch; running trials count at each rung (no wait for completed ones)
        return pruners.HyperbandPruner(
            min_resource=1, max_resource=max(2, self.num_chunks), reduction_factor=2
        )

    # ------------------------------------------------------------------ early-stopping policy
    def on_chunk(self, result: ChunkResult, runs: Sequence[RunState]) -> Decisions:
        return self._pending() + self._on_chunk(result, runs)

    def _pending(self) -> Decisions:
        """The notes expand() left, once."""
        notes, self._notes = tuple(self._notes), []
        return Decisions(notes=notes)

    def _on_chunk(self, result: ChunkResult, runs: Sequence[RunState]) -> Decisions:
        trial = self._trials.get(result.run_id)
        values = [result.value(m) for _, m in self.objectives]
        if trial is None or any(v is None for v in values):
            return Decisions()
        value = float(values[0])  # type: ignore[arg-type]
        self._last[result.run_id] = value
        if result.final:
            self._tell(result.run_id, values=[float(v) for v in values])  # type: ignore[arg-type]
            return self._replace()
        epoch_end = result.chunk % self.num_chunks == 0
        if len(self.objectives) > 1 or math.isnan(value) or (self.granularity == "epoch" and not epoch_end):
            return Decisions()
        step = result.chunk if self.granularity == "chunk" else result.chunk // self.num_chunks
        trial.report(value, step)
        if not trial.should_prune() or any(s.run_id == result.run_id and s.exempt for s in runs):
            return Decisions()
        total = next((s.total_chunks for s in runs if s.run_id == result.run_id), 0)
        reason = (
            f"pruned by Optuna's {self.pruner} pruner at chunk {result.chunk}/{total}: "
            f"{self.metric} {value:.4g} (trial {trial.number})"
        )
        self._tell(result.run_id, state="PRUNED")
        return Decisions(stops=(EarlyStop(result.run_id, result.chunk, reason),)) + self._replace()

    def on_change(self, runs: Sequence[RunState], changed: Sequence[RunState]) -> Decisions:
        out = self._pending()
        for s in changed:
            if s.run_id in self._trials and s.status in (
                RunStatus.FAILED,
                RunStatus.DELETED,
                RunStatus.COMPLETED,
            ):
                last = self._last.get(s.run_id)
                if s.status is RunStatus.COMPLETED and last is not None and len(self.objectives) == 1:
                    self._tell(s.run_id, values=[last])
                else:
                    self._tell(s.run_id, state="FAIL")
                out = out + self._replace()
        return out

    def on_added(self, run_id: int, new_run: NewRun) -> None:
        if self._waiting:
            self._trials[run_id] = self._waiting.pop(0)
            self._run_of[self._trials[run_id].number] = run_id

    def _tell(self, run_id: int, values: list[float] | None = None, state: str | None = None) -> None:
        trial = self._trials.pop(run_id)
        kind = self._optuna.trial.TrialState
        if values is not None:
            self.study.tell(trial, values if len(values) > 1 else values[0])
        else:
            self.study.tell(trial, state=getattr(kind, str(state)))
        self._states[trial.number] = "COMPLETE" if values is not None else str(state)

    def _replace(self) -> Decisions:
        """Ask the study for the next trial while the budget lasts; a trial that repeats the config of an earlier
        one is not trained again (:meth:`_settle_repeat`), and another is asked, up to ``_MAX_REPEATS`` times."""
        notes: list[str] = []
        for _ in range(_MAX_REPEATS):
            if len(self.study.trials) >= self.budget:
                return Decisions(notes=tuple(notes))
            trial = self.study.ask()
            leaf = self._leaf(trial)
            earlier = self._same_config(trial)
            if earlier is None:
                self._states[trial.number] = "RUNNING"
                self._waiting.append(trial)
                info = {"source": "trial", "trial": trial.number}
                return Decisions(new_runs=(NewRun(leaf, info),), notes=tuple(notes))
            notes.append(self._settle_repeat(trial, earlier))
        notes.append(
            f"RFOptuna: {_MAX_REPEATS} trials in a row asked for configs tried already; no new trial is asked "
            "(the search space looks exhausted: widen a Range or add List values to search further)"
        )
        return Decisions(notes=tuple(notes))

    def _same_config(self, trial: Any) -> Any:
        """The earliest other trial (not FAIL) with exactly ``trial``'s parameters, or None."""
        fail = self._optuna.trial.TrialState.FAIL
        for other in sorted(self.study.trials, key=lambda t: t.number):
            if other.number != trial.number and other.state != fail and other.params == trial.params:
                return other
        return None

    def _settle_repeat(self, trial: Any, earlier: Any) -> str:
        """Tell ``trial`` (a repeat of ``earlier``'s config) without training it, and say so.

        A COMPLETE earlier trial gives its values (Optuna's samplers then see the result twice, as they would
        had it been trained again: training is deterministic here); a PRUNED one makes it PRUNED; one still
        training makes it FAIL (its result is not known yet; samplers skip FAIL trials). Either way the trial
        counts against the budget: it is a trial the study asked.
        """
        state = self._optuna.trial.TrialState
        run = self._run_of.get(earlier.number)
        where = f"trial {earlier.number}" + (f" (run {run})" if run is not None else "")
        head = f"RFOptuna: trial {trial.number} asked for the config of {where} again; not trained twice"
        if earlier.state == state.COMPLETE:
            self.study.tell(trial, earlier.values if len(earlier.values) > 1 else earlier.values[0])
            self._states[trial.number] = "COMPLETE"
            shown = ", ".join(
                f"{m} {v:.4g}" for (_, m), v in zip(self.objectives, earlier.values, strict=False)
            )
            return f"{head}: given its result ({shown})"
        if earlier.state == state.PRUNED:
            self.study.tell(trial, state=state.PRUNED)
            self._states[trial.number] = "PRUNED"
            return f"{head}: pruned as it was"
        self.study.tell(trial, state=state.FAIL)
        self._states[trial.number] = "FAIL"
        return f"{head}: that one is still training (this trial is told FAIL)"

    def progress(self) -> dict[str, Any]:
        """``{"label", "kind": "search", "name": "Optuna", "trials", "budget", "pruned", "running"}``: trials
        asked so far (a restarted kernel counts the earlier ones), of the budget, and how many of them Optuna
        pruned / are still running (counted from what this search told the study; no database read)."""
        states = list(self._states.values())
        return {
            "label": self.describe(),
            "kind": "search",
            "name": "Optuna",
            "trials": len(states),
            "budget": self.budget,
            "pruned": states.count("PRUNED"),
            "running": states.count("RUNNING"),
        }

    def describe(self) -> str:
        objective = ", ".join(f"{d}:{m}" for d, m in self.objectives)
        return f"RFOptuna({objective}, {self.sampler}, pruner {self.pruner}, budget {self.budget})"

    def __repr__(self) -> str:
        return (
            f"RFOptuna(configs=<{len(self.configs)} RFModelConfig>, trainer_type={self.trainer_type!r}, "
            f"n_initial={self.n_initial}, budget={self.budget})"
        )
