"""Arguments of the wrong kind to the loaders, the atlas builders, the ablation's parser and the model's resolver:
one InputError naming the argument and what it takes, before anything is read, written or computed; never a bare
TypeError or AttributeError from deep inside, nor None taken for the name "None"."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import toy_export

import attnviz
import attnviz.api
from attnviz.atlas import build, build_atlas, compute_atlas, load_atlas, write_atlas
from attnviz.checkpoints.catalog import resolve_model, visitor_model, visitor_path
from attnviz.cli import main
from attnviz.errors import AtlasError, ExportError, InputError
from attnviz.export import load_export, write_atomically
from attnviz.methods.ablation import Ablation
from attnviz.training.history import HistoryWriter, load_history, recorded_every

NOT_PATHS = [None, 5, 2.5, b"folder", ["folder"]]


@pytest.fixture(scope="module")
def bundle():
    return attnviz.load("reverse", device="cpu")


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("a b c\nd e f\n", encoding="utf-8")
    return path


@pytest.fixture
def no_reading(monkeypatch):
    """The corpus's first pass fails the test: an argument is checked before any line is read."""

    def read(*args, **kwargs):
        raise AssertionError("the corpus was read before the arguments were checked")

    monkeypatch.setattr(build, "survey", read)


# ---------------------------------------------------------------------------------------------
# Paths


@pytest.mark.parametrize("value", NOT_PATHS)
@pytest.mark.parametrize(
    ("call", "words"),
    [
        (attnviz.api.load_atlas, "folder must be the atlas's folder, as text or a Path"),
        (load_atlas, "folder must be the atlas's folder, as text or a Path"),
        (attnviz.load_export, "path must be the export file to read"),
        (load_history, "folder must be a training's --out folder or its history folder"),
        (recorded_every, "out must be a training's --out folder or its history folder"),
        (lambda v: write_atomically(v, b""), "path must be the file to write"),
        (lambda v: toy_export().save(v), "path must be the file to write"),
        (lambda v: HistoryWriter(v, "encoder-decoder", "reverse", [("a", "b")], {}), "out must be a training's"),
    ],
    ids=["api.load_atlas", "load_atlas", "load_export", "load_history", "recorded_every", "write", "save", "writer"],
)
def test_a_path_that_is_not_text_or_a_path_is_one_input_error(call, words, value):
    with pytest.raises(InputError, match=words) as caught:
        call(value)
    assert caught.value.args[0].endswith(f"got {'None' if value is None else type(value).__name__}")


def test_a_path_of_any_kind_that_is_text_still_reads(tmp_path):
    """A str, a Path and any os.PathLike are paths: only what is neither is refused."""

    class Named:
        def __fspath__(self):
            return str(tmp_path / "nowhere.npz")

    for path in (str(tmp_path / "nowhere.npz"), tmp_path / "nowhere.npz", Named()):
        with pytest.raises(ExportError, match="does not exist"):
            load_export(path)


@pytest.mark.parametrize("value", NOT_PATHS)
def test_atlas_paths_that_are_not_paths_are_refused_before_the_corpus_is_read(
    bundle, corpus, tmp_path, no_reading, value
):
    """out=5 had read the whole corpus first, then said "no usable sentence"; corpus=5 failed in Path()."""
    out = tmp_path / "out"
    with pytest.raises(InputError, match="^corpus must be the corpus file"):
        build_atlas(bundle, value, out)
    with pytest.raises(InputError, match="^out must be the folder to write the atlas into"):
        build_atlas(bundle, corpus, out=value)
    if value is not None:  # None: no targets
        with pytest.raises(InputError, match="^targets must be the file of decoder inputs"):
            write_atlas(bundle, corpus, out, targets=value)
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# Whole numbers


BAD_COUNTS = ["2", 0, -1, 2.5, True, None, np.float64(2.0)]


@pytest.mark.parametrize("value", BAD_COUNTS, ids=repr)
def test_compute_atlas_takes_a_batch_size_that_is_a_whole_number_of_one_or_more(bundle, value):
    """A batch of "2" had failed on a comparison deep inside; 0, -1, 2.5 and True had been written into the manifest."""
    with pytest.raises(InputError, match="^batch_size must be a whole number of 1 or more; got"):
        compute_atlas(bundle, ["a b c"], batch_size=value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (name, value)
        for name in ("batch_size", "shard_size", "limit", "chunk_lines")
        for value in BAD_COUNTS
        if value is not None or name in ("batch_size", "shard_size")  # None: every line, the default chunk
    ],
    ids=repr,
)
def test_the_atlas_folders_counts_are_whole_numbers_of_one_or_more(bundle, corpus, tmp_path, no_reading, name, value):
    out = tmp_path / "out"
    with pytest.raises(InputError, match=f"^{name} must be a whole number of 1 or more"):
        write_atlas(bundle, corpus, out, **{name: value})
    with pytest.raises(InputError, match=f"^{name} must be a whole number of 1 or more"):
        build_atlas(bundle, corpus, out, **{name: value})
    assert not out.exists()


def test_numpy_whole_numbers_are_taken_and_recorded_as_json_numbers(bundle, corpus, tmp_path):
    manifest = write_atlas(bundle, corpus, tmp_path / "out", batch_size=np.int64(2), limit=np.int32(1))
    assert (manifest["batch"], manifest["limit"]) == (2, 1)
    written = json.loads((tmp_path / "out" / "manifest.json").read_text(encoding="utf-8"))
    assert type(written["batch"]) is int and written["counts"]["sentences"] == 1
    assert compute_atlas(bundle, ["a b c"], batch_size=np.int64(3)).manifest["batch"] == 3


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"allow_unknown": "no"}, "^allow_unknown must be True or False; got 'no'"),
        ({"allow_unknown": None}, "^allow_unknown must be True or False; got null"),
        ({"progress": "bar"}, "^progress must be a function"),
        ({"reading": 5}, "^reading must be a function"),
        ({"ray_device": "gpu", "engine": "ray"}, "^ray_device must be one of auto, cpu, cuda .*; got 'gpu'"),
        ({"ray_device": "mps", "engine": "ray"}, "^ray_device must be one of auto, cpu, cuda .*; got 'mps'"),
        (
            {"ray_device": torch.device("cuda")},
            "^ray_device must be one of .*; got a value of type device",
        ),
    ],
)
def test_flags_and_callbacks_of_another_kind_are_refused_first(bundle, corpus, tmp_path, no_reading, options, words):
    """allow_unknown="no" had been read as yes and recorded as "kept"; a progress of text failed after a batch."""
    with pytest.raises(InputError, match=words):
        write_atlas(bundle, corpus, tmp_path / "out", **options)
    if "reading" not in options and "ray_device" not in options:  # in memory: no reading, no Ray
        with pytest.raises(InputError, match=words):
            compute_atlas(bundle, ["a b c"], **options)


def test_the_local_engine_takes_the_command_lines_device_as_ray_device(bundle, corpus, tmp_path):
    """`attnviz atlas --device mps` hands write_atlas ray_device="mps" whatever the engine: the local engine, which runs
    on the model's own device, takes it."""
    assert write_atlas(bundle, corpus, tmp_path / "out", ray_device="mps")["complete"] is True


# ---------------------------------------------------------------------------------------------
# Ablations and models


@pytest.mark.parametrize("text", [5, None, ["cross:1.2"]])
def test_an_ablation_that_is_not_text_is_one_input_error(text):
    with pytest.raises(InputError, match="^text must be the heads as text, KIND:LAYER.HEAD"):
        Ablation.parse(text)


@pytest.mark.parametrize("mode", [["zero"], {"zero": 1}, None, 0])
def test_an_ablation_mode_that_is_not_a_name_is_one_input_error(mode):
    """A list had failed as an unhashable key of MODES."""
    with pytest.raises(InputError, match="the ablation mode must be zero or mean"):
        Ablation(mode=mode)
    with pytest.raises(InputError, match="the ablation mode must be zero or mean"):
        Ablation.parse("cross:1.2", mode)


@pytest.mark.parametrize("value", [None, 5, ["en-de"], b"en-de"])
def test_a_model_that_is_not_text_or_a_path_is_not_looked_for_by_that_name(value):
    """None had been looked for as the model "None"."""
    with pytest.raises(InputError, match="^name_or_dir must be a shipped model's name, a checkpoint folder") as e:
        resolve_model(value)
    assert "no model named" not in str(e.value)


@pytest.mark.parametrize("visitor", [visitor_path, visitor_model])
def test_what_a_visitor_typed_must_be_text(visitor):
    with pytest.raises(InputError, match="^typed must be the text a visitor typed; got NoneType"):
        visitor(None)


# ---------------------------------------------------------------------------------------------
# A finished atlas whose tables were damaged afterwards


LINES = ["a b c d", "d c b a", "", "b b a"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """An atlas of the reverse model written by the command, as tests/test_atlas_diff.py writes its atlases."""
    root = tmp_path_factory.mktemp("finished")
    (root / "c.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    args = ["atlas", "--model", "reverse", "--corpus", str(root / "c.txt"), "--out", str(root / "A")]
    assert main([*args, "--device", "cpu"]) in (0, None)
    return root


def _rewrite(folder, table, change):
    path = folder / f"{table}.parquet"
    change(pd.read_parquet(path)).to_parquet(path, index=False)


def _rewrite_manifest(folder, change):
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    change(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


def _count(manifest):
    manifest["counts"]["sentences"] -= 1


DAMAGE = {
    "heads: a row cut": (lambda f: _rewrite(f, "heads", lambda t: t.iloc[1:]), "heads.parquet lacks"),
    "sentences: a row cut": (lambda f: _rewrite(f, "sentences", lambda t: t.iloc[:-1]), "sentences.parquet has"),
    "mds: a row cut": (lambda f: _rewrite(f, "mds", lambda t: t.iloc[1:]), "mds.parquet lacks"),
    "distances: a row cut": (lambda f: _rewrite(f, "distances", lambda t: t.iloc[1:]), "distances.parquet has"),
    "a manifest count edited": (lambda f: _rewrite_manifest(f, _count), "manifest counts 2 sentences"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_rerun_of_a_finished_atlas_whose_tables_disagree_computes_it_again(finished, tmp_path, damage, capsys):
    """It had checked each table's metadata alone and said "wrote": load_atlas, and every page, then refused it."""
    atlas = shutil.copytree(finished / "A", tmp_path / "A")
    harm, words = DAMAGE[damage]
    harm(atlas)
    with pytest.raises(AtlasError, match=words):
        load_atlas(atlas)
    args = ["atlas", "--model", "reverse", "--corpus", str(finished / "c.txt"), "--out", str(atlas)]
    assert main([*args, "--device", "cpu"]) in (0, None)
    err = capsys.readouterr().err
    assert "is marked finished but cannot be read" in err and "it is computed again" in err, err
    again, good = load_atlas(atlas), load_atlas(finished / "A")
    for name in ("sentences", "heads", "distances", "mds", "inputs"):
        pd.testing.assert_frame_equal(getattr(again, name), getattr(good, name), obj=name)
    assert again.manifest["counts"] == good.manifest["counts"]
    assert len(again.manifest["runs"]) == 2, "the run that computed it again joins the runs"


def test_a_rerun_of_a_good_finished_atlas_computes_nothing(bundle, finished, tmp_path, monkeypatch):
    atlas = shutil.copytree(finished / "A", tmp_path / "A")
    before = {p.name: p.stat().st_mtime_ns for p in atlas.iterdir()}

    def run(*args, **kwargs):
        raise AssertionError("a finished atlas was computed again")

    monkeypatch.setattr(build, "run_tagged", run)
    manifest = write_atlas(bundle, finished / "c.txt", atlas)
    assert manifest["complete"] is True and len(manifest["runs"]) == 1
    assert {p.name: p.stat().st_mtime_ns for p in atlas.iterdir() if p.name != "manifest.json"} == {
        name: t for name, t in before.items() if name != "manifest.json"
    }


def test_a_rerun_of_a_finished_atlas_reads_no_table_back(bundle, finished, tmp_path, monkeypatch):
    """A rerun had read the whole atlas back to know it finished: several GB of tables for a lab's million lines,
    far past the bound the run itself keeps. It now checks the tables' bytes against what the finishing run
    recorded, a megabyte at a time; an atlas whose record is gone is read back as before."""
    import hashlib

    from attnviz.atlas import store

    atlas = shutil.copytree(finished / "A", tmp_path / "A")
    manifest = json.loads((atlas / "manifest.json").read_text(encoding="utf-8"))
    record = manifest["finished_sha256"]
    for name in ("sentences", "heads", "distances", "mds", "inputs"):
        assert record[name] == hashlib.sha256((atlas / f"{name}.parquet").read_bytes()).hexdigest(), name
    reads = []
    monkeypatch.setattr(store, "_read_table", lambda *a, **k: reads.append(a) or pytest.fail("a table was read back"))
    again = write_atlas(bundle, finished / "c.txt", atlas)
    assert again == manifest and reads == []

    _rewrite_manifest(atlas, lambda m: m.pop("finished_sha256"))  # an atlas of an attnviz before the record
    monkeypatch.undo()
    read_back = []
    monkeypatch.setattr(store, "load_atlas", lambda folder: read_back.append(folder) or load_atlas(folder))
    assert write_atlas(bundle, finished / "c.txt", atlas)["complete"] is True and read_back == [atlas]


def test_a_finished_atlas_past_the_readers_size_bound_is_not_computed_again(bundle, finished, tmp_path, monkeypatch):
    """A lab's million lines make tables of hundreds of MB, past the 256 MB a reader takes unless
    ATTNVIZ_MAX_ATLAS_MB is raised: every rerun of the finished command had found it unreadable and computed it
    all again (20 minutes and more), to the same size."""
    atlas = shutil.copytree(finished / "A", tmp_path / "A")
    monkeypatch.setenv("ATTNVIZ_MAX_ATLAS_MB", "0.001")
    with pytest.raises(AtlasError, match="over the limit"):
        load_atlas(atlas)
    monkeypatch.setattr(build, "run_tagged", lambda *a, **k: pytest.fail("a finished atlas was computed again"))
    manifest = write_atlas(bundle, finished / "c.txt", atlas)
    assert manifest["complete"] is True and len(manifest["runs"]) == 1


def test_a_finished_atlas_s_rerun_neither_reads_its_corpus_nor_joins_a_cluster(bundle, finished, tmp_path, monkeypatch):
    """Its first pass had tokenised the whole corpus again (minutes for a lab's million lines), and with --engine
    ray joined the cluster and planned its actors first, all to find the atlas finished."""
    from attnviz.atlas import ray_engine

    atlas = shutil.copytree(finished / "A", tmp_path / "A")

    def refused(*args, **kwargs):
        raise AssertionError("a finished atlas's rerun read its corpus or joined a cluster")

    monkeypatch.setattr(build, "survey", refused)
    monkeypatch.setattr(ray_engine, "connected", refused)
    for engine in ("local", "ray"):
        manifest = write_atlas(bundle, finished / "c.txt", atlas, engine=engine)
        assert manifest["complete"] is True and manifest == load_atlas(atlas).manifest
    with pytest.raises(AssertionError, match="read its corpus"):  # another setting: the run's own checks decide
        write_atlas(bundle, finished / "c.txt", atlas, shard_size=7)
