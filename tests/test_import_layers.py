"""The import direction of ``rapidfire_nb`` and ``kernel_scheduler``, read from the source with ``ast``.

Every import counts: module level, inside functions and methods, under ``if TYPE_CHECKING:`` and in
``try``/``except``; relative imports are resolved. ``from pkg import name`` counts as importing the module
``pkg.name`` when that is a module, else ``pkg``. Importing ``a.b.c`` counts as importing ``a.b.c`` only (not its
parent packages, which Python also runs: every module would otherwise import ``rapidfire_nb/__init__``).
Imports built from strings (``importlib.import_module``) are not seen.

Checks:

* **No cycle** between modules (a package's ``__init__`` is the module named like the package).
* **Layers**: each module belongs to a *unit* (``kernel_scheduler``, the ``rapidfire_nb`` root, or
  ``rapidfire_nb.<first name>``: ``rapidfire_nb.training.kinds.base`` is in ``rapidfire_nb.training``, and
  ``rapidfire_nb.experiment`` is one unit whether a module or a package). A unit may import only units of a
  lower rank in ``RANKS``; two units of the same rank may not import each other (``automl`` and ``training``).
  A unit missing from ``RANKS`` gets ``DEFAULT_RANK`` (just below ``experiment``). Besides: ``kernel_scheduler``
  imports only the standard library, and ``server`` only ``SERVER_MAY_IMPORT`` plus jupyter_server/tornado;
  ``devices`` imports ``training`` and torch only on the worker side (``devices._child``'s functions,
  ``devices._ray_actor``'s methods).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rapidfire_nb", "kernel_scheduler")

# Arrows point down: errors -> schema -> spec -> {automl, training} -> experiment -> magic/server.
RANKS: dict[str, int] = {
    "kernel_scheduler": 0,
    "rapidfire_nb.errors": 0,
    "rapidfire_nb._version": 0,
    "rapidfire_nb._atomic": 0,
    "rapidfire_nb.redact": 0,
    "rapidfire_nb.meta_keys": 0,  # every store meta key (stdlib only)
    "rapidfire_nb.schema": 1,
    "rapidfire_nb.paths": 1,
    "rapidfire_nb._writer_lock": 1,
    "rapidfire_nb.run_folder": 1,
    "rapidfire_nb.frontend": 0,
    "rapidfire_nb._priority": 0,
    "rapidfire_nb._quiet_logs": 0,  # the bitsandbytes line hidden at import (stdlib only)
    "rapidfire_nb.tracking": 1,
    "rapidfire_nb.spec": 2,
    "rapidfire_nb.store": 2,
    "rapidfire_nb.automl": 3,
    "rapidfire_nb.training": 3,
    "rapidfire_nb.data": 3,
    "rapidfire_nb.view": 2,  # snapshot, text, clock, stops, wire: stdlib + kernel_scheduler + schema.trainer_kinds
    "rapidfire_nb.devices": 4,  # workers; training only on their side (_child, _ray_actor: below)
    "rapidfire_nb.panel": 4,  # the live panel, its static copy, the text progress, the ES bundler
    "rapidfire_nb.testing": 5,
    "rapidfire_nb.experiment": 6,
    "rapidfire_nb.magic": 7,
    "rapidfire_nb.server": 7,
    "rapidfire_nb": 8,  # the package root: re-exports Experiment
}
DEFAULT_RANK = 5  # a new module: may import what lies below the experiment layer; experiment may import it

SERVER_MAY_IMPORT = frozenset(
    {
        "rapidfire_nb.server",
        "rapidfire_nb.store",
        "rapidfire_nb.view",
        "rapidfire_nb.redact",
        "rapidfire_nb.meta_keys",
        "rapidfire_nb.paths",
        "rapidfire_nb.errors",
        "rapidfire_nb._version",
        "kernel_scheduler",
    }
)
SERVER_THIRD_PARTY = frozenset({"jupyter_server", "tornado", "traitlets"})  # traitlets: ExtensionApp's config


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported module (ours, resolved), or a top-level third-party/stdlib name
    line: int
    where: str  # "module level" or "in <function>"

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} (line {self.line}, {self.where})"


def _modules() -> dict[str, tuple[Path, bool]]:
    """``{dotted name: (path, is_package)}`` of every module of ``PACKAGES``."""
    out: dict[str, tuple[Path, bool]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


MODULES = _modules()


def _ours(name: str) -> str | None:
    """The longest known module prefix of ``name``, or ``None`` for a name outside ``PACKAGES``."""
    if name.split(".")[0] not in PACKAGES:
        return None
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


class _Collector(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool) -> None:
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.scope: list[str] = []
        self.found: list[Import] = []

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def _add(self, target: str, node: ast.stmt) -> None:
        where = f"in {'.'.join(self.scope)}()" if self.scope else "module level"
        self.found.append(Import(self.module, _ours(target) or target.split(".")[0], node.lineno, where))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")
            base = base[: len(base) - (node.level - 1)]
            module = ".".join([*base, *([node.module] if node.module else [])])
        else:
            module = node.module or ""
        if module == "__future__":
            return
        for alias in node.names:
            sub = f"{module}.{alias.name}"
            self._add(sub if sub in MODULES else module, node)


def _imports() -> list[Import]:
    found: list[Import] = []
    for name, (path, is_package) in MODULES.items():
        collector = _Collector(name, is_package)
        collector.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        found.extend(collector.found)
    return found


IMPORTS = _imports()
INTERNAL = [i for i in IMPORTS if i.target in MODULES and i.target != i.source]


def unit(module: str) -> str:
    """The layer unit of a module: ``kernel_scheduler``, ``rapidfire_nb`` or ``rapidfire_nb.<first name>``."""
    parts = module.split(".")
    if parts[0] == "kernel_scheduler":
        return "kernel_scheduler"
    return ".".join(parts[:2])


def rank(u: str) -> int:
    return RANKS.get(u, DEFAULT_RANK)


def _cycles(edges: dict[str, dict[str, Import]]) -> Iterator[list[Import]]:
    """One cycle (as its imports) per strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(MODULES):
        if v not in index:
            visit(v)
    for component in components:
        yield _cycle_in(component, edges)


def _cycle_in(component: list[str], edges: dict[str, dict[str, Import]]) -> list[Import]:
    """A shortest cycle through the component's first module (breadth-first back to it)."""
    members, start = set(component), component[0]
    came: dict[str, Import] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w, imp in sorted(edges.get(v, {}).items()):
                if w not in members:
                    continue
                if w == start:
                    path = [imp]
                    while path[0].source != start:
                        path.insert(0, came[path[0].source])
                    return path
                if w not in came:
                    came[w] = imp
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle found in component {component}")  # pragma: no cover


def _edges() -> dict[str, dict[str, Import]]:
    edges: dict[str, dict[str, Import]] = {}
    for imp in INTERNAL:
        edges.setdefault(imp.source, {}).setdefault(imp.target, imp)
    return edges


def test_the_walk_sees_the_packages() -> None:
    assert {"rapidfire_nb", "rapidfire_nb.spec", "rapidfire_nb.schema", "kernel_scheduler.loop"} <= set(
        MODULES
    )
    # a function-level and a relative import are both seen
    assert any(
        i.source == "rapidfire_nb" and i.target == "rapidfire_nb.magic" and i.where.startswith("in ")
        for i in IMPORTS
    )
    assert any(
        i.source == "rapidfire_nb.training.executor" and i.target == "rapidfire_nb.training.worker"
        for i in IMPORTS
    )


def test_no_import_cycle_between_modules() -> None:
    cycles = list(_cycles(_edges()))
    assert not cycles, "import cycles:\n" + "\n".join(
        "  " + "\n    ".join(str(i) for i in cycle) for cycle in cycles
    )


def test_no_import_cycle_between_units() -> None:
    edges: dict[str, dict[str, Import]] = {}
    for imp in INTERNAL:
        a, b = unit(imp.source), unit(imp.target)
        if a != b:
            edges.setdefault(a, {}).setdefault(b, imp)
    seen = [
        f"{a} <-> {b}: {imp} / {edges[b][a]}"
        for a, targets in sorted(edges.items())
        for b, imp in sorted(targets.items())
        if a < b and a in edges.get(b, {})
    ]
    assert not seen, "units importing each other:\n  " + "\n  ".join(seen)


def test_units_import_only_lower_layers() -> None:
    bad = []
    for imp in INTERNAL:
        a, b = unit(imp.source), unit(imp.target)
        if a != b and rank(b) >= rank(a):
            bad.append(f"{imp}  [{a} rank {rank(a)} may not import {b} rank {rank(b)}]")
    assert not bad, "imports against the layer order (see RANKS):\n  " + "\n  ".join(bad)


@pytest.mark.parametrize(
    "a, b",
    [("rapidfire_nb.automl", "rapidfire_nb.training"), ("rapidfire_nb.training", "rapidfire_nb.automl")],
)
def test_automl_and_training_never_import_each_other(a: str, b: str) -> None:
    bad = [str(i) for i in INTERNAL if unit(i.source) == a and unit(i.target) == b]
    assert not bad, f"{a} imports {b}:\n  " + "\n  ".join(bad)


def test_kernel_scheduler_imports_only_the_standard_library() -> None:
    bad = [
        str(i)
        for i in IMPORTS
        if unit(i.source) == "kernel_scheduler"
        and unit(i.target) != "kernel_scheduler"
        and i.target not in sys.stdlib_module_names
    ]
    assert not bad, "kernel_scheduler imports outside the standard library:\n  " + "\n  ".join(bad)


def test_server_imports_only_store_view_wire_paths_and_jupyter_server() -> None:
    bad = []
    for imp in IMPORTS:
        if unit(imp.source) != "rapidfire_nb.server":
            continue
        if imp.target in MODULES:
            if unit(imp.target) not in SERVER_MAY_IMPORT:
                bad.append(str(imp))
        elif imp.target not in sys.stdlib_module_names and imp.target not in SERVER_THIRD_PARTY:
            bad.append(str(imp))
    assert not bad, "the server extension imports more than it may:\n  " + "\n  ".join(bad)


WORKER_SIDE = {"rapidfire_nb.devices._child", "rapidfire_nb.devices._ray_actor"}  # run in the worker only


def test_devices_import_training_and_torch_only_inside_the_worker_entry_point() -> None:
    """``rapidfire_nb.devices`` is torch-free in the kernel: only the worker side (``_child``'s functions for a
    local worker, ``_ray_actor.Actor``'s methods for a Ray actor) imports the training layer or torch."""
    bad = [
        str(i)
        for i in IMPORTS
        if unit(i.source) == "rapidfire_nb.devices"
        and (unit(i.target) == "rapidfire_nb.training" or i.target == "torch")
        and (i.source not in WORKER_SIDE or i.where == "module level")
    ]
    assert not bad, "rapidfire_nb.devices imports torch / training outside the worker:\n  " + "\n  ".join(bad)


def test_the_rank_table_names_only_units_that_exist_or_are_planned() -> None:
    units = {unit(m) for m in MODULES}
    assert set(RANKS) <= units, sorted(set(RANKS) - units)
