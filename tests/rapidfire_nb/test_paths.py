"""rapidfire_nb.paths: experiment root, names, folders."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs
import pytest

from rapidfire_nb.errors import ConfigError
from rapidfire_nb.paths import (
    STORE_FILENAME,
    experiment_dir,
    experiments_root,
    list_experiments,
    validate_experiment_name,
)


def test_experiments_root_prefers_argument_then_env_then_user_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RF_HOME", str(tmp_path / "env"))
    assert experiments_root(tmp_path / "arg") == tmp_path / "arg"
    assert experiments_root(str(tmp_path / "arg")) == tmp_path / "arg"
    assert experiments_root() == tmp_path / "env"
    monkeypatch.delenv("RF_HOME")
    assert experiments_root() == Path(platformdirs.user_data_dir("rapidfire_nb"))
    monkeypatch.setenv("RF_HOME", "")
    assert experiments_root() == Path(platformdirs.user_data_dir("rapidfire_nb"))


def test_experiments_root_expands_user(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert experiments_root("~/exps") == tmp_path / "exps"


@pytest.mark.parametrize("name", ["exp", "exp-1", "my_exp.v2", "A" * 128, "0", "a..b", "x."])
def test_valid_names_are_returned(name):
    assert validate_experiment_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", ".hidden", ".", "..", "a/b", "a\\b", "../up", "with space", "é", "tab\t", "A" * 129, "a:b", None, 5],
)
def test_invalid_names_raise_config_error_naming_the_rule(name):
    with pytest.raises(ConfigError) as info:
        validate_experiment_name(name)
    message = str(info.value)
    assert "experiment_name" in message
    if isinstance(name, str) and 0 < len(name) <= 128:
        assert "letters, digits, '-', '_' and '.'" in message


def test_experiment_dir_is_inside_root(tmp_path):
    path = experiment_dir(tmp_path, "exp-1")
    assert path == tmp_path.resolve() / "exp-1"
    assert not path.exists()  # not created
    with pytest.raises(ConfigError):
        experiment_dir(tmp_path, "../escape")


def test_experiment_dir_refuses_symlink_leading_outside_root(tmp_path):
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ConfigError, match="outside"):
        experiment_dir(root, "link")


def test_list_experiments_only_lists_folders_with_a_store(tmp_path):
    for name in ["b", "a", "no-store", ".hidden"]:
        (tmp_path / name).mkdir()
    for name in ["a", "b", ".hidden"]:
        (tmp_path / name / STORE_FILENAME).write_bytes(b"")
    (tmp_path / "file.txt").write_text("x")
    assert list_experiments(tmp_path) == ["a", "b"]
    assert list_experiments(tmp_path / "missing") == []


def test_a_hard_linked_store_is_refused_by_the_kernel_too(tmp_path):
    root = tmp_path / "root"
    (root / "evil").mkdir(parents=True)
    (tmp_path / "secret.sqlite").write_bytes(b"")
    os.link(tmp_path / "secret.sqlite", root / "evil" / STORE_FILENAME)
    with pytest.raises(ConfigError, match=r"store.sqlite has 2 hard links: another name.*cp store.sqlite"):
        experiment_dir(root, "evil")
    os.unlink(tmp_path / "secret.sqlite")
    assert experiment_dir(root, "evil") == (root / "evil").resolve()
