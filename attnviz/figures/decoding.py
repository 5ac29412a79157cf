"""Figures of decoding: the most likely next tokens, and one step's attention rows of every layer and head."""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.common import (
    AT_THE_EDGE,
    HIGHLIGHT,
    KEY_ANGLES,
    WEIGHT_COLORSCALE,
    above_top_labels,
    as_array,
    check_tokens,
    kind_titles,
    plotly_labels,
    ticks,
)
from attnviz.figures.images import colour_bar


def topk_bar(tokens: Sequence[str], probs: Sequence[float], chosen: str | None = None) -> go.Figure:
    """A horizontal bar chart of next-token probabilities, most likely on top, ``chosen`` in red.

    The most likely is on top; each bar is labelled with its token alone (a rank beside a digit
    token would read as one number: "1 1"), and hover gives the rank. If ``chosen`` (a token string, e.g. the
    teacher-forced or beam-search token) is not among ``tokens``, the title says so.
    """
    probs = as_array(probs, "probs", 1)
    if len(tokens) != len(probs):
        raise ValueError(f"got {len(tokens)} tokens but {len(probs)} probabilities")
    order = np.argsort(-probs, kind="stable")
    ranked = [tokens[i] for i in order]
    labels = [html.escape(f"{rank} {t}", quote=False) for rank, t in enumerate(ranked, start=1)]
    bars = go.Bar(
        x=probs[order],
        y=labels,
        orientation="h",
        marker={"color": [HIGHLIGHT if t == chosen else "#6baed6" for t in ranked]},
        text=[f"{p:.3f}" for p in probs[order]],
        textposition="auto",
        customdata=np.arange(1, len(ranked) + 1),
        hovertemplate="rank %{customdata}: %{y}<br>probability %{x:.6f}<extra></extra>",
    )
    title = "Most likely next tokens"
    if chosen is not None:
        where = "red" if chosen in ranked else "not in the top " + str(len(ranked))
        title += f" (chosen: {html.escape(chosen, quote=False)}, {where})"
    layout = {
        "title": title,
        "height": 120 + 28 * len(ranked),
        "margin": {"l": 10, "r": 10, "t": 50, "b": 10},
        "xaxis": {"title": "probability", "range": [0.0, 1.0]},
        "yaxis": {"title": "next token (most likely on top)", "autorange": "reversed", **ticks(labels, tokens=True)},
    }
    return go.Figure(data=[bars], layout=layout)


def step_rows_grid(rows: np.ndarray, key_tokens: Sequence[str], title: str, kind: str = "cross") -> go.Figure:
    """One decoding step's attention rows (L, H, K) as one heatmap of L * H rows, on a 0..1 scale.

    Row "layer l head h" is what the step's query (the newest decoder position) attends to with that
    head, e.g. `attnviz.decoding.DecodeStep.cross_attn` (``kind`` "cross": keys are source
    tokens) or ``self_attn`` (``kind`` "decoder": keys are the decoder input so far). Its colour bar is
    the maps' (`attnviz.figures.images.colour_bar`).
    """
    _, _, x_title = kind_titles(kind)
    rows = as_array(rows, "rows", 3)
    L, H, K = rows.shape
    check_tokens(K, key_tokens, "key")
    y = [f"layer {layer} head {head}" for layer in range(1, L + 1) for head in range(1, H + 1)]
    x = plotly_labels(key_tokens)
    heatmap = go.Heatmap(
        z=rows.reshape(L * H, K),  # (L * H, K): layer-major, as the labels
        x=x,
        y=y,
        zmin=0.0,
        zmax=1.0,
        colorscale=WEIGHT_COLORSCALE,
        colorbar={**colour_bar("linear"), **AT_THE_EDGE},
        hovertemplate="%{y}<br>key %{x}<br>weight %{z:.6f}<extra></extra>",
    )
    layout = {
        # 18 px a row: each row's label apart from the next, up to the 18 px labels of presenter mode
        "height": max(300, 18 * L * H + 250),
        **above_top_labels(title, x),
        "xaxis": {"title": x_title, "side": "top", "autotickangles": KEY_ANGLES, **ticks(x, tokens=True)},
        "yaxis": {"title": "query of this step, per layer and head", "autorange": "reversed", **ticks(y)},
    }
    return go.Figure(data=[heatmap], layout=layout)
