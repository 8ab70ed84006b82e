"""``import rapidfire_nb.automl`` stays cheap: no torch, transformers, trl or peft."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_import_automl_does_not_import_torch():
    code = (
        "import sys\n"
        "import rapidfire_nb.automl as a\n"
        "from rapidfire_nb.automl import List, Range, RFGridSearch, RFModelConfig\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'trl', 'peft') if m in sys.modules)\n"
        "print(','.join(heavy) or 'none')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "none"
