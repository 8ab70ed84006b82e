"""The text views of an experiment (issue 37): ``get_runs_info()`` and ``%rapidfire status`` show a stop reason whole
(pandas cut it to "...not in th..."), ``%rapidfire list`` has no 0-based index, ``%rapidfire status`` marks a pruned
run PRUNED and gives chunks as done/total with a line saying why a run's total is not a whole number of epochs'.
Stores written directly (no training, no kernel)."""

from __future__ import annotations

import pickle
import re
import types
import weakref
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from IPython.core.error import UsageError

from rapidfire_nb import magic
from rapidfire_nb.experiment import registry
from rapidfire_nb.experiment.frames import ListFrame, RunsFrame
from rapidfire_nb.experiment.tables import runs_table
from rapidfire_nb.store import Store
from rapidfire_nb.view.text import cut_at_word, format_chunk_line
from tests.rapidfire_nb.server._stores import make_experiment

PRUNE = "pruned at chunk 2/8: eval_loss 2.71 not in the best 4 of 8 at this rung (cutoff 2.43)"
BULK = "stop all but best 1 by eval_loss"


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = make_experiment(tmp_path, "views", statuses={1: "STOPPED", 2: "STOPPED", 3: "COMPLETED"}, epochs=1)
    s.add_op("p1", "stop", 1, {"reason": PRUNE, "chunk": 2}, source="early_stopping", state="applied")
    s.add_op("b2", "stop", 2, {"reason": BULK}, source="panel", state="applied")
    yield s
    s.close()


def test_cut_at_word() -> None:
    assert cut_at_word("short", 10) == "short"
    assert cut_at_word("stop all but best 2 by eval_loss", 20) == "stop all but best…"
    assert cut_at_word("x" * 30, 10) == "x" * 9 + "…"  # no space in its second half: at the limit
    assert all(len(cut_at_word("a b " * 40, n)) <= n for n in (5, 17, 60))


def test_get_runs_info_shows_a_stop_reason_whole_and_keeps_every_value(store: Store) -> None:
    table = runs_table(store, {}, [], False)
    assert isinstance(table, RunsFrame) and isinstance(table, pd.DataFrame)
    assert list(table.stop_reason) == [PRUNE, BULK, None]
    with pd.option_context("display.max_columns", None, "display.width", 400):  # every column, as a notebook
        text = repr(table)
    html = table._repr_html_() or ""
    assert PRUNE in text and BULK in text and "not in th..." not in text
    assert PRUNE in html and "(cutoff 2.43)</td>" in html
    assert "{'model_name': 'tiny', 'rid': 1, 'training'…" in text  # config cut as pandas did, at a word
    assert table.config[0] == {"model_name": "tiny", "rid": 1, "training": {"num_train_epochs": 1}}
    derived = table.drop(columns=["config"]).set_index("run_id")
    assert isinstance(derived, RunsFrame) and PRUNE in repr(derived)
    assert table.attrs["best_by"]["metric"] == "eval_loss"
    assert isinstance(pickle.loads(pickle.dumps(table)), RunsFrame)


def test_status_marks_pruned_runs_and_gives_chunks_done_of_total(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = [
        {"run_id": 1, "status": "STOPPED", "pruned": True, "num_segments": 4},
        {"run_id": 2, "status": "STOPPED", "pruned": False, "num_segments": 1, "total_steps": 4},
        {"run_id": 3, "status": "COMPLETED", "num_segments": 4},
    ]
    exp = types.SimpleNamespace(
        panel_snapshot=lambda: {"runs": runs, "num_chunks": 2, "early_stopping": None},
        get_runs_info=lambda: runs_table(store, {}, [], False),
    )
    df = magic._status(exp)  # type: ignore[arg-type]
    assert list(df.status) == ["PRUNED", "STOPPED", "COMPLETED"]  # PRUNED is a mark: the API keeps STOPPED
    assert list(df.chunks) == ["1/4", "4/1", "0/4"] and "chunks_done" not in df.columns
    assert list(df.columns[:6]) == ["status", "loss", "eval_loss", "step", "chunks", "epoch"]
    assert list(df.step) == ["3/12", "12/12", "0/12"]
    assert PRUNE in repr(df) and df.loc[2, "stop_reason"] == BULK
    out = capsys.readouterr().out
    assert out == (
        "[rapidfire] run 2: 1 chunk in all, with 2 chunks per epoch: its step budget (4 steps: max_steps, or a "
        "fractional num_train_epochs) ends in chunk 1/2 of epoch 1\n"
    )
    # a clone not built yet has no budget: "–", as the panel shows it
    unbuilt = runs_table(store, {}, [], False).assign(total_steps=[12, 12, 0])
    exp.get_runs_info = lambda: unbuilt
    assert list(magic._status(exp).step) == ["3/12", "12/12", "–"]  # type: ignore[arg-type]


def test_list_has_no_zero_based_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("alpha", "beta"):
        make_experiment(tmp_path, name).close()
    monkeypatch.setenv("RF_HOME", str(tmp_path))
    # only $RF_HOME: experiments other tests left live in this process add their roots to the list
    monkeypatch.setattr(registry, "live_roots", lambda: [])
    df = magic._list_experiments()
    assert isinstance(df, ListFrame) and list(df.experiment) == ["alpha", "beta"]  # still a column
    first = repr(df).splitlines()[1]
    assert first.split()[0] == "alpha"  # no "0" before it
    html = df._repr_html_() or ""
    assert re.search(r"<tbody>\s*<tr>\s*<td>alpha</td>", html) and "<th>0</th>" not in html


def test_a_chunk_line_of_a_later_epoch_names_it() -> None:
    run = {"run_id": 2, "status": "ONGOING", "chunks_done": 5, "completed_steps": 50, "total_steps": 80}
    # was "chunk 5/4"
    assert format_chunk_line(run, num_chunks=4) == "run 2  chunk 1/4 of epoch 2  step 50/80"
    assert format_chunk_line({**run, "chunks_done": 3}, num_chunks=4) == "run 2  chunk 3/4  step 50/80"


def test_list_and_e_name_look_under_this_kernels_experiment_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fresh-user pass: with Experiment(..., experiment_path=ROOT) in the kernel, %rapidfire list was empty and
    -e NAME said 'no experiment named ... under <the default root>'."""
    from rapidfire_nb import Experiment

    mine, default = tmp_path / "mine", tmp_path / "default"
    for name in ("alpha", "beta"):
        make_experiment(mine, name).close()
    make_experiment(default, "gamma").close()
    monkeypatch.setenv("RF_HOME", str(default))
    # only this test's experiments: others that tests left live in this process add their roots to the list
    monkeypatch.setattr(registry, "_BY_PATH", weakref.WeakValueDictionary())
    monkeypatch.setattr(registry, "_BY_NAME", weakref.WeakValueDictionary())
    monkeypatch.setattr(registry, "_CURRENT", [None])
    exp = Experiment("alpha", experiment_path=mine)
    try:
        df = magic._list_experiments()
        assert list(df.experiment) == ["alpha", "beta", "gamma"]  # this kernel's root first, then $RF_HOME
        assert list(df.root) == [str(mine), str(mine), str(default)]
        beta = magic._find_experiment("beta")
        assert beta.path == mine / "beta"
        with pytest.raises(UsageError, match=f"no experiment named 'delta' under {mine} or {default}"):
            magic._find_experiment("delta")
        beta.end()
    finally:
        exp.end()


def test_a_text_column_beside_none_prints_none_never_nan() -> None:
    """pandas 3 infers its str dtype when mapping texts beside None, which prints NaN (a one-device run's
    ``sharding`` beside a gang's ``fsdp``)."""
    table = RunsFrame(
        [{"run_id": 1, "sharding": "fsdp"}, {"run_id": 2, "sharding": None}], columns=["run_id", "sharding"]
    )
    table["sharding"] = table["sharding"].astype(object).where(table["sharding"].notna(), None)
    assert "NaN" not in repr(table) and repr(table).splitlines()[-1].split() == ["1", "2", "None"]
    assert "NaN" not in table._repr_html_() and "<td>None</td>" in table._repr_html_()
    assert table["sharding"].tolist() == ["fsdp", None]  # the values themselves unchanged
