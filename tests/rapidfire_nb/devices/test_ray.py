"""``run_fit(devices=2, backend="ray")`` on a local Ray (``ray.init(num_cpus=2)``): two actors, runs exact.

One experiment: 3 LoRA runs on the tiny model, 3 chunks, ``create_model_fn`` defined as in a notebook cell
(``__main__``: shipped by value); every final adapter equals a plain ``SFTTrainer(...).train()``, the runs are
spread over ``cpu:0`` and ``cpu:1``, and ``end()`` kills the actors and removes the placement group. A second one
where an actor is killed (``ray.kill``) in the middle of a chunk: its run continues on the other actor and ends
exact.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import adapter_from_folder, max_abs_diff, metric_points, qa_dataset, train_plain_trl
from tests.rapidfire_nb.devices.test_devices_engine import _group

ray = pytest.importorskip(
    "ray", reason='Ray is not installed (pip install "rapidfire_nb[ray]"; CI installs it)'
)

SEED = 7


def _main_create() -> Any:
    """A create_model_fn defined as in a notebook cell (module ``__main__``: cloudpickle sends it by value)."""
    ns: dict[str, Any] = {"__name__": "__main__"}
    exec(  # noqa: S102 - the test's stand-in for a notebook cell
        "def create_model(config):\n"
        "    from rapidfire_nb.testing import tiny_create_model\n"
        "    return tiny_create_model(config)\n",
        ns,
    )
    fn = ns["create_model"]
    assert fn.__module__ == "__main__"
    return fn


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    """A local Ray with 2 CPUs for the module, its workers' output kept out of the test's (shut down after)."""
    # a loaded machine starts Ray's Python agents slowly: give the raylet longer than its default to see them
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


def _groups() -> dict[str, str]:
    """Placement group id -> state (``CREATED``, ``REMOVED``...)."""
    from ray.util import placement_group_table

    return {gid: row["state"] for gid, row in placement_group_table().items()}


def _dead(actor: Any) -> bool:
    try:
        ray.get(actor.ready.remote(), timeout=30)
    except ray.exceptions.RayActorError:
        return True
    return False


@pytest.fixture(scope="module")
def two_actors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model

    root = tmp_path_factory.mktemp("ray")
    train, evald = qa_dataset(24, seed=0), qa_dataset(6, seed=1)
    group = _group([6, 2, 6], [1e-3, 1e-3, 5e-4])  # runs 1, 3: 4 steps; run 2: 12
    exp = Experiment("ray-devices", experiment_path=root)
    started = time.monotonic()
    exp.run_fit(group, _main_create(), train, evald, num_chunks=3, seed=SEED, devices=2, backend="ray")
    fit_s = time.monotonic() - started
    info = exp.get_runs_info()
    pool = exp.session.executor
    actors = [pool.member(device).actor for device in pool.devices]
    groups_before = _groups()
    exp.end()
    refs = {
        rid: train_plain_trl(leaf, tiny_create_model, train, evald, SEED, root / f"plain-{rid}")
        for rid, leaf in enumerate(group.expand(SEED), start=1)
    }
    return {
        "info": info,
        "refs": refs,
        "fit_s": fit_s,
        "devices": pool.devices,
        "groups_before": groups_before,
        "groups_after": _groups(),
        "dead_after": [_dead(actor) for actor in actors],
    }


def test_three_runs_on_two_ray_actors_equal_plain_trl(two_actors: dict[str, Any]) -> None:
    assert two_actors["devices"] == ("cpu:0", "cpu:1")
    info = two_actors["info"].set_index("run_id")
    assert list(info.status) == ["COMPLETED"] * 3, info[["status", "error"]]
    assert set(info.device) == {"cpu:0", "cpu:1"}
    diffs = {
        rid: max_abs_diff(adapter_from_folder(info.loc[rid, "checkpoint_dir"]), ref.final)
        for rid, ref in two_actors["refs"].items()
    }
    assert diffs == {1: 0.0, 2: 0.0, 3: 0.0}


def test_end_kills_the_actors_and_removes_the_placement_group(two_actors: dict[str, Any]) -> None:
    created = [gid for gid, state in two_actors["groups_before"].items() if state == "CREATED"]
    assert len(created) == 1
    assert two_actors["groups_after"][created[0]] == "REMOVED"
    assert two_actors["dead_after"] == [True, True]
    deadline = time.monotonic() + 10  # the bundles' CPUs go back to the cluster (reported asynchronously)
    while ray.available_resources().get("CPU") != 2.0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("CPU") == 2.0


def test_a_killed_actor_hands_its_run_to_the_other_and_it_ends_exact(tmp_path: Any) -> None:
    from rapidfire_nb import Experiment
    from rapidfire_nb.testing import tiny_create_model
    from tests.helpers import slow_create_model

    train, evald = qa_dataset(24, seed=0), qa_dataset(6, seed=1)
    group = _group([2, 2], [1e-3, 5e-4])  # 12 steps each, chunks of 4
    exp = Experiment("ray-killed", experiment_path=tmp_path)
    exp.run_fit(
        group,
        slow_create_model,
        train,
        evald,
        num_chunks=3,
        seed=SEED,
        devices=2,
        backend="ray",
        background=True,
    )
    victim = exp.session.executor.member("cpu:1")
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # run 2 (cpu:1) inside its second chunk
        snap = exp.session.scheduler.run_snapshot(2)
        if snap is not None and snap.on_device and snap.segments_done == 1:
            if (exp.session.recorder.live_step(2) or 0) > 4:
                break
        time.sleep(0.05)
    else:
        pytest.fail("run 2 never reached its second chunk")
    ray.kill(victim.actor)
    assert exp.wait(timeout=300)
    info = exp.get_runs_info().set_index("run_id")
    losses = [(p["run_id"], p["step"]) for p in metric_points(exp, "loss")]
    exp.end()
    assert not victim.alive() and "died" in (victim._death or "")
    assert list(info.status) == ["COMPLETED", "COMPLETED"], info[["status", "error"]]
    assert list(info.device) == ["cpu:0", "cpu:0"]
    # what run 2 logged after its checkpoint, before the kill, was dropped: every step once
    assert sorted(losses) == sorted(set(losses)) and len([k for k in losses if k[0] == 2]) == 12
    for rid, leaf in enumerate(group.expand(SEED), start=1):
        ref = train_plain_trl(leaf, tiny_create_model, train, evald, SEED, tmp_path / f"plain-{rid}")
        assert max_abs_diff(adapter_from_folder(info.loc[rid, "checkpoint_dir"]), ref.final) == 0.0, (
            f"run {rid}"
        )
    assert all(state == "REMOVED" for state in _groups().values())
