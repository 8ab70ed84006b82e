"""The bundler's comment stripping (rapidfire_nb/panel/esm_bundle.py ``strip_comments``): every comment, the
indentation and the empty lines go; strings, template literals and regular expression literals stay exactly, so
the stripped modules behave as the sources (the node unit tests pass on them)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from rapidfire_nb.panel.esm_bundle import EsmBundleError, strip_comments

REPO = Path(__file__).resolve().parents[3]

SOURCE = """\
// a line comment
/**
 * a block comment
 */
export function f(a, b) {
    const url = "http://x/*y*/"; // a comment after code
    const q = 'it\\'s // not a comment';
    const t = `line one // kept
    /* kept too */ ${a ? `${b} // in a nested template` : "}"} end`;
    const r = /\\/\\/[/*]+/g.test(q) ? a / b / 2 : /* inline */ b;
    let i = 0; i++ / 2;

    return /[",\\r\\n]/.test(t) && r /* spans
    lines */ ;
}
"""

EXPECTED = """\
export function f(a, b) {
const url = "http://x/*y*/";
const q = 'it\\'s // not a comment';
const t = `line one // kept
    /* kept too */ ${a ? `${b} // in a nested template` : "}"} end`;
const r = /\\/\\/[/*]+/g.test(q) ? a / b / 2 :   b;
let i = 0; i++ / 2;
return /[",\\r\\n]/.test(t) && r
;
}"""


def test_comments_go_and_literals_stay_exactly() -> None:
    assert strip_comments(SOURCE) == EXPECTED


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ('const a = 1;\nconst s = "open;\n', '2: an unterminated "string"'),
        ("const a = 1; /* open\n", "1: an unterminated /* comment"),
        ("const t = `open\n", "1: an unterminated template literal"),
        ("const r = (/open\n);", "1: an unterminated regular expression"),
    ],
)
def test_an_unterminated_literal_or_comment_is_an_error_naming_the_line(text: str, what: str) -> None:
    with pytest.raises(EsmBundleError, match="^" + re.escape(f"m.js:{what}")):
        strip_comments(text, "m.js")


@pytest.mark.skipif(shutil.which("node") is None, reason="node not installed")
def test_the_stripped_widget_modules_pass_the_node_unit_tests(tmp_path: Path) -> None:
    (tmp_path / "widgets").mkdir()
    for module in (REPO / "widgets").glob("*.js"):
        stripped = strip_comments(module.read_text(encoding="utf-8"), module.name)
        assert "//" not in stripped.replace("://", "") and "/*" not in stripped, module.name
        (tmp_path / "widgets" / module.name).write_text(stripped, encoding="utf-8")
    tests = tmp_path / "tests" / "rapidfire_nb" / "js"
    shutil.copytree(REPO / "tests" / "rapidfire_nb" / "js", tests)
    proc = subprocess.run(
        ["node", "--test", *sorted(str(p) for p in tests.glob("*.test.mjs"))],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0 and "# fail 0" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]
