"""Two runs side by side: which positions line up, the difference of two maps, and which heads changed.

A difference A - B is drawn only when the two maps have the same shape; the axis labels then name
both sides' tokens where they differ ("3 cat | dog"), since a difference between two sentences that
differ in one word is the point of comparing them. Shape letters: L layers, H heads, Q queries, K keys.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.common import (
    KEY_ANGLES,
    SCORE_COLORSCALE,
    above_top_labels,
    as_array,
    check_tokens,
    kind_titles,
    ticks,
)
from attnviz.figures.images import colour_indices, map_image


def pair_labels(tokens_a: Sequence[str], tokens_b: Sequence[str]) -> list[str]:
    """Position labels for two token lists of one length: "3 cat" where they agree, "3 cat | dog" where not.

    Escaped for plotly, like `attnviz.figures.common.plotly_labels`.
    """
    if len(tokens_a) != len(tokens_b):
        raise ValueError(f"the two sides have {len(tokens_a)} and {len(tokens_b)} tokens; pair labels need one length")
    return [
        html.escape(f"{i} {a}" if a == b else f"{i} {a} | {b}", quote=False)
        for i, (a, b) in enumerate(zip(tokens_a, tokens_b, strict=True))
    ]


def _limit(values: np.ndarray) -> float:
    return max(float(np.abs(values).max(initial=0.0)), 1e-6)


def difference_heatmap(
    a: np.ndarray, b: np.ndarray, query_labels: Sequence[str], key_labels: Sequence[str], kind: str, title: str
) -> go.Figure:
    """A - B of two (Q, K) maps as an exact heatmap on a diverging scale centred at 0; hover gives A, B and A - B."""
    kind_title, y_title, x_title = kind_titles(kind)
    a, b = as_array(a, "a", 2), as_array(b, "b", 2)
    if a.shape != b.shape:
        raise ValueError(f"A is {a.shape} and B is {b.shape}: a difference needs the same shape")
    check_tokens(a.shape[0], query_labels, "query")
    check_tokens(a.shape[1], key_labels, "key")
    difference = a - b
    limit = _limit(difference)
    heatmap = go.Heatmap(
        z=difference,
        x=list(key_labels),
        y=list(query_labels),
        customdata=np.stack([a, b], axis=-1),
        colorscale=SCORE_COLORSCALE,
        zmin=-limit,
        zmax=limit,
        colorbar={"title": {"text": "A - B"}},
        hovertemplate=(
            "query %{y}<br>key %{x}<br>A %{customdata[0]:.6f}<br>B %{customdata[1]:.6f}<br>A - B %{z:.6f}"
            "<extra></extra>"
        ),
    )
    layout = {
        "height": max(320, min(900, 24 * a.shape[0] + 250)),
        **above_top_labels(title, list(key_labels), subtitle=f"{kind_title}: red where A is larger, blue where B is"),
        "xaxis": {
            "title": x_title,
            "side": "top",
            "autotickangles": KEY_ANGLES,
            **ticks(list(key_labels), tokens=True),
        },
        "yaxis": {"title": y_title, "autorange": "reversed", **ticks(list(query_labels), tokens=True)},
    }
    return go.Figure(data=[heatmap], layout=layout)


def difference_image(
    difference: np.ndarray,
    query_labels: Sequence[str],
    key_labels: Sequence[str],
    kind: str,
    title: str,
    limit: float | None = None,
) -> go.Figure:
    """A difference of two maps (A - B, (Q, K)) as an image on a diverging scale centred at 0.

    ``limit`` is the largest |A - B| the scale shows (default: the largest there is, at least 1e-6);
    blue is B larger, red A larger. The labels name each position (the two sides' tokens when they differ).
    """
    kind_title, y_title, x_title = kind_titles(kind)
    values = as_array(difference, "difference", 2)
    Q, K = values.shape
    check_tokens(Q, query_labels, "query")
    check_tokens(K, key_labels, "key")
    limit = _limit(values) if limit is None else limit
    indices = colour_indices((values / limit + 1.0) / 2.0)
    bar = {"title": {"text": "A - B"}, "tickvals": [0, 0.5, 1], "ticktext": [f"-{limit:.3g}", "0", f"+{limit:.3g}"]}
    note = f"{kind_title}: red where A is larger, blue where B is; {Q} x {K}, one pixel per cell"
    labels = (list(query_labels), list(key_labels))
    return map_image(indices, SCORE_COLORSCALE, bar, "A - B", labels, (y_title, x_title), title, note)


def head_changes(a: np.ndarray, b: np.ndarray, kind: str, title: str) -> go.Figure:
    """The largest |A - B| of every head of two (L, H, Q, K) stacks of maps of one shape, as an L x H heatmap."""
    kind_title = kind_titles(kind)[0]
    a, b = as_array(a, "a", 4), as_array(b, "b", 4)
    if a.shape != b.shape:
        raise ValueError(f"A is {a.shape} and B is {b.shape}: a difference needs the same shape")
    L, H = a.shape[:2]
    largest = np.abs(a - b).max(axis=(-2, -1))  # (L, H)
    heatmap = go.Heatmap(
        z=largest,
        x=[f"head {h}" for h in range(1, H + 1)],
        y=[f"layer {layer}" for layer in range(1, L + 1)],
        colorscale="Reds",
        zmin=0.0,
        colorbar={"title": {"text": "max |A - B|"}},
        hovertemplate="%{y}, %{x}<br>largest |A - B| %{z:.6f}<extra></extra>",
    )
    layout = {
        "title": {"text": title, "subtitle": {"text": f"{kind_title}: the largest change of any weight, per head"}},
        "height": max(260, 60 * L + 160),
        "margin": {"l": 10, "r": 10, "t": 110, "b": 10},
        "yaxis": {"autorange": "reversed", "type": "category"},
        "xaxis": {"side": "top", "type": "category"},
    }
    return go.Figure(data=[heatmap], layout=layout)


def why_no_difference(kind: str, shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> str | None:
    """Why two stacks of maps (L, H, Q, K) of ``kind`` have no difference map, or None when they do."""
    if shape_a == shape_b:
        return None
    _, query_axis, key_axis = kind_titles(kind)
    parts = []
    for what, axis, a, b in (
        ("layers", None, shape_a[0], shape_b[0]),
        ("heads", None, shape_a[1], shape_b[1]),
        ("rows", query_axis, shape_a[2], shape_b[2]),
        ("columns", key_axis, shape_a[3], shape_b[3]),
    ):
        if a != b:
            parts.append(f"A has {a} {what}" + (f" ({axis}s)" if axis else "") + f", B has {b}")
    return (
        "No difference map: " + "; ".join(parts) + ". A difference needs the same layers and heads and the same "
        "number of tokens on both axes (the same tokenizer, and sentences of one length; for the decoder, give "
        "both the same target sentence, or the two outputs must have one length)."
    )
