"""``rapidfireai``'s ``run_fit(..., num_gpus, monte_carlo_simulations)``: accepted with their meaning, or refused
before anything is built (``num_gpus`` below 1; a gang wider than the devices: ``test_gang_specs.py``). No training here: every call ends at a
check (``num_chunks=0`` stops an accepted call right after the two arguments passed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb.errors import ConfigError
from rapidfire_nb.experiment import compat


@pytest.fixture
def exp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from rapidfire_nb import Experiment

    monkeypatch.setattr(compat, "_NOTED", set())  # this test's process has said nothing yet
    e = Experiment("compat", experiment_path=tmp_path)
    said: list[str] = []
    e.on_message(said.append)
    e.said = said
    yield e
    e.end()


def _fit(exp: Any, *args: Any, **kwargs: Any) -> None:
    """run_fit with stand-ins for the group, the model function and the rows: every call here ends at a check
    made before any of them is used."""
    exp.run_fit(object(), lambda config: None, [{"text": "row"}], None, *args, background=True, **kwargs)


def test_rapidfireai_positional_arguments_are_accepted(exp: Any) -> None:
    with pytest.raises(ConfigError, match="num_chunks must be an integer from 1 to"):
        _fit(exp, 0, 42, 1, 1000)  # num_chunks, seed, num_gpus, monte_carlo_simulations
    assert exp.said == [
        "[rapidfire] monte_carlo_simulations=1000 has no effect in rapidfire_nb: the runs take turns on one "
        "device in a fixed fairness order (the run furthest behind trains next), so there is no schedule to "
        "simulate"
    ]
    with pytest.raises(ConfigError, match="num_chunks"):
        _fit(exp, 0, num_gpus=None, monte_carlo_simulations=50)
    assert len(exp.said) == 1  # said once


@pytest.mark.parametrize("num_gpus", [0, -1])
def test_num_gpus_below_one_is_refused_before_training(exp: Any, num_gpus: int) -> None:
    with pytest.raises(ConfigError) as err:
        _fit(exp, 2, 42, num_gpus)
    text = str(err.value)
    assert text.startswith("num_gpus must be a positive int (the devices each run trains on at once)")
    assert f"got int {num_gpus}; leave it out or pass num_gpus=1" in text
    assert exp.store.runs() == [] and exp.session is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"num_gpus": "1"},
            r"num_gpus must be a positive int \(the devices each run trains on at once\), got str '1'",
        ),
        ({"num_gpus": True}, "num_gpus must be a positive int .* got bool True"),
        ({"num_gpus": 1.0}, "num_gpus must be a positive int .* got float 1.0"),
        ({"monte_carlo_simulations": 0}, "monte_carlo_simulations must be a positive int, got 0"),
        ({"monte_carlo_simulations": "many"}, "monte_carlo_simulations must be a positive int, got 'many'"),
    ],
)
def test_wrong_types_name_the_argument(exp: Any, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _fit(exp, 2, **kwargs)
    assert exp.said == []


def test_num_shards_is_rapidfireai_s_newer_name_for_num_chunks(exp: Any) -> None:
    """Issue 34 item 10: rapidfireai 0.16.2 renamed run_fit(num_chunks=) to num_shards=; it was a bare TypeError."""
    with pytest.raises(ConfigError, match="num_chunks must be an integer from 1 to"):
        _fit(
            exp, num_chunks=10**9, num_shards=10**9
        )  # taken as num_chunks: refused by the chunk check, so it reached it
    assert exp.said == [
        "[rapidfire] num_shards=1000000000 is rapidfireai's newer name for num_chunks: 1000000000 chunks per epoch "
        "(rapidfire_nb calls them chunks)"
    ]
    with pytest.raises(ConfigError, match="num_chunks must be an integer from 1 to"):
        _fit(exp, num_shards=10**9)  # the same knob under its new name alone
    assert len(exp.said) == 1  # said once
    with pytest.raises(
        ConfigError, match=r"num_shards=0: it is the number of chunks per epoch \(num_chunks\)"
    ):
        _fit(exp, num_shards=0)  # named as given, before any note
    with pytest.raises(ConfigError, match=r"num_chunks=6 and num_shards=8: both name the chunks per epoch"):
        _fit(exp, 6, num_shards=8)
    with pytest.raises(ConfigError, match="num_shards must be an int"):
        _fit(exp, num_shards="8")


def test_num_shards_sets_the_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "_NOTED", set())
    assert compat.chunks_from_shards(4, None) == (4, None)
    assert compat.chunks_from_shards(4, 8)[0] == 8
    assert compat.chunks_from_shards(8, 8) == (8, None)  # noted once per process
