"""``rapidfire_nb.training.sharding`` / ``gang`` in one process: the gang environment, the run's plan, the refusals
before anything is sharded, the spec a run's TRL config is built from (no process group is created here)."""

from __future__ import annotations

import pytest

from rapidfire_nb.errors import ConfigError
from rapidfire_nb.spec import LeafConfig
from rapidfire_nb.spec.fsdp import ShardingPlan
from rapidfire_nb.training.gang import training_spec
from rapidfire_nb.training.sharding import Gang, gang_env, join_gang, run_plan, shard_model

GANG_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "RF_GANG_TIMEOUT_S")
FSDP = {
    "fsdp": "full_shard auto_wrap",
    "fsdp_config": {"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]},
}


@pytest.fixture
def no_gang(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in GANG_VARS:
        monkeypatch.delenv(name, raising=False)


def _leaf(training: dict[str, object]) -> LeafConfig:
    return LeafConfig(trainer_type="SFT", model_name="tiny", lora={"r": 4}, training=training)


def test_a_process_without_gang_variables_is_no_rank(no_gang: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert gang_env() is None and join_gang() is None
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert gang_env() is None


def test_the_gang_environment_is_read(no_gang: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert gang_env() == Gang(rank=1, world_size=2, local_rank=1, timeout_s=60.0)  # never gloo's 30 minutes
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("RF_GANG_TIMEOUT_S", "12.5")
    assert gang_env() == Gang(rank=1, world_size=2, local_rank=0, timeout_s=12.5)
    monkeypatch.setenv("RF_GANG_TIMEOUT_S", "soon")
    with pytest.raises(ConfigError, match="RF_GANG_TIMEOUT_S"):
        gang_env()
    monkeypatch.setenv("RF_GANG_TIMEOUT_S", "10")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ConfigError, match="RANK=2"):
        gang_env()
    monkeypatch.delenv("RANK")
    with pytest.raises(ConfigError, match="RANK"):
        gang_env()


def test_run_plan_outside_a_gang(no_gang: None) -> None:
    assert run_plan(_leaf({})).sharding is None
    plan = run_plan(_leaf(FSDP))  # fsdp with one device: unsharded, said in a note
    assert plan.sharding is None and "unsharded" in plan.notes[0]


def test_a_gang_run_outside_its_gang_is_refused(no_gang: None, monkeypatch: pytest.MonkeyPatch) -> None:
    class Wide:  # a spec with num_gpus (LeafConfig's field), any version of it
        training = FSDP
        num_gpus = 2

    with pytest.raises(ConfigError, match="gang of 2 worker processes.*not a gang rank"):
        run_plan(Wide())
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match="a rank of a gang of 4"):
        run_plan(Wide())
    Wide.num_gpus = None  # type: ignore[assignment]
    assert run_plan(Wide()).sharding is None  # None: one device, even in a process with gang variables

    class Older:  # a spec type without the num_gpus field: the gang counts
        training = FSDP

    assert run_plan(Older()).num_gpus == 4


def test_the_trl_config_is_built_without_the_fsdp_fields() -> None:
    plain = _leaf({"learning_rate": 1e-3})
    assert training_spec(plain) is plain  # one-device runs: the very same spec
    stripped = training_spec(_leaf({"learning_rate": 1e-3, **FSDP}))
    assert stripped.training == {"learning_rate": 1e-3} and stripped.lora == {"r": 4}


def test_refusals_before_sharding() -> None:
    from rapidfire_nb.testing import tiny_model
    from rapidfire_nb.training.sharding import _units

    model = tiny_model()
    with pytest.raises(ConfigError, match="offload_params"):  # on the CPU, before any process group is needed
        shard_model(model, ShardingPlan(sharding="fsdp", num_gpus=2, offload_params=True))
    with pytest.raises(ConfigError, match=r"\['Nope'\] matches no module.*LlamaDecoderLayer"):
        _units(model, ShardingPlan(sharding="fsdp", num_gpus=2, layer_classes=("Nope",)))
    units = _units(model, ShardingPlan(sharding="fsdp", num_gpus=2))  # the model's _no_split_modules
    assert [type(u).__name__ for u in units] == ["LlamaDecoderLayer", "LlamaDecoderLayer"]
    assert _units(model, ShardingPlan(sharding="fsdp", num_gpus=2, wrap_policy="NO_WRAP")) == []
