"""Trainer kinds: the registry, the warm-start rules, the defaults a new kind inherits, the model provider.

No model is built here (no torch, except in the subprocess that checks it stays unloaded).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from rapidfire_nb import schema
from rapidfire_nb.errors import ConfigError
from rapidfire_nb.spec import LeafConfig
from rapidfire_nb.training.kinds import KINDS, WARM_FORBIDDEN, TrainerKind, get_kind, warm_start_violations
from rapidfire_nb.training.kinds.dpo import reference_model
from rapidfire_nb.training.models import ModelProvider, SharedBase

ROOT = Path(__file__).resolve().parents[3]

#: the one list experiment.py held before the kinds owned their rules (behaviour must not change)
OLD_WARM_FORBIDDEN = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "seed",
    "num_generations",
    "max_length",
    "max_prompt_length",
    "max_completion_length",
    "packing",
    "lora.r",
    "lora.target_modules",
    "model_name",
    "steps_per_generation",
    "dataloader_drop_last",
    "group_by_length",
    "data_seed",
    "num_train_epochs",
    "generation_batch_size",
    "num_iterations",
)


def test_importing_the_kinds_loads_no_torch() -> None:
    code = (
        "import sys\n"
        "from rapidfire_nb.training.kinds import WARM_FORBIDDEN, get_kind\n"
        "get_kind('GRPO').warm_start_violations({'lora.r': 8})\n"
        "heavy = ('torch', 'transformers', 'trl', 'peft', 'datasets', 'accelerate')\n"
        "print(','.join(sorted(m for m in heavy if m in sys.modules)) or 'none')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
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


def test_registry_covers_the_schema_trainer_types() -> None:
    assert tuple(KINDS) == schema.TRAINER_TYPES
    for name, kind in KINDS.items():
        assert kind.name == name and get_kind(name.lower()) is kind
        assert kind.trainer_class_name == f"{name}Trainer"


def test_unknown_kind_is_a_config_error() -> None:
    with pytest.raises(
        ConfigError, match=r"trainer_type='ORPO' is not supported; use one of 'SFT', 'DPO', 'GRPO'"
    ):
        get_kind("ORPO")


def test_required_columns_and_extra_columns_per_kind() -> None:
    assert get_kind("SFT").required_columns == (("prompt", "completion"), ("messages",), ("text",))
    assert get_kind("DPO").required_columns == (("prompt", "chosen", "rejected"), ("chosen", "rejected"))
    assert get_kind("GRPO").required_columns == (("prompt",),)
    assert [k.keep_extra_columns for k in KINDS.values()] == [False, False, True]


# issue 36 added these: a gang's boundary is each rank's share, sharded for its num_gpus and plan
GANG_WARM_FORBIDDEN = ("num_gpus", "fsdp", "fsdp_config")


def test_warm_forbidden_over_all_kinds_is_the_old_list() -> None:
    assert sorted(WARM_FORBIDDEN) == sorted(OLD_WARM_FORBIDDEN + GANG_WARM_FORBIDDEN)
    assert len(set(WARM_FORBIDDEN)) == len(WARM_FORBIDDEN)


def test_warm_start_violations() -> None:
    changes = {"learning_rate": 1e-4, "lora.r": 8, "model_kwargs.dtype": "float32", "num_generations": 2}
    assert warm_start_violations(changes) == ["lora.r", "model_kwargs.dtype", "num_generations"]
    assert warm_start_violations({"learning_rate": 1e-4, "lora.lora_alpha": 16}) == []
    # per kind: only that kind's own rules (num_generations means nothing to SFT)
    assert warm_start_violations(changes, "SFT") == ["lora.r", "model_kwargs.dtype"]
    assert warm_start_violations(changes, "GRPO") == ["lora.r", "model_kwargs.dtype", "num_generations"]
    assert warm_start_violations({"packing": True}, "SFT") == ["packing"]


def test_a_new_kind_needs_only_its_names_and_inherits_sft_behaviour() -> None:
    class Incomplete(TrainerKind):
        name = "XYZ"

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()  # type: ignore[abstract]

    class ORPOLike(TrainerKind):
        name = "ORPO"
        trainer_class_name = "ORPOTrainer"
        required_columns = (("prompt", "chosen", "rejected"),)

    kind = ORPOLike()
    assert kind.trainer_kwargs(None, None, None, None) == {}  # type: ignore[arg-type]
    assert isinstance(kind.building(None, None), contextlib.nullcontext)
    assert kind.warm_start_violations({"seed": 1, "beta": 0.2}) == ["seed"]
    kind.precheck(None, None)  # type: ignore[arg-type]  # nothing to check by default


class _FakeModel:
    def __init__(self, name: str) -> None:
        self.name, self.training, self.frozen = name, True, False

    def eval(self) -> None:
        self.training = False

    def parameters(self) -> list[Any]:
        model = self

        class _P:
            def requires_grad_(self, flag: bool) -> None:
                model.frozen = not flag

        return [_P()]


class _FakeProvider(ModelProvider):
    """Records what a kind asks for; proves a kind needs no executor."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.cache: dict[Hashable, Any] = {}
        self.base = SharedBase(key="base-key", model=_FakeModel("base"), tokenizer=object())

    def create(self, model_config: dict[str, Any]) -> tuple[Any, Any]:
        self.created.append(model_config)
        return _FakeModel(model_config["model_name"]), object()

    def base_for(self, spec: LeafConfig, args: Any) -> SharedBase:
        return self.base

    def shared(self, key: Hashable, make: Callable[[], Any]) -> Any:
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]


def test_dpo_reference_comes_from_the_model_provider() -> None:
    provider = _FakeProvider()
    named = LeafConfig(trainer_type="DPO", model_name="tiny", ref_model_name="tiny-ref")
    ref = reference_model(named, _FakeModel("trained"), None, provider)
    assert ref is reference_model(named, _FakeModel("trained"), None, provider), "one per distinct reference"
    assert ref.name == "tiny-ref" and ref.frozen and not ref.training
    assert [c["model_name"] for c in provider.created] == ["tiny-ref"]
    assert provider.created[0]["peft_config"] is None
    full = LeafConfig(trainer_type="DPO", model_name="tiny")
    copy_of_base = reference_model(full, _FakeModel("trained"), None, provider)
    assert copy_of_base is not provider.base.model and copy_of_base.name == "base" and copy_of_base.frozen
    assert provider.base.model.training, "the shared base itself is untouched"

    class _Lora(_FakeModel):
        peft_config: ClassVar[dict[str, Any]] = {}

    assert reference_model(full, _Lora("peft"), None, provider) is None  # LoRA: the base, adapters off
    assert get_kind("DPO").trainer_kwargs(full, _Lora("peft"), None, provider) == {}
