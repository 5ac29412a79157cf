"""Where models come from: names, paths, and the folders a visitor of the app may open."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from attnviz.checkpoints.catalog import model_roots, pretrained_dir, resolve_model, visitor_path
from attnviz.errors import CheckpointError


@pytest.fixture
def roots(tmp_path, monkeypatch):
    """Two model roots with a model folder each, and a folder outside them."""
    a, b, outside = tmp_path / "a", tmp_path / "b", tmp_path / "outside"
    for folder in (a / "m1", b / "sub" / "m2", outside / "secret"):
        folder.mkdir(parents=True)
    (outside / "secret" / "config.json").write_text('{"token": "hunter2"}')
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", os.pathsep.join([str(a), str(b)]))
    return a, b, outside


def test_default_roots_are_the_shipped_models_and_the_hub_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("ATTNVIZ_MODEL_ROOTS", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert model_roots() == [pretrained_dir().resolve(), (tmp_path / "hub").resolve()]
    assert visitor_path("en-de") == (pretrained_dir() / "en-de").resolve()


def test_folders_under_the_roots_open_by_absolute_or_relative_path(roots):
    a, b, _ = roots
    assert visitor_path(str(a / "m1")) == (a / "m1").resolve()
    assert visitor_path("m1") == (a / "m1").resolve()
    assert visitor_path("sub/m2") == (b / "sub" / "m2").resolve()
    assert visitor_path("  sub/m2 ") == (b / "sub" / "m2").resolve()


@pytest.mark.parametrize("typed", ["~", "/", "..", "../outside/secret", "m1/../../outside", "", "x" * 5000, "a\0b"])
def test_anything_else_is_refused_naming_only_what_was_typed(roots, typed):
    a, _, outside = roots
    with pytest.raises(CheckpointError) as info:
        visitor_path(typed if typed != "../outside/secret" else str(outside / "secret"))
    message = str(info.value)
    assert str(a) not in message and "hunter2" not in message and "config.json" not in message


def test_a_symbolic_link_out_of_a_root_is_refused(roots):
    a, _, outside = roots
    (a / "escape").symlink_to(outside / "secret", target_is_directory=True)
    with pytest.raises(CheckpointError):
        visitor_path("escape")
    with pytest.raises(CheckpointError):
        visitor_path(str(a / "escape"))


def test_an_empty_setting_allows_no_folder(monkeypatch):
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", "")
    assert model_roots() == []
    with pytest.raises(CheckpointError):
        visitor_path(str(pretrained_dir() / "en-de"))


def test_a_bare_name_is_a_shipped_model_even_beside_a_folder_of_that_name(tmp_path, monkeypatch):
    (tmp_path / "en-de").mkdir()
    (tmp_path / "en-de" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("en-de") == pretrained_dir() / "en-de"
    assert resolve_model("./en-de") == Path("./en-de")
    assert resolve_model(str(tmp_path / "en-de")) == tmp_path / "en-de"
    (tmp_path / "mine").mkdir()
    assert resolve_model("mine") == Path("mine"), "a bare name that is no shipped model is a folder here"
    with pytest.raises(CheckpointError, match="no model named 'nothing'"):
        resolve_model("nothing")
    with pytest.raises(CheckpointError, match="cannot use"):
        resolve_model("x" * 300)


def test_dot_and_dot_dot_are_this_folder_and_the_one_above(tmp_path, monkeypatch):
    """`attnviz translate --model .` in a checkpoint's folder had looked for pretrained/config.json, "." being a
    folder under pretrained/ (itself), and ".." listed the repository's files in its message."""
    import shutil

    from attnviz.cli import main

    shutil.copytree(pretrained_dir() / "reverse", tmp_path / "mine")
    monkeypatch.chdir(tmp_path / "mine")
    assert resolve_model(".") == Path(".") and resolve_model("..") == Path("..")
    assert resolve_model(" . ") == Path(".")  # as typed in a form, spaces around it
    assert main(["translate", "--model", ".", "a b c"]) == 0
