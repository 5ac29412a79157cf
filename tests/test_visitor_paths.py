"""Folder paths as a person who just ran ``streamlit run`` types them, and what a refusal tells them.

A relative path is looked up under the model roots and under the working folder, and opens only
when it resolves under a root; a folder wins over a hub id of the same spelling. A refusal names
only what was typed, and is the same for a folder outside the roots and for no folder at all,
whatever the server allows: a visitor learns nothing about the server.
"""

from __future__ import annotations

import pytest

from attnviz.checkpoints.catalog import pretrained_dir, visitor_model, visitor_path
from attnviz.errors import CheckpointError

REPO_ROOT = pretrained_dir().parent  # `streamlit run app.py` starts here
SHIPPED = (pretrained_dir() / "en-de").resolve()
REFUSED = "is not a model folder this server lets visitors open"
REFUSAL = (
    "{typed} is not a model folder this server lets visitors open; choose one of the listed models, or type the "
    "path of a folder under the model folders it offers (its operator names them in ATTNVIZ_MODEL_ROOTS)"
)


@pytest.fixture
def default_roots(tmp_path, monkeypatch):
    """The default roots (shipped models, an empty hub cache), no downloads, and a hub that is never asked."""
    import huggingface_hub

    monkeypatch.delenv("ATTNVIZ_MODEL_ROOTS", raising=False)
    monkeypatch.delenv("ATTNVIZ_ALLOW_DOWNLOADS", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    calls = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: calls.append(a))
    return calls


@pytest.mark.parametrize("typed", ["pretrained/en-de", "./pretrained/en-de", " ./pretrained/en-de/ "])
@pytest.mark.parametrize("downloads", ["0", "1"])
def test_a_path_typed_from_the_repo_root_opens_the_shipped_model(default_roots, monkeypatch, typed, downloads):
    monkeypatch.setenv("ATTNVIZ_ALLOW_DOWNLOADS", downloads)
    monkeypatch.chdir(REPO_ROOT)
    assert visitor_path(typed) == SHIPPED
    assert visitor_model(typed) == SHIPPED, "the folder wins over the hub id of the same spelling"
    assert default_roots == [], "no request to the hub"


def test_from_elsewhere_the_same_paths_are_refused_clearly(default_roots, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError) as info:
        visitor_model("./pretrained/en-de")
    assert REFUSED in info.value.public and "under the model folders it offers" in info.value.public
    with pytest.raises(CheckpointError) as info:
        visitor_model("pretrained/en-de")  # no such folder anywhere: read as a hub id, as before
    assert "is not among the models this server has" in info.value.public
    assert default_roots == []


@pytest.mark.parametrize("downloads", ["0", "1"])
def test_a_folder_outside_the_roots_is_refused_as_a_missing_one_is(default_roots, tmp_path, monkeypatch, downloads):
    """Whether a folder outside the roots exists is not told, even where downloads are allowed: a class server
    may allow them, so that setting does not mean the visitor owns the machine."""
    mine = tmp_path / "pretrained" / "en-de"
    mine.mkdir(parents=True)
    (mine / "config.json").write_text('{"secret": "hunter2"}')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNVIZ_ALLOW_DOWNLOADS", downloads)
    said = {}
    for typed in (str(mine), str(tmp_path / "pretrained" / "nothing"), "./pretrained/en-de", "./pretrained/none"):
        with pytest.raises(CheckpointError) as info:
            visitor_model(typed)
        said[typed] = info.value.public.replace(repr(typed), "TYPED")
    assert len(set(said.values())) == 1, said
    public = next(iter(said.values()))
    assert REFUSED in public and "ATTNVIZ_MODEL_ROOTS" in public, public
    assert str(tmp_path) not in public and str(pretrained_dir()) not in public and "hunter2" not in public
    assert default_roots == [], "none of them is a hub id: no request to the hub"


@pytest.fixture
def roots(tmp_path, monkeypatch):
    """One model root holding a model and a working folder, a secret folder beside it; cwd in the root."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    for folder in (root / "work", root / "models" / "m1", outside / "secret"):
        folder.mkdir(parents=True)
    (outside / "secret" / "config.json").write_text('{"token": "hunter2"}')
    (root / "work" / "escape").symlink_to(outside / "secret", target_is_directory=True)
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(root))
    monkeypatch.chdir(root / "work")
    return root, outside


@pytest.mark.parametrize("downloads", ["0", "1"])
@pytest.mark.parametrize(
    "typed", ["../../outside/secret", "../models/../../outside/secret", "escape", "./escape", "../.."]
)
def test_escapes_from_the_working_folder_stay_refused(roots, monkeypatch, typed, downloads):
    monkeypatch.setenv("ATTNVIZ_ALLOW_DOWNLOADS", downloads)
    root, outside = roots
    with pytest.raises(CheckpointError) as info:
        visitor_path(typed)
    public = info.value.public
    assert str(root) not in public and str(outside) not in public and "hunter2" not in public
    assert public == REFUSAL.format(typed=repr(typed)), "the same words as for a folder that is not there"


def test_a_relative_path_from_a_working_folder_inside_a_root_opens(roots):
    root, _ = roots
    assert visitor_path("../models/m1") == (root / "models" / "m1").resolve()
    assert visitor_path("models/m1") == (root / "models" / "m1").resolve(), "under the root itself"


@pytest.mark.slow  # two seconds or more on a 2-core AMD EPYC with AVX2 only
@pytest.mark.usefixtures("fresh_streamlit_caches")
def test_the_app_opens_a_path_typed_from_the_repo_root(default_roots, tmp_path, monkeypatch):
    from conftest import open_app

    from attnviz.app import CUSTOM_PATH

    monkeypatch.chdir(REPO_ROOT)
    at = open_app("pages/explorer.py")
    at.sidebar.selectbox(key="model").set_value(CUSTOM_PATH).run()
    at.sidebar.text_input(key="model_path").set_value("./pretrained/en-de").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.get("plotly_chart")
    monkeypatch.chdir(tmp_path)
    at.sidebar.text_input(key="model_path").set_value("./pretrained/en-de/").run()
    assert not at.exception and REFUSED in " ".join(e.value for e in at.error)
