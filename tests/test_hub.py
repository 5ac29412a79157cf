"""Models by hub id: a hub-layout cache built here, read offline; the download path with a fake hub client.

Nothing here reaches the network: conftest sets HF_HUB_OFFLINE=1, and the tests of the download
path replace huggingface_hub.snapshot_download with a function that copies from a local folder.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

import attnviz
from attnviz.checkpoints import hub, marian
from attnviz.checkpoints.catalog import resolve_model, visitor_model, visitor_path
from attnviz.cli import main
from attnviz.errors import CheckpointError

transformers = pytest.importorskip("transformers")

from test_marian import make_marian  # noqa: E402

REPO = "test-org/opus-mt-tiny"
SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def marian_files(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("marian") / "opus-mt-tiny"
    make_marian(folder, shared=True, activation="swish", d_model=16, heads=2, enc=1, dec=1)
    return folder


def build_cache(cache: Path, repo_id: str, files: Path, sha: str = SHA) -> Path:
    """The hub's cache layout: blobs, snapshots/<sha>/ of links to them, refs/main; returns the snapshot."""
    repo = hub.cache_folder(repo_id, cache)
    snap = repo / "snapshots" / sha
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True)
    for file in files.iterdir():
        blob = repo / "blobs" / f"{sha[:8]}-{file.name}"
        shutil.copy(file, blob)
        (snap / file.name).symlink_to(Path("../../blobs") / blob.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(sha)
    return snap


@pytest.fixture
def cache(tmp_path, monkeypatch, marian_files) -> Path:
    cache = tmp_path / "hub-cache"
    build_cache(cache, REPO, marian_files)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    return cache


def test_a_hub_id_resolves_offline_from_the_cache(cache):
    folder = resolve_model(REPO)
    assert folder.resolve() == (hub.cache_folder(REPO, cache) / "snapshots" / SHA).resolve()
    bundle = attnviz.load(REPO, device="cpu")
    assert bundle.name == REPO and bundle.info["family"] == "marian"
    assert attnviz.attention(bundle, "the cat reads a book").encoder.shape[-1] >= 2


def test_refs_main_chooses_among_several_snapshots(cache, marian_files):
    newer = "f" * 40
    build_cache(cache, "test-org/two-snapshots", marian_files, sha=SHA)
    repo = hub.cache_folder("test-org/two-snapshots", cache)
    shutil.copytree(repo / "snapshots" / SHA, repo / "snapshots" / newer, symlinks=True)
    (repo / "refs" / "main").write_text(newer)
    assert attnviz.load("test-org/two-snapshots", device="cpu").path == (repo / "snapshots" / newer).resolve()
    assert marian.load(repo, device="cpu").path == (repo / "snapshots" / newer).resolve(), "the cache folder itself"
    (repo / "refs" / "main").write_text("nonsense")
    with pytest.raises(CheckpointError, match="2 snapshots"):
        marian.load(repo, device="cpu")


def test_a_missing_id_offline_is_one_clear_error(cache, capsys):
    with pytest.raises(CheckpointError) as info:
        resolve_model("test-org/not-downloaded")
    message = str(info.value)
    assert "not in the Hugging Face cache" in message and "HF_HUB_OFFLINE=1" in message
    assert str(cache) not in info.value.public, "a visitor is never told a server path"
    assert main(["translate", "--model", "test-org/not-downloaded", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("attnviz: error: test-org/not-downloaded is not in the")


def test_a_local_folder_at_that_relative_path_wins(cache, tmp_path, marian_files):
    local = tmp_path / "test-org" / "opus-mt-tiny"
    shutil.copytree(marian_files, local)
    assert resolve_model(REPO) == Path(REPO), "a folder here, not the cache"
    assert resolve_model("./" + REPO) == Path("./" + REPO)


@pytest.mark.parametrize("text", ["org/name", "Helsinki-NLP/opus-mt-en-de", "a.b/c_d-1"])
def test_hub_ids(text):
    assert hub.is_hub_id(text)


@pytest.mark.parametrize("text", ["./org/name", "/org/name", "org/name/x", "org", "-org/name", "o--x/y", "o/..", "~/x"])
def test_not_hub_ids(text):
    assert not hub.is_hub_id(text)


# ---------------------------------------------------------------------------------------------
# Downloads, with a fake hub client: the config first, refusals before weights, the weights file


class FakeHub:
    """snapshot_download as the hub would answer for ``repos`` (id -> folder of files), recording each call."""

    def __init__(self, cache: Path, repos: dict[str, Path]):
        self.cache, self.repos, self.calls = cache, repos, []

    def __call__(self, repo_id, *, cache_dir, allow_patterns, local_files_only):
        import fnmatch

        from huggingface_hub.errors import LocalEntryNotFoundError

        self.calls.append((repo_id, list(allow_patterns), local_files_only))
        snap = hub.cache_folder(repo_id, Path(cache_dir)) / "snapshots" / SHA
        if local_files_only:
            if not snap.is_dir():
                raise LocalEntryNotFoundError("not cached")
            return str(snap)
        snap.mkdir(parents=True, exist_ok=True)
        for file in self.repos[repo_id].iterdir():
            if any(fnmatch.fnmatch(file.name, p) for p in allow_patterns):
                shutil.copy(file, snap / file.name)
        return str(snap)


@pytest.fixture
def online(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))

    def serve(repos: dict[str, Path]) -> FakeHub:
        fake = FakeHub(tmp_path / "cache", repos)
        monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
        return fake

    return serve


def test_a_download_fetches_the_config_first_then_what_the_importer_reads(online, marian_files, tmp_path):
    repo = tmp_path / "remote"
    shutil.copytree(marian_files, repo)
    (repo / "tf_model.h5").write_bytes(b"not read")
    fake = online({REPO: repo})
    bundle = attnviz.load(REPO, device="cpu")
    assert bundle.name == REPO
    assert fake.calls[0] == (REPO, ["config.json"], False)
    assert "model.safetensors" in fake.calls[1][1] and len(fake.calls) == 2
    assert not any(p.name == "tf_model.h5" for p in Path(bundle.path).iterdir()), "only what attnviz reads"


def test_a_model_without_safetensors_gets_its_pickle(online, marian_files, tmp_path):
    import torch
    from safetensors.torch import load_file

    repo = tmp_path / "remote"
    shutil.copytree(marian_files, repo)
    torch.save(load_file(repo / "model.safetensors"), repo / "pytorch_model.bin")
    (repo / "model.safetensors").unlink()
    fake = online({REPO: repo})
    assert attnviz.load(REPO, device="cpu").info["weights_file"] == "pytorch_model.bin"
    assert fake.calls[-1][1] == ["pytorch_model.bin"]


def test_a_foreign_or_oversized_model_is_refused_before_its_weights(online, marian_files, tmp_path, monkeypatch):
    gpt = tmp_path / "gpt"
    gpt.mkdir()
    (gpt / "config.json").write_text(json.dumps({"model_type": "gemma2"}))
    (gpt / "model.safetensors").write_bytes(b"x" * 100)
    fake = online({"test-org/gpt": gpt, REPO: marian_files})
    with pytest.raises(CheckpointError, match="not a model attnviz can load"):
        resolve_model("test-org/gpt")
    assert fake.calls == [("test-org/gpt", ["config.json"], False)]
    monkeypatch.setenv("ATTNVIZ_MAX_LAYERS", "0")
    with pytest.raises(CheckpointError, match="ATTNVIZ_MAX_LAYERS"):
        resolve_model(REPO)
    assert fake.calls[-1] == (REPO, ["config.json"], False), "no weights were fetched"


# ---------------------------------------------------------------------------------------------
# Visitors of the app: the cache only, unless the operator allows downloads


def test_a_visitor_opens_a_cached_hub_id_and_never_starts_a_download(cache, monkeypatch):
    import huggingface_hub

    monkeypatch.delenv("ATTNVIZ_MODEL_ROOTS", raising=False)  # default roots: shipped models and the cache
    monkeypatch.delenv("ATTNVIZ_ALLOW_DOWNLOADS", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE")  # even online
    calls = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: calls.append(a))
    assert visitor_model(REPO) == hub.cache_folder(REPO, cache).resolve()
    assert attnviz.load(str(visitor_model(REPO)), device="cpu").name == REPO
    with pytest.raises(CheckpointError) as info:
        visitor_model("test-org/not-downloaded")
    assert "downloads none for visitors" in info.value.public and "ATTNVIZ_ALLOW_DOWNLOADS=1" in info.value.public
    assert calls == [], "no download without ATTNVIZ_ALLOW_DOWNLOADS"
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", "")
    with pytest.raises(CheckpointError):
        visitor_path(REPO)


def test_with_downloads_allowed_a_visitor_may_fetch_a_model(online, marian_files, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_ALLOW_DOWNLOADS", "1")
    fake = online({REPO: marian_files})
    folder = visitor_model(REPO)
    assert attnviz.load(str(folder), device="cpu").name == REPO
    assert fake.calls[0][2] is True, "the cache is read first, with no request to the hub"
    assert [c[1] for c in fake.calls if not c[2]][0] == ["config.json"], "then the config, before the weights"
    monkeypatch.setenv("ATTNVIZ_ALLOW_DOWNLOADS", "0")
    with pytest.raises(CheckpointError):
        visitor_model("test-org/other")


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
@pytest.mark.usefixtures("fresh_streamlit_caches")
def test_the_app_opens_a_cached_hub_id_and_refuses_an_uncached_one(cache, monkeypatch):
    from conftest import open_app

    from attnviz.app import CUSTOM_PATH

    monkeypatch.delenv("ATTNVIZ_MODEL_ROOTS", raising=False)  # the defaults: shipped models and the hub's cache
    monkeypatch.delenv("ATTNVIZ_ALLOW_DOWNLOADS", raising=False)
    at = open_app("pages/explorer.py")
    at.sidebar.selectbox(key="model").set_value(CUSTOM_PATH).run()
    at.sidebar.text_input(key="model_path").set_value(REPO).run()
    at.sidebar.text_area(key="src").set_value("the cat reads a book").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.get("plotly_chart") and REPO in " ".join(c.value for c in at.sidebar.caption)
    at.sidebar.text_input(key="model_path").set_value("test-org/not-downloaded").run()
    assert not at.exception
    shown = " ".join(e.value for e in at.error)
    assert "is not among the models this server has" in shown and str(cache) not in shown


# ---------------------------------------------------------------------------------------------
# Why a hub id cannot be had: told in plain words where the visitor is the machine's own user


def no_server_path_in(public: str, *paths: Path) -> bool:
    from attnviz.checkpoints.catalog import hf_cache_dir, pretrained_dir

    return not any(str(p) in public for p in (*paths, hf_cache_dir(), pretrained_dir()))


def test_offline_with_downloads_allowed_a_visitor_is_told_why_and_how_to_copy_a_cache(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_ALLOW_DOWNLOADS", "1")
    monkeypatch.delenv("ATTNVIZ_MODEL_ROOTS", raising=False)
    with pytest.raises(CheckpointError) as info:
        visitor_model("test-org/not-downloaded")
    public = info.value.public
    assert "HF_HUB_OFFLINE=1 forbids reaching the Hugging Face hub" in public
    assert "hf download test-org/not-downloaded" in public and "huggingface-cli download" in public
    assert "models--test-org--not-downloaded" in public and "HF_HUB_CACHE" in public
    assert "ATTNVIZ_MODEL_ROOTS" in public
    assert no_server_path_in(public, tmp_path, cache), public
    assert str(cache) in str(info.value), "the log has the full story"


def test_without_downloads_allowed_the_message_is_as_before(cache, monkeypatch):
    monkeypatch.delenv("ATTNVIZ_ALLOW_DOWNLOADS", raising=False)
    with pytest.raises(CheckpointError) as info:
        visitor_model("test-org/not-downloaded")
    assert info.value.public == (
        "test-org/not-downloaded is not among the models this server has, and it downloads none for visitors "
        "(its operator can allow that with ATTNVIZ_ALLOW_DOWNLOADS=1)"
    )


def test_a_hub_that_cannot_be_reached_is_named_as_such(cache, tmp_path, monkeypatch):
    """The real client against a closed port on this machine: the hub itself is never asked."""
    import socket

    from huggingface_hub import constants

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once the socket is closed
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("ATTNVIZ_ALLOW_DOWNLOADS", "1")
    with pytest.raises(CheckpointError) as info:
        visitor_model("test-org/not-downloaded")
    public = info.value.public
    assert "the Hugging Face hub could not be reached (no network" in public and "HF_HUB_OFFLINE" not in public
    assert "models--test-org--not-downloaded" in public and no_server_path_in(public, tmp_path, cache), public


def hub_error(kind: str) -> Exception:
    """An exception of huggingface_hub's class ``kind``, built without the HTTP response its constructor wants."""
    from huggingface_hub import errors

    cls = getattr(errors, kind)
    e = cls.__new__(cls)
    Exception.__init__(e, "from the hub")
    return e


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("RepositoryNotFoundError", "the Hugging Face hub has no model test-org/secret, or it is private"),
        ("GatedRepoError", "test-org/secret is a gated model on the Hugging Face hub: accept its terms"),
    ],
)
def test_an_id_the_hub_refuses_says_why(online, tmp_path, monkeypatch, kind, reason):
    import huggingface_hub

    online({})

    def refuse(repo_id, *, cache_dir, allow_patterns, local_files_only):
        from huggingface_hub.errors import LocalEntryNotFoundError

        if local_files_only:
            raise LocalEntryNotFoundError("not cached")
        raise hub_error(kind)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    monkeypatch.setenv("ATTNVIZ_ALLOW_DOWNLOADS", "1")
    with pytest.raises(CheckpointError) as info:
        visitor_model("test-org/secret")
    public = info.value.public
    assert reason in public and "hf auth login" in public and "models--test-org--secret" in public, public
    assert no_server_path_in(public, tmp_path), public


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_streamlit_caches")
def test_the_app_shows_why_a_hub_id_cannot_be_had_when_downloads_are_allowed(cache, tmp_path, monkeypatch):
    from conftest import open_app

    from attnviz.app import CUSTOM_PATH

    monkeypatch.delenv("ATTNVIZ_MODEL_ROOTS", raising=False)
    monkeypatch.setenv("ATTNVIZ_ALLOW_DOWNLOADS", "1")
    at = open_app("pages/explorer.py")
    at.sidebar.selectbox(key="model").set_value(CUSTOM_PATH).run()
    at.sidebar.text_input(key="model_path").set_value("test-org/not-downloaded").run()
    assert not at.exception
    shown = re.sub(r"\\(.)", r"\1", " ".join(e.value for e in at.error))  # as the page shows the markdown
    assert "HF_HUB_OFFLINE=1 forbids reaching the Hugging Face hub" in shown and "HF_HUB_CACHE" in shown, shown
    assert no_server_path_in(shown, tmp_path, cache), shown
