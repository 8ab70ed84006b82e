"""Runs over several devices, the spec's side (issue 36): each run's width and sharding, the composite devices,
and the refusals made before anything is built."""

from __future__ import annotations

import json

import pytest

from rapidfire_nb.automl import RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.errors import ConfigError
from rapidfire_nb.spec.gangs import check_gangs, gang_tiles, run_width, sharding_of, with_run_fit_width
from rapidfire_nb.spec.leaf import LeafConfig
from rapidfire_nb.spec.packs import why_not_packed

FSDP = {"fsdp": "full_shard auto_wrap", "fsdp_config": {"auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}}


def _spec(num_gpus: int | None = None, trainer: str = "SFT", **training: object) -> LeafConfig:
    return LeafConfig(
        trainer_type=trainer, model_name="tiny", lora={"r": 4}, training=dict(training), num_gpus=num_gpus
    )


def test_width_and_sharding_follow_num_gpus_and_fsdp() -> None:
    assert (run_width(_spec()), sharding_of(_spec())) == (1, None)
    assert (run_width(_spec(1, **FSDP)), sharding_of(_spec(1, **FSDP))) == (1, None)
    assert (run_width(_spec(2)), sharding_of(_spec(2))) == (2, "ddp")
    assert (run_width(_spec(4, **FSDP)), sharding_of(_spec(4, **FSDP))) == (4, "fsdp")


def test_num_gpus_is_a_config_field_and_a_hyperparameter_only_when_set() -> None:
    plain, gang = _spec(), _spec(2)
    assert "num_gpus" not in plain.to_json() and "num_gpus" not in plain.fingerprint()
    assert json.loads(gang.fingerprint())["num_gpus"] == 2
    assert plain.hparams().get("num_gpus") is None and gang.hparams()["num_gpus"] == 2
    assert gang.with_changes({"num_gpus": 1}).num_gpus == 1
    specs = RFGridSearch(
        [
            RFModelConfig(
                model_name="tiny", peft_config=RFLoraConfig(r=4), training_args=RFSFTConfig(), num_gpus=2
            )
        ],
        trainer_type="SFT",
    ).expand(0)
    assert [s.num_gpus for s in specs] == [2]
    with pytest.raises(ConfigError, match="RFModelConfig.num_gpus must be a positive int"):
        RFModelConfig(model_name="tiny", num_gpus=0)


def test_run_fit_num_gpus_fills_only_the_configs_that_leave_it_out() -> None:
    specs = with_run_fit_width([_spec(), _spec(4)], 2)
    assert [s.num_gpus for s in specs] == [2, 4]
    assert [s.num_gpus for s in with_run_fit_width([_spec()], 1)] == [
        None
    ]  # rapidfireai's default: unchanged


def test_gangs_tile_the_devices_per_width_without_overlap_within_a_width() -> None:
    names = ("cpu:0", "cpu:1", "cpu:2", "cpu:3", "cpu:4")
    assert gang_tiles(names, [2]) == [("cpu:0+cpu:1", (0, 1)), ("cpu:2+cpu:3", (2, 3))]
    assert gang_tiles(names, [1, 3, 2, 3]) == [
        ("cpu:0+cpu:1", (0, 1)),
        ("cpu:2+cpu:3", (2, 3)),
        ("cpu:0+cpu:1+cpu:2", (0, 1, 2)),
    ]
    assert gang_tiles(names, [1]) == []


def test_a_gang_run_never_packs() -> None:
    assert why_not_packed(_spec(2), "SFT") == "num_gpus=2 (one run over several devices)"
    assert why_not_packed(_spec(), "SFT") is None


CPUS = ("cpu:0", "cpu:1")


def _reward(completions: list[object], **kwargs: object) -> list[float]:
    return [0.0] * len(completions)


def test_a_gang_on_ray_actors_is_accepted() -> None:
    """Ray trains gangs (a placement group of k bundles: tests/rapidfire_nb/devices/test_ray_gang.py)."""
    assert check_gangs([_spec(2, **FSDP)], CPUS, True, "ray") == (
        "runs over several devices: 1 (fsdp, 2 devices); gangs on cpu:0+cpu:1",
    )


def test_check_gangs_says_which_runs_shard_and_where() -> None:
    notes = check_gangs([_spec(), _spec(2, **FSDP), _spec(2)], CPUS, True, "local")
    assert notes == (
        "runs over several devices: 2 (fsdp, 2 devices), 3 (ddp, 2 devices); gangs on cpu:0+cpu:1",
    )
    assert check_gangs([_spec()], CPUS, True, "local") == ()
    assert check_gangs([_spec(None, **FSDP)], CPUS, True, "local") == (
        "run 1: training_args.fsdp='full_shard auto_wrap' applies with num_gpus > 1 (RFModelConfig(num_gpus=k) or "
        "run_fit(num_gpus=k)): this run trains on one device, unsharded",
    )


def test_fsdp_settings_are_checked_before_training_and_their_notes_said() -> None:
    seeds = {"fsdp": "full_shard auto_wrap", "fsdp_config": {"backward_prefetch": "backward_pre"}}
    notes = check_gangs([_spec(), _spec(2, **seeds)], CPUS, True, "local")
    assert notes[0].startswith(
        "run 2: training_args.fsdp_config backward_prefetch: FSDP1 settings, ignored by FSDP2"
    )
    assert notes[1] == "runs over several devices: 2 (fsdp, 2 devices); gangs on cpu:0+cpu:1"
    bad = _spec(2, fsdp="full_shard", fsdp_config={"auto_wrap_policy": "SIZE_BASED_WRAP"})
    with pytest.raises(ConfigError, match=r"^run 2: training_args.fsdp_config\['auto_wrap_policy'\]"):
        check_gangs([_spec(), bad], CPUS, True, "local")


@pytest.mark.parametrize(
    ("spec", "names", "workers", "backend", "message"),
    [
        (
            _spec(2),
            ("device",),
            False,
            "kernel",
            r"run 1: num_gpus=2 needs 2 devices but this run_fit trains on one device in the kernel process; "
            r"pass run_fit\(devices=2\) or more",
        ),
        (
            _spec(3),
            CPUS,
            True,
            "local",
            r"needs 3 devices but this run_fit trains on 2 devices \(cpu:0, cpu:1\)",
        ),
        (
            LeafConfig(trainer_type="GRPO", model_name="tiny", reward_funcs=(_reward,), num_gpus=2),
            CPUS,
            True,
            "local",
            r"run 1: num_gpus=2: GRPO full fine-tuning over several devices is not built yet \(its beta reference "
            r"model would not be sharded\); use LoRA",
        ),
        (
            LeafConfig(trainer_type="DPO", model_name="tiny", num_gpus=2),
            CPUS,
            True,
            "local",
            r"run 1: num_gpus=2: DPO full fine-tuning over several devices: the reference model is not sharded "
            r"yet; use LoRA",
        ),
        (
            LeafConfig(
                trainer_type="DPO", model_name="tiny", lora={"r": 4}, ref_model_name="other", num_gpus=2
            ),
            CPUS,
            True,
            "local",
            r"run 1: num_gpus=2 with ref_model_name / ref_model_kwargs: DPO's separate reference model is not "
            r"sharded over several devices yet; leave them out",
        ),
        (
            LeafConfig(
                trainer_type="SFT",
                model_name="tiny",
                model_kwargs={"quantization_config": {"load_in_4bit": True}},
                lora={"r": 4},
                num_gpus=2,
            ),
            CPUS,
            True,
            "local",
            "FSDP cannot shard a bitsandbytes-quantized base",
        ),
        (
            _spec(2, fsdp="full_shard", fsdp_config={"offload_params": True}),
            CPUS,
            True,
            "local",
            r"^run 1: num_gpus=2 with CPU offload \(fsdp 'offload' or fsdp_config\[\"offload_params\"\]\)",
        ),
    ],
)
def test_refusals_name_the_run_and_the_field(
    spec: LeafConfig, names: tuple[str, ...], workers: bool, backend: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        check_gangs([spec], names, workers, backend)


def test_dpo_lora_trains_over_a_gang() -> None:
    spec = LeafConfig(trainer_type="DPO", model_name="tiny", lora={"r": 4}, training=dict(FSDP), num_gpus=2)
    notes = check_gangs([spec], CPUS, True, "local")
    assert notes[-1] == "runs over several devices: 1 (fsdp, 2 devices); gangs on cpu:0+cpu:1"


def test_grpo_lora_trains_over_a_gang() -> None:
    spec = LeafConfig(
        trainer_type="GRPO",
        model_name="tiny",
        lora={"r": 4},
        reward_funcs=(_reward,),
        training=dict(FSDP),
        num_gpus=2,
    )
    notes = check_gangs([spec], CPUS, True, "local")
    assert notes[-1] == "runs over several devices: 1 (fsdp, 2 devices); gangs on cpu:0+cpu:1"


def test_offload_in_the_fsdp_string_is_refused_on_cpu_workers_before_training() -> None:
    with pytest.raises(ConfigError, match=r"^run 2: num_gpus=2 with CPU offload"):
        check_gangs([_spec(), _spec(2, fsdp="full_shard auto_wrap offload")], CPUS, True, "local")


def test_offload_is_allowed_on_gpus() -> None:
    spec = _spec(2, fsdp="full_shard", fsdp_config={"offload_params": True})
    assert check_gangs([spec], ("cuda:0", "cuda:1"), True, "local")[0].startswith("runs over several devices")


@pytest.mark.parametrize("field", ["use_vllm", "use_transformers_continuous_batching"])
def test_grpo_generation_that_ignores_synced_gpus_is_refused_over_a_gang(field: str) -> None:
    spec = LeafConfig(
        trainer_type="GRPO",
        model_name="tiny",
        lora={"r": 4},
        reward_funcs=(_reward,),
        training={**FSDP, field: True},
        num_gpus=2,
    )
    with pytest.raises(ConfigError, match=rf"^run 1: num_gpus=2 with {field}=True: a gang generates"):
        check_gangs([spec], CPUS, True, "local")


def test_a_clone_s_num_gpus_must_match_a_device_of_this_run_fit() -> None:
    from rapidfire_nb.devices.resolve import DevicePlan
    from rapidfire_nb.experiment.resources import check_clone_fits

    plan = DevicePlan("local", CPUS, (None, None), 1, widths=(2,), singles=True)
    check_clone_fits(_spec(2, **FSDP), None, plan, 1)  # the gang cpu:0+cpu:1
    check_clone_fits(_spec(), None, plan, 1)  # a single device
    with pytest.raises(ConfigError) as err:
        check_clone_fits(_spec(3, **FSDP), None, plan, 1)
    assert str(err.value).startswith(
        "the clone of run 1: num_gpus=3 needs 3 devices but this run_fit trains on 2"
    )
    gangs_only = DevicePlan("local", CPUS, (None, None), 1, widths=(2,), singles=False)
    with pytest.raises(ConfigError) as err:
        check_clone_fits(_spec(), None, gangs_only, 1)
    assert str(err.value) == (
        "the clone of run 1: num_gpus=1, but this run_fit trains runs on 2 device(s) at once (cpu:0, cpu:1; gangs: "
        "cpu:0+cpu:1); clone with num_gpus=2, or run_fit again with a config of num_gpus=1"
    )
    with pytest.raises(ConfigError, match=r"^the clone of run 1: num_gpus=2 with CPU offload"):
        check_clone_fits(_spec(2, fsdp="full_shard auto_wrap offload"), None, plan, 1)


def test_a_warm_clone_keeps_its_parent_s_sharding() -> None:
    from rapidfire_nb.training.kinds import warm_start_violations

    assert warm_start_violations({"num_gpus": 1, "fsdp_config": {}, "fsdp": "", "learning_rate": 1e-4}) == [
        "num_gpus",
        "fsdp_config",
        "fsdp",
    ]


def test_our_fsdp_message_comes_before_transformers_fsdp1_advice() -> None:
    with pytest.raises(ConfigError, match=r"^training_args.fsdp option 'hybrid_shard' exists only in FSDP1"):
        _spec(2, **FSDP).with_changes({"fsdp": "hybrid_shard"})
