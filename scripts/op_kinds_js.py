"""Write ``widgets/op_kinds.js``, the front end's copy of the op-kind table (kernel_scheduler/op_kinds.py).

Run after changing an op kind: ``.venv/bin/python scripts/op_kinds_js.py``. ``tests/rapidfire_nb/view/test_ops_view.py``
fails while the file differs from what this writes.
"""

from __future__ import annotations

from pathlib import Path

from rapidfire_nb.view.ops_view import op_kinds_js

TARGET = Path(__file__).resolve().parents[1] / "widgets" / "op_kinds.js"

if __name__ == "__main__":
    TARGET.write_text(op_kinds_js(), encoding="utf-8")
    print(f"wrote {TARGET}")
