"""A clone's rows tokenized off the device thread, so that building it does not hold the other runs (issue 34 item 5).

``TorchExecutor.prepare_run`` hands a clone (or a search's new trial) to :class:`RowPreparer`: its one builder
thread formats and tokenizes the run's rows while the device thread trains the other runs; the scheduler builds
the run (``add_run``: adapter, trainer) on the device thread once they are ready, and :meth:`RowPreparer.rows`
gives the trainer the tokenized rows instead of the raw ones. With a 20,000-row training set the tokenization is
most of a build (``benchmarks/clone_build_wait.py``).

Exact: the rows are TRL's own. The builder calls ``SFTTrainer._prepare_dataset`` (tokenize, labels, truncate, drop
fully masked rows) with the three attributes it reads set as ``SFTTrainer.__init__`` sets them, on a copy of the
base's tokenizer; the trainer then gets them with ``skip_prepare_dataset`` (its own preparation of rows that hold
``input_ids`` and ``labels`` would only truncate and filter again, which changes nothing). ``tests/rapidfire_nb/training/test_prepared_rows.py`` holds
the rows and a clone's final weights equal to the build on the device thread.

Safe: the builder thread touches no model, no adapter and no RNG (``datasets.map`` and the Rust tokenizer; the
tokenizer is copied, so the device thread's own is never used from two threads). The adapter attach and the
trainer's construction (which seeds torch's process-wide RNG) stay on the device thread, between segments.

Where it does nothing (``prepare`` returns None or the rows come back unprepared, and ``add_run`` tokenizes as
before, on the device thread): trainer kinds other than SFT (DPO and GRPO tokenize differently), packing,
``padding_free``, ``assistant_only_loss`` (a training chat template), ``dataset_kwargs``, a processor instead of a
tokenizer, a base not created yet (its tokenizer comes from ``create_model_fn``, which runs on the device thread),
and any unexpected error of the preparation (the device thread's build then reports it as it always did).
"""

from __future__ import annotations

import copy
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from rapidfire_nb.errors import ConfigError

from .quiet import silence_globally

__all__ = ["RowPreparer", "sft_rows"]

log = logging.getLogger(__name__)

#: ``(args, train rows, eval rows or None, tokenizer)`` -> tokenized ``(train, eval)``, or None (not here)
Tokenize = Callable[[Any, Any, Any, Any], "tuple[Any, Any] | None"]


@dataclass(frozen=True)
class _Ready:
    spec: Any
    train: Any
    eval: Any


class RowPreparer:
    """One builder thread and the rows it prepared, by run id.

    Args:
        inputs: ``(run_id, spec) -> (args, train rows, eval rows or None, tokenizer or None)``: the run's checked
            inputs and its base's tokenizer (None: the base does not exist yet). Raises ``ConfigError`` on bad
            input. Called on the builder thread.
        tokenize: the trainer kind's tokenization (:func:`sft_rows`), or None: nothing is prepared.

    Thread-safety: :meth:`start`, :meth:`discard` and :meth:`close` on the scheduler thread, :meth:`rows` on the
    device thread; the prepared rows are kept under a lock.
    """

    def __init__(
        self, inputs: Callable[[int, Any], tuple[Any, Any, Any, Any]], tokenize: Tokenize | None
    ) -> None:
        self._inputs = inputs
        self._tokenize = tokenize
        self._lock = threading.Lock()
        self._ready: dict[int, _Ready] = {}
        self._futures: dict[int, Future[None]] = {}
        self._jobs: queue.SimpleQueue[tuple[int, Any, Future[None]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.prepared = 0  # runs whose trainer got rows tokenized here (tests, benchmark)

    def start(self, run_id: int, spec: Any) -> Future[None] | None:
        """Prepare run ``run_id``'s rows on the builder thread; None when this trainer kind prepares nothing.

        The Future resolves once they are ready (also when they could not be: ``add_run`` then tokenizes them), or
        with the ``ConfigError`` bad input raises.
        """
        if self._tokenize is None:
            return None
        fut: Future[None] = Future()
        with self._lock:
            self._futures[run_id] = fut
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name="rapidfire-builder", daemon=True)
                self._thread.start()
        self._jobs.put((run_id, spec, fut))
        return fut

    def rows(self, run_id: int, spec: Any, train: Any, eval_rows: Any, args: Any) -> tuple[Any, Any]:
        """The rows run ``run_id``'s trainer gets: the tokenized ones prepared for this ``spec``, else the given.

        With prepared rows, the run's built TRL config ``args`` gets ``dataset_kwargs={"skip_prepare_dataset":
        True}``: the trainer's own preparation would only truncate and filter them again (a no-op that still walks
        every row: ~2 s of the device thread for 20,000 rows).
        """
        with self._lock:
            ready = self._ready.pop(run_id, None)
            self._futures.pop(run_id, None)
        if ready is None or ready.spec is not spec or args.dataset_kwargs:
            return train, eval_rows
        args.dataset_kwargs = {"skip_prepare_dataset": True}
        self.prepared += 1
        return ready.train, ready.eval

    def discard(self, run_id: int) -> None:
        """Run ``run_id`` will not be built (deleted): its preparation is cancelled if not begun, its rows dropped."""
        with self._lock:
            self._ready.pop(run_id, None)
            fut = self._futures.pop(run_id, None)
        if fut is not None:
            fut.cancel()

    def close(self) -> None:
        """Stop the builder thread after its current job (a daemon: a long tokenization never holds Python's exit)."""
        with self._lock:
            self._ready.clear()
            futures, self._futures = list(self._futures.values()), {}
        for fut in futures:
            fut.cancel()
        self._jobs.put(None)

    def _main(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            run_id, spec, fut = job
            if not fut.set_running_or_notify_cancel():
                continue  # deleted before it began
            try:
                ready = self._prepare(run_id, spec)
            except ConfigError as exc:  # bad input: the run fails with it, as add_run would say
                fut.set_exception(exc)
                continue
            except Exception:  # anything else: add_run tokenizes on the device thread and reports it there
                log.debug("rapidfire_nb: preparing run %s's rows failed", run_id, exc_info=True)
                ready = None
            if ready is not None:
                with self._lock:
                    if run_id in self._futures:  # not discarded meanwhile
                        self._ready[run_id] = ready
            fut.set_result(None)

    def _prepare(self, run_id: int, spec: Any) -> _Ready | None:
        assert self._tokenize is not None
        silence_globally()
        args, train, eval_rows, tokenizer = self._inputs(run_id, spec)
        if tokenizer is None:
            return None
        out = self._tokenize(args, train, eval_rows, copy.deepcopy(tokenizer))
        return None if out is None else _Ready(spec, out[0], out[1])


def sft_rows(args: Any, train: Any, eval_rows: Any, tokenizer: Any) -> tuple[Any, Any] | None:
    """``SFTTrainer``'s own preparation of ``train`` and ``eval_rows`` (rows after ``formatting_func``) for the
    built ``SFTConfig`` ``args``, outside a trainer; None where it is not done here (see the module).

    Raises:
        Whatever TRL's preparation raises (the caller falls back to the device thread's build).
    """
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase
    from trl import SFTTrainer

    plain = (
        not args.packing
        and not args.eval_packing
        and not getattr(args, "padding_free", False)
        and not args.assistant_only_loss
        and not args.dataset_kwargs
        and isinstance(tokenizer, PreTrainedTokenizerBase)
        and isinstance(train, Dataset)
        and (eval_rows is None or isinstance(eval_rows, Dataset))
    )
    if not plain:
        return None
    first = next(iter(train))
    stand_in = _SFTPreparation(
        _tokenizer=tokenizer,
        chat_template=None,  # SFTTrainer's, without assistant_only_loss
        completion_only_loss=(
            "prompt" in first and "completion" in first
            if args.completion_only_loss is None
            else args.completion_only_loss
        ),
    )
    prepare = SFTTrainer._prepare_dataset
    out_train = prepare(stand_in, train, tokenizer, args, False, None, "train")  # type: ignore[arg-type]
    out_eval = (
        None if eval_rows is None else prepare(stand_in, eval_rows, tokenizer, args, False, None, "eval")  # type: ignore[arg-type]
    )
    return out_train, out_eval


@dataclass
class _SFTPreparation:
    """What ``SFTTrainer._prepare_dataset`` reads from its trainer, set as ``SFTTrainer.__init__`` sets it."""

    _tokenizer: Any
    chat_template: Any
    completion_only_loss: bool
