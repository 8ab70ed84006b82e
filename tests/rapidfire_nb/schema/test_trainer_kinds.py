"""The trainer-kind table (``rapidfire_nb.schema.trainer_kinds``): it covers SFT, DPO and GRPO, agrees with the
installed TRL (class names, which arguments each trainer takes), with the training kinds and the user's config
wrappers, and every reader derives its answer from it.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rapidfire_nb import schema
from rapidfire_nb.automl.configs import TRAINER_CONFIG_CLASSES
from rapidfire_nb.errors import ConfigError
from rapidfire_nb.schema.trainer_kinds import TRAINER_KINDS, TRAINER_TYPES, TrainerKindFacts, trainer_kind
from rapidfire_nb.spec import REF_MODEL_TRAINERS, REWARD_FUNCS_TRAINERS
from rapidfire_nb.training.kinds import KINDS

ROOT = Path(__file__).resolve().parents[3]


def _trainer_arguments(facts: TrainerKindFacts) -> set[str]:
    import trl

    return set(inspect.signature(getattr(trl, facts.trainer_class_name).__init__).parameters)


def test_the_table_covers_sft_dpo_and_grpo_in_order() -> None:
    assert TRAINER_TYPES == ("SFT", "DPO", "GRPO") == tuple(TRAINER_KINDS) == schema.TRAINER_TYPES
    assert [(k.config_class_name, k.trainer_class_name) for k in TRAINER_KINDS.values()] == [
        ("SFTConfig", "SFTTrainer"),
        ("DPOConfig", "DPOTrainer"),
        ("GRPOConfig", "GRPOTrainer"),
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        TRAINER_KINDS["SFT"].takes_reward_funcs = True  # type: ignore[misc]


def test_the_lookup_takes_any_case_and_names_the_choices_for_an_unknown_kind() -> None:
    assert trainer_kind(" grpo ") is TRAINER_KINDS["GRPO"]
    assert schema.normalize_trainer_type("dpo") == "DPO"
    for bad in ("ORPO", None, 3):
        with pytest.raises(
            ConfigError, match=rf"trainer_type must be one of 'SFT', 'DPO', 'GRPO', got {bad!r}"
        ):
            trainer_kind(bad)


def test_the_config_classes_are_trls_and_the_schemas() -> None:
    import trl

    for name, facts in TRAINER_KINDS.items():
        cls = getattr(trl, facts.config_class_name)
        assert schema.trainer_config_class(name.lower()) is cls
        assert TRAINER_CONFIG_CLASSES[name].wrapped_class() is cls  # the user's wrapper builds the same class
    assert tuple(TRAINER_CONFIG_CLASSES) == TRAINER_TYPES


def test_the_training_kinds_name_the_same_trainers() -> None:
    assert tuple(KINDS) == TRAINER_TYPES
    assert {n: k.trainer_class_name for n, k in KINDS.items()} == {
        n: f.trainer_class_name for n, f in TRAINER_KINDS.items()
    }


@pytest.mark.parametrize("name", TRAINER_TYPES)
def test_the_flags_agree_with_what_each_trl_trainer_takes(name: str) -> None:
    import trl

    facts = trainer_kind(name)
    arguments = _trainer_arguments(facts)
    assert facts.takes_reward_funcs == ("reward_funcs" in arguments)
    assert facts.takes_compute_metrics == ("compute_metrics" in arguments)
    # a reference model: DPOTrainer takes one; GRPOTrainer takes none but builds its own for the KL term (beta)
    grpo_kl_term = name == "GRPO" and "beta" in schema.field_names(getattr(trl, facts.config_class_name))
    assert facts.has_reference_model == ("ref_model" in arguments or grpo_kl_term)
    assert facts.has_reference_model == (name != "SFT")


def test_the_readers_derive_their_answers_from_the_table() -> None:
    assert REWARD_FUNCS_TRAINERS == ("GRPO",)
    assert REF_MODEL_TRAINERS == ("DPO", "GRPO")
    assert [k.takes_compute_metrics for k in TRAINER_KINDS.values()] == [True, True, False]


def test_importing_the_table_loads_no_torch_or_trl() -> None:
    code = (
        "import sys\n"
        "from rapidfire_nb.schema.trainer_kinds import trainer_kind\n"
        "trainer_kind('SFT')\n"
        "heavy = ('torch', 'transformers', 'trl', 'peft')\n"
        "print(','.join(sorted(m for m in heavy if m in sys.modules)) or 'none')\n"
    )
    env: dict[str, Any] = dict(
        os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "none"
