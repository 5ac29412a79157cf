"""Positional encoding: the sinusoids of section 3.5, their wavelengths, similarities and two layouts."""

import html

import numpy as np
import streamlit as st

from attnviz.app import bound, shared, sinusoid_inputs
from attnviz.app.frame import Context, frame
from attnviz.app.present import first, room
from attnviz.app.widgets import escape_markdown, guarded
from attnviz.figures import positional as pp
from attnviz.figures.common import export_config
from attnviz.lessons import positional as pe

INTRO = (
    "Attention by itself cannot tell word order: it sees a set of tokens. The Transformer adds to each "
    "token's embedding a vector that depends on its position only (section 3.5): sines and cosines of "
    "wavelengths growing geometrically from 2π to about 2π·10000. Below you see that table, why each "
    "column is a wave, and that the similarity of two positions depends on how far apart they are, not "
    "on where they are, which is what makes relative positions easy for attention to use."
)


def controls() -> tuple[int, int, float, str]:
    c1, c2, c3, c4 = st.columns(4)
    d_model, base, layout = sinusoid_inputs(
        (c1, c3, c4), "pe", base_help="The paper's 10000: the longest wavelength is just under 2π times the base."
    )
    n = bound(c2.slider, "Positions", 8, 512, 128, step=8, key="pe_length", help="Positions 0 to this number minus 1.")
    return d_model, n, base, layout


def sinusoid_stem(d_model: int, n: int, base: float, layout: str) -> str:
    """The start of a file name for a figure of the sinusoids the page's controls chose."""
    return f"pe-d{d_model}-n{n}-base{base:g}-{layout}"


def encoding_section(table: np.ndarray, d_model: int, base: float, layout: str) -> None:
    st.header("The encoding matrix")
    title = f"PE for d_model = {d_model}, base {base:g}"
    fig = shared("pe-matrix", (d_model, table.shape[0], base, layout), lambda: pp.encoding_heatmap(table, title=title))
    name = sinusoid_stem(d_model, table.shape[0], base, layout)
    first("pe_matrix").plotly_chart(room(fig), width="stretch", config=export_config(name, "png"))
    st.caption(
        "Row p is the vector added to the embedding of the token at position p. Left columns oscillate "
        "fast (wavelength 2π), right columns slowly: together they give every position a distinct code, "
        "like the digits of a binary counter but continuous."
    )


def curves_section(table: np.ndarray, d_model: int, base: float, layout: str) -> None:
    st.header("Every dimension is a sinusoid")
    default = [d for d in (4, 5, 24, 48) if d < d_model]  # a sin/cos pair, then slower waves
    dims = bound(
        st.multiselect,
        "Dimensions",
        range(d_model),
        default=default,
        key="pe_dims",
        format_func=lambda d: pe.dimension_label(d, d_model, layout),
    )
    left, right = st.columns(2)
    with left:
        if dims:
            labels = [pe.dimension_label(d, d_model, layout) for d in dims]
            key = (d_model, table.shape[0], base, layout, tuple(dims))
            name = sinusoid_stem(d_model, table.shape[0], base, layout) + "-dims" + "-".join(map(str, dims))
            st.plotly_chart(
                room(shared("pe-curves", key, lambda: pp.dimension_curves(table, dims, labels)), 0.5),
                width="stretch",
                config=export_config(name, "png"),
            )
            st.caption(
                "The Annotated Transformer's chart, interactive: a sine and a cosine share each frequency "
                "(pair i), and higher pairs are slower waves. Click a legend entry to hide its line."
            )
        else:
            st.info("Choose at least one dimension.")
    with right:
        lam = pe.wavelengths(d_model, base)
        wavelengths = shared("pe-wavelengths", (d_model, base), lambda: pp.wavelength_chart(lam, base))
        name = f"pe-d{d_model}-base{base:g}-wavelengths"
        st.plotly_chart(room(wavelengths, 0.5), width="stretch", config=export_config(name, "png"))
        st.caption(
            f"Pair i has wavelength 2π·base^(2i/d_model): each is {base ** (2 / d_model):.4f} times the one "
            f"before, from {lam[0]:.3f} to {lam[-1]:,.1f} positions, a straight line on this log axis."
        )


def similarity_figures(table: np.ndarray, cosine: bool, name: str, closed_form: np.ndarray | None):
    """(heatmap, offset profile, largest range over p, that range relative to the offset-0 value)."""
    value = "cos(PE(p), PE(q))" if cosine else "PE(p)·PE(q)"
    profile = pe.similarity_by_offset(table, cosine)
    heatmap = pp.similarity_heatmap(pe.similarity_matrix(table, cosine), f"{value}, {name}", value)
    by_offset = pp.offset_profile_chart(profile, f"By offset k, {name}", value.replace("q", "p+k"), closed_form)
    spread = float((profile["max"] - profile["min"]).max())
    relative = spread / max(abs(float(profile["mean"].iloc[0])), 1e-300)  # against |PE(p)|^2, the offset-0 value
    return heatmap, by_offset, spread, relative


def similarity_view(key: tuple, table: np.ndarray, cosine: bool, name: str, stem: str, closed_form=None) -> None:
    """Heatmap and offset profile of one table (the page's sinusoids or a model's positions); ``key`` names it,
    ``stem`` starts its figures' file names."""
    heatmap, by_offset, spread, relative = shared(
        "pe-similarity", (*key, cosine), lambda: similarity_figures(table, cosine, name, closed_form)
    )
    left, right = st.columns(2)
    stem += "-cosine" if cosine else "-dot"
    left.plotly_chart(room(heatmap, 0.5), width="stretch", config=export_config(f"{stem}-similarity", "png"))
    right.plotly_chart(room(by_offset, 0.5), width="stretch", config=export_config(f"{stem}-by-offset", "png"))
    st.caption(
        f"Left: every pair of positions. Right: the same values grouped by offset k = q − p; the band is "
        f"the range over p. Largest range over p at any offset: **{spread:.2e}**, {relative:.1e} of the "
        "value at offset 0 "
        + ("(rounding: the similarity depends on the offset only)." if relative < 1e-5 else "(it depends on p too).")
    )


def similarity_section(ctx: Context, table: np.ndarray, d_model: int, base: float, layout: str) -> None:
    st.header("Similarity depends on the offset only")
    cosine = bound(st.toggle, "Cosine similarity (divide by the norms)", key="pe_cosine")
    k = np.arange(table.shape[0])
    closed = pe.offset_similarity(k, d_model, base) / (d_model / 2 if cosine else 1.0)
    stem = sinusoid_stem(d_model, table.shape[0], base, layout)
    similarity_view(("sinusoids", d_model, table.shape[0], base, layout), table, cosine, "sinusoids", stem, closed)
    st.markdown(
        "Why: sin a·sin b + cos a·cos b = cos(a − b), so PE(p)·PE(q) = Σ_i cos((p − q)·ω_i), the dotted "
        "line. It is largest at offset 0 and falls off, with ripples, as the offset grows: near positions "
        "look alike, far ones less so, wherever they are in the sentence."
    )
    st.subheader("The positions of the loaded model")
    if not ctx.ready:
        st.info("Choose a model in the sidebar to compare its positions.")
        return
    guarded(lambda: model_similarity(ctx, table, cosine))  # a failure leaves the layouts below standing


def model_similarity(ctx: Context, table: np.ndarray, cosine: bool) -> None:
    """The similarity of the loaded model's positions, over as many positions as ``table`` has."""
    kind, model_table = pe.model_positions(ctx.bundle.model)
    if kind == "rotary":  # no table to add, yet its attention depends on positions
        st.info(
            f"{escape_markdown(ctx.label)} uses rotary positions (RoPE): it adds no table to its embeddings, but "
            "turns each query and key by its position's angles inside attention, so that a score depends on the "
            "offset between query and key. The page on the linearity of relative positions shows that rotation "
            "on this model."
        )
        return
    if model_table is None:
        st.info(
            f"{escape_markdown(ctx.label)} adds no positional encoding (kind '{kind}'): its attention sees the "
            "tokens as a set, and only a causal mask or the data could tell order."
        )
        return
    n = min(table.shape[0], model_table.shape[0])
    st.caption(
        f"{escape_markdown(ctx.label)}: {kind} positions, a table of {model_table.shape[0]} × {model_table.shape[1]}; "
        f"the first {n} positions, as many as chosen above."
    )
    title = f"{html.escape(ctx.label, quote=False)} ({kind})"  # plotly reads HTML in a title
    similarity_view((ctx.model, ctx.device, n), model_table[:n], cosine, title, f"{ctx.file_stem}-positions-n{n}")


def layout_figure(d_model: int, n: int, base: float):
    """(the two layouts side by side, their largest difference once reordered, of their dot products)."""
    interleaved = pe.encoding_matrix(n, d_model, base, "interleaved")
    concat = pe.encoding_matrix(n, d_model, base, "concat")
    same = float(np.abs(concat - interleaved[:, pe.layout_permutation(d_model)]).max())
    sim_gap = float(np.abs(pe.similarity_matrix(concat) - pe.similarity_matrix(interleaved)).max())
    return pp.layout_comparison(interleaved, concat), same, sim_gap


def layout_section(d_model: int, n: int, base: float) -> None:
    st.header("Interleaved or concatenated: both are valid")
    fig, same, sim_gap = shared("pe-layouts", (d_model, n, base), lambda: layout_figure(d_model, n, base))
    name = f"pe-d{d_model}-n{n}-base{base:g}-layouts"
    st.plotly_chart(room(fig), width="stretch", config=export_config(name, "png"))
    st.caption(
        "The paper interleaves sin and cos (columns 2i and 2i+1); tensor2tensor and Marian put every sine "
        "first. Reordering the interleaved columns gives the concatenated table exactly "
        f"(largest difference {same:.1e}), and every dot product is unchanged (largest difference "
        f"{sim_gap:.1e})."
    )
    st.markdown(
        "Why both work: the model only ever reads the encoding through learned linear maps (W^Q, W^K, "
        "W^V, the feed-forward layer) after adding it to the embedding. A fixed reordering of columns is "
        "itself a linear map, which training absorbs into those weights, and the offset-only similarity "
        "and the rotation M_k of the next page survive the reordering. What matters is fixing one layout "
        "at training time: a checkpoint trained with one layout gives nonsense positions with the other."
    )


def body(ctx: Context) -> None:
    d_model, n, base, layout = controls()
    table = shared("pe-table", (n, d_model, base, layout), lambda: pe.encoding_matrix(n, d_model, base, layout))
    encoding_section(table, d_model, base, layout)
    curves_section(table, d_model, base, layout)
    similarity_section(ctx, table, d_model, base, layout)
    layout_section(d_model, n, base)


frame(body, intro=INTRO, prose=True, needs_model=False)
