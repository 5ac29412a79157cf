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
