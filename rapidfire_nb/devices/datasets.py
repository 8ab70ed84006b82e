"""The experiment's rows, written once as Arrow files that every worker process memory-maps.

Pickling a ``datasets.Dataset`` per run (or per worker) copies every row; ``save_to_disk`` once and
``datasets.load_from_disk`` in each worker shares the pages of one file instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rapidfire_nb._atomic import atomic_dir, is_complete_dir
from rapidfire_nb.errors import ConfigError

__all__ = ["FINGERPRINT_FILE", "share_datasets"]

FINGERPRINT_FILE = "rapidfire_fingerprint.json"
"""In each shared dataset folder: ``{"fingerprint": <datasets' fingerprint>, "rows": <row count>}``."""


def share_datasets(exp_dir: Path, train_dataset: Any, eval_dataset: Any | None) -> tuple[str, str | None]:
    """Write the rows into ``<exp_dir>/datasets/{train,eval}`` (once) and return the two folders.

    Each folder is written atomically (:func:`rapidfire_nb._atomic.atomic_dir`) with ``save_to_disk`` and kept
    when it already holds a dataset with the same fingerprint and row count (a restarted kernel, a second
    ``run_fit`` with the same data): then nothing is written.

    Returns:
        ``(train folder, eval folder or None)`` as strings (what :class:`~rapidfire_nb.devices.WorkerSettings`
        takes).

    Raises:
        ConfigError: a dataset is not a ``datasets.Dataset``.
        OSError: the disk refused the write.
    """
    root = Path(exp_dir) / "datasets"
    train = _share(root / "train", train_dataset, "train_dataset")
    evald = _share(root / "eval", eval_dataset, "eval_dataset") if eval_dataset is not None else None
    return train, evald


def _share(folder: Path, dataset: Any, what: str) -> str:
    from datasets import Dataset

    if not isinstance(dataset, Dataset):
        raise ConfigError(
            f"{what} must be a datasets.Dataset to be shared with worker processes, got {type(dataset)}"
        )
    stamp = {"fingerprint": dataset._fingerprint, "rows": len(dataset)}
    if is_complete_dir(folder) and _stamp(folder) == stamp:
        return str(folder)
    with atomic_dir(folder) as tmp:
        dataset.save_to_disk(str(tmp))
        (Path(tmp) / FINGERPRINT_FILE).write_text(json.dumps(stamp) + "\n")
    return str(folder)


def _stamp(folder: Path) -> Any:
    try:
        return json.loads((folder / FINGERPRINT_FILE).read_text())
    except (OSError, ValueError):
        return None
