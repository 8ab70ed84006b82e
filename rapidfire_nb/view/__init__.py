"""What every window shows of an experiment, built once: torch-free, so the server extension may import it.

* :mod:`.snapshot` — the panel/page snapshot from the store's rows (+ the kernel's live state) (re-exported here,
  with the two below: ``from rapidfire_nb.view import store_snapshot``);
* :mod:`.ops_view` — each run's status, legal ops, op hints and editable fields; the front end's op-kind table;
* :mod:`.devices_view` — the device of each run, the header's devices, the server page's device chip;
* :mod:`.text` — numbers, chunk lines and summaries as text;
* :mod:`.clock` — training time and tqdm-like progress numbers;
* :mod:`.stops` — why each run stopped, read from the ops log;
* :mod:`.wire` — the panel's wire format and JSON helpers.

Standard library + :mod:`kernel_scheduler` + :mod:`rapidfire_nb.meta_keys` only.
"""

from __future__ import annotations

from .snapshot import *  # noqa: F403  (the package's face: the snapshot API)
from .snapshot import __all__ as __all__
