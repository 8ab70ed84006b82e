"""``run_fit``'s arguments on their way down: ``FitArgs`` (as given) and ``FitInputs`` (checked, derived once)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest


def _group() -> Any:
    from rapidfire_nb.automl import List, RFGridSearch, RFModelConfig, RFSFTConfig

    return RFGridSearch(
        List([RFModelConfig("tiny", training_args=RFSFTConfig(learning_rate=lr)) for lr in (1e-3, 1e-4)]),
        "SFT",
    )


def _rows(n: int) -> Any:
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [f"q{i}" for i in range(n)], "completion": ["a"] * n})


def test_fit_args_holds_exactly_run_fits_parameters() -> None:
    from rapidfire_nb import Experiment
    from rapidfire_nb.experiment.inputs import FitArgs

    params = list(inspect.signature(Experiment.run_fit).parameters.values())[1:]  # without self
    fields = dataclasses.fields(FitArgs)
    assert [p.name for p in params] == [f.name for f in fields]
    assert [p.kind is inspect.Parameter.KEYWORD_ONLY for p in params] == [f.kw_only for f in fields]
    for p, f in zip(params, fields):
        default = dataclasses.MISSING if p.default is inspect.Parameter.empty else p.default
        assert f.default == default, p.name


def test_fit_inputs_carries_the_columns_and_the_dataset_fingerprints() -> None:
    from rapidfire_nb.experiment.inputs import FitArgs, check_fit_inputs, column_names, dataset_fingerprint

    train, eval_ = _rows(8), _rows(3)
    inputs = check_fit_inputs(FitArgs(_group(), lambda cfg: None, train, eval_, num_chunks=2, seed=3))
    # the one field that differs between the runs
    assert inputs.columns == ("learning_rate",) == tuple(column_names(inputs.specs))
    assert inputs.train_data == dataset_fingerprint(train) and inputs.eval_data == dataset_fingerprint(eval_)
    assert inputs.meta() == {
        "num_chunks": 2,
        "seed": 3,
        "train_data": dataset_fingerprint(train),
        "eval_data": dataset_fingerprint(eval_),
        "eval_generation_samples": None,
    }
    no_eval = check_fit_inputs(FitArgs(_group(), lambda cfg: None, train, num_chunks=2, seed=3))
    assert no_eval.eval_data is None


def test_a_dataset_without_rows_to_count_is_named() -> None:
    from rapidfire_nb import ConfigError
    from rapidfire_nb.experiment.inputs import FitArgs, check_fit_inputs

    with pytest.raises(ConfigError, match="eval_dataset must be a datasets.Dataset, got int"):
        check_fit_inputs(FitArgs(_group(), lambda cfg: None, _rows(4), 5))
    with pytest.raises(ConfigError, match="train_dataset must be a datasets.Dataset, got object"):
        check_fit_inputs(FitArgs(_group(), lambda cfg: None, object()))
