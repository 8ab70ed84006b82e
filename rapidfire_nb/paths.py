"""Where experiments live on disk (standard library + platformdirs only).

Layout::

    <experiments_root>/            experiment_path argument, else $RF_HOME, else the user data dir
        <experiment name>/         experiment_dir(root, name)
            store.sqlite           the experiment's Store (see rapidfire_nb.store)
            ...
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import platformdirs

from rapidfire_nb.errors import ConfigError

__all__ = [
    "APP_NAME",
    "MAX_EXPERIMENT_NAME_LENGTH",
    "RF_HOME_ENV",
    "STORE_FILENAME",
    "STORE_SIDE_FILES",
    "experiment_dir",
    "experiments_root",
    "list_experiments",
    "validate_experiment_name",
]

APP_NAME = "rapidfire_nb"
RF_HOME_ENV = "RF_HOME"
STORE_FILENAME = "store.sqlite"
MAX_EXPERIMENT_NAME_LENGTH = 128

# ASCII letters, digits, '-', '_', '.'; the first character is not a '.'.
_NAME_RE = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]*")


def experiments_root(experiment_path: str | os.PathLike[str] | None = None) -> Path:
    """Return the folder holding all experiments.

    Args:
        experiment_path: explicit root; wins over everything else.

    Returns:
        ``experiment_path`` if given, else ``$RF_HOME`` if set and non-empty, else
        ``platformdirs.user_data_dir("rapidfire_nb")``. ``~`` is expanded; the folder is not created.
    """
    if experiment_path is not None:
        return Path(experiment_path).expanduser()
    env = os.environ.get(RF_HOME_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_data_dir(APP_NAME))


def validate_experiment_name(name: object) -> str:
    """Check that ``name`` is a safe experiment folder name and return it.

    Raises:
        ConfigError: not a string, empty, longer than 128 characters, a character other than ASCII
            letters, digits, ``-``, ``_``, ``.``, or a leading ``.``.
    """
    allowed = "only ASCII letters, digits, '-', '_' and '.' (not as the first character)"
    if not isinstance(name, str):
        raise ConfigError(f"experiment_name must be a string, got {type(name).__name__}; use {allowed}.")
    if not name:
        raise ConfigError(f"experiment_name must not be empty; use {allowed}.")
    if len(name) > MAX_EXPERIMENT_NAME_LENGTH:
        raise ConfigError(
            f"experiment_name is {len(name)} characters long; the limit is {MAX_EXPERIMENT_NAME_LENGTH}."
        )
    if name.startswith("."):
        raise ConfigError(f"experiment_name {name!r} must not start with '.'; use {allowed}.")
    if not _NAME_RE.fullmatch(name):
        bad = sorted({c for c in name if not re.fullmatch(r"[A-Za-z0-9_.\-]", c)})
        raise ConfigError(f"experiment_name {name!r} contains {''.join(bad)!r}; use {allowed}.")
    return name


STORE_SIDE_FILES = (STORE_FILENAME, f"{STORE_FILENAME}-wal", f"{STORE_FILENAME}-shm", "writer.lock")
"""The files in an experiment folder that are opened for writing by name (the store, SQLite's WAL and shared-memory
files, the writer lock): none may be a link leading out of the experiments root."""


def experiment_dir(root: str | os.PathLike[str], name: str) -> Path:
    """Return ``<root>/<name>`` after validating ``name``; the folder is not created.

    Raises:
        ConfigError: ``name`` is invalid, or the folder or one of its :data:`STORE_SIDE_FILES` (symlinks followed)
            is not inside ``root``, or one of those files has more than one hard link (another name, perhaps
            outside ``root``, refers to the same file: what is written here would be written there too).
    """
    validate_experiment_name(name)
    base = Path(root).expanduser().resolve()
    path = base / name
    # A valid name has no separators, but an existing symlink could still point elsewhere.
    if not path.resolve().is_relative_to(base):
        raise ConfigError(f"experiment folder {path} resolves outside the experiments root {base}.")
    for file_name in STORE_SIDE_FILES:
        file = path / file_name
        if file.is_symlink() and not file.resolve().is_relative_to(base):
            raise ConfigError(
                f"{file} is a link to {file.resolve()}, outside the experiments root {base}; it is not opened. "
                "Replace the link by the file itself (or move that experiment into the root)."
            )
        _refuse_hard_links(file, base)
    return path


def _refuse_hard_links(file: Path, base: Path) -> None:
    """Raise ConfigError when ``file`` (symlinks followed) exists with ``st_nlink > 1``.

    A hard link cannot be told from the file it links: the other name may lie anywhere on the same file system,
    outside the experiments root (``os.link("/secret/store.sqlite", root / "evil" / "store.sqlite")``), so any
    second name is refused, as a symlink leading out of the root is.
    """
    try:
        st = file.stat()
    except OSError:  # absent (the side files come and go), or unreadable: the store's own open says why
        return
    links = st.st_nlink
    if (
        stat.S_ISREG(st.st_mode) and links > 1
    ):  # a folder's count is its subfolders (the store's open refuses it)
        raise ConfigError(
            f"{file} has {links} hard links: another name, perhaps outside the experiments root {base}, is the "
            "same file, and what is written here would be written there; it is not opened. Give the experiment "
            f"a copy of its own (cp {file.name} {file.name}.copy && mv {file.name}.copy {file.name}) or remove "
            "the other name."
        )


def list_experiments(root: str | os.PathLike[str]) -> list[str]:
    """Return the sorted names of the folders in ``root`` that hold a ``store.sqlite``."""
    base = Path(root).expanduser()
    if not base.is_dir():
        return []
    names = []
    for child in base.iterdir():
        if not _NAME_RE.fullmatch(child.name) or len(child.name) > MAX_EXPERIMENT_NAME_LENGTH:
            continue
        if (child / STORE_FILENAME).is_file():
            names.append(child.name)
    return sorted(names)
