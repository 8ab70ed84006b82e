"""What can be sent to a worker process, and the ConfigError naming what cannot (before any worker starts)."""

from __future__ import annotations

import subprocess
import sys
import threading
import types
from typing import Any

import pytest

from rapidfire_nb.errors import ConfigError
from rapidfire_nb.spec.bundles import GroupSettings, TrainingCallbacks


def _in_main(source: str, name: str, **globals_: Any) -> Any:
    """A function as if defined in a notebook cell (module ``__main__``), with these globals."""
    ns: dict[str, Any] = {"__name__": "__main__", **globals_}
    exec(source, ns)  # noqa: S102 - the test's stand-in for a notebook cell
    return ns[name]


def test_a_function_defined_in_main_travels_by_value() -> None:
    from rapidfire_nb.devices import ship, unship

    fn = _in_main("def create(config):\n    return (config['model_name'], 42)\n", "create")
    data = ship(fn, "create_model_fn")
    # loaded in a fresh interpreter where no __main__ defines it
    code = "import sys, cloudpickle; fn = cloudpickle.loads(sys.stdin.buffer.read()); print(fn({'model_name': 'x'}))"
    out = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, check=True)
    assert out.stdout.decode().strip() == "('x', 42)"
    assert unship(data)({"model_name": "y"}) == ("y", 42)


def test_a_loaded_model_in_the_closure_is_refused_naming_create_model_fn() -> None:
    import torch

    from rapidfire_nb.devices import ship

    model = torch.nn.Linear(2, 2)

    def outer() -> Any:
        def create_model(config: dict) -> Any:
            return model, None

        create_model.__module__ = "__main__"
        return create_model

    with pytest.raises(ConfigError) as info:
        ship(outer(), "create_model_fn")
    text = str(info.value)
    assert text.startswith("create_model_fn cannot be sent to a worker process: it refers to a loaded model")
    assert "torch.nn.Module Linear" in text and "`model` in the closure of create_model" in text
    assert "load the model inside create_model_fn" in text


def test_a_model_as_a_global_of_a_main_function_is_refused() -> None:
    import torch

    from rapidfire_nb.devices import ship

    fn = _in_main("def create(config):\n    return MODEL, None\n", "create", MODEL=torch.nn.Linear(2, 2))
    with pytest.raises(
        ConfigError, match=r"loaded model \(torch.nn.Module Linear\) \(global `MODEL` of create\)"
    ):
        ship(fn, "create_model_fn")


def test_a_lock_or_an_open_file_is_refused_and_other_pickling_errors_are_config_errors(tmp_path: Any) -> None:
    from rapidfire_nb.devices import ship

    fn = _in_main("def f(row):\n    with LOCK:\n        return row\n", "f", LOCK=threading.Lock())
    with pytest.raises(
        ConfigError, match=r"run 2's config cannot be sent .* a threading lock \(global `LOCK` of f\)"
    ):
        ship({"formatting_func": fn}, "run 2's config")
    with open(tmp_path / "x.txt", "w") as handle:
        g = _in_main("def g(row):\n    return FILE.name\n", "g", FILE=handle)
        with pytest.raises(ConfigError, match="an open file"):
            ship(g, "formatting_func")
    gen = (i for i in range(3))
    with pytest.raises(
        ConfigError, match=r"^create_model_fn cannot be sent .*pickling failed with TypeError"
    ):
        ship(_in_main("def h(c):\n    return next(G)\n", "h", G=gen), "create_model_fn")


def test_a_run_spec_with_its_functions_ships(tmp_path: Any) -> None:
    from rapidfire_nb.automl import RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
    from rapidfire_nb.devices import ship, unship

    fmt = _in_main("def fmt(row):\n    return {'text': row['q'] + '!'}\n", "fmt")
    leaf = RFGridSearch(
        RFModelConfig(
            model_name="tiny",
            peft_config=RFLoraConfig(r=4, target_modules=["q_proj"]),
            formatting_func=fmt,
            training_args=RFSFTConfig(learning_rate=1e-3),
        ),
        trainer_type="SFT",
    ).expand(1)[0]
    back = unship(ship(leaf, "run 1's config"))
    assert back.fingerprint() == leaf.fingerprint() and back.formatting_func({"q": "a"}) == {"text": "a!"}


def test_the_worker_executor_refuses_before_starting_a_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from rapidfire_nb.devices import WorkerExecutor, WorkerSettings, _process

    def no_process(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a worker process was started")

    monkeypatch.setattr(_process.subprocess, "Popen", no_process)
    fn = _in_main("def create(config):\n    return MODEL, None\n", "create", MODEL=torch.nn.Linear(2, 2))
    settings = WorkerSettings("cpu:0", GroupSettings("SFT", fn, 2, 0), "/nowhere", None, "/nowhere")
    with pytest.raises(ConfigError, match="^create_model_fn cannot be sent to a worker process"):
        WorkerExecutor(settings, TrainingCallbacks())


def test_a_create_model_fn_the_worker_cannot_load_is_a_config_error_at_start(tmp_path: Any) -> None:
    from rapidfire_nb.devices import WorkerExecutor, WorkerSettings

    module = types.ModuleType("only_in_this_kernel")  # importable here (sys.modules), not in the worker
    exec("def create(config):\n    return None, None\n", module.__dict__)  # noqa: S102
    sys.modules[module.__name__] = module
    try:
        fn = module.create
        settings = WorkerSettings("cpu:0", GroupSettings("SFT", fn, 2, 0), str(tmp_path), None, str(tmp_path))
        worker = WorkerExecutor(settings, TrainingCallbacks())
        try:
            with pytest.raises(
                ConfigError, match="create_model_fn could not be loaded in worker cpu:0: Module"
            ):
                worker.wait_ready()
        finally:
            worker.close()
        assert worker._proc.poll() is not None and not worker.alive("cpu:0")
    finally:
        del sys.modules[module.__name__]
