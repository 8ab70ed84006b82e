"""The house limits (docs/ARCHITECTURE.md, "Rooms"): sizes that keep each module one job.

In ``rapidfire_nb/`` and ``kernel_scheduler/``: ``kernel_scheduler/loop.py`` under 450 lines; no module over 500
lines; no class over 450 lines; no function over 60 lines (``def`` to its end, its docstring not counted); no
function with more than 10 parameters (``self``/``cls`` not counted) except the public ``Experiment.run_fit`` and
the config constructors in ``automl/`` that mirror TRL/PEFT. And no two test files share a basename (pytest
imports them by it).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rapidfire_nb", "kernel_scheduler")
MAX_CLASS_LINES = 450
MAX_LOOP_LINES = 450
MAX_PARAMETERS = 10
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
ALLOWED_WIDE = {("rapidfire_nb/experiment/facade.py", "run_fit")}  # the public drop-in signature


def _sources() -> list[tuple[str, ast.Module]]:
    out = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            out.append((path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(encoding="utf-8"))))
    return out


def test_loop_stays_small() -> None:
    lines = (ROOT / "kernel_scheduler" / "loop.py").read_text(encoding="utf-8").count("\n")
    assert lines < MAX_LOOP_LINES, (
        f"kernel_scheduler/loop.py has {lines} lines: move the new job into a helper"
    )


def test_no_class_over_the_limit() -> None:
    big = [
        f"{name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for name, tree in _sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.end_lineno is not None
        if node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES
    ]
    assert not big, f"classes over {MAX_CLASS_LINES} lines: {big}"


def test_no_function_with_more_than_ten_parameters() -> None:
    wide = []
    for name, tree in _sources():
        if name.startswith("rapidfire_nb/automl/"):
            continue  # RF*Config constructors mirror TRL/PEFT's arguments
        for node in ast.walk(tree):
            if (
                not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                or (name, node.name) in ALLOWED_WIDE
            ):
                continue
            args = node.args
            params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
            count = len(params) - (1 if params and params[0].arg in ("self", "cls") else 0)
            if count > MAX_PARAMETERS:
                wide.append(f"{name}:{node.lineno} {node.name} ({count} parameters)")
    assert not wide, f"functions over {MAX_PARAMETERS} parameters (bundle them in a frozen dataclass): {wide}"


def test_no_module_over_the_limit() -> None:
    big = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            lines = path.read_text(encoding="utf-8").count("\n")
            if lines > MAX_MODULE_LINES:
                big.append(f"{path.relative_to(ROOT).as_posix()} ({lines} lines)")
    assert not big, f"modules over {MAX_MODULE_LINES} lines (split by responsibility): {big}"


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from ``def`` to the function's end, its docstring not counted."""
    assert node.end_lineno is not None
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        assert first.end_lineno is not None
        lines -= first.end_lineno - first.lineno + 1
    return lines


def test_no_function_over_the_limit() -> None:
    long = [
        f"{name}:{node.lineno} {node.name} ({_body_lines(node)} lines)"
        for name, tree in _sources()
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and _body_lines(node) > MAX_FUNCTION_LINES
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (docstring excluded): {long}"


def test_test_files_have_unique_basenames() -> None:
    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(path.relative_to(ROOT).as_posix())
    twins = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not twins, f"test files sharing a basename (pytest's 'import file mismatch'): {twins}"
