"""The long-text (tiled) path in the app: the operator's token bound, and a zoom link (issue 31).

A random language model (the letter tokenizer of `bench_render`: ``letters(n)`` is n + 1 tokens)
with room for 16,384 positions, so that only the server's ATTNVIZ_MAX_TOKENS can refuse a text.
Reading a text's tokens is all the refusals need: no layer is computed for them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import open_from_link

from attnviz.app import CUSTOM_PATH

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from bench_render import build_random_lm, letters  # noqa: E402

pytestmark = pytest.mark.slow  # AppTest runs of a model: the full suite

POSITIONS = 16384


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("long") / "lm"
    build_random_lm(folder, max_len=POSITIONS)
    return folder


@pytest.fixture
def server(lm, monkeypatch, fresh_streamlit_caches):
    """The app's settings for the test: the model folder visitors may open, the work in the test's thread."""
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(lm.parent))
    monkeypatch.setenv("ATTNVIZ_HEAVY_IN", "threads")
    monkeypatch.delenv("ATTNVIZ_MAX_TOKENS", raising=False)
    monkeypatch.delenv("ATTNVIZ_FULL_MAPS_MB", raising=False)
    return monkeypatch


def _link(lm: Path, tokens: int, **more: str) -> dict:
    return {"model": CUSTOM_PATH, "model_path": str(lm), "src": letters(tokens - 1), **more}


@pytest.mark.parametrize(
    ("limit", "tokens"),
    [("1000", 3599), (None, 8193), (None, POSITIONS)],
    ids=["limit-1000-3599-tokens", "default-8193-tokens", "default-16384-tokens"],
)
@pytest.mark.parametrize("view", ["One head", "All heads (model view)", "Head statistics"])
def test_a_long_text_over_the_operator_s_bound_is_refused_not_drawn_tile_by_tile(server, lm, limit, tokens, view):
    if limit is not None:
        server.setenv("ATTNVIZ_MAX_TOKENS", limit)
    at = open_from_link("pages/explorer.py", _link(lm, tokens, view=view))
    assert not at.exception, [e.value for e in at.exception]
    most = f"{int(limit or 8192):,}"
    said = [e.value.replace("\\", "") for e in at.error]  # shown as text: markdown's characters escaped
    assert any(f"{tokens:,} tokens long; this server takes at most {most} (ATTNVIZ_MAX_TOKENS)" in e for e in said), (
        said
    )
    assert not at.get("plotly_chart") and not at.dataframe, "nothing of it is drawn"
    assert not any("tile by tile" in i.value for i in at.info)


def test_the_home_page_refuses_it_too_and_takes_a_text_at_the_bound(server, lm):
    at = open_from_link("app.py", _link(lm, 8193))
    assert any("8,193 tokens long; this server takes at most 8,192" in e.value for e in at.error)
    at = open_from_link("app.py", _link(lm, 8192))
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    assert any("8,192 tokens long" in i.value and "tile by tile" in i.value for i in at.info)


@pytest.mark.parametrize(
    ("zoom_q", "zoom_k"),
    [
        (["2000", "2090"], ["1000", "1090"]),
        (["2090", "2000"], ["1000", "1090"]),
        ("2000-2090", "1000-1090"),
        ("2000,2090", "1090, 1000"),
    ],
    ids=["streamlit-form", "streamlit-form-high-first", "dash", "comma"],
)
def test_a_zoom_link_opens_its_region(server, lm, zoom_q, zoom_k):
    """Streamlit writes a range as two values (``zoom_q=2000&zoom_q=2090``); people write one. Two values high
    first (``zoom_q=2090&zoom_q=2000``) had been the range 2090 to 2000: "Something went wrong" on a tiled map,
    an empty zoom on a whole one."""
    at = open_from_link("pages/explorer.py", _link(lm, 3000, view="One head", zoom_q=zoom_q, zoom_k=zoom_k))
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    titles = [json.loads(chart.proto.spec)["layout"]["title"]["text"] for chart in at.get("plotly_chart")]
    assert any(t.endswith("queries 2000-2090, keys 1000-1090") for t in titles), titles
    assert at.slider(key="zoom_q").value == (2000, 2090) and at.slider(key="zoom_k").value == (1000, 1090)
    assert not any("Set aside" in c.value for c in at.caption), "the footer does not call the link's range unused"
