"""Every store meta key lives in rapidfire_nb.meta_keys: no module names one as a string literal."""

from __future__ import annotations

import ast
from pathlib import Path

from rapidfire_nb import meta_keys

ROOT = Path(__file__).resolve().parents[2]
_META_CALLS = {"get_meta", "set_meta"}


def test_all_holds_every_key_once() -> None:
    keys = {name: getattr(meta_keys, name) for name in meta_keys.__all__ if name != "ALL"}
    assert set(keys.values()) == meta_keys.ALL
    assert len(set(keys.values())) == len(keys) == 24
    assert meta_keys.CLOCK == "clock" and meta_keys.ENDED_AT == "ended_at"  # stored names never change


def _literal_uses(path: Path, root: Path = ROOT) -> list[str]:
    """``get_meta("x")`` / ``set_meta("x", ...)`` / ``meta.get("x")`` with ``x`` a meta key, and dict displays passed
    to ``update_meta`` with such a literal key."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        attr, owner = node.func.attr, node.func.value
        literals: list[ast.expr] = []
        if attr in _META_CALLS or (attr == "get" and isinstance(owner, (ast.Name, ast.Attribute))):
            if attr == "get" and (ast.unparse(owner).split(".")[-1] != "meta"):
                continue
            literals = node.args[:1]
        elif attr == "update_meta" and node.args and isinstance(node.args[0], ast.Dict):
            literals = [k for k in node.args[0].keys if k is not None]
        for arg in literals:
            if isinstance(arg, ast.Constant) and arg.value in meta_keys.ALL:
                out.append(f"{path.relative_to(root)}:{node.lineno} {ast.unparse(node)[:80]}")
    return out


def test_no_module_spells_a_meta_key() -> None:
    found = [use for path in sorted((ROOT / "rapidfire_nb").rglob("*.py")) for use in _literal_uses(path)]
    assert found == [], "use rapidfire_nb.meta_keys:\n" + "\n".join(found)


def test_the_scan_sees_a_literal(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        'def f(store, meta, d):\n    store.get_meta("clones")\n    store.update_meta({"seed": 1})\n'
        '    d.get("clones")\n    return meta.get("ended_at")\n'
    )
    uses = [u.split(" ", 1)[1] for u in _literal_uses(probe, tmp_path)]
    assert sorted(uses) == [
        "meta.get('ended_at')",
        "store.get_meta('clones')",
        "store.update_meta({'seed': 1})",
    ]
