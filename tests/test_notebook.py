"""The notebook views' Python side (attnviz.notebook): inputs, state, binary traits, fallbacks, files.

What a view draws is checked against the app's own figures (the palette PNGs of
`attnviz.figures.images`, decoded) and against the maps themselves, never against numbers
written here. The browser side: tests/test_notebook_browser.py.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from conftest import TOY_SRC, TOY_TGT, toy_export
from PIL import Image

pytest.importorskip("anywidget")

from attnviz import tiles  # noqa: E402
from attnviz.errors import ExportError, InputError, NonFiniteError  # noqa: E402
from attnviz.export import row_labels  # noqa: E402
from attnviz.figures.common import WEIGHT_COLORSCALE  # noqa: E402
from attnviz.figures.images import (  # noqa: E402
    attention_image,
    decode_png,
    head_grid,
    palette,
    pooled_attention_image,
)
from attnviz.kinds import causal_mask, writing_labels  # noqa: E402
from attnviz.notebook import head_view, model_view, plain_export  # noqa: E402
from attnviz.notebook.standalone import script  # noqa: E402
from attnviz.tiles import TiledAttention  # noqa: E402


def _softmax(scores: np.ndarray) -> np.ndarray:
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def hf_attentions(layers=3, batch=1, heads=2, T=6, causal=True, seed=0):
    """Hugging Face's outputs.attentions: a tuple of (batch, heads, T, T) arrays, one per layer."""
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(layers, batch, heads, T, T))
    if causal:
        scores = np.where(causal_mask(T), scores, -np.inf)
    return tuple(_softmax(scores[i]) for i in range(layers))


def frame_indices(view) -> np.ndarray:
    return np.frombuffer(view.indices, dtype=np.uint8).reshape(view.frame["shape"])


def frame_weights(view) -> np.ndarray:
    return np.frombuffer(view.weights, dtype=view.frame["dtype"]).reshape(view.frame["shape"])


# ---------------------------------------------------------------------------------------------
# Plain data from other libraries


def test_hugging_face_attentions_of_a_decoder_become_a_language_models_export():
    attentions = hf_attentions()
    tokens = [f"t{i}" for i in range(6)]
    export = plain_export(attentions, tokens)
    assert export.encoder is None and export.cross is None
    np.testing.assert_array_equal(export.decoder, np.stack([a[0] for a in attentions]))
    view = head_view(attentions, tokens=tokens, layer=3, head=2, mode="widget")
    assert view.frame["kind"] == "decoder"
    assert view.frame["rows"] == writing_labels(tokens, [*tokens[1:], "…"])  # the app's row labels
    np.testing.assert_array_equal(frame_weights(view), attentions[2][0, 1])


def test_a_bert_like_map_is_an_encoders_and_kind_can_say_so():
    attentions = hf_attentions(causal=False)
    tokens = [f"t{i}" for i in range(6)]
    assert head_view(attentions, tokens, mode="widget").frame["kind"] == "encoder"
    causal = hf_attentions()
    assert head_view(causal, tokens, kind="encoder", mode="widget").frame["kind"] == "encoder"
    with pytest.raises(InputError, match="not causal"):
        plain_export(attentions, tokens, kind="decoder")


def test_a_batch_of_several_texts_is_refused_or_indexed():
    attentions = hf_attentions(batch=3)
    tokens = [f"t{i}" for i in range(6)]
    with pytest.raises(InputError, match=r"batch of 3 texts.*batch=i \(from 0 to 2\)"):
        head_view(attentions, tokens=tokens)
    view = head_view(attentions, tokens=tokens, batch=2, layer=2, head=1, mode="widget")
    np.testing.assert_array_equal(frame_weights(view), attentions[1][2, 0])
    with pytest.raises(InputError, match="from 0 to 2"):
        head_view(attentions, tokens=tokens, batch=3)


def test_mismatched_tokens_scores_and_empty_tuples_are_clear_errors():
    attentions = hf_attentions()
    with pytest.raises(InputError, match="6 query and key positions but 5 tokens"):
        head_view(attentions, tokens=["a"] * 5)
    with pytest.raises(InputError, match="give the tokens"):
        head_view(attentions)
    with pytest.raises(InputError, match="not the scores"):
        head_view(tuple(a * 3 - 1 for a in attentions), tokens=["a"] * 6)
    with pytest.raises(InputError, match="output_attentions=True"):
        head_view((), tokens=[])
    with pytest.raises(InputError, match="list of strings"):
        head_view(attentions, tokens="a b c d e f")


def test_a_transformer_lens_stack_and_per_layer_patterns_give_the_same_maps():
    attentions = hf_attentions(batch=2)
    stacked = np.stack(attentions)  # cache.stack_activation("pattern"): (layer, batch, head, q, k)
    tokens = [f"t{i}" for i in range(6)]
    a = plain_export(stacked, tokens, batch=1)
    b = plain_export(list(attentions), tokens, batch=1)
    np.testing.assert_array_equal(a.decoder, b.decoder)
    np.testing.assert_array_equal(a.decoder[1], attentions[1][1])


def test_an_encoder_decoders_plain_maps_and_their_checks():
    export = toy_export()
    view = head_view(
        encoder=[m[None] for m in export.encoder],
        decoder=[m[None] for m in export.decoder],
        cross=[m[None] for m in export.cross],
        src_tokens=TOY_SRC,
        tgt_tokens=TOY_TGT,
        mode="widget",
    )
    assert view.spec["kinds"] == ["encoder", "decoder", "cross"] and view.frame["kind"] == "cross"
    np.testing.assert_array_equal(frame_weights(view), export.cross[0, 0])
    three = export.encoder[:, :, :3, :3] / export.encoder[:, :, :3, :3].sum(-1, keepdims=True)  # rows of weights
    with pytest.raises(InputError, match="cross-attention is 4 x 5 but the encoder has 3"):
        plain_export(encoder=three, cross=export.cross, src_tokens=TOY_SRC[:3], tgt_tokens=TOY_TGT)
    with pytest.raises(InputError, match="4 tokens were given"):
        plain_export(cross=export.cross, src_tokens=TOY_SRC[:4], tgt_tokens=TOY_TGT)


def test_plain_decoder_rows_end_on_an_unknown_token_with_or_without_the_encoders_maps():
    """Maps from another library carry no ids: what the last decoder position writes is unknown. It had been
    labelled "</s>" when the encoder's maps were passed and "…" when they were not, for the same rows."""
    export = toy_export()
    decoder, cross = [m[None] for m in export.decoder], [m[None] for m in export.cross]
    tokens = {"src_tokens": TOY_SRC, "tgt_tokens": TOY_TGT}
    both = plain_export(encoder=[m[None] for m in export.encoder], decoder=decoder, cross=cross, **tokens)
    alone = plain_export(decoder=decoder, cross=cross, **tokens)
    assert both.writes() == alone.writes() == (*TOY_TGT[1:], "…")
    assert row_labels(both, "cross") == row_labels(alone, "cross") == writing_labels(TOY_TGT, [*TOY_TGT[1:], "…"])
    assert export.writes()[-1] == "</s>", "an export with ids (a model's run) knows it ends the translation"


def test_a_bare_4d_array_with_batch_is_refused_not_read_as_layers():
    """One layer's (batch, heads, Q, K) tensor, passed bare, had its texts shown as layers: a bare 4-D array is
    (layers, heads, Q, K), so batch= beside one is a sign it is not, and is refused; in a list it is one layer."""
    layer = hf_attentions(layers=1, batch=2, heads=3, T=5)[0]  # outputs.attentions[0]: (batch, heads, Q, K)
    tokens = [f"t{i}" for i in range(5)]
    for batch in (0, 1):
        with pytest.raises(InputError, match=r"one 4-D array \(2, 3, 5, 5\).*pass it in a list, \[t\]"):
            plain_export(layer, tokens, batch=batch)
    np.testing.assert_array_equal(plain_export([layer], tokens, batch=1).decoder, layer[None, 1])
    assert plain_export(layer, tokens).decoder.shape == (2, 3, 5, 5)  # without batch: attnviz's own layout


def test_auto_kind_refuses_a_mix_of_causal_and_other_maps_and_names_the_first():
    """A decoder with one head that sees the future (a padding query spread over every key) had been shown,
    every head of it, as an encoder's maps."""
    attentions = [a.copy() for a in hf_attentions(layers=3, T=5)]
    attentions[1][0, 1, 0, :] = 1 / 5  # layer 1, head 1 (from 0): its first query attends to all 5 keys
    tokens = list("abcde")
    with pytest.raises(InputError, match=r"some are not, first layer 1, head 1 \(from 0\).*kind='encoder'"):
        head_view(attentions, tokens=tokens, mode="widget")
    with pytest.raises(InputError, match=r"first layer 1, head 1 \(from 0\): they are not causal"):
        plain_export(attentions, tokens, kind="decoder")
    assert head_view(attentions, tokens=tokens, kind="encoder", mode="widget").frame["kind"] == "encoder"
    assert plain_export(hf_attentions(causal=False), [f"t{i}" for i in range(6)]).encoder is not None


def _zero_rows(maps: np.ndarray, *rows: int) -> np.ndarray:
    maps = maps.copy()
    maps[..., rows, :] = 0
    return maps


@pytest.mark.parametrize(
    ("maps", "kind", "message"),
    [
        (np.zeros((1, 1, 2, 8, 8), np.float32), "auto", r"every row of layer 0, head 0 \(from 0\) sums to 0"),
        (
            np.random.default_rng(0).random((1, 1, 2, 200, 200), np.float32) / 20_000,  # normalised over the map
            "auto",
            r"sums to 0\.00\d+, not 1",
        ),
        (_zero_rows(hf_attentions(layers=1, T=4)[0], 2), "decoder", r"index \(0, 0, 2\) sums to 0.*sees at least"),
        (_zero_rows(hf_attentions(layers=1, T=4)[0], 0), "auto", r"index \(0, 0, 0\) sums to 0.*sees at least"),
    ],
    ids=["all zeros", "normalised over the whole map", "a decoder's zero row", "a causal map's zero first row"],
)
def test_rows_summing_to_about_zero_are_not_taken_for_masked_queries(maps, kind, message):
    """A row summing to at most 0.01 had counted as a query that saw no key: an all-zero map, rows of 1/200 each
    and a decoder's zero rows were drawn. Only a row summing to about 0 (1e-6) is one now."""
    with pytest.raises(InputError, match=message):
        plain_export(maps, [f"t{i}" for i in range(maps.shape[-1])], kind=kind)


def test_an_encoders_masked_query_rows_are_still_drawn():
    maps = _zero_rows(hf_attentions(layers=2, T=6, causal=False)[1], 5)  # the padding query at the end
    export = plain_export([maps, maps], [f"t{i}" for i in range(6)], kind="encoder")
    assert not export.encoder[..., 5, :].any()


def test_token_arguments_no_map_uses_are_refused():
    """src_tokens beside attentions, or beside decoder maps alone, had been ignored without a word."""
    export = toy_export()
    attentions = hf_attentions()
    tokens = [f"t{i}" for i in range(6)]
    with pytest.raises(InputError, match="attentions takes its tokens as tokens="):
        plain_export(attentions, tokens, src_tokens=tokens)
    with pytest.raises(InputError, match="attentions takes its tokens as tokens="):
        head_view(attentions, tokens=tokens, tgt_tokens=tokens)
    with pytest.raises(InputError, match="src_tokens label the source, which only encoder= and cross= maps have"):
        plain_export(decoder=export.decoder, src_tokens=TOY_SRC, tgt_tokens=TOY_TGT)
    with pytest.raises(InputError, match="tgt_tokens label the decoder input"):
        plain_export(encoder=export.encoder, src_tokens=TOY_SRC, tgt_tokens=TOY_TGT)
    assert plain_export(decoder=export.decoder, tgt_tokens=TOY_TGT).decoder is not None


def test_plain_maps_past_the_bound_are_refused_before_they_are_converted(monkeypatch):
    from attnviz.notebook import data

    attentions = hf_attentions(layers=3, heads=2, T=6)  # 3 x 2 x 6 x 6 float32: 864 bytes
    monkeypatch.setattr(data, "MAX_PLAIN_MB", 800 / 2**20)
    for maps in (attentions, np.stack(attentions)):
        with pytest.raises(InputError, match=r"3 layers x 2 heads of 6 x 6 weights take 0 MB.*tile by tile"):
            head_view(maps, tokens=[f"t{i}" for i in range(6)])
    monkeypatch.setattr(data, "MAX_PLAIN_MB", 864 / 2**20)
    assert plain_export(attentions, [f"t{i}" for i in range(6)]).decoder.nbytes == 864


def test_plain_maps_are_converted_without_a_second_copy_of_them_all():
    """Converting each layer, stacking, then checking causality on a copy of every map had taken twice the
    maps' float32 size; now a layer at a time into one array, and the causality a head at a time."""
    import tracemalloc

    attentions = tuple(a.astype(np.float16) for a in hf_attentions(layers=4, heads=4, T=256))
    maps_bytes = 4 * 4 * 4 * 256 * 256
    tracemalloc.start()
    try:
        export = plain_export(attentions, [f"t{i}" for i in range(256)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert export.decoder.nbytes == maps_bytes
    assert peak < 1.5 * maps_bytes, f"{peak / maps_bytes:.2f} x the maps' size at the peak"


# ---------------------------------------------------------------------------------------------
# State and binary traits: what the widget sends is the app's picture


@pytest.mark.parametrize("contrast", ["linear", "log", "row"])
def test_the_head_frame_is_the_apps_image_under_each_contrast(contrast):
    export = toy_export()
    view = head_view(export, kind="decoder", layer=2, head=3, contrast=contrast, mode="widget")
    weights = export.decoder[1, 2]
    fig = attention_image(weights, TOY_TGT, TOY_TGT, "decoder", contrast, causal_mask(len(TOY_TGT)))
    np.testing.assert_array_equal(frame_indices(view), decode_png(fig.data[0].source)[0])
    assert np.frombuffer(view.palette, dtype=np.uint8).reshape(-1, 3).tolist() == palette(WEIGHT_COLORSCALE).tolist()


def test_choices_change_the_frame_and_the_buffers_are_bytes_not_lists():
    export = toy_export()
    view = head_view(export, mode="widget")
    first = bytes(view.weights)
    view.kind, view.layer, view.head = "encoder", 2, 4
    assert isinstance(view.weights, bytes) and isinstance(view.indices, bytes)
    assert view.frame["title"].endswith("layer 2, head 4") and bytes(view.weights) != first
    np.testing.assert_array_equal(frame_weights(view), export.encoder[1, 3])
    assert "weights" not in view.frame and "indices" not in view.frame  # JSON holds no numbers of the map
    view.head = 9
    assert "layer 2 of" not in view.error and "counted from 1" in view.error  # a message, never a traceback
    half = head_view(export, dtype="float16", mode="widget")
    assert len(half.weights) * 2 == len(head_view(export, mode="widget").weights)
    np.testing.assert_allclose(frame_weights(half), export.cross[0, 0], atol=1e-3)


def test_words_come_from_the_export_over_words():
    from attnviz.notebook.data import Source
    from attnviz.tokenizer import Word

    export = toy_export()
    src_words = (Word(0, 2, "the cat"), Word(2, 3, "sat"), Word(3, 4, "down"), Word(4, 5, "</s>", True))
    tgt_words = (Word(0, 1, "<s>", True), Word(1, 3, "die Katze"), Word(3, 4, "saß"))
    from attnviz.words import merge_export

    merged = merge_export(export, src_words, tgt_words)
    view = head_view(Source(export, merged), words=True, mode="widget")
    np.testing.assert_allclose(frame_weights(view), merged.cross[0, 0])
    assert view.frame["cols"] == ["the cat", "sat", "down", "</s>"]
    assert not head_view(export, mode="widget").spec["has_words"]
    with pytest.raises(InputError, match="without words"):
        head_view(export, words=True)


def long_tiled(T=8192, D=16, layers=1, heads=2, seed=0) -> TiledAttention:
    """A language model's queries and keys for T tokens, made up: the maps tiles computes from them."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(layers, heads, T, D)).astype(np.float32) * 2
    k = rng.normal(size=(layers, heads, T, D)).astype(np.float32)
    tokens = tuple(f"w{i % 97}" for i in range(T))
    return TiledAttention({"decoder": q}, {"decoder": k}, None, tokens, {"model": "made up"})


@pytest.mark.parametrize("T", [1000, 2000])
def test_a_long_texts_overview_is_the_apps_under_each_contrast(T):
    """The overview comes from one pass (column maxima of the scan); the app pools with tiles.region."""
    tiled = long_tiled(T=T)
    view = head_view(tiled, head=2, contrast="log", mode="widget")
    one = tiled.head("decoder", 1, 2)
    scanned = tiles.scan(one, "decoder")
    for contrast in ("log", "linear", "row"):
        view.contrast = contrast
        values, ok, blocks = tiles.region(one, scanned, (0, T), (0, T), 1024, contrast == "row")
        assert view.frame["blocks"] == list(blocks) == ([1, 1] if T <= 1024 else [2, 2])
        fig = pooled_attention_image(
            values, ok, blocks, ((0, T), (0, T)), tiled.tgt_tokens, tiled.tgt_tokens, "decoder", contrast
        )
        np.testing.assert_array_equal(frame_indices(view), decode_png(fig.data[0].source)[0])
        if blocks == (1, 1):  # hover tells the weight itself, under any contrast
            values = tiles.region(one, scanned, (0, T), (0, T), 1024, False)[0]
        np.testing.assert_allclose(frame_weights(view), values, rtol=1e-6, atol=1e-9)


def test_a_long_text_opens_pooled_and_a_zoom_gives_exact_weights():
    tiled = long_tiled(T=2000)
    view = head_view(tiled, head=2, contrast="log", mode="widget")
    one = tiled.head("decoder", 1, 2)
    assert view.frame["blocks"] == [2, 2]
    view.zoom = [1500, 1540, 1480, 1530]
    assert view.frame["blocks"] == [1, 1] and view.frame["region"] == [1500, 1540, 1480, 1530]
    full_rows = np.exp(np.float64(one.queries[1500:1540]) @ np.float64(one.keys).T * one.scale)
    full_rows = np.where(causal_mask(40, 2000, 1500), full_rows, 0.0)
    exact = (full_rows / full_rows.sum(-1, keepdims=True))[:, 1480:1530]  # numpy softmax: independent of tiles
    np.testing.assert_allclose(frame_weights(view), exact, atol=1e-6)
    view.layer = 1
    view.head = 1
    assert view.zoom == [] and view.frame["blocks"] == [2, 2]


def _pooled_by_hand(weights: np.ndarray, region, causal: bool, contrast: str) -> tuple[np.ndarray, np.ndarray, tuple]:
    """A plain map's picture of ``region`` as the head view's docstring defines it, in numpy alone: each cell's
    colour value (row: over its whole row), the largest in each block of the overview's size from the region's
    top left, grey where every cell of a block is masked; and each block's largest weight."""
    r0, r1, c0, c1 = region
    part = weights[r0:r1, c0:c1].astype(np.float64)
    if contrast == "linear":
        values = np.clip(part, 0, 1)
    elif contrast == "log":
        values = (np.log10(np.clip(part, 1e-5, 1)) + 5) / 5
    else:
        values = part / weights[r0:r1].astype(np.float64).max(axis=1, keepdims=True)
    fr, fc = -(-(r1 - r0) // 1024), -(-(c1 - c0) // 1024)
    rows, cols = np.arange(0, r1 - r0, fr), np.arange(0, c1 - c0, fc)  # each block's first row and column

    def block_max(a):  # numpy's reduceat over the blocks' starts, rows then columns
        return np.maximum.reduceat(np.maximum.reduceat(a, rows, axis=0), cols, axis=1)

    ok = np.arange(r0, r1)[:, None] >= np.arange(c0, c1)[None, :] if causal else np.ones(part.shape, bool)
    colour, peak, grey = block_max(values), block_max(part), ~block_max(ok)
    indices = np.rint(np.clip(colour, 0, 1) * 253).astype(np.uint8)
    indices[grey] = 254  # the masked grey, after the 254 levels
    return indices, peak, (fr, fc)


@pytest.mark.slow  # maps of over a thousand tokens, each picture made four to six times: 0.7-1.4 s each on a Xeon
@pytest.mark.parametrize(
    ("kind", "shape", "zoom"),
    [
        ("decoder", (1101, 1101), None),  # pooled 2 x 2, the last block of each side short
        ("decoder", (1300, 1300), [10, 1290, 200, 1300]),  # keys past the queries: blocks wholly masked, and not
        ("cross", (1100, 2100), [100, 1090, 7, 2100]),  # target rows by source columns, pooled 1 x 3
    ],
)
def test_a_plain_maps_pooled_picture_is_each_blocks_largest_a_band_of_rows_at_a_time(monkeypatch, kind, shape, zoom):
    """The first picture of a long plain map is coloured and pooled a band of rows at a time (a few MiB, where the
    whole map in float64 copies had taken several times its size): in one band or in several, the last one short,
    it is the picture numpy gives of the whole, under each contrast."""
    from attnviz.notebook import frames

    rng = np.random.default_rng(5)
    Q, K = shape
    scores = rng.normal(size=(1, 1, Q, K)) * 3
    if kind == "decoder":
        scores = np.where(causal_mask(Q), scores, -np.inf)
        maps = {"attentions": _softmax(scores), "tokens": [f"t{i}" for i in range(Q)], "kind": "decoder"}
    else:
        maps = {"cross": _softmax(scores), "src_tokens": [f"s{i}" for i in range(K)],
                "tgt_tokens": [f"t{i}" for i in range(Q)]}  # fmt: skip
    weights = _softmax(scores)[0, 0]
    region = zoom or [0, Q, 0, K]
    for band_cells in (frames.BAND_CELLS, 100_000):  # one band; several, the last one short
        monkeypatch.setattr(frames, "BAND_CELLS", band_cells)
        maps_and_tokens = dict(maps)
        attentions = maps_and_tokens.pop("attentions", None)
        view = head_view(attentions, mode="widget", **maps_and_tokens)
        for contrast in ("linear", "log", "row"):
            view.contrast = contrast
            if zoom:
                view.zoom = zoom
            indices, peak, blocks = _pooled_by_hand(weights, region, kind == "decoder", contrast)
            assert view.frame["blocks"] == list(blocks) and view.frame["region"] == region
            np.testing.assert_array_equal(frame_indices(view), indices, err_msg=f"{contrast}, bands of {band_cells}")
            np.testing.assert_array_equal(frame_weights(view), peak.astype(np.float32))


@pytest.mark.slow  # a map of 5,000 tokens made and checked: about 2 s
def test_a_long_plain_maps_first_picture_takes_less_memory_than_the_map():
    """A plain map of 5,000 tokens (95 MiB of float32): its first picture, under each contrast, takes a few bands'
    worth of memory, not the float64 copies of the whole map (0.6-0.9 GiB for 6,000 tokens before)."""
    import tracemalloc

    from attnviz.notebook.data import as_source
    from attnviz.notebook.frames import HeadFrames

    n = 5000
    weights = np.tril(np.random.default_rng(0).random((n, n), dtype=np.float32))
    weights /= weights.sum(axis=-1, keepdims=True)
    frames = HeadFrames(as_source(weights[None, None], [f"t{i}" for i in range(n)], kind="decoder"))
    for contrast in ("linear", "log", "row"):
        tracemalloc.start()
        try:
            frame = frames.frame("decoder", 1, 1, contrast)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert frame["blocks"] == [5, 5]
        assert peak < 0.8 * weights.nbytes, f"{contrast}: {peak / weights.nbytes:.2f} x the map's size at the peak"


def test_the_model_views_thumbnails_are_the_apps_grid():
    export = toy_export()
    view = model_view(export, kind="encoder", contrast="row", mode="widget")
    L, H, h, w = view.grid_info["grid_shape"]
    grid = np.frombuffer(view.grid, dtype=np.uint8).reshape(L, H, h, w)
    fig = head_grid(export.encoder, TOY_SRC, TOY_SRC, "encoder", "row")
    picture = decode_png(fig.data[0].source)[0]
    from attnviz.figures.images import grid_layout

    _, _, xs, ys = grid_layout(L, H, h, w)
    for layer in range(L):
        for head in range(H):
            np.testing.assert_array_equal(
                grid[layer, head], picture[ys[layer] : ys[layer] + h, xs[head] : xs[head] + w]
            )
    view.kind = "decoder"
    assert view.grid_info["grid_kind"] == "decoder"


# ---------------------------------------------------------------------------------------------
# Fallbacks and files


def test_the_mime_bundle_keeps_a_picture_and_the_numbers():
    export = toy_export()
    view = head_view(export, kind="encoder", layer=2, head=1, mode="widget")
    data, _ = view._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data
    image = Image.open(io.BytesIO(base64.b64decode(data["image/png"])))
    assert min(image.size) >= 320
    picture = np.array(image)  # palette indices, each cell a square of whole pixels
    scale = image.size[0] // len(TOY_SRC)
    np.testing.assert_array_equal(picture[::scale, ::scale], frame_indices(view))
    weights = export.encoder[1, 0]
    i, j = np.unravel_index(weights.argmax(), weights.shape)
    assert f"<td>{weights[i, j]:.4f}</td>" in data["text/html"].split("<tr>")[2]  # the strongest weight first
    assert "<script" not in data["text/html"]


def test_html_mode_is_one_self_contained_document_in_an_iframe():
    view = head_view(toy_export(), mode="html")
    data = view._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" not in data
    assert data["text/html"].startswith("<iframe srcdoc=")
    doc = view.html()
    assert "export default" not in doc and "attnvizStandalone(" in doc
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", doc), "the page loads nothing from any host"
    assert "require(" not in doc and "import(" not in doc
    frames = json.loads(re.search(r"const ATTNVIZ_FRAMES = (.*);\n", doc).group(1))
    assert len(frames["head"]) == 3 * 2 * 4 * 3  # every kind, layer, head and contrast fit in the budget


def test_the_html_pages_budget_counts_each_kinds_frames_at_their_own_size():
    """The budget had been the current frame's size times the number of frames: opened on a short target's
    cross-attention, a long source's S x S encoder frames were all embedded, past PAGE_BUDGET."""
    from attnviz.notebook.standalone import PAGE_BUDGET

    rng = np.random.default_rng(0)
    L, H, S, T = 2, 4, 600, 4
    encoder, cross = _softmax(rng.normal(size=(L, 1, H, S, S))), _softmax(rng.normal(size=(L, 1, H, T, S)))
    src, tgt = [f"s{i}" for i in range(S)], [f"t{i}" for i in range(T)]
    for kind in ("cross", "encoder"):
        view = head_view(encoder=encoder, cross=cross, src_tokens=src, tgt_tokens=tgt, kind=kind, mode="html")
        frames = view.frames_for_page()
        embedded = sum(len(f["indices"]) + len(f["weights"]) for f in frames["head"].values())
        assert embedded <= PAGE_BUDGET, f"{embedded / 2**20:.1f} MB of frames embedded (opened on {kind})"
        assert not frames["complete"] and len(frames["head"]) == 3  # this head under each contrast
        for one in frames["head"].values():
            assert len(one["indices"]) + len(one["weights"]) == view._frames.frame_bytes(one["kind"])
    tiled = head_view(long_tiled(T=2000), mode="widget")  # pooled 2 x 2: the size comes from the shape alone
    assert len(tiled.indices) + len(tiled.weights) == tiled._frames.frame_bytes("decoder") == 1000 * 1000 * 5


def test_save_writes_svg_and_html(tmp_path):
    export = toy_export()
    view = head_view(export, kind="cross", mode="widget")
    svg = view.save(tmp_path / "head.svg")
    root = ET.parse(svg).getroot()
    rects = root.findall("{http://www.w3.org/2000/svg}rect")
    cells = [r for r in rects if r.get("width") == r.get("height") and r.get("width") != "14"]
    assert len(cells) == len(TOY_TGT) * len(TOY_SRC)
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "▁Katze → ▁saß" in texts and "▁down" in texts
    html = view.save(tmp_path / "head.html").read_text()
    assert html.startswith("<!DOCTYPE html>")
    with pytest.raises(InputError, match=".html or .svg"):
        view.save(tmp_path / "head.pdf")


def test_labels_xml_forbids_are_shown_visibly_and_every_file_is_written(tmp_path):
    """A control character in a token made the SVG not well-formed (browsers refuse the whole file), and a lone
    surrogate made save() raise UnicodeEncodeError for .svg and .html."""
    attentions = hf_attentions(layers=1, T=4)
    tokens = ["a", "b\x0c", "c\x1b[0m\x00", "d\ufffe"]
    svg = head_view(attentions, tokens=tokens, mode="widget").save(tmp_path / "controls.svg")
    texts = [t.text for t in ET.parse(svg).getroot().iter("{http://www.w3.org/2000/svg}text")]
    assert {"b␌", "c␛[0m␀", "d\\ufffe"} <= set(texts), texts
    view = head_view(attentions, tokens=["a", "b\udcff", "c", "d"], mode="widget")
    svg = view.save(tmp_path / "surrogate.svg")
    assert "b\\udcff" in [t.text for t in ET.parse(svg).getroot().iter("{http://www.w3.org/2000/svg}text")]
    doc = view.save(tmp_path / "surrogate.html").read_text(encoding="utf-8")
    frames = json.loads(re.search(r"const ATTNVIZ_FRAMES = (.*);\n", doc).group(1))
    assert frames["labels"]["decoder|0"][1][1] == "b\udcff"  # the script reads the label as it was given


def test_the_script_ships_in_the_package_and_imports_nothing():
    from importlib.resources import files

    source = (files("attnviz.notebook") / "static" / "views.js").read_text()
    assert not re.search(r"^\s*import\s", source, re.M) and "http" not in source.replace("http://www.w3.org", "")
    assert source.rstrip().endswith("export default { render };")
    assert "export default" not in script()


def test_the_step_view_holds_each_steps_rows_and_tokens(tiny_model):
    import torch

    from attnviz.decoding import step_through
    from attnviz.notebook import step_view

    src = torch.tensor([[5, 9, 7, 11, 2]])
    decoding = step_through(tiny_model, src, max_len=6)
    n = len(decoding.steps)
    prefix = ["<s>", *(f"t{s.token_id}" for s in decoding.steps)]  # the decoder input and the last token written
    view = step_view(
        decoding,
        src_tokens=[f"s{i}" for i in range(5)],
        tgt_tokens=prefix,
        id_to_token=lambda i: f"t{i}",
        mode="widget",
    )
    spec = view.spec
    L, H = spec["n_layers"], spec["n_heads"]
    assert (spec["n_steps"], L, H) == (n, 2, 4)
    assert spec["written"] == [f"t{s.token_id}" for s in decoding.steps]
    cross = np.frombuffer(view.cross_rows, dtype=np.float32).reshape(n, L, H, 5)
    rows = np.frombuffer(view.self_rows, dtype=np.float32).reshape(n, L, H, spec["prefix_len"])
    for i, step in enumerate(decoding.steps):
        np.testing.assert_array_equal(cross[i], step.cross_attn.numpy())
        t = step.self_attn.shape[-1]
        np.testing.assert_array_equal(rows[i, :, :, :t], step.self_attn.numpy())
        assert not rows[i, :, :, t:].any()  # past this step's prefix: nothing
    assert "<img" in view.fallback_html()
    with pytest.raises(InputError, match="needs tgt_tokens"):
        step_view(decoding, src_tokens=["s"] * 5)


def test_the_step_views_decoder_input_is_checked_against_what_each_step_wrote(tiny_model):
    """Labels past the decoder input had been cut off without a word, and labels shifted by one (what each step
    writes, not what it reads) had been drawn as the prefix."""
    import torch

    from attnviz.decoding import step_through
    from attnviz.notebook import step_view

    decoding = step_through(tiny_model, torch.tensor([[5, 9, 7, 11, 2]]), forced=[6, 8, 10, 2])  # teacher-forced
    written = [f"t{s.token_id}" for s in decoding.steps]
    assert written == ["t6", "t8", "t10", "t2"]
    P = len(decoding.steps)  # the start token, then every token written but the last
    given = {"src_tokens": [f"s{i}" for i in range(5)], "id_to_token": lambda i: f"t{i}", "mode": "widget"}
    for right in (["<s>", *written[:-1]], ["<s>", *written]):  # P, or P + 1 with the last token written
        assert step_view(decoding, tgt_tokens=right, **given).spec["prefix"] == ["<s>", *written[: P - 1]]
    with pytest.raises(InputError, match=rf"reads {P} decoder input tokens but tgt_tokens gives {P + 3}"):
        step_view(decoding, tgt_tokens=["<s>", *written, "x", "y"], **given)
    with pytest.raises(InputError, match=rf"reads {P} decoder input tokens but tgt_tokens gives {P - 1}"):
        step_view(decoding, tgt_tokens=["<s>", *written[:-2]], **given)
    shifted = [*written, "</s>"]
    with pytest.raises(InputError, match=r"tgt_tokens\[1\] is 't8', but step 0 \(from 0\) wrote 't6' \(id 6\)"):
        step_view(decoding, tgt_tokens=shifted, **given)


def test_the_step_view_refuses_steps_whose_prefix_does_not_grow_by_one(tiny_model):
    """Each step reads the prefix the step before read and the token it wrote. Steps whose rows were as long as
    the step before's (or jumped) had been taken, and a label no step wrote was drawn as a key: the check of
    each written token skips a position no step's row ends at."""
    import dataclasses

    import torch

    from attnviz.decoding import step_through
    from attnviz.notebook import step_view

    decoding = step_through(tiny_model, torch.tensor([[5, 9, 7, 11, 2]]), forced=[6, 8, 10, 2])
    given = {"src_tokens": [f"s{i}" for i in range(5)], "id_to_token": lambda i: f"t{i}", "mode": "widget"}
    steps = decoding.steps
    assert [s.self_attn.shape[-1] for s in steps] == [1, 2, 3, 4]
    # the same rows, shown as equal (step 1 reads step 0's one token) and as a jump (step 2 reads 4, step 3 four)
    same = dataclasses.replace(steps[1], self_attn=steps[0].self_attn)
    jump = dataclasses.replace(steps[2], self_attn=steps[3].self_attn)
    for bad, message in (
        ((steps[0], same, *steps[2:]), r"step 1 \(from 0\)'s self_attn rows read 1 decoder input tokens, step 0's 1"),
        ((*steps[:2], jump, steps[3]), r"step 2 \(from 0\)'s self_attn rows read 4 decoder input tokens, step 0's 1"),
    ):
        with pytest.raises(InputError, match=message + r".*\(\d here\)"):
            step_view(dataclasses.replace(decoding, steps=bad), tgt_tokens=["<s>", "t6", "zz", "t10"], **given)
    view = step_view(decoding, tgt_tokens=["<s>", "t6", "t8", "t10"], **given)
    assert view.spec["step_lengths"] == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_built_wheel_ships_the_script_and_style_and_a_view_runs_from_it(tmp_path):
    """A non-editable install: the wheel built from the package holds static/views.js and views.css, and a
    view made from the installed copy reads them from there."""
    import shutil
    import subprocess
    import sys
    import zipfile
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    source = tmp_path / "src"
    shutil.copytree(root / "attnviz", source / "attnviz", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, source / name)
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", str(source), "--no-deps", "--no-build-isolation", "-w", str(wheels)], check=True)
    (wheel,) = wheels.glob("attnviz-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"attnviz/notebook/static/views.js", "attnviz/notebook/static/views.css"} <= names
    target = tmp_path / "installed"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True)
    check = (
        "import numpy as np, attnviz.notebook.widgets as w; from attnviz.notebook import head_view; "
        "v = head_view((np.full((1, 1, 3, 3), 1 / 3, np.float32),), tokens=list('abc'), kind='encoder'); "
        "print(w.__file__); print(v._esm.rstrip().endswith('export default { render };'), '.attnviz-view' in v._css)"
    )
    out = subprocess.run(
        [sys.executable, "-c", check],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    assert out[0].startswith(str(target)) and out[1] == "True True"


def quickstart_page(notebook: dict) -> str:
    """docs/notebooks/quickstart.md as the notebook's cells make it: prose as it is, code fenced, in order."""
    parts = [
        "<!-- The quickstart notebook as a page: its cells, in order (tests/test_notebook.py keeps them equal). -->"
    ]
    for cell in notebook["cells"]:
        text = "".join(cell["source"]).strip("\n")
        parts.append(text if cell["cell_type"] == "markdown" else f"```python\n{text}\n```")
    parts.append("[Download the notebook](quickstart.ipynb) to run it, with every view drawn.")
    return "\n\n".join(parts) + "\n"


def test_the_docs_page_of_the_quickstart_is_the_notebook():
    """The manual shows the notebook nbclient runs (tests/test_notebook_browser.py), cell for cell."""
    docs = Path(__file__).resolve().parent.parent / "docs" / "notebooks"
    want = quickstart_page(json.loads((docs / "quickstart.ipynb").read_text(encoding="utf-8")))
    assert (docs / "quickstart.md").read_text(encoding="utf-8") == want, (
        "docs/notebooks/quickstart.md is not the notebook's cells: write tests.test_notebook.quickstart_page's "
        "output into it"
    )


def _changed(export, **arrays):
    import dataclasses

    return dataclasses.replace(export, **arrays)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda e: {"encoder": np.where(np.eye(5, dtype=bool), np.nan, e.encoder)}, "NaN or infinite"),
        (lambda e: {"encoder": e.encoder * 5}, "not the scores"),
        (lambda e: {"cross": e.cross[..., ::-1, :].copy() * 0.5}, r"sums to 0\.5, not 1"),
        (lambda e: {"decoder": np.swapaxes(e.decoder, -1, -2).copy()}, "sums to|above the diagonal"),
        (lambda e: {"src_tokens": e.src_tokens[:-1]}, "its encoder maps are shaped"),
        (lambda e: {"manifest": {**e.manifest, "method": "norm"}}, "the 'norm' method's maps"),
    ],
    ids=["NaN", "scores", "rows of half", "transposed decoder", "a token short", "a method's maps"],
)
def test_an_export_is_checked_as_plain_maps_are(change, message, tmp_path):
    """An attnviz export or .npz is drawn only if its maps are weights of its tokens, as plain maps must be:
    NaN had been drawn as 0, scores as weights, a token short raised an IndexError when displayed."""
    bad = _changed(toy_export(), **change(toy_export()))
    with pytest.raises(InputError, match=message):
        head_view(bad, mode="widget")
    if "method" not in bad.manifest and bad.src_tokens == toy_export().src_tokens:  # the file: load_export's own
        path = bad.save(tmp_path / "bad.npz")
        with pytest.raises((InputError, ExportError), match=message):  # NaN: refused by load_export itself
            head_view(str(path), mode="widget")
    head_view(toy_export(), mode="widget")  # the same export, unchanged, is drawn


def test_layers_of_other_shapes_name_the_layer():
    attentions = list(hf_attentions())
    attentions[1] = attentions[1][:, :, :5, :5]
    with pytest.raises(InputError, match=r"layer 1 \(from 0\) is \(1, \d+, 5, 5\)"):
        head_view(attentions, tokens=[f"t{i}" for i in range(6)])


def test_plain_maps_given_keys_by_queries_are_refused():
    attentions = tuple(np.swapaxes(a, -1, -2).copy() for a in hf_attentions())  # causal, transposed: columns sum to 1
    with pytest.raises(InputError, match="transposed"):
        head_view(attentions, tokens=[f"t{i}" for i in range(6)], kind="encoder")


def test_wrong_arguments_are_clear_errors_not_tracebacks_or_guesses():
    """A float or bool layer had raised an IndexError or been drawn as 'layer True'; an unknown kind and a
    batch of a model were ignored; a step view given a source token short read its rows with the wrong stride."""
    import traitlets

    from attnviz.decoding import step_through
    from attnviz.notebook import step_view

    export = toy_export()
    for bad in ({"layer": 1.0}, {"layer": True}, {"head": "1"}, {"kind": "bogus"}):
        with pytest.raises(InputError, match="whole number|kind must be"):
            head_view(export, mode="widget", **bad)
    with pytest.raises(InputError, match="holds one text already"):
        head_view(export, batch=0, mode="widget")
    view = head_view(export, mode="widget")
    for name, value in (("contrast", "bogus"), ("zoom", [0, 1]), ("zoom", [3, 1, 2, 0]), ("zoom", [-5, -1, 0, 4])):
        with pytest.raises(traitlets.TraitError):
            setattr(view, name, value)
    assert (view.contrast, view.zoom) == ("linear", [])  # refused values leave the view drawable
    view.zoom = [0, 2, 0, 3]
    assert not view.error and view.frame["region"] == [0, 2, 0, 3]
    Q, K = view.frame["full"]
    view.zoom = [1, 2, 1, K + 100]  # past the last column: drawn clipped, and the state says so
    assert (view.zoom, view.frame["region"]) == ([1, 2, 1, K], [1, 2, 1, K]) and not view.error
    view.zoom = [0, Q + 5, 0, K + 5]  # the whole map and more: the whole map
    assert (view.zoom, view.frame["region"]) == ([], [0, Q, 0, K])

    from conftest import seeded_model, tiny_config

    model = seeded_model(tiny_config()).eval()
    import torch

    decoding = step_through(model, torch.tensor([[5, 6, 7, 2]]), max_len=3)
    src, prefix = ["a", "b", "c", "</s>"], ["<s>"] + [str(s.token_id) for s in decoding.steps]
    step_view(decoding, src_tokens=src, tgt_tokens=prefix, id_to_token=str, mode="widget")
    for bad, message in (
        ({"src_tokens": src[:-1]}, "reads 4 source tokens; src_tokens gives 3"),
        ({"src_tokens": None}, "src_tokens gives none"),
        ({"id_to_token": 5}, "id_to_token must be a function"),
    ):
        with pytest.raises(InputError, match=message):
            step_view(decoding, **{"src_tokens": src, "tgt_tokens": prefix, "id_to_token": str, **bad}, mode="widget")


def test_an_export_path_refuses_what_it_would_ignore(tmp_path):
    """An export given as a path had dropped tokens=, batch=, maps and src_tokens/tgt_tokens without a word, where
    the same export as an object refuses them."""
    path = toy_export().save(tmp_path / "toy.npz")
    for name in (path, str(path)):
        for extra, message in (
            ({"tokens": list("wxyz")}, "carries its own tokens: pass it alone"),
            ({"cross": np.eye(3, dtype=np.float32)}, "carries its own tokens: pass it alone"),
            ({"src_tokens": TOY_SRC}, "carries its own tokens: pass it alone"),
            ({"batch": 0}, "holds one text already"),
        ):
            with pytest.raises(InputError, match=message):
                head_view(name, mode="widget", **extra)
            with pytest.raises(InputError, match=message):
                model_view(name, mode="widget", **extra)
    assert head_view(path, mode="widget").frame["cols"] == list(TOY_SRC)


def test_arguments_a_source_does_not_use_are_refused_not_dropped(tmp_path, monkeypatch):
    """text=, tgt= and generate= beside plain maps or an export, a text given twice to a model, and maps beside a
    model had been dropped without a word: the view drew something other than what was asked for."""
    from attnviz.notebook import data

    attentions, tokens = hf_attentions(causal=False), [f"t{i}" for i in range(6)]
    for extra in ({"text": "x"}, {"tgt": "y"}, {"generate": 5}):
        with pytest.raises(InputError, match="only with an attnviz model"):
            head_view(attentions, tokens, kind="encoder", mode="widget", **extra)
        with pytest.raises(InputError, match="only with an attnviz model"):
            model_view(plain_export(attentions, tokens, kind="encoder"), mode="widget", **extra)
        with pytest.raises(InputError, match="only with an attnviz model"):
            head_view(toy_export().save(tmp_path / "toy.npz"), mode="widget", **extra)
    monkeypatch.setattr(data, "_is_bundle", lambda value: value == "a model")
    monkeypatch.setattr(data, "from_model", lambda *args, **kwargs: pytest.fail("the model was run"))
    with pytest.raises(InputError, match="the text twice"):
        data.as_source("a model", "a cat", text="the dog")
    with pytest.raises(InputError, match="runs on its text: give no maps"):
        data.as_source("a model", text="the dog", encoder=attentions, src_tokens=tokens)
    with pytest.raises(InputError, match="holds one text already"):
        data.as_source("a model", text="the dog", batch=0)


@pytest.mark.parametrize(
    "tokens",
    [
        pytest.param("tensor", id="a tensor of ids"),
        pytest.param([b"a", b"b", b"c", b"d", b"e", b"f"], id="bytes"),
        pytest.param([None] * 6, id="None"),
        pytest.param(list(range(6)), id="ids"),
        pytest.param(6, id="a number"),
    ],
)
def test_tokens_that_are_not_strings_are_refused_not_str_ed(tokens):
    import torch

    if tokens == "tensor":
        tokens = torch.arange(6)
    with pytest.raises(InputError, match="tokens must be a list of strings"):
        head_view(hf_attentions(causal=False), tokens, kind="encoder", mode="widget")


def test_no_layers_or_no_texts_are_clear_errors():
    tokens = [f"t{i}" for i in range(4)]
    with pytest.raises(InputError, match="no layers given"):
        head_view(np.zeros((0, 2, 4, 4), np.float32), tokens, mode="widget")
    with pytest.raises(InputError, match="no layers given"):
        head_view(np.zeros((0, 1, 2, 4, 4), np.float32), tokens, mode="widget")
    with pytest.raises(InputError, match="batch axis holds no texts"):
        head_view([np.zeros((0, 2, 4, 4), np.float32)], tokens, mode="widget")


def test_complex_maps_are_refused_not_cut_to_their_real_part():
    import torch

    layer = hf_attentions(layers=1)[0]
    tokens = [f"t{i}" for i in range(6)]
    for complex_layer in (layer.astype(np.complex64), torch.tensor(layer).to(torch.complex64)):
        with pytest.raises(InputError, match="complex"):
            head_view([complex_layer], tokens, mode="widget")


@pytest.mark.parametrize("view", [head_view, model_view])
@pytest.mark.parametrize("contrast", ["bogus", None, ["linear"]])
def test_a_bad_contrast_is_an_input_error(view, contrast):
    with pytest.raises(InputError, match="contrast must be one of"):
        view(toy_export(), contrast=contrast, mode="widget")


def _own_decoding(changes=None, L=2, H=2, S=3):
    """A Decoding of two steps made by hand (as a user may), with ``changes`` {step: {field: value}} applied."""
    import torch

    from attnviz.decoding import Candidate, DecodeStep, Decoding

    rng = np.random.default_rng(0)
    steps = []
    for i, token in enumerate((6, 7)):
        fields = {
            "index": i,
            "token_id": token,
            "prob": 0.5,
            "top": (Candidate(token, 0.5),),
            "self_attn": torch.tensor(_softmax(rng.normal(size=(L, H, i + 1)))),
            "cross_attn": torch.tensor(_softmax(rng.normal(size=(L, H, S)))),
        }
        fields.update((changes or {}).get(i, {}))
        steps.append(DecodeStep(**fields))
    return Decoding(ids=(6, 7), steps=tuple(steps), score=0.0)


def test_a_decoding_of_ones_own_is_checked_as_plain_maps_are():
    """A hand-made Decoding had been drawn with NaN or weights of 5 or a probability of 7, or had failed with a
    numpy ValueError, an AttributeError or a TypeError."""
    import torch

    from attnviz.notebook import step_view

    given = {"src_tokens": list("abc"), "tgt_tokens": ["<s>", "t6"], "id_to_token": lambda i: f"t{i}", "mode": "widget"}
    good = _own_decoding()
    step_view(good, **given)
    cross = good.steps[1].cross_attn
    for changes, message in (
        ({1: {"cross_attn": cross * float("nan")}}, "NaN or infinite"),
        ({1: {"cross_attn": cross * 5}}, r"0\.\.1"),
        ({0: {"self_attn": good.steps[0].self_attn * 0.5}}, "not 1"),
        ({1: {"prob": float("nan")}}, "probability"),
        ({1: {"prob": 7.0}}, "probability"),
        ({1: {"top": ((7, 0.5),)}}, "candidates"),
        ({1: {"cross_attn": torch.ones(2, 2, 4) / 4}}, r"step 1 \(from 0\).* \(2, 2, 4\), step 0's \(2, 2, 3\)"),
        ({1: {"self_attn": torch.ones(3, 2, 2) / 2}}, r"step 1 \(from 0\).* \(3, 2, 2\)"),
        ({1: {"cross_attn": None}}, "cross-attention in some steps"),
        ({0: {"self_attn": torch.ones(2, 1)}}, r"\(layers, heads, positions\)"),
        ({0: {"cross_attn": cross.to(torch.complex64)}}, "complex"),
    ):
        with pytest.raises(InputError, match=message):
            step_view(_own_decoding(changes), **given)
    for bad, message in (
        ({"tgt_tokens": 5}, "tgt_tokens must be a list of strings"),
        ({"src_tokens": 3}, "src_tokens must be a list of strings"),
        ({"tgt_tokens": [b"<s>", b"t6"]}, "tgt_tokens must be a list of strings"),
    ):
        with pytest.raises(InputError, match=message):
            step_view(good, **{**given, **bad})
    with pytest.raises(InputError, match="takes an attnviz.decoding.Decoding"):
        step_view([1, 2, 3], **given)


def _own_tiled(q_shape=(1, 2, 6, 4), k_shape=(1, 2, 6, 4), tokens=tuple("abcdef"), q=None, **more):
    """A TiledAttention made by hand (the docs invite one), of a decoder, with ``more`` kinds' (q, k) beside it."""
    rng = np.random.default_rng(0)
    queries = {"decoder": rng.normal(size=q_shape).astype(np.float32) if q is None else q}
    keys = {"decoder": rng.normal(size=k_shape).astype(np.float32)}
    for kind, (q_more, k_more) in more.items():
        queries[kind], keys[kind] = q_more, k_more
    return TiledAttention(queries, keys, tuple("xyz") if more else None, tokens, {"model": "made up"})


def test_a_tiled_attention_of_ones_own_is_checked():
    """A hand-made TiledAttention had been drawn with more rows than labels, or with NaN, or had failed with an
    IndexError at a head past its key heads."""
    import torch

    head_view(_own_tiled(), mode="widget")
    model_view(_own_tiled(q_shape=(1, 4, 6, 4)), mode="widget")  # grouped-query: 4 query heads over 2 key heads
    cross = (np.ones((2, 2, 6, 4), np.float32), np.ones((2, 2, 3, 4), np.float32))
    for tiled, message in (
        (_own_tiled(tokens=tuple("abcd")), "6 queries but 4 tokens"),
        (_own_tiled(tokens=None), "tgt_tokens must be a list of strings"),
        (_own_tiled(tokens=list(range(6))), "tgt_tokens must be a list of strings"),
        (_own_tiled(q=np.full((1, 2, 6, 4), np.nan, np.float32)), "NaN or infinite"),
        (_own_tiled(q_shape=(1, 3, 6, 4)), "3 query heads is not a multiple of its 2 key heads"),
        (_own_tiled(k_shape=(1, 3, 6, 4)), "2 query heads is not a multiple of its 3 key heads"),
        (_own_tiled(k_shape=(1, 2, 6, 5)), "queries of 4 dimensions but keys of 5"),
        (_own_tiled(q_shape=(2, 2, 6, 4)), "2 layers of queries but 1 of keys"),
        (_own_tiled(q_shape=(2, 4)), r"\(layers, heads, queries, dimensions\)"),
        (_own_tiled(cross=cross), "every kind needs the same layers"),
        (_own_tiled(q=torch.ones(1, 2, 6, 4)), "float32 numpy array; got Tensor"),
        (_own_tiled(q=np.ones((1, 2, 6, 4), np.float16)), "float32 numpy array; got float16 array"),
        (TiledAttention({"decoder": np.ones((1, 1, 2, 2), np.float32)}, {}, None, ("a", "b"), {}), "the same kinds"),
    ):
        with pytest.raises(InputError, match=message):
            head_view(tiled, mode="widget")
        with pytest.raises(InputError, match=message):
            model_view(tiled, mode="widget")
    # finite queries and keys whose scores overflow float32: every weight had been NaN, drawn as a blank map
    overflowing = _own_tiled(q=np.full((1, 2, 6, 4), 1e19, np.float32))
    overflowing.keys["decoder"][:] = 1e20
    for view in (head_view, model_view):
        with pytest.raises(NonFiniteError, match=r"the decoder scores of query row 0 \(from 0\) are not finite"):
            view(overflowing, mode="widget")


def test_the_model_views_page_keeps_its_thumbnail_grids_within_the_budget(monkeypatch):
    """Every kind's grid under every contrast had been embedded whatever its size, past PAGE_BUDGET. The page
    answers a head frame with its kind's and contrast's grid, so every head frame kept has its grid."""
    from attnviz.notebook import standalone

    budget = 400_000
    monkeypatch.setattr(standalone, "PAGE_BUDGET", budget)
    attentions = hf_attentions(layers=4, heads=4, T=100, causal=False)  # grids of 16 heads x 96 x 96: 147 kB each
    view = model_view(attentions, [f"t{i}" for i in range(100)], contrast="log", mode="html")
    frames = view.frames_for_page()
    grids = sum(len(g["grid"]) for g in frames["grids"].values())
    heads = sum(len(f["indices"]) + len(f["weights"]) for f in frames["head"].values())
    assert grids + heads <= budget, f"{grids} bytes of grids and {heads} of head frames embedded"
    assert "encoder|log" in frames["grids"] and "encoder|1|1|log|0" in frames["head"]  # what the page opens on
    assert all(f"{f['kind']}|{f['contrast']}" in frames["grids"] for f in frames["head"].values())
    assert not frames["complete"]
    whole = model_view(hf_attentions(layers=1, heads=1, T=4), list("abcd"), mode="html").frames_for_page()
    assert len(whole["grids"]) == 3 and whole["complete"]  # a small model's page keeps every choice
