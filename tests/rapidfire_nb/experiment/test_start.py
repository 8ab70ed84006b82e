"""Opening a run_fit against what the experiment already holds (no torch: a real Store, specs faked)."""

from __future__ import annotations

from pathlib import Path

from rapidfire_nb.store import Store


def test_a_different_config_group_names_the_fields_that_differ(tmp_path: Path) -> None:
    import types

    import pytest

    from rapidfire_nb import ExperimentError
    from rapidfire_nb.experiment.start import check_group

    store = Store(tmp_path / "exp")
    stored = {"model_name": "tiny", "training_args": {"max_steps": 48, "learning_rate": 1e-3}}
    store.upsert_run(1, status="INTERRUPTED", config=stored, hparams={})
    store.set_meta("fingerprint", "stored-group")
    given = {"model_name": "tiny", "training_args": {"max_steps": 40, "learning_rate": 1e-3}}
    inputs = types.SimpleNamespace(
        fingerprint="given-group", specs=(types.SimpleNamespace(to_json=lambda: given),)
    )
    with pytest.raises(  # was: "already holds a different config group (1 runs)" and nothing more
        ExperimentError, match=r"\(1 runs; run 1: training_args.max_steps is 48 there, 40 here\)"
    ):
        check_group("crash", store, inputs, trained_here=False)  # type: ignore[arg-type]
    store.close()
