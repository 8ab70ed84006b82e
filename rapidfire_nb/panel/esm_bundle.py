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
``const { a, b: c } = __rf_name;``. Comments (``//`` and ``/* ... */``, also after code on a line), indentation,
trailing blanks and empty lines are left out of the bundle (:func:`strip_comments`): ``_esm`` is a synced trait,
sent with each panel's widget state and kept for every panel by a notebook saved with widget state, so it stays
small.
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
#: In code, the characters where the scan stops: quotes, a template literal, a slash, a line end, braces.
_CODE_STOP = re.compile(r"['\"`/\n{}]")
#: Code line ends while scanning (never in a module's text): the lines around them are trimmed, empty ones dropped.
_EOL = "\x00"
#: Words and characters after which a ``/`` starts a regular expression literal (after anything else it divides).
_REGEX_AFTER_WORDS = frozenset(
    "return typeof case do else in of new delete void throw instanceof yield await".split()
)
_REGEX_AFTER = frozenset("(,=:[!&|?{};+-*%<>~^")


class _Scan:
    """One pass over a module: strings, template literals (``${...}`` nested) and regular expression literals are
    copied as they are; comments are dropped (a block comment that spans lines leaves a line end, for automatic
    semicolon insertion); then each code line loses its indentation and trailing blanks, and empty lines go."""

    def __init__(self, text: str, where: str) -> None:
        if _EOL in text:
            raise EsmBundleError(f"{where}: a NUL character")
        self.text, self.where, self.i = text, where, 0
        self.out: list[str] = []
        self.braces: list[int] = []  # per open `${`: the `{` depth inside it

    def fail(self, what: str) -> EsmBundleError:
        line = self.text.count("\n", 0, self.i) + 1
        return EsmBundleError(f"{self.where}:{line}: {what}")

    def run(self) -> str:
        text, n = self.text, len(self.text)
        while self.i < n:
            stop = _CODE_STOP.search(text, self.i)
            j = stop.start() if stop else n
            self.out.append(text[self.i : j])
            self.i = j
            if j < n:
                self.special(text[j], text[j + 1 : j + 2])
        lines = "".join(self.out).split(_EOL)
        return "\n".join(s for s in (line.strip(" \t") for line in lines) if s)

    def special(self, c: str, nxt: str) -> None:
        if c in "'\"":
            self.copy_until(c, f"an unterminated {c}string{c}")
        elif c == "`":
            self.out.append("`")
            self.i += 1
            self.template()
        elif c == "\n":
            self.out.append(_EOL)
            self.i += 1
        elif c == "/" and nxt == "/":
            end = self.text.find("\n", self.i)
            self.i = len(self.text) if end < 0 else end
        elif c == "/" and nxt == "*":
            end = self.text.find("*/", self.i + 2)
            if end < 0:
                raise self.fail("an unterminated /* comment")
            self.out.append(_EOL if "\n" in self.text[self.i : end] else " ")
            self.i = end + 2
        elif c == "/" and self.regex_may_start():
            self.copy_until("/", "an unterminated regular expression")
        elif c == "}" and self.braces and self.braces[-1] == 0:
            self.braces.pop()  # the end of a `${...}`: the template literal goes on
            self.out.append("}")
            self.i += 1
            self.template()
        else:
            if self.braces and c in "{}":
                self.braces[-1] += 1 if c == "{" else -1
            self.out.append(c)
            self.i += 1

    def copy_until(self, close: str, what: str) -> None:
        """Copy a string or regular expression literal (one line; ``\\`` escapes; a ``/`` in a class ``[...]``)."""
        text, j, in_class = self.text, self.i + 1, False
        while j < len(text) and text[j] != "\n":
            c = text[j]
            if c == "\\":
                j += 2
                continue
            if close == "/" and c in "[]":
                in_class = c == "["
            elif c == close and not in_class:
                self.out.append(text[self.i : j + 1])
                self.i = j + 1
                return
            j += 1
        raise self.fail(what)

    def template(self) -> None:
        """Copy a template literal's text up to its closing backtick, or up to a ``${`` (then code, until its ``}``)."""
        text, j = self.text, self.i
        while j < len(text):
            c = text[j]
            if c == "\\":
                j += 2
            elif c == "`" or text.startswith("${", j):
                end = j + (1 if c == "`" else 2)
                self.out.append(text[self.i : end])
                self.i = end
                if c != "`":
                    self.braces.append(0)
                return
            else:
                j += 1
        raise self.fail("an unterminated template literal")

    def regex_may_start(self) -> bool:
        """Whether a ``/`` here starts a regular expression literal, by the code before it."""
        k = len(self.out)
        while k and not self.out[k - 1].strip(" \t" + _EOL):
            k -= 1  # blanks and line ends
        before = "".join(self.out[max(0, k - 4) : k]).rstrip(" \t" + _EOL)
        if not before:
            return True
        if before.endswith(("++", "--")):
            return False
        if before[-1] in _REGEX_AFTER or before[-1] == "}":
            return True
        word = re.search(r"[\w$]+$", before)
        return bool(word) and word.group(0) in _REGEX_AFTER_WORDS


def strip_comments(text: str, where: str = "module") -> str:
    """``text`` without comments, indentation, trailing blanks and empty lines: a scan that knows strings, template
    literals and regular expression literals (a ``//`` in any of them stays), so a comment after code on its line
    goes too. Text inside a template literal is kept exactly.

    Raises:
        EsmBundleError: an unterminated string, template, regular expression or comment (``where`` and the line).
    """
    return _Scan(text, where).run()


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
        text = _rewrite_imports(
            strip_comments((folder / name).read_text(encoding="utf-8"), name), name, visit
        )
        var = "__rf_" + re.sub(r"\W", "_", name.removesuffix(".js"))
        parts.append(_wrap(text, name, var))
        active.pop()
        done[name] = var
        return var

    active.append(entry.name)
    main = _rewrite_imports(strip_comments(entry.read_text(encoding="utf-8"), entry.name), entry.name, visit)
    return "".join(parts) + main
