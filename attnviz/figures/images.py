"""Maps as images: one head at full resolution, the all-heads grid with peaks kept, and the contrast modes.

A heatmap trace sends every cell to the browser as a JSON number (a 1024 x 1024 map is about 7 MB
and a quarter of a gigabyte of browser memory; shared/FACTS.md). Here a map is colour-mapped on
the server to one byte per cell, a palette PNG (255 colour levels and a grey for masked cells),
and drawn by a plotly ``Image`` trace: a few hundred kilobytes, one ``<image>`` element, crisp
cells when zoomed (plotly renders images pixelated). ``benchmarks/bench_render.py`` measures it
in a browser. What an image cannot carry is each cell's exact number on hover: the one-head image
says which query and key the pointer is on, and the explorer shows any region of it as an exact
heatmap (`attnviz.figures.attention.attention_heatmap`), whose hover gives every weight.

**Contrast** (`CONTRASTS`): on a linear 0..1 scale a row spread over 1000 keys is near
white everywhere; the log scale and each row scaled to its maximum show where it looks. The colour
bar says which scale is on. Every weight view takes one.

Shape letters: L layers, H heads, Q queries, K keys. Rows are queries and columns are keys.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from PIL import Image

from attnviz.analysis import downsample
from attnviz.errors import InputError
from attnviz.figures.common import (
    HIGHLIGHT,
    MASKED_GREY,
    MAX_TICK_CHARS,
    SCORE_COLORSCALE,
    WEIGHT_COLORSCALE,
    above_top_labels,
    as_array,
    check_mask,
    check_tokens,
    kind_titles,
    plotly_labels,
    shortened,
)

CONTRASTS = {
    "linear": "linear",
    "log": "logarithmic",
    "row": "each row to its maximum",
}
LOG_FLOOR = 1e-5  # the log scale's bottom: weights at or below it get the lightest colour
LEVELS = 254  # colour levels: palette indices 0..253, then the grey of masked cells and a white background
MASKED_INDEX = LEVELS
BACKGROUND_INDEX = LEVELS + 1
THUMBNAIL = 96  # the all-heads grid keeps at most this many pixels per axis of each head, by max-pooling
# A long map (attnviz.tiles), in the app and in the notebook views: its overview, max-pooled to at most
# OVERVIEW pixels a side; a zoomed region exact up to ZOOM_MAX positions a side, else pooled to DETAIL.
OVERVIEW = 1024
DETAIL = 1024
ZOOM_MAX = 128
GAP = 0.12  # the space between thumbnails, as a share of a thumbnail
FRAME_GREY = "#d9d9d9"


def check_contrast(contrast: str) -> str:
    """``contrast`` itself; an InputError (a ValueError) for anything but one of `CONTRASTS`, None included."""
    if not isinstance(contrast, str) or contrast not in CONTRASTS:
        raise InputError(f"contrast must be one of {', '.join(CONTRASTS)}; got {contrast!r}")
    return contrast


def contrast_values(weights: np.ndarray, contrast: str, row_max: np.ndarray | None = None) -> np.ndarray:
    """Weights (..., Q, K) mapped to 0..1 for colouring (float64), as ``contrast`` says.

    - ``linear``: the weight itself, clipped to 0..1.
    - ``log``: (log10 w - log10 floor) / -log10 floor, with w raised to `LOG_FLOOR`:
      1 is a weight of 1, 0 a weight of 1e-5 or less, and each decade is a fifth of the scale.
    - ``row``: w / the largest weight of its row (``row_max`` (..., Q) when ``weights`` is a region
      of a larger map whose rows go on); a row of zeros stays 0.
    """
    weights = np.asarray(weights, dtype=np.float64)
    check_contrast(contrast)
    if contrast == "linear":
        return np.clip(weights, 0.0, 1.0)
    if contrast == "log":
        floor = math.log10(LOG_FLOOR)
        return (np.log10(np.clip(weights, LOG_FLOOR, 1.0)) - floor) / -floor
    peak = weights.max(axis=-1) if row_max is None else np.asarray(row_max, dtype=np.float64)
    peak = peak[..., None]
    return np.divide(np.clip(weights, 0.0, None), peak, out=np.zeros_like(weights), where=peak > 0).clip(0.0, 1.0)


def colour_bar(contrast: str) -> dict:
    """The colour bar of a weight view under ``contrast``: its title says which scale, its ticks are weights."""
    check_contrast(contrast)
    if contrast == "linear":
        return {
            "title": {"text": "weight"},
            "tickvals": [0, 0.25, 0.5, 0.75, 1],
            "ticktext": ["0", "0.25", "0.5", "0.75", "1"],
        }
    if contrast == "log":
        decades = -int(round(math.log10(LOG_FLOOR)))
        values = [i / decades for i in range(decades + 1)]
        text = [f"≤{LOG_FLOOR:g}"] + [f"{10.0 ** (i - decades):g}" for i in range(1, decades + 1)]
        return {"title": {"text": "weight (log scale)"}, "tickvals": values, "ticktext": text}
    return {
        "title": {"text": "weight ÷ its row's max"},
        "tickvals": [0, 0.5, 1],
        "ticktext": ["0", "½ of max", "row max"],
    }


def palette(colorscale: str) -> np.ndarray:
    """(LEVELS + 2, 3) uint8: ``colorscale`` sampled at LEVELS evenly spaced points, the masked grey, white."""
    from plotly.colors import get_colorscale, hex_to_rgb, sample_colorscale

    colours = sample_colorscale(get_colorscale(colorscale), list(np.linspace(0.0, 1.0, LEVELS)), colortype="tuple")
    rgb = np.array(colours) * 255 if max(max(c) for c in colours) <= 1.0 else np.array(colours)
    return np.concatenate([np.rint(rgb), [hex_to_rgb(MASKED_GREY), (255, 255, 255)]]).astype(np.uint8)


def colour_indices(values: np.ndarray, masked: np.ndarray | None = None) -> np.ndarray:
    """Values in 0..1 as palette indices: round(v * (LEVELS - 1)), and `MASKED_INDEX` where masked."""
    indices = np.rint(np.clip(np.asarray(values, dtype=np.float64), 0.0, 1.0) * (LEVELS - 1)).astype(np.uint8)
    if masked is not None:
        indices[np.asarray(masked, dtype=bool)] = MASKED_INDEX
    return indices


def png_data_uri(indices: np.ndarray, colorscale: str) -> str:
    """A palette PNG of ``indices`` (rows x columns, uint8) in ``colorscale``, as a data URI for plotly."""
    image = Image.fromarray(np.ascontiguousarray(indices, dtype=np.uint8), mode="P")
    image.putpalette(palette(colorscale).ravel().tolist())
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")  # zlib level 6: within 3% of optimize=True, at a twelfth of its time
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_png(uri: str) -> tuple[np.ndarray, np.ndarray]:
    """(indices (rows, columns) uint8, palette (n, 3) uint8) of a PNG data URI made by `png_data_uri`."""
    image = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))
    return np.array(image), np.array(image.getpalette(), dtype=np.uint8).reshape(-1, 3)


def legend_trace(colorscale: str, bar: dict) -> go.Scatter:
    """An empty trace that draws only the colour bar (an Image trace has none)."""
    return go.Scatter(
        x=[None],
        y=[None],
        mode="markers",
        hoverinfo="skip",
        showlegend=False,
        marker={"color": [0.0], "cmin": 0.0, "cmax": 1.0, "colorscale": colorscale, "showscale": True, "colorbar": bar},
    )


def position_ticks(labels: list[str], max_labels: int = 40, span: tuple[int, int] | None = None) -> dict:
    """Numeric-axis ticks at every n-th position of ``span`` (start, stop; default all), labelled with
    the position-prefixed tokens."""
    start, stop = span or (0, len(labels))
    step = max(1, math.ceil((stop - start) / max_labels))
    positions = list(range(start, stop, step))
    return {
        "tickmode": "array",
        "tickvals": positions,
        "ticktext": [shortened(labels[i], MAX_TICK_CHARS) for i in positions],
    }


def map_image(
    indices: np.ndarray,
    colorscale: str,
    bar: dict,
    name: str,
    labels: tuple[list[str], list[str]],
    axis_titles: tuple[str, str],
    title: str,
    note: str,
    region: tuple[tuple[int, int], tuple[int, int]] | None = None,
    blocks: tuple[int, int] = (1, 1),
) -> go.Figure:
    """One map's palette indices drawn as an image, one pixel per cell (or per block), with its colour bar.

    Rows are queries, columns keys: ``labels`` and ``axis_titles`` are (queries, keys), the labels
    ready for plotly (escaped); keys are labelled along the top, rotated. The image covers
    ``region`` ((r0, r1), (c0, c1), half-open; default the whole of ``labels``), one pixel per block
    of ``blocks`` (rows, columns) positions, so the axes keep the map's own positions. Hover gives
    the query and key positions. Zoom with the mouse (drag a box; double-click to reset): cells stay
    sharp squares.
    """
    (query_labels, key_labels), (y_title, x_title) = labels, axis_titles
    (r0, r1), (c0, c1) = region or ((0, len(query_labels)), (0, len(key_labels)))
    fr, fc = blocks
    pooled = fr > 1 or fc > 1
    hover = "around query %{y:.0f}<br>key %{x:.0f}" if pooled else "query %{y}<br>key %{x}"
    image = go.Image(
        source=png_data_uri(indices, colorscale),
        x0=c0 + (fc - 1) / 2,  # the centre of the first block
        y0=r0 + (fr - 1) / 2,
        dx=fc,
        dy=fr,
        name=name,
        hovertemplate=hover + "<extra></extra>",
    )
    layout = {
        "height": max(360, min(900, indices.shape[0] + 260)),
        "plot_bgcolor": "white",
        **above_top_labels(title, key_labels[c0:c1], angle=90, subtitle=note),
        "xaxis": {
            "title": x_title,
            "side": "top",
            "tickangle": -90,
            "range": [c0 - 0.5, c1 - 0.5],
            **position_ticks(key_labels, max_labels=30, span=(c0, c1)),
        },
        "yaxis": {"title": y_title, "range": [r1 - 0.5, r0 - 0.5], **position_ticks(query_labels, span=(r0, r1))},
    }
    return go.Figure(data=[image, legend_trace(colorscale, bar)], layout=layout)


def attention_image(
    weights: np.ndarray,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    kind: str,
    contrast: str = "linear",
    mask: np.ndarray | None = None,
    title: str | None = None,
) -> go.Figure:
    """One head's map (Q, K) at full resolution, one pixel per cell, as an image under ``contrast``.

    ``mask`` (Q, K, True = may attend) greys the cells a query may not see. Hover gives the query
    and key positions; axis labels show every n-th position's token. Zoom with the mouse (drag a
    box; double-click to reset): cells stay sharp squares.
    """
    kind_title, y_title, x_title = kind_titles(kind)
    values = as_array(weights, "weights", 2)
    Q, K = values.shape
    check_tokens(Q, query_tokens, "query")
    check_tokens(K, key_tokens, "key")
    mask = check_mask(mask, Q, K)
    masked = None if mask is None else ~mask
    indices = colour_indices(contrast_values(values, contrast), masked)
    note = f"{Q} x {K}, one pixel per weight, contrast: {CONTRASTS[contrast]}" + (
        "; grey: masked" if masked is not None and masked.any() else ""
    )
    labels = (plotly_labels(query_tokens), plotly_labels(key_tokens))
    bar = colour_bar(contrast)
    return map_image(indices, WEIGHT_COLORSCALE, bar, "weights", labels, (y_title, x_title), title or kind_title, note)


def pooled_attention_image(
    values: np.ndarray,
    allowed: np.ndarray,
    blocks: tuple[int, int],
    region: tuple[tuple[int, int], tuple[int, int]],
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    kind: str,
    contrast: str = "linear",
    title: str | None = None,
) -> go.Figure:
    """A region of one head's map, max-pooled ([`attnviz.tiles.region`][]), as an image under ``contrast``.

    ``values`` (h, w) is the largest weight of each block of ``blocks`` (rows, columns) positions,
    or, for the ``row`` contrast, the largest weight / its row's largest weight (rows run on beyond
    the region, so the region cannot rescale them itself). ``allowed`` (h, w) is False where every
    cell of a block is masked: grey. The axes keep the map's positions (``region``: (r0, r1), (c0, c1)).
    """
    kind_title, y_title, x_title = kind_titles(kind)
    values = as_array(values, "values", 2)
    ((r0, r1), (c0, c1)), (fr, fc) = region, blocks
    expected = (math.ceil((r1 - r0) / fr), math.ceil((c1 - c0) / fc))
    allowed = np.asarray(allowed, dtype=bool)
    if values.shape != expected or allowed.shape != expected:
        raise ValueError(f"a region {region} in blocks of {blocks} is {expected} pixels; got {values.shape}")
    coloured = contrast_values(values, "linear" if check_contrast(contrast) == "row" else contrast)
    indices = colour_indices(coloured, ~allowed)
    note = f"queries {r0}-{r1 - 1}, keys {c0}-{c1 - 1}; contrast: {CONTRASTS[contrast]}"
    if fr > 1 or fc > 1:
        note = f"each pixel the largest of {fr} x {fc} weights (max-pooled); " + note
    else:
        note = "one pixel per weight; " + note
    if not allowed.all():
        note += "; grey: masked"
    labels = (plotly_labels(query_tokens), plotly_labels(key_tokens))
    bar = colour_bar(contrast)
    return map_image(
        indices,
        WEIGHT_COLORSCALE,
        bar,
        "weights",
        labels,
        (y_title, x_title),
        title or kind_title,
        note,
        region=region,
        blocks=blocks,
    )


def grid_layout(n_layers: int, n_heads: int, rows: int, cols: int) -> tuple[int, int, list[int], list[int]]:
    """(width, height, column starts, row starts) in pixels of a layers x heads mosaic of rows x cols thumbnails."""
    gap_x, gap_y = max(1, round(GAP * cols)), max(1, round(GAP * rows))
    starts_x = [h * (cols + gap_x) for h in range(n_heads)]
    starts_y = [layer * (rows + gap_y) for layer in range(n_layers)]
    return starts_x[-1] + cols, starts_y[-1] + rows, starts_x, starts_y


def head_grid(
    maps: np.ndarray,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    kind: str,
    contrast: str = "linear",
    mask: np.ndarray | None = None,
    selected: tuple[int, int] | None = None,
    thumbnail: int = THUMBNAIL,
) -> go.Figure:
    """Every layer (rows) and head (columns) of ``maps`` (L, H, Q, K) as one image of thumbnails.

    A map longer than ``thumbnail`` on an axis is **max-pooled** (`attnviz.analysis.downsample`
    with ``how="max"``): each pixel is the strongest weight of its block, after the contrast, so a
    sharp head (previous token, a delimiter) keeps its line at any length instead of fading into an
    average. A block whose every cell is masked is grey. One invisible point per head, at the
    thumbnail's centre, carries its (layer, head) as ``customdata``: hovering says which head it is,
    and a click on it can open the head (``st.plotly_chart(on_select=...)``). ``selected`` (layer,
    head), from 1, is outlined.
    """
    maps = as_array(maps, "maps", 4)
    L, H, Q, K = maps.shape
    check_tokens(Q, query_tokens, "query")
    check_tokens(K, key_tokens, "key")
    if thumbnail < 1:
        raise ValueError(f"thumbnail must be at least 1 pixel, got {thumbnail}")
    check_contrast(contrast)
    mask = check_mask(mask, Q, K)
    allowed_blocks = None if mask is None else thumbnail_allowed(mask, thumbnail)
    rows, cols = min(Q, thumbnail), min(K, thumbnail)

    def tile(layer: int, head: int) -> np.ndarray:  # one head at a time: every head at once is L*H*Q*K float64s
        return thumbnail_indices(maps[layer, head], contrast, allowed_blocks, thumbnail)

    pooled = (math.ceil(Q / rows), math.ceil(K / cols))
    return _grid_figure(tile, (L, H), (rows, cols), pooled, kind, contrast, selected)


def thumbnail_allowed(mask: np.ndarray, thumbnail: int = THUMBNAIL) -> np.ndarray:
    """(h, w) bool: whether any cell of each block of a `head_grid` thumbnail may be non-zero (``mask`` (Q, K))."""
    return downsample(np.asarray(mask, dtype=np.float64), thumbnail, how="max")[0] > 0


def thumbnail_indices(
    weights: np.ndarray, contrast: str, allowed_blocks: np.ndarray | None = None, thumbnail: int = THUMBNAIL
) -> np.ndarray:
    """One head's (Q, K) map as a `head_grid` thumbnail: palette indices, max-pooled after the contrast.

    ``allowed_blocks`` (`thumbnail_allowed`) greys the blocks whose every cell is masked.
    """
    pooled = downsample(contrast_values(weights, contrast), thumbnail, how="max")[0]
    return colour_indices(pooled, None if allowed_blocks is None else ~allowed_blocks)


def pooled_thumbnail_indices(thumbnails: np.ndarray, allowed: np.ndarray, contrast: str) -> np.ndarray:
    """One head's tiled thumbnail ((2, h, w): block maxima, and of weight / row max) as palette indices."""
    which, shown = (1, "linear") if check_contrast(contrast) == "row" else (0, contrast)
    return colour_indices(contrast_values(thumbnails[which], shown), ~np.asarray(allowed, dtype=bool))


def pooled_head_grid(
    thumbnails: np.ndarray,
    allowed: np.ndarray,
    blocks: tuple[int, int],
    kind: str,
    contrast: str = "linear",
    selected: tuple[int, int] | None = None,
) -> go.Figure:
    """`head_grid` of thumbnails already max-pooled from queries and keys ([`attnviz.tiles`][]).

    ``thumbnails`` (L, H, 2, h, w): each head's largest weight per block of ``blocks`` positions, and
    the largest weight / its row's largest weight (`attnviz.tiles.LayerTiles.thumbnails`);
    ``allowed`` (h, w) is False where every cell of a block is masked.
    """
    thumbnails = np.asarray(thumbnails, dtype=np.float32)
    if thumbnails.ndim != 5 or thumbnails.shape[2] != 2:
        raise ValueError(f"thumbnails must be (layers, heads, 2, h, w), got {thumbnails.shape}")
    L, H, _, h, w = thumbnails.shape
    check_contrast(contrast)

    def tile(layer: int, head: int) -> np.ndarray:
        return pooled_thumbnail_indices(thumbnails[layer, head], allowed, contrast)

    return _grid_figure(tile, (L, H), (h, w), blocks, kind, contrast, selected)


def _grid_figure(
    tile,
    heads_shape: tuple[int, int],
    size: tuple[int, int],
    pooled: tuple[int, int],
    kind: str,
    contrast: str,
    selected: tuple[int, int] | None,
) -> go.Figure:
    """The mosaic of `head_grid`: ``tile(layer, head)`` (from 0) gives each head's palette indices."""
    kind_title, y_title, x_title = kind_titles(kind)
    (L, H), (rows, cols), (pooled_rows, pooled_cols) = heads_shape, size, pooled
    if selected is not None and not (1 <= selected[0] <= L and 1 <= selected[1] <= H):
        raise ValueError(f"selected is (layer, head) from 1; these maps have {L} layers and {H} heads, got {selected}")
    width, height, starts_x, starts_y = grid_layout(L, H, rows, cols)
    indices = np.full((height, width), BACKGROUND_INDEX, dtype=np.uint8)
    for layer in range(L):
        for head in range(H):
            indices[starts_y[layer] : starts_y[layer] + rows, starts_x[head] : starts_x[head] + cols] = tile(
                layer, head
            )
    centres_x = [x + (cols - 1) / 2 for x in starts_x]
    centres_y = [y + (rows - 1) / 2 for y in starts_y]
    heads = [(layer, head) for layer in range(1, L + 1) for head in range(1, H + 1)]
    traces = [
        go.Image(
            source=png_data_uri(indices, WEIGHT_COLORSCALE), x0=0, y0=0, dx=1, dy=1, hoverinfo="skip", name="heads"
        ),
        go.Scatter(
            x=[centres_x[h - 1] for _, h in heads],
            y=[centres_y[layer - 1] for layer, _ in heads],
            mode="markers",
            marker={"size": 28, "symbol": "square", "color": "rgba(0,0,0,0)"},
            customdata=heads,
            hovertemplate="layer %{customdata[0]}, head %{customdata[1]}<br>click to open it<extra></extra>",
            showlegend=False,
            name="open a head",
        ),
        legend_trace(WEIGHT_COLORSCALE, colour_bar(contrast)),
    ]
    title = f"{kind_title}: {L} layers x {H} heads"
    if pooled_rows > 1 or pooled_cols > 1:
        title += f" (max-pooled: each pixel is the largest of up to {pooled_rows}x{pooled_cols} weights)"
    frames = []  # a thin frame, so that a thumbnail of near-zero weights is not lost on the white
    for layer, head in heads:
        x, y = starts_x[head - 1], starts_y[layer - 1]
        chosen = selected == (layer, head)
        frames.append(
            {
                "type": "rect",
                "x0": x - 0.5,
                "x1": x + cols - 0.5,
                "y0": y - 0.5,
                "y1": y + rows - 0.5,
                "line": {"color": HIGHLIGHT if chosen else FRAME_GREY, "width": 3 if chosen else 1},
            }
        )
    layout = {  # whole, in one go: plotly's add_shape lays the figure out again for each of L x H frames
        "title": {
            "text": title,
            "subtitle": {"text": f"in each map, rows: {y_title}; columns: {x_title}; contrast: {CONTRASTS[contrast]}"},
        },
        "height": max(300, min(1400, 130 + 110 * L)),
        "margin": {"l": 10, "r": 10, "t": 110, "b": 10},
        "plot_bgcolor": "white",
        "dragmode": False,
        "hovermode": "closest",
        "shapes": frames,
        "xaxis": {
            "side": "top",
            "range": [-0.5, width - 0.5],
            "tickmode": "array",
            "tickvals": centres_x,
            "ticktext": [f"head {h}" for h in range(1, H + 1)],
            "showgrid": False,
            "zeroline": False,
        },
        "yaxis": {
            "range": [height - 0.5, -0.5],
            "tickmode": "array",
            "tickvals": centres_y,
            "ticktext": [f"layer {layer}" for layer in range(1, L + 1)],
            "showgrid": False,
            "zeroline": False,
        },
    }
    return go.Figure(data=traces, layout=layout)


def scores_image(
    scores: np.ndarray, query_tokens: Sequence[str], key_tokens: Sequence[str], kind: str, title: str | None = None
) -> go.Figure:
    """One head's scaled scores Q K^T / sqrt(d_k) (Q, K) as an image on a diverging scale centred at 0.

    The scale runs from -m to m, m the largest finite |score|; -inf (a masked position) is grey.
    """
    kind_title, y_title, x_title = kind_titles(kind)
    values = as_array(scores, "scores", 2)
    Q, K = values.shape
    check_tokens(Q, query_tokens, "query")
    check_tokens(K, key_tokens, "key")
    masked = np.isneginf(values)
    finite = np.where(masked, 0.0, values)
    limit = max(float(np.abs(finite).max(initial=0.0)), 1e-6)
    indices = colour_indices((finite / limit + 1.0) / 2.0, masked)
    bar = {"title": {"text": "score"}, "tickvals": [0, 0.5, 1], "ticktext": [f"-{limit:.3g}", "0", f"+{limit:.3g}"]}
    note = f"{Q} x {K}, one pixel per score" + ("; grey: masked" if masked.any() else "")
    labels = (plotly_labels(query_tokens), plotly_labels(key_tokens))
    return map_image(indices, SCORE_COLORSCALE, bar, "scores", labels, (y_title, x_title), title or kind_title, note)
