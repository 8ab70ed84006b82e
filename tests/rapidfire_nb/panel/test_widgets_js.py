"""The panel's front-end modules: the one-module bundle anywidget gets; node unit tests of the reducer."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from rapidfire_nb.panel import RunPanel
from rapidfire_nb.panel.esm_bundle import EsmBundleError, bundle_esm

REPO = Path(__file__).resolve().parents[3]
WIDGETS = REPO / "widgets"
needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="node not installed")


def _write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder / "main.js"


def _node(script: str, cwd: Path) -> str:
    out = subprocess.run(
        ["node", "--input-type=module", "-e", script],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout


@needs_node
def test_bundle_inlines_siblings_once_in_dependency_order(tmp_path: Path) -> None:
    main = _write(
        tmp_path,
        {
            "a.js": 'import { twice } from "./b.js";\nconst hidden = 1;\n'
            "export function four() { return twice(2); }\n"
            "export const ONE = hidden;\n",
            "b.js": "const hidden = 2;\nexport function twice(x) { return x * hidden; }\n",
            "main.js": 'import { four, ONE as one } from "./a.js";\nimport {\n  twice,\n} from "./b.js";\n'
            "export { one };\nexport default { value: four() + twice(1) + one };\n",
        },
    )
    text = bundle_esm(main)
    assert text.count("const __rf_b = ") == 1 and text.index("__rf_b =") < text.index("__rf_a =")
    assert not re.search(r"^import\b", text, re.M)
    (tmp_path / "bundle.mjs").write_text(text)
    out = _node(
        "import('./bundle.mjs').then(m => console.log(JSON.stringify([m.default.value, m.one])))", tmp_path
    )
    assert json.loads(out) == [4 + 2 + 1, 1]  # each module keeps its own `hidden`


@pytest.mark.parametrize(
    ("files", "fragment"),
    [
        ({"main.js": 'import x from "./a.js";\n', "a.js": ""}, "only `import"),
        ({"main.js": 'import { x } from "./a.js";\n', "a.js": "export default 1;\n"}, "only declarations"),
        (
            {"main.js": 'import { x } from "./a.js";\n', "a.js": "const x = 1;\nexport { x };\n"},
            "only declarations",
        ),
        (
            {
                "main.js": 'import { x } from "./a.js";\n',
                "a.js": 'import { y } from "./main.js";\nexport const x = 1;\n',
            },
            "import cycle",
        ),
    ],
)
def test_bundle_refuses_what_it_does_not_inline(tmp_path: Path, files: dict[str, str], fragment: str) -> None:
    with pytest.raises(EsmBundleError, match=fragment):
        bundle_esm(_write(tmp_path, files))


@needs_node
def test_the_widget_bundle_is_one_working_module(tmp_path: Path) -> None:
    text = RunPanel._esm
    # _esm is synced with each panel's state and a notebook saved with widget state keeps it per panel (plotly.js,
    # 4.8 MB, must never be inlined): comments and indentation are stripped (esm_bundle.strip_comments)
    assert not re.search(r"^import\b", text, re.M) and len(text) < 100_000
    (tmp_path / "panel.mjs").write_text(text)
    out = _node(
        "import('./panel.mjs').then(m => console.log(JSON.stringify([typeof m.default.initialize,"
        " typeof m.default.render, m.fmtNum(2.5e-5), m.runColor(3)])))",
        tmp_path,
    )
    assert json.loads(out) == ["function", "function", "2.5e-5", "#e52592"]


@needs_node
@pytest.mark.parametrize(
    "name",
    [
        "state",
        "curves",
        "rank",
        "export",
        "compare",
        "table",
        "kind_metrics",
        "marks",
        "eta",
        "pull",
        "run_name",
        "plot_settings",
        "chunks_note",
    ],
)
def test_pure_front_end_modules_in_node(name: str) -> None:
    proc = subprocess.run(
        ["node", "--test", str(REPO / "tests" / "rapidfire_nb" / "js" / f"{name}.test.mjs")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "# fail 0" in proc.stdout


@needs_node
def test_front_end_statuses_and_ops_are_the_schedulers() -> None:
    from kernel_scheduler import OpKind, RunStatus

    out = _node(
        "import('./widgets/format.js').then(m => console.log(JSON.stringify([m.STATUSES, m.OPS])))", REPO
    )
    assert json.loads(out) == [[s.value for s in RunStatus], [k.value for k in OpKind]]
