"""The head atlas page in AppTest: the model's examples, pasted sentences, an atlas folder, a chosen head."""

from __future__ import annotations

import shutil

import pytest
from conftest import open_app

import attnviz
from attnviz.atlas import build_atlas

PAGE = "pages/atlas.py"
pytestmark = pytest.mark.usefixtures("fresh_streamlit_caches")


def assert_ok(at) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def charts(at) -> list:
    return list(at.get("plotly_chart"))


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
def test_the_models_examples_give_a_map_a_table_and_typical_sentences():
    at = open_app(PAGE)
    assert_ok(at)
    assert at.radio(key="at_source").value == "examples"
    assert at.dataframe, "the table of heads"
    assert len(charts(at)) >= 3, "the map, and the maps of the chosen head's typical sentences"
    text = " ".join(m.value for m in at.markdown)
    assert "Most typical" in text and "Least typical" in text


@pytest.mark.slow
def test_choosing_a_kind_statistic_and_head():
    at = open_app(PAGE)
    at.radio(key="at_kind").set_value("cross").run()
    at.selectbox(key="at_stat").set_value("diagonal").run()
    at.selectbox(key="at_layer").set_value(2).run()
    at.selectbox(key="at_head").set_value(3).run()
    assert_ok(at)
    assert any("Layer 2, head 3" in h.value for h in at.subheader)
    titles = [c.proto.spec for c in charts(at)]
    assert any("layer 2, head 3, line" in spec for spec in titles), "the chosen head's maps"
    at.selectbox(key="at_stat").set_value("mean_distance").run()  # cross-attention has none
    assert not at.exception
    assert any("has no mean_distance" in i.value for i in at.info)


@pytest.mark.slow
def test_pasted_sentences_are_bounded_and_give_an_atlas():
    at = open_app(PAGE)
    at.radio(key="at_source").set_value("pasted").run()
    assert_ok(at)
    assert at.text_area(key="at_pasted").value.splitlines() == attnviz.load("en-de").info["examples"]
    assert at.dataframe and charts(at), "the box starts from the model's examples: an atlas at once"
    at.text_area(key="at_pasted").set_value("").run()
    assert any("Paste some sentences" in i.value for i in at.info)
    lines = ["twenty-one", "seven", "x" * 500, "Thursday, July 2, 1998"]
    at.text_area(key="at_pasted").set_value("\n".join(lines)).run()
    assert_ok(at)
    assert any("Using 3 of 4 lines" in w.value for w in at.warning)
    assert at.dataframe and charts(at)
    at.text_area(key="at_pasted").set_value("x" * 10_000).run()  # not "the corpus is empty"
    assert_ok(at)
    assert any("Every line is longer than" in i.value for i in at.info), [i.value for i in at.info]


@pytest.fixture(scope="module")
def built_atlases(tmp_path_factory):
    """The two atlas folders the tests open (en-de's, reverse's), built once for the module."""
    folder = tmp_path_factory.mktemp("atlases")
    corpus = folder / "corpus.txt"
    corpus.write_text("twenty-one\nseven\nThursday, July 2, 1998\n\n")
    build_atlas(attnviz.load("en-de", device="cpu"), corpus, folder / "demo")
    build_atlas(attnviz.load("reverse", device="cpu"), _reverse_corpus(folder), folder / "reverse-demo")
    return folder


@pytest.fixture
def atlas_root(built_atlases, tmp_path, monkeypatch):
    """An atlas folder under the only folder visitors may open: the test's own copy, which it may break."""
    root = tmp_path / "roots"
    root.mkdir()
    for name in ("demo", "reverse-demo"):
        shutil.copytree(built_atlases / name, root / name)
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(root))
    return root


def _reverse_corpus(tmp_path):
    path = tmp_path / "reverse.txt"
    path.write_text("a b c\nh e l l o\n")
    return path


@pytest.mark.slow
def test_an_atlas_folder_opens_and_a_head_shows_its_sentences(atlas_root):
    at = open_app(PAGE)
    at.radio(key="at_source").set_value("folder").run()
    at.text_input(key="at_folder").set_value("demo").run()
    assert_ok(at)
    assert any("3 sentences (1 lines skipped: 1 empty)" in c.value for c in at.caption), [c.value for c in at.caption]
    at.selectbox(key="at_layer").set_value(3).run()
    assert_ok(at)
    assert len(charts(at)) >= 3
    captions = " ".join(c.value for c in at.caption)
    assert "Line 3: Thursday, July 2, 1998" in captions or "Line 1: twenty-one" in captions


@pytest.mark.slow  # two seconds or more on a 2-core AMD EPYC with AVX2 only
def test_an_atlas_of_another_model_shows_its_table_and_says_which_model(atlas_root):
    at = open_app(PAGE)
    at.radio(key="at_source").set_value("folder").run()
    at.text_input(key="at_folder").set_value("reverse-demo").run()
    assert_ok(at)
    assert at.dataframe
    assert any("computed with the model 'reverse'" in i.value for i in at.info)
    assert len(charts(at)) == 1, "the map only: no head maps from a model that is not the atlas's"


@pytest.mark.slow
@pytest.mark.parametrize("typed", ["../", "/etc", "missing"])
def test_a_folder_outside_the_roots_is_refused_naming_only_what_was_typed(atlas_root, typed):
    at = open_app(PAGE)
    at.radio(key="at_source").set_value("folder").run()
    at.text_input(key="at_folder").set_value(typed).run()
    assert not at.exception
    assert at.error and "not an atlas folder this server lets visitors open" in at.error[0].value
    assert str(atlas_root) not in at.error[0].value


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
def test_a_model_folder_that_is_not_an_atlas_says_so(atlas_root, tmp_path):
    (atlas_root / "empty").mkdir()
    at = open_app(PAGE)
    at.radio(key="at_source").set_value("folder").run()
    at.text_input(key="at_folder").set_value("empty").run()
    assert not at.exception
    assert at.error and "manifest.json is missing" in at.error[0].value


@pytest.mark.slow
def test_a_link_reopens_the_chosen_head():
    from test_app import open_link

    params = {"at_kind": "cross", "at_stat": "weight on the aligned key", "at_layer": "2", "at_head": "3"}
    at, notices = open_link(PAGE, params)
    assert_ok(at)
    assert not notices, notices
    assert (at.radio(key="at_kind").value, at.selectbox(key="at_stat").value) == ("cross", "diagonal")
    assert any("Layer 2, head 3" in h.value for h in at.subheader)
    at, notices = open_link(PAGE, {"at_kind": "sideways", "at_layer": "9"})
    assert_ok(at)
    assert "at_kind='sideways'" in notices and "at_layer='9'" in notices, notices


def _hostile(folder, case: str, outside) -> None:
    """Make the atlas folder ``folder`` hostile in the way ``case`` names."""
    import json
    import os
    import shutil

    import pandas as pd

    manifest = folder / "manifest.json"
    if case == "manifest to /dev/zero":
        manifest.unlink()
        manifest.symlink_to("/dev/zero")
    elif case == "manifest a FIFO":
        manifest.unlink()
        os.mkfifo(manifest)
    elif case == "manifest a folder":
        manifest.unlink()
        manifest.mkdir()
    elif case == "manifest huge":
        manifest.write_text(json.dumps({"format": "attnviz-atlas/1", "pad": "x" * 2_000_000}))
    elif case == "manifest nested":
        manifest.write_text("[" * 100_000 + "]" * 100_000)
    elif case == "manifest wrong types":
        data = json.loads(manifest.read_text())
        data["model"] = ["not", "an", "object"]
        manifest.write_text(json.dumps(data))
    elif case == "table of 60 M rows":
        pd.DataFrame({"line": pd.Series(0, index=range(60_000_000), dtype="int8")}).to_parquet(folder / "heads.parquet")
    elif case == "table linked out of the folder":
        shutil.copy(folder / "mds.parquet", outside / "mds.parquet")
        (folder / "mds.parquet").unlink()
        (folder / "mds.parquet").symlink_to(outside / "mds.parquet")
    elif case == "table without its columns":
        pd.DataFrame({"kind": ["cross"]}).to_parquet(folder / "distances.parquet")
    elif case == "table not parquet":
        (folder / "inputs.parquet").write_bytes(b"PAR1 not really")


HOSTILE = [
    "manifest to /dev/zero",
    "manifest a FIFO",
    "manifest a folder",
    "manifest huge",
    "manifest nested",
    "manifest wrong types",
    "table of 60 M rows",
    "table linked out of the folder",
    "table without its columns",
    "table not parquet",
]


@pytest.mark.slow
@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_atlas_folder_gives_a_message_that_names_no_path(atlas_root, built_atlases, tmp_path, case):
    """Atlas folders get the checks checkpoint files get: no hang, no GB read, no link out, no traceback."""
    import resource
    import time

    outside = tmp_path / "outside"
    outside.mkdir()
    _hostile(atlas_root / "demo", case, outside)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    at = open_app(PAGE)
    at.radio(key="at_source").set_value("folder").run()
    at.text_input(key="at_folder").set_value("demo").run()
    assert time.perf_counter() - start < 60, "a FIFO must not hang the visitor"
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 400, f"{case}: the server grew by {grown_mb:.0f} MB"
    assert not at.exception, [e.value for e in at.exception]
    shown = " ".join(e.value for e in at.error)
    assert shown, f"{case}: no message"
    for path in (str(atlas_root), str(tmp_path), str(built_atlases), "/dev/zero"):
        assert path not in shown, (case, shown)
