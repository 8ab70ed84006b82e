"""The page's config block survives an experiments root with characters HTML and JSON treat specially."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

ODD = "a & b <c> 'd' \"e\" <!-- \u2028"


@pytest.fixture
def rf_root(tmp_path: Path) -> Path:  # overrides the conftest's: the page shows this root
    root = tmp_path / ODD
    root.mkdir()
    return root


async def test_page_config_is_json_safe_in_a_script_element(jp_fetch: Any, rf_root: Path) -> None:
    html = (await jp_fetch("rapidfire/")).body.decode()
    start = html.index('id="rf-page-config">') + len('id="rf-page-config">')
    block = html[start : html.index("</script>", start)]
    assert (
        "<" not in block and ">" not in block and "&" not in block
    )  # cannot close the element or open a comment
    assert json.loads(block)["root"] == str(rf_root)  # what the page's JSON.parse(textContent) reads
