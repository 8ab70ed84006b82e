"""A clean kernel shutdown freezes the displayed panel: its output is updated in place to the static copy
(``update_display_data`` with ``text/html``) before the kernel exits, so a saved notebook keeps the final state."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.kernel

SHOW = """\
from rapidfire_nb.testing.fake_source import FakeSource
from rapidfire_nb.panel import display_panel
source = FakeSource(2, total_steps=20, steps_per_tick=2, tick_s=0.02, experiment="shutdown-demo")
panel = display_panel(source)
"""


def test_a_clean_shutdown_replaces_the_panel_by_its_static_copy(ipy_kernel: Any) -> None:
    k = ipy_kernel
    cell = k.execute(SHOW, timeout=120)
    shown = [m for m in cell.messages if m.msg_type == "display_data"]
    assert len(shown) == 1 and "application/vnd.jupyter.widget-view+json" in shown[0].content["data"]
    display_id = shown[0].content["transient"]["display_id"]
    k.kc.shutdown(restart=False)  # what JupyterLab's "Shut Down Kernel" sends (control channel)
    update = k.wait_for(
        lambda r: (
            r.msg_type == "update_display_data"
            and (r.content.get("transient") or {}).get("display_id") == display_id
        ),
        30,
        "the panel's display update at shutdown",
    )
    data = update.content["data"]
    assert set(data) == {"text/html", "text/plain"} and "data-rf-static" in data["text/html"]
    assert "shutdown-demo" in data["text/html"] and "kernel shut down" in data["text/html"]
