"""Opening an experiment's folder and store from the kernel: a new folder, an existing one, a read-only one.

``Experiment(name)`` calls :func:`open_experiment_store`. It refuses what cannot be opened safely with a message
naming the file, what is wrong and what to do: a damaged ``store.sqlite`` (:class:`~rapidfire_nb.store.
DamagedStoreError`), and a missing or empty (0-byte) store in a folder that still holds run folders (a lost
record: setting it up as a new experiment would train those runs again over their saved weights). A folder this
process cannot write is opened read-only: results can be read, training is refused (:func:`read_only_reason`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from .. import meta_keys
from ..errors import ExperimentError
from ..paths import STORE_FILENAME
from ..store import Store

__all__ = ["open_experiment_store", "read_only_reason"]


def open_experiment_store(path: Path, name: str) -> tuple[Store, str | None]:
    """Create or open the experiment folder ``path`` and its store.

    Args:
        path: the experiment folder (``experiment_dir(root, name)``; it may not exist yet).
        name: the experiment's name (for messages).

    Returns:
        ``(store, read_only)``: ``read_only`` is None for a writable folder, else the reason training is refused
        (the store is then opened read-only).

    Raises:
        ExperimentError: the folder cannot be created; ``store.sqlite`` is not a file; the store is missing or
            empty but the folder holds runs; the folder is read-only and holds no store.
        DamagedStoreError: ``store.sqlite`` is not a readable SQLite database.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExperimentError(
            f"cannot create the experiment folder {path}: {exc.strerror or exc}. Choose an experiments root you "
            "can write, e.g. Experiment(name, experiment_path=...) or $RF_HOME"
        ) from exc
    db = path / STORE_FILENAME
    if db.exists() and not db.is_file():
        kind = "a folder" if db.is_dir() else "not a regular file"
        raise ExperimentError(
            f"{db} is not a file ({kind}); an experiment's store is the SQLite file store.sqlite. Move it aside, or "
            "use another experiment name"
        )
    _refuse_lost_record(db, name)
    reason = read_only_reason(path, name)
    if reason is None:
        store = Store(path)
        if store.get_meta(meta_keys.NAME) is None:
            store.update_meta({meta_keys.NAME: name, meta_keys.CREATED_AT: time.time()})
        return store, None
    if not db.is_file():
        raise ExperimentError(f"{reason}; and it holds no experiment yet, so there is nothing to open")
    return Store(path, read_only=True), reason


def read_only_reason(path: Path, name: str) -> str | None:
    """Why this process cannot train the experiment in ``path`` (a folder or store it cannot write), or None."""
    db = path / STORE_FILENAME
    if os.access(path, os.W_OK) and (not db.exists() or os.access(db, os.W_OK)):
        return None
    what = path if not os.access(path, os.W_OK) else db
    return (
        f"experiment {name!r} is read-only here ({what} cannot be written by this process): its results can be "
        "read (get_runs_info, get_results, ops, the panel), but training, IC Ops and end() need write access. "
        "Make the folder writable, or copy it into an experiments root you can write and open it there "
        "(Experiment(name, experiment_path=...))"
    )


def _refuse_lost_record(db: Path, name: str) -> None:
    """A missing or 0-byte store next to run folders is a lost record, not a new experiment."""
    runs = db.parent / "runs"
    try:
        if db.is_file() and db.stat().st_size > 0:
            return
        held = sorted(p.name for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []
    except OSError:
        return  # cannot look: opening the store says what is wrong
    if not held:
        return
    state = "is empty (0 bytes)" if db.is_file() else "is missing"
    raise ExperimentError(
        f"experiment {name!r}: its store {db} {state}, but {runs} holds the folders of {len(held)} earlier "
        f"run(s) ({', '.join(held[:5])}{', ...' if len(held) > 5 else ''}). The experiment's record was lost, so "
        "it cannot be continued, and setting it up as a new experiment would train those runs again over their "
        "saved weights. Restore store.sqlite from a backup; or start afresh with "
        f"Experiment({name!r}, overwrite=True) (deletes the folder); or use another experiment name"
    )
