"""How a run over several devices reads in the views (issue 36): the header lists a gang's devices as its parts,
each run's sharding comes from its stored config, and the memory check counts an FSDP run's share per device."""

from __future__ import annotations

import pytest

from rapidfire_nb.errors import ConfigError
from rapidfire_nb.experiment import resources
from rapidfire_nb.spec.leaf import LeafConfig
from rapidfire_nb.view.devices_view import device_list, placed_as, run_sharding

FSDP = {"fsdp": "full_shard auto_wrap"}


def test_the_header_lists_a_gang_by_its_parts() -> None:
    live = device_list(
        {"cpu:0": "idle", "cpu:1": "idle"}, {"cpu:0+cpu:1": 1, "cpu:0": 1, "cpu:1": 1}, ["cpu:0+cpu:1"]
    )
    assert live == [
        {"name": "cpu:0", "state": "training", "run_id": 1},
        {"name": "cpu:1", "state": "training", "run_id": 1},
    ]
    page = device_list({}, {}, ["cpu:2", "cpu:0+cpu:1"])  # the server page: from the store only
    assert [(d["name"], d["state"]) for d in page] == [("cpu:0", "—"), ("cpu:1", "—"), ("cpu:2", "—")]


@pytest.mark.parametrize(
    ("config", "sharding"),
    [
        (LeafConfig(trainer_type="SFT", model_name="m", training=FSDP, num_gpus=2).to_json(), "fsdp"),
        (LeafConfig(trainer_type="SFT", model_name="m", num_gpus=2).to_json(), "ddp"),
        (LeafConfig(trainer_type="SFT", model_name="m", training=FSDP).to_json(), None),  # one device
        ({"model_name": "m", "training": {}}, None),  # stored before num_gpus existed
        (None, None),
        ({"num_gpus": True}, None),
    ],
)
def test_sharding_is_read_from_the_stored_config(config: object, sharding: str | None) -> None:
    assert run_sharding(config) == sharding
    assert placed_as({"packs": {"3": 3}}, 3, config) == {"pack": 3, "sharding": sharding}


def test_an_fsdp_run_needs_its_share_of_memory_on_each_device(monkeypatch: pytest.MonkeyPatch) -> None:
    def spec(num_gpus: int | None, **training: object) -> LeafConfig:
        return LeafConfig(trainer_type="SFT", model_name="tiny", training=dict(training), num_gpus=num_gpus)

    need = resources._estimate(spec(None))[1].memory_bytes  # full fine-tuning of the tiny model
    free = int(need * 0.7) + resources.MEMORY_MARGIN_BYTES
    monkeypatch.setattr(resources, "free_memory", lambda devices: (free, "CPU RAM"))
    with pytest.raises(ConfigError, match=r"optimizer state \(139,584 trainable parameters: [^)]*\); in all"):
        resources.check_group_fits([spec(None)], None, None)
    with pytest.raises(ConfigError):  # DDP: a whole replica on each device
        resources.check_group_fits([spec(2)], None, None)
    resources.check_group_fits([spec(2, **FSDP)], None, None)  # half of it on each of 2 devices
    with pytest.raises(
        ConfigError, match=r", sharded over 3 devices: ~[\d.]+ [KM]B on each\); in all on one device"
    ):
        monkeypatch.setattr(
            resources, "free_memory", lambda devices: (resources.MEMORY_MARGIN_BYTES, "CPU RAM")
        )
        resources.check_group_fits([spec(3, **FSDP)], None, None)


def test_get_runs_info_shows_a_gang_s_num_gpus_and_sharding_beside_runs_that_leave_it_out(
    tmp_path: object,
) -> None:
    """A hyperparameter some runs leave out (num_gpus of a gang beside one-device runs) reads None, its ints stay
    ints (not 2.0 beside a NaN); sharding is None, never NaN, for the one-device runs."""
    from pathlib import Path

    from rapidfire_nb.experiment.tables import runs_table
    from tests.rapidfire_nb.server._stores import make_experiment

    store = make_experiment(Path(str(tmp_path)), "gangs")
    try:
        configs = {
            1: LeafConfig(trainer_type="SFT", model_name="m", training=FSDP, num_gpus=2),
            2: None,
            3: None,
        }
        for rid, leaf in configs.items():
            leaf = leaf or LeafConfig(trainer_type="SFT", model_name="m")
            store.upsert_run(rid, config=leaf.to_json(), hparams=leaf.hparams())
        store.update_meta({"hparam_columns": ["num_gpus"]})
        table = runs_table(store, {}, [], False)
        assert table["num_gpus"].tolist() == [2, None, None] and table["num_gpus"].dtype == object
        assert table["sharding"].tolist() == ["fsdp", None, None]
        assert "NaN" not in repr(table) and "2.0" not in repr(table)
    finally:
        store.close()
