"""A file's name says what it holds: two downloads with different contents never share a name, every chart's
camera button saves under a name of its own (never plotly's 'newplot'), and a button's help describes its file.

A visitor who downloads two views under one name overwrites the first, or keeps both as 'name (1)' without
knowing which is which.
"""

from __future__ import annotations

import hashlib
import io
import json

import numpy as np
import pytest
import streamlit as st
from conftest import open_app
from streamlit.delta_generator import DeltaGenerator

from attnviz.app.registry import PAGES


@pytest.fixture
def drawn(monkeypatch):
    """Every download button the app draws, in order: (file name, label, data, help)."""
    buttons = []
    real, on_main = DeltaGenerator.download_button, st.download_button

    def record(self, label, data, file_name=None, *args, **kwargs):
        buttons.append((file_name, label, data, kwargs.get("help")))
        return real(self, label, data, file_name, *args, **kwargs)

    def record_main(label, data, file_name=None, *args, **kwargs):
        buttons.append((file_name, label, data, kwargs.get("help")))
        return on_main(label, data, file_name, *args, **kwargs)

    monkeypatch.setattr(DeltaGenerator, "download_button", record)
    monkeypatch.setattr(st, "download_button", record_main)
    return buttons


def content(name: str, data) -> str:
    """A digest of what the file holds: an NPZ's arrays, not its zip bytes (which carry the time they were built)."""
    data = data() if callable(data) else data
    if not name.endswith(".npz"):
        return hashlib.sha256(data).hexdigest()
    digest = hashlib.sha256()
    with np.load(io.BytesIO(data)) as npz:
        for key in sorted(npz.files):
            digest.update(key.encode() + npz[key].tobytes())
    return digest.hexdigest()


def clashes(buttons) -> dict[str, set[str]]:
    """File names drawn with more than one content: name -> the distinct digests."""
    seen: dict[str, set[str]] = {}
    for name, _, data, _ in buttons:
        seen.setdefault(name, set()).add(content(name, data))
    return {name: digests for name, digests in seen.items() if len(digests) > 1}


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_streamlit_caches")
def test_the_methods_page_never_names_two_files_alike(drawn):
    """Gradient-weighted attention depends on the words toggle and on the position it explains: both are in
    the CSV's and the NPZ's names."""
    at = open_app("pages/beyond.py")
    at.radio(key="bw_kind").set_value("cross").run()
    at.radio(key="bw_method").set_value("grad-attention").run()
    at.selectbox(key="bw_position").set_value(2).run()
    at.toggle(key="words").set_value(True).run()
    at.selectbox(key="bw_position").set_value(3).run()
    at.toggle(key="words").set_value(False).run()
    assert not at.exception, [e.value for e in at.exception]
    names = {name for name, *_ in drawn}
    assert {"en-de-grad-attention-position3.npz", "en-de-words-grad-attention-position3.npz"} <= names, sorted(names)
    assert not clashes(drawn), sorted(clashes(drawn))


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_streamlit_caches")
def test_the_lines_view_names_its_heads(drawn):
    at = open_app("pages/explorer.py")
    at.radio(key="kind").set_value("cross").run()
    at.selectbox(key="layer").set_value(3).run()
    at.selectbox(key="view").set_value("lines").run()
    at.multiselect(key="lines_heads").set_value([1, 2]).run()
    assert not at.exception, [e.value for e in at.exception]
    names = {name for name, *_ in drawn}
    assert "en-de-cross-L3H1-2-lines.csv" in names, sorted(names)
    assert not clashes(drawn), sorted(clashes(drawn))


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_streamlit_caches")
def test_the_head_statistics_button_says_what_its_file_holds(drawn):
    at = open_app("pages/explorer.py")
    at.selectbox(key="view").set_value("stats").run()
    assert not at.exception, [e.value for e in at.exception]
    ((name, _, data, help_text),) = [b for b in drawn if b[0].endswith("head-statistics.csv")]
    header = (data() if callable(data) else data).split(b"\n", 1)[0].decode()
    assert header.startswith("layer,head,entropy"), header
    assert "query index" not in help_text and "entropy" in help_text, help_text


def chart_names(at) -> list[tuple[str, str]]:
    """(title, camera file name) of every plotly chart on the page; the name is 'newplot' where none is given."""
    found = []
    for chart in at.get("plotly_chart"):
        config = json.loads(chart.proto.config or "{}")
        title = json.loads(chart.proto.spec).get("layout", {}).get("title", {}).get("text", "")
        found.append((title, config.get("toImageButtonOptions", {}).get("filename", "newplot")))
    return found


def unnamed(at) -> list[str]:
    return [title or "(untitled)" for title, name in chart_names(at) if name == "newplot"]


def walkthrough_stages(at):
    """The walkthrough at each of its stages after the first, by its Next button."""
    for _ in range(len(at.selectbox(key="wt_stage").options) - 1):
        at.button(key="_wt_next").click().run()
        yield at.selectbox(key="wt_stage").value


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_streamlit_caches")
def test_every_chart_saves_under_a_name_of_its_own():
    """Every page as it opens, every view of the explorer, each method of the methods page and every stage of
    the walkthrough: no chart's camera button saves 'newplot.png'."""
    missing = {}
    for page in PAGES:
        at = open_app(page.path)
        assert not at.exception, (page.path, [e.value for e in at.exception])
        missing[page.path] = unnamed(at)
        if page.path == "pages/explorer.py":
            for view in ("grid", "lines", "aggregate", "stats", "qk"):
                at.selectbox(key="view").set_value(view).run()
                missing[page.path] += unnamed(at)
        if page.path == "pages/beyond.py":
            at.radio(key="bw_method").set_value("grad-attention").run()  # its relevance chart
            missing[page.path] += unnamed(at)
        if page.path == "pages/walkthrough.py":
            for stage in walkthrough_stages(at):
                missing[page.path] += [f"{stage}: {title}" for title in unnamed(at)]
        assert not at.exception, (page.path, [e.value for e in at.exception])
    missing = {page: titles for page, titles in missing.items() if titles}
    assert not missing, missing


# ---------------------------------------------------------------------------------------------
# Charts the page walk above does not reach: a long text's zoom and tiles, a live training


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    pytest.importorskip("transformers")
    from lm_models import build

    folder = tmp_path_factory.mktemp("long") / "llama"
    build("llama", folder)
    return folder


LONG_WORDS = "the cat sat on the mat one two three four five six a b c d e f g h".split()
LONG_PROMPT = " ".join(LONG_WORDS[i % len(LONG_WORDS)] for i in range(150))  # 237 tokens, as tests/test_app_long.py


@pytest.fixture
def long_link(llama, monkeypatch, fresh_streamlit_caches):
    """A 237-token prompt to a random Llama: maps of 3.4 MB (see tests/test_app_long.py)."""
    from attnviz.app import CUSTOM_PATH

    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(llama.parent))
    monkeypatch.setenv("ATTNVIZ_HEAVY_IN", "threads")
    return {"model": CUSTOM_PATH, "model_path": str(llama), "src": LONG_PROMPT}


@pytest.mark.slow
def test_a_long_text_s_charts_save_under_names_of_their_own(long_link, monkeypatch):
    """Tile by tile (over ATTNVIZ_FULL_MAPS_MB): the overview, the exact zoom and the pooled detail; under it:
    the one-head image's exact zoom. Each names the head, and a zoom its region (newplot.png before)."""
    from conftest import open_from_link

    names = []
    zoom = {"zoom_q": ["10", "209"], "zoom_k": ["5", "150"]}  # over 128 a side: the pooled detail
    for tiled in (True, False):
        if tiled:
            monkeypatch.setenv("ATTNVIZ_FULL_MAPS_MB", "1")
        else:
            monkeypatch.delenv("ATTNVIZ_FULL_MAPS_MB", raising=False)
        for region in ({}, zoom) if tiled else ({},):
            at = open_from_link(
                "pages/explorer.py", {**long_link, "view": "One head", "layer": "2", "head": "3", **region}
            )
            assert not at.exception, [e.value for e in at.exception]
            assert any("tile by tile" in i.value for i in at.info) == tiled
            shown = [name for _, name in chart_names(at)]
            assert len(shown) == 2, shown  # the map (or its overview) and the zoom (or the detail)
            names += shown
    assert "newplot" not in names, names
    assert all("L2H3" in name for name in names), names
    # the head (its overview, or its image), and each region of it: a zoom names its first and last query and key
    assert set(names) == {
        "llama-decoder-L2H3",
        "llama-decoder-L2H3-q0-47-k0-47",
        "llama-decoder-L2H3-q10-209-k5-150",
    }, names


@pytest.mark.slow
def test_a_live_training_s_charts_save_under_names_of_their_own(tmp_path, fresh_streamlit_caches):
    """The losses, every head's statistic and the clearest head's map, drawn from a small recorded history."""
    from streamlit.testing.v1 import AppTest
    from test_live_training import write_record

    write_record(tmp_path, 50)
    write_record(tmp_path, 100)
    script = (
        "from types import SimpleNamespace\n"
        "from attnviz.app.live_training import draw\n"
        "from attnviz.training import load_history\n"
        f"draw(SimpleNamespace(id='run1', task='reverse'), load_history({str(tmp_path)!r}))\n"
    )
    at = AppTest.from_string(script, default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    names = [name for _, name in chart_names(at)]
    assert len(names) == 3, names
    assert "newplot" not in names, names
    assert len(set(names)) == 3 and all("reverse" in n and "step100" in n for n in names), names
    assert any("cross-L2H1" in n for n in names), names  # the clearest head's map says which head


def _calls_without_a_name(path) -> list[str]:
    """``.plotly_chart(`` and ``map_chart(`` calls in ``path`` with neither ``config=`` nor ``**kwargs``."""
    import ast

    missing = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name not in ("plotly_chart", "map_chart"):
            continue
        if any(k.arg == "config" or k.arg is None for k in node.keywords):  # None: **kwargs forwarded
            continue
        missing.append(f"{path.parent.name}/{path.name}:{node.lineno}")
    return missing


def test_no_chart_call_in_the_app_lacks_a_file_name():
    """A source scan: every chart the app draws is given a camera file name (``config=export_config(...)``), so a
    new chart cannot save 'newplot.png' unnoticed where the page walk does not reach it."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    files = [root / "app.py", *sorted((root / "pages").glob("*.py")), *sorted((root / "attnviz" / "app").rglob("*.py"))]
    assert len(files) > 10
    missing = [call for path in files for call in _calls_without_a_name(path)]
    assert not missing, missing


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_streamlit_caches")
def test_the_walkthrough_s_csv_names_say_the_model_and_the_step(drawn):
    """Two models' tensors of one name, and the output layer's rows of the top candidates at two steps, are
    different files: their names differ."""
    for model in ("en-de", "reverse"):
        at = open_app("pages/walkthrough.py", model)
        at.selectbox(key="wt_stage").set_value("embedding").run()
        at.selectbox(key="wt_stage").set_value("output").run()
        for step in at.selectbox(key="wt_step").options[:2]:
            at.selectbox(key="wt_step").set_value(step).run()
        assert not at.exception, [e.value for e in at.exception]
    names = {name for name, *_ in drawn}
    assert any(name.startswith("en-de-") for name in names) and any(name.startswith("reverse-") for name in names), (
        sorted(names)
    )
    assert not clashes(drawn), sorted(clashes(drawn))
