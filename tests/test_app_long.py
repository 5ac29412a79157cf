"""A text whose maps are over ATTNVIZ_FULL_MAPS_MB: the explorer shows it tile by tile, other pages say why not.

A random Llama folder (rotary positions, grouped-query attention) with a prompt of 237 tokens:
its maps are 2 layers x 8 heads x 237^2 floats, 3.4 MB, over the 1 MB the tests allow.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from attnviz import tiles
from attnviz.app import CUSTOM_PATH, registry

pytest.importorskip("transformers")

from conftest import open_from_link  # noqa: E402
from lm_models import build  # noqa: E402

pytestmark = pytest.mark.slow  # AppTest runs of a model: the full suite

WORDS = "the cat sat on the mat one two three four five six a b c d e f g h".split()
PROMPT = " ".join(WORDS[i % len(WORDS)] for i in range(150))  # 237 tokens


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("long") / "llama"
    build("llama", folder)
    return folder


@pytest.fixture
def long_server(llama, monkeypatch, fresh_streamlit_caches):
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(llama.parent))
    monkeypatch.setenv("ATTNVIZ_FULL_MAPS_MB", "1")
    monkeypatch.setenv("ATTNVIZ_HEAVY_IN", "threads")  # the queue, run in the test's own thread
    return {"model": CUSTOM_PATH, "model_path": str(llama), "src": PROMPT}


def _errors(at) -> list[str]:
    return [e.value for e in at.exception] + [e.value for e in at.error]


def _tiled(llama):
    import attnviz

    bundle = attnviz.load(str(llama), device="cpu")
    return attnviz.tiled_attention(bundle, PROMPT)


def test_one_head_is_an_overview_and_an_exact_zoom_of_its_weights(long_server, llama):
    at = open_from_link("pages/explorer.py", {**long_server, "view": "One head", "layer": "2", "head": "3"})
    assert not _errors(at), _errors(at)
    assert any("tile by tile" in i.value for i in at.info), "it says how the maps are computed"
    charts = at.get("plotly_chart")
    assert len(charts) == 2, "the overview and the zoom"
    tiled = _tiled(llama)
    T = tiled.shape("decoder")[2]
    assert T == 237
    # The zoom opens on the first 48 positions, exactly: its heatmap holds the weights themselves.
    zoom = json.loads(charts[1].proto.spec)
    title = zoom["layout"]["title"]["text"]
    assert "queries 0-47, keys 0-47" in title
    exact = tiled.map("decoder", 2, 3)[:48, :48]
    z = _heatmap_values(zoom)
    np.testing.assert_allclose(np.nan_to_num(z), exact, atol=1e-6)


def _heatmap_values(spec: dict) -> np.ndarray:
    """The z of the first heatmap trace (plotly encodes arrays as base64 'bdata')."""
    trace = next(t for t in spec["data"] if t["type"] == "heatmap")
    z = trace["z"]
    if isinstance(z, dict):
        shape = [int(n) for n in str(z["shape"]).split(",")]
        return np.frombuffer(base64.b64decode(z["bdata"]), dtype=np.dtype(z["dtype"])).reshape(shape)
    return np.array(z, dtype=float)


def test_a_zoom_over_128_positions_is_a_pooled_picture_and_a_link_keeps_it(long_server):
    zoom = {"zoom_q": ["10", "209"], "zoom_k": ["5", "150"]}  # how a link writes a range
    at = open_from_link("pages/explorer.py", {**long_server, "view": "One head", **zoom})
    assert not _errors(at), _errors(at)
    detail = json.loads(at.get("plotly_chart")[1].proto.spec)
    assert detail["data"][0]["type"] == "image"
    assert "queries 10-209, keys 5-150" in detail["layout"]["title"]["text"]
    assert detail["data"][0]["x0"] == 5 and detail["data"][0]["y0"] == 10  # the map's own positions


def test_all_heads_and_the_statistics_come_tile_by_tile(long_server, llama):
    at = open_from_link("pages/explorer.py", {**long_server, "view": "Head statistics"})
    assert not _errors(at), _errors(at)
    table = at.dataframe[0].value
    want = _tiled(llama).statistics("decoder")
    np.testing.assert_allclose(table["bos"], want["bos"].round(4), atol=1e-9)
    at = open_from_link("pages/explorer.py", {**long_server, "view": "All heads (model view)"})
    assert not _errors(at), _errors(at)
    L, H = _tiled(llama).shape("decoder")[:2]
    assert f"{L} layers x {H} heads" in at.get("plotly_chart")[0].proto.spec


def test_views_that_need_every_map_say_why_not(long_server):
    at = open_from_link("pages/explorer.py", {**long_server, "view": "Lines"})
    assert not _errors(at), _errors(at)
    assert any("draws every weight" in i.value for i in at.info)


@pytest.mark.parametrize("page", [p.path for p in registry.PAGES if p.path != "pages/explorer.py"])
def test_every_other_page_opens_and_says_in_words_what_it_cannot_show(long_server, page):
    at = open_from_link(page, long_server)
    assert not at.exception, [e.value for e in at.exception]
    said = " ".join(e.value for e in [*at.error, *at.info])
    for message in at.error:  # an error is that message, or a heading over it ("Side A:")
        assert "shorten the text" in message.value or len(message.value) < 20, message.value
    if at.error:
        assert "tile by tile" in said and "shorten the text" in said, said


def test_the_tiles_in_the_app_are_the_cores(llama):
    """The app fetches layers through the job the workers run: the same numbers as the core."""
    import attnviz
    from attnviz import jobs

    bundle = attnviz.load(str(llama), device="cpu")
    layer = jobs.run_job(bundle, "tiled_layer", (PROMPT, None, "decoder", 1))
    tiled = attnviz.tiled_attention(bundle, PROMPT)
    for h, (head, scanned) in enumerate(zip(layer.heads, layer.scans, strict=True), 1):
        np.testing.assert_array_equal(head.queries, tiled.head("decoder", 1, h).queries)
        np.testing.assert_allclose(tiles.tile(head, scanned, (0, 50), (0, 50)), tiled.map("decoder", 1, h)[:50, :50])
