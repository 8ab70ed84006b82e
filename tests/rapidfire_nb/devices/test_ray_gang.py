"""A gang on Ray: ``run_fit(devices=2, backend="ray")`` with ``num_gpus=2`` and ``fsdp`` on a local Ray (2 CPUs).

The gang's two ranks are two actors on a ``STRICT_PACK`` placement group of their own with 2 bundles (the only
group: no single-device run, so no bundle is reserved for one); the sharded LoRA run trains in 2 chunks and its
final adapter equals plain TRL sharded the same way under ``torch.distributed.run`` (both gloo on the CPU: 0.0);
``end()`` kills both actors and removes the group.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.rapidfire_nb.training._gang_launch import WEIGHTS
from tests.rapidfire_nb.training._gang_launch import check as _check
from tests.rapidfire_nb.training._gang_launch import max_diff as _max_diff
from tests.rapidfire_nb.training._gang_launch import spawn as _spawn
from tests.rapidfire_nb.training.test_sharding_fit import _group

ray = pytest.importorskip(
    "ray", reason='Ray is not installed (pip install "rapidfire_nb[ray]"; CI installs it)'
)

ROWS = 16  # 4 steps of 4 rows (2 per rank), 2 chunks of 2


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    """A local Ray with 2 CPUs for the module (as tests/rapidfire_nb/devices/test_ray.py), shut down after."""
    os.environ.setdefault("RAY_agent_register_timeout_ms", "120000")
    if ray.is_initialized():
        ray.shutdown()
    for attempt in (1, 2):  # Ray gives up after 30 s when its node is slow to register; once more then
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
            break
        except Exception:
            ray.shutdown()
            if attempt == 2:
                raise
    yield
    ray.shutdown()


def _groups() -> dict[str, dict[str, Any]]:
    """Placement group id -> Ray's row (``state``, ``strategy``, ``bundles``)."""
    from ray.util import placement_group_table

    return dict(placement_group_table())


def _dead(actor: Any) -> bool:
    try:
        ray.get(actor.ready.remote(), timeout=30)
    except ray.exceptions.RayActorError:
        return True
    return False


@pytest.fixture(scope="module")
def gang_on_ray(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model, tiny_sft_dataset

    root = tmp_path_factory.mktemp("raygang")
    exp = Experiment("ray-gang", experiment_path=root)
    exp.progress_lines = False
    started = time.monotonic()
    exp.run_fit(
        _group(),
        tiny_create_model,
        tiny_sft_dataset(ROWS),
        None,
        num_chunks=2,
        seed=0,
        devices=2,
        backend="ray",
    )
    fit_s = time.monotonic() - started
    info = exp.get_runs_info().set_index("run_id")
    pool = exp.session.executor
    gang = pool.member("cpu:0+cpu:1")
    actors = [rank.actor for rank in gang._ranks]
    groups_before = _groups()
    exp.end()
    return {
        "root": root,
        "info": info,
        "fit_s": fit_s,
        "devices": pool.devices,
        "actors": actors,
        "groups_before": groups_before,
        "groups_after": _groups(),
    }


def test_a_sharded_run_trains_on_a_gang_of_two_ray_actors_exactly(gang_on_ray: dict[str, Any]) -> None:
    from safetensors.torch import load_file

    info = gang_on_ray["info"]
    assert gang_on_ray["devices"] == ("cpu:0+cpu:1",)
    assert info.loc[1, "status"] == "COMPLETED", info.loc[1, "error"]
    assert info.loc[1, "chunks_done"] == 2 and info.loc[1, "completed_steps"] == ROWS // 4
    assert info.loc[1, "device"] == "cpu:0+cpu:1" and info.loc[1, "sharding"] == "fsdp"
    ours = load_file(os.path.join(info.loc[1, "checkpoint_dir"], WEIGHTS["lora"]))
    ref = gang_on_ray["root"] / "ref"
    _check(_spawn("plain", ref, rows=ROWS))  # plain TRL sharded the same way under torch.distributed.run
    assert _max_diff(ours, load_file(str(ref / "lora" / "plain" / WEIGHTS["lora"]))) == 0.0


def test_the_gang_has_a_strict_pack_group_of_two_bundles_and_end_leaves_nothing(
    gang_on_ray: dict[str, Any],
) -> None:
    created = {gid: row for gid, row in gang_on_ray["groups_before"].items() if row["state"] == "CREATED"}
    assert len(created) == 1  # the gang's own; none for single devices (every run is the gang's)
    ((gid, row),) = created.items()
    assert row["strategy"] == "STRICT_PACK"
    assert [dict(b) for b in row["bundles"].values()] == [{"CPU": 1.0}, {"CPU": 1.0}]
    assert gang_on_ray["groups_after"][gid]["state"] == "REMOVED"
    assert all(r["state"] == "REMOVED" for r in gang_on_ray["groups_after"].values())
    assert [_dead(actor) for actor in gang_on_ray["actors"]] == [True, True]
    deadline = time.monotonic() + 10  # the bundles' CPUs go back to the cluster (reported asynchronously)
    while ray.available_resources().get("CPU") != 2.0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("CPU") == 2.0


def test_a_gang_group_goes_when_its_last_rank_closed() -> None:
    """The bookkeeping a revive relies on: the dead ranks' close removes their group (a fresh one is made)."""
    from rapidfire_nb.devices.ray_backend import placement_group_for
    from rapidfire_nb.devices.ray_gangs import GangGroup

    group = GangGroup(placement_group_for([False, False], 1, strategy="STRICT_PACK"), 2)
    gid = group.group.id.hex()
    group.rank_closed()
    assert _groups()[gid]["state"] == "CREATED"  # one rank still holds it
    group.rank_closed()
    assert _groups()[gid]["state"] == "REMOVED" and group.group is None
    group.remove()  # a second removal does nothing
