"""One ES module text from the panel's sibling modules.

anywidget loads ``_esm`` as one module from a blob URL, where relative imports do not resolve. No npm, no
bundler: a fixed, small subset of module syntax is inlined.

The rules the widget modules (``widgets/*.js``) follow, checked here:

* sibling imports in one form only: ``import { a, b as c } from "./name.js";`` (the braces may span lines);
  no other static import;
* a module other than the entry exports only declarations: ``export function|async function|class|const|let
  name``; the entry module (``panel.js``) may also ``export default`` and ``export { ... };``.

Each imported module becomes ``const __rf_name = (() => { <its text>; return { <its exports> }; })();``
(its own scope, evaluated once, in dependency order) and each import a destructuring
``const { a, b: c } = __rf_name;``. Comments that start a line (``//`` lines, ``/* ... */`` blocks) and leading
indentation are left out of the bundle: it is saved with a notebook's widget state, so it stays small.
Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

__all__ = ["EsmBundleError", "bundle_esm", "strip_comments"]

_IMPORT = re.compile(r'^import\s*\{([^}]*)\}\s*from\s*"\./([A-Za-z0-9_-]+\.js)"\s*;?[ \t]*$', re.M)
_ANY_IMPORT = re.compile(r"^import\b(?!\s*\()", re.M)
_EXPORT_DECL = re.compile(r"^export\s+((?:async\s+)?function\*?|class|const|let)\s+([A-Za-z_$][\w$]*)", re.M)
_ANY_EXPORT = re.compile(r"^export\b.*$", re.M)
_NAME = re.compile(r"^[A-Za-z_$][\w$]*$")
_BLOCK_COMMENT = re.compile(r"^([ \t]*)/\*[\s\S]*?\*/[ \t]*", re.M)
_LINE_COMMENT = re.compile(r"^[ \t]*//.*\n", re.M)


def strip_comments(text: str) -> str:
    """``text`` without the comments that start a line (``//`` lines, ``/* ... */`` blocks; code after a block on
    its last line stays) and without leading indentation, except on lines that may continue a template literal
    (after a line with an odd number of backticks). Comments inside a line are kept (``//`` may be in a string)."""
    lines, inside = [], False
    for line in _LINE_COMMENT.sub("", _BLOCK_COMMENT.sub(lambda m: m.group(1), text)).split("\n"):
        lines.append(line if inside else line.lstrip(" \t"))
        if line.count("`") % 2:
            inside = not inside
    return "\n".join(lines)


class EsmBundleError(ValueError):
    """A widget module uses a form :func:`bundle_esm` does not inline (its message says which and where)."""


def _bindings(names: str, where: str) -> list[tuple[str, str]]:
    """``a, b as c`` -> ``[("a", "a"), ("b", "c")]`` (imported name, local name)."""
    out = []
    for part in (p.strip() for p in names.split(",")):
        if not part:
            continue
        imported, _, local = (s.strip() for s in part.partition(" as "))
        local = local or imported
        if not (_NAME.match(imported) and _NAME.match(local)):
            raise EsmBundleError(f"{where}: cannot read the import binding {part!r}")
        out.append((imported, local))
    return out


def _rewrite_imports(text: str, where: str, visit: Callable[[str], str]) -> str:
    """Replace each sibling import by a destructuring of the inlined module (``visit(file)`` inlines it)."""

    def one(match: re.Match[str]) -> str:
        var = visit(match.group(2))
        pairs = ", ".join(i if i == loc else f"{i}: {loc}" for i, loc in _bindings(match.group(1), where))
        return f"const {{ {pairs} }} = {var};"

    out = _IMPORT.sub(one, text)
    stray = _ANY_IMPORT.search(out)
    if stray:
        line = out[stray.start() : out.find("\n", stray.start())]
        raise EsmBundleError(f'{where}: only `import {{ ... }} from "./name.js";` is inlined, got {line!r}')
    return out


def _wrap(text: str, where: str, var: str) -> str:
    """A non-entry module as an immediately called function returning its exports."""
    names = [m.group(2) for m in _EXPORT_DECL.finditer(text)]
    body = _EXPORT_DECL.sub(lambda m: f"{m.group(1)} {m.group(2)}", text)
    stray = _ANY_EXPORT.search(body)
    if stray:
        raise EsmBundleError(
            f"{where}: a module other than the entry may export only declarations, got {stray.group(0)!r}"
        )
    return f"const {var} = (() => {{\n{body}\nreturn {{ {', '.join(names)} }};\n}})();\n"


def bundle_esm(entry: Path) -> str:
    """The ES module ``entry`` with its sibling modules inlined (see the module docstring for the rules).

    Args:
        entry: the entry module (``widgets/panel.js``); its imports are resolved in its folder.

    Returns:
        One module text: the inlined siblings in dependency order, then the entry with its exports.

    Raises:
        EsmBundleError: an unsupported import or export form, or an import cycle.
        OSError: a module cannot be read.
    """
    folder = entry.parent
    done: dict[str, str] = {}  # file name -> its variable
    parts: list[str] = []
    active: list[str] = []

    def visit(name: str) -> str:
        if name in done:
            return done[name]
        if name in active:
            raise EsmBundleError(f"import cycle: {' -> '.join([*active, name])}")
        active.append(name)
        text = _rewrite_imports(strip_comments((folder / name).read_text(encoding="utf-8")), name, visit)
        var = "__rf_" + re.sub(r"\W", "_", name.removesuffix(".js"))
        parts.append(_wrap(text, name, var))
        active.pop()
        done[name] = var
        return var

    active.append(entry.name)
    main = _rewrite_imports(strip_comments(entry.read_text(encoding="utf-8")), entry.name, visit)
    return "".join(parts) + main
