"""List and Range: construction errors, sampling bounds, quantisation, reproducibility (no torch needed)."""

from __future__ import annotations

import math
import random

import pytest

from rapidfire_nb.automl import List, Range
from rapidfire_nb.errors import ConfigError


def test_list_is_iterable_and_sized():
    knob = List([1, 2, 3])
    assert list(knob) == [1, 2, 3]
    assert len(knob) == 3
    assert knob[1] == 2
    assert knob == List((1, 2, 3))


@pytest.mark.parametrize("bad", [[], "abc", {"a": 1}, 5])
def test_list_rejects_non_lists_and_empty(bad):
    with pytest.raises(ConfigError):
        List(bad)


def test_list_sample_is_reproducible():
    knob = List(["a", "b", "c", "d"])
    draws1 = [knob.sample(random.Random(3)) for _ in range(5)]
    draws2 = [knob.sample(random.Random(3)) for _ in range(5)]
    assert draws1 == draws2
    rng = random.Random(0)
    assert {knob.sample(rng) for _ in range(200)} == {"a", "b", "c", "d"}


def test_range_start_must_be_below_end():
    with pytest.raises(ConfigError, match=r"Range start must be < end, got start=5, end=5"):
        Range(5, 5)
    with pytest.raises(ConfigError, match="Range start must be < end"):
        Range(1e-3, 1e-5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"start": 0.0, "end": 1.0, "log": True}, "log=True"),
        ({"start": -1.0, "end": 1.0, "log": True}, "log=True"),
        ({"start": 0, "end": 10, "step": 0}, "step must be > 0"),
        ({"start": 0, "end": 10, "step": -2}, "step must be > 0"),
        ({"start": 1, "end": 10, "dtype": "complex"}, "dtype"),
        ({"start": 1.5, "end": 10, "dtype": "int"}, "whole-number"),
        ({"start": "a", "end": 10}, "numbers"),
        ({"start": 1e-5, "end": 1e-3, "log": True, "step": 1e-5}, "cannot be combined"),
    ],
)
def test_range_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Range(**kwargs)


def test_range_dtype_inference_and_aliases():
    assert Range(1, 10).dtype == "int"
    assert Range(1, 10.0).dtype == "float"
    assert Range(1.0, 10, dtype=int).dtype == "int"
    assert Range(1, 10, dtype=float).dtype == "float"


def test_range_int_samples_are_ints_in_bounds_and_cover_them():
    knob = Range(1, 4)
    rng = random.Random(0)
    draws = [knob.sample(rng) for _ in range(300)]
    assert all(type(v) is int for v in draws)
    assert set(draws) == {1, 2, 3, 4}


def test_range_log_sampling_spreads_over_decades():
    knob = Range(1e-5, 1e-1, log=True)
    rng = random.Random(1)
    draws = [knob.sample(rng) for _ in range(4000)]
    assert all(1e-5 <= v <= 1e-1 for v in draws)
    below = sum(v < 1e-3 for v in draws) / len(draws)
    assert 0.45 < below < 0.55  # half the log-interval; a uniform draw would give ~1%


def test_range_step_quantises():
    ints = Range(8, 64, step=8)
    rng = random.Random(2)
    draws = {ints.sample(rng) for _ in range(300)}
    assert draws == {8, 16, 24, 32, 40, 48, 56, 64}
    floats = Range(0.0, 1.0, step=0.25)
    fdraws = {floats.sample(rng) for _ in range(300)}
    assert fdraws == {0.0, 0.25, 0.5, 0.75, 1.0}
    odd = Range(0.1, 0.35, step=0.1)  # 0.1, 0.2, 0.3 (never above end)
    odraws = {odd.sample(rng) for _ in range(300)}
    assert odraws == {0.1, 0.2, 0.3}


def test_range_same_seed_same_draws():
    knob = Range(0.0, 1.0)
    a = [knob.sample(random.Random(11)) for _ in range(3)]
    b = [knob.sample(random.Random(11)) for _ in range(3)]
    c = knob.sample(random.Random(12))
    assert a == b
    assert not math.isclose(a[0], c)
