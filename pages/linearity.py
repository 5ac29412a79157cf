"""Relative-position linearity: PE(pos + k) = M_k PE(pos), the claim of section 3.5, checked."""

import html
from dataclasses import dataclass

import numpy as np
import streamlit as st

from attnviz.app import bound, clamp_state, keep_in_range, load_bundle, shared, sinusoid_inputs
from attnviz.app.frame import Context, frame
from attnviz.app.present import data_table, first, room
from attnviz.app.widgets import escape_markdown, guarded
from attnviz.checkpoints.catalog import checkpoint_stamp
from attnviz.errors import InputError
from attnviz.figures import positional as pp
from attnviz.figures.common import export_config
from attnviz.lessons import positional as pe
from attnviz.lessons import rotary
from attnviz.lessons.rotary import FIT_OFFSET

INTRO = (
    "Section 3.5 says the sinusoids were chosen because, for any fixed offset k, PE(pos + k) is a linear "
    "function of PE(pos). Here you build that function, a matrix M_k made of one 2×2 rotation per "
    "frequency, and check that the same M_k works at every position, to rounding error. It matters "
    "because attention is built from linear maps: a head can learn to look k tokens back wherever it is."
)

STARTS = [0, 1_000, 100_000, 10_000_000]
RANDOM_SEED = 0


@st.cache_data(show_spinner="Fitting linear maps…", max_entries=32)
def sinusoid_fit(d_model: int, base: float, layout: str, precision: str, n: int, ks: tuple[int, ...]) -> np.ndarray:
    """Fit residual per offset for the sinusoids of these settings."""
    dtype, angle_dtype = pe.PRECISIONS[precision]
    return pe.fit_residual_by_offset(
        pe.encoding_matrix(n, d_model, base, layout, dtype=dtype, angle_dtype=angle_dtype), ks
    )


@st.cache_data(show_spinner="Fitting linear maps…", max_entries=16)
def random_fit(d_model: int, n: int, ks: tuple[int, ...]) -> np.ndarray:
    """Fit residual per offset for a random table: it depends on the sizes only, so base or layout reuse it."""
    return pe.fit_residual_by_offset(pe.random_table(n, d_model, RANDOM_SEED), ks)


@st.cache_data(show_spinner="Fitting the model's positions…", max_entries=16)
def model_fit(model: str, device: str, ks: tuple[int, ...], stamp: tuple) -> tuple[str, np.ndarray | None]:
    """The loaded model's position kind and its fit residual per offset (None without a table); ``stamp``, the
    folder's version (`checkpoint_stamp`), keys it: a folder rewritten while the server runs is fitted again."""
    kind, table = pe.model_positions(load_bundle(model, device).model)
    return kind, None if table is None else pe.fit_residual_by_offset(table, ks)


@dataclass(frozen=True)
class Controls:
    """The page's controls: the sinusoids' settings, the offset and the positions they are checked at."""

    d_model: int
    base: float
    layout: str
    n: int
    k: int
    precision: str
    start: int

    @property
    def key(self) -> tuple:
        """Every control of the page, in order: the key of what is drawn from them."""
        return (self.d_model, self.base, self.layout, self.n, self.k, self.precision, self.start)

    @property
    def sinusoids(self) -> str:
        """The start of a figure's file name: the sinusoids chosen (d_model, base, layout)."""
        return f"linearity-d{self.d_model}-base{self.base:g}-{self.layout}"

    @property
    def stem(self) -> str:
        """The start of the file name of a figure drawn from every control."""
        return f"{self.sinusoids}-n{self.n}-k{self.k}-{self.precision}-from{self.start}"


def controls() -> Controls:
    c1, c2, c3, c4 = st.columns(4)
    d_model, base, layout = sinusoid_inputs(
        (c1, c2, c3),
        "lin",
        base_help="The paper's 10000. Any base gives an exact M_k: try 10, or 1e8.",
        layout_help="M_k for the concatenated layout is the same matrix with rows and columns reordered.",
    )
    n = bound(c4.slider, "Positions", 32, 512, 256, step=32, key="lin_length")
    c1, c2, c3 = st.columns([1, 2, 1])
    keep_in_range("lin_k", 5, 1, min(256, n - 1))
    k = bound(c1.slider, "Offset k", 1, min(256, n - 1), key="lin_k")
    precision = bound(
        c2.radio,
        "Precision",
        list(pe.PRECISIONS),
        key="lin_precision",
        horizontal=True,
        index=1,
        help="float32 table: angles in float64, table rounded (as the model does). float32 angles: "
        "pos·ω itself rounded to float32.",
    )
    start = bound(c3.select_slider, "First position", STARTS, key="lin_start", format_func=lambda s: f"{s:,}")
    return Controls(d_model, base, layout, n, k, precision, start)


def rotation_section(c: Controls, M: np.ndarray, table: np.ndarray) -> None:
    st.header("M_k: one rotation per frequency")
    d_model, k = c.d_model, c.k
    left, right = first("lin_rotation").columns([2, 3])  # M_k and one dimension, first in presenter mode
    rotation = shared("lin-rotation", (d_model, c.base, c.layout, k), lambda: pp.rotation_heatmap(M, k))
    left.plotly_chart(room(rotation, 0.4), width="stretch", config=export_config(f"{c.sinusoids}-k{k}-M_k", "png"))
    left.caption(
        "Each pair (sin pos·ω_i, cos pos·ω_i) is turned by the angle k·ω_i: the 2×2 block "
        "[[cos kω_i, sin kω_i], [−sin kω_i, cos kω_i]]. No entry involves pos. In the concatenated layout "
        "the same blocks are spread out by the column reordering."
    )
    check = shared("lin-shift", c.key, lambda: pe.shift_residual(table, k, M))
    with right:
        clamp_state("lin_dim", range(d_model))
        dim = bound(
            st.selectbox,
            "Dimension",
            range(d_model),
            index=min(32, d_model - 1),
            key="lin_dim",
            format_func=lambda d: pe.dimension_label(d, d_model, c.layout),
        )
        label = pe.dimension_label(dim, d_model, c.layout)
        positions = c.start + check.positions
        shift = shared(
            "lin-shift-chart",
            (*c.key, dim),
            lambda: pp.shift_chart(positions, check.predicted[:, dim], check.actual[:, dim], k, label),
        )
        st.plotly_chart(room(shift, 0.6), width="stretch", config=export_config(f"{c.stem}-dim{dim}-shift", "png"))
        st.caption("The line is the table shifted by k; the markers are M_k applied to the unshifted table.")
    residual = shared(
        "lin-residual",
        c.key,
        lambda: pp.residual_chart(
            positions,
            {f"k = {k}": check.residual},
            f"Residual max_d |M_k·PE(pos) − PE(pos + k)|, {c.precision}",
            "position pos",
            "largest error over dimensions",
        ),
    )
    st.plotly_chart(room(residual), width="stretch", config=export_config(f"{c.stem}-residual", "png"))
    worst = float(check.residual.max())
    st.caption(
        f"Largest residual over every position: **{worst:.2e}**. One float32 step near 1 is 1.2e-7 and one "
        "float64 step 2.2e-16: what is left is rounding, not a failure of the identity. Exact zeros (from "
        f"position 0, M_k·PE(0) is exactly the row PE(k)) are drawn at {pp.LOG_FLOOR:g}."
    )


def angle_figure(c: Controls, i: int):
    """(both sides of the angle-addition identities for pair i, the largest gap between them)."""
    pos = c.start + np.arange(c.n)
    both = pe.angle_addition(pos, c.k, i, c.d_model, c.base)
    gap = max(np.abs(both.sin_lhs - both.sin_rhs).max(), np.abs(both.cos_lhs - both.cos_rhs).max())
    return pp.angle_addition_chart(pos, both.sin_lhs, both.sin_rhs, both.cos_lhs, both.cos_rhs, i), gap


def angle_section(c: Controls) -> None:
    st.header("The angle-addition form")
    d_model = c.d_model
    keep_in_range("lin_pair", 16, 0, d_model // 2 - 1)
    i = bound(st.slider, "Frequency pair i", 0, d_model // 2 - 1, key="lin_pair")
    st.latex(r"PE_{pos+k,\,2i} = PE_{pos,\,2i}\,PE_{k,\,2i+1} + PE_{pos,\,2i+1}\,PE_{k,\,2i}")
    st.latex(r"PE_{pos+k,\,2i+1} = PE_{pos,\,2i+1}\,PE_{k,\,2i+1} - PE_{pos,\,2i}\,PE_{k,\,2i}")
    fig, gap = shared("lin-angles", (*c.key, i), lambda: angle_figure(c, i))
    st.plotly_chart(room(fig), width="stretch", config=export_config(f"{c.stem}-pair{i}-angles", "png"))
    st.caption(
        f"sin(a + b) = sin a cos b + cos a sin b and cos(a + b) = cos a cos b − sin a sin b, with a = pos·ω_i "
        f"and b = k·ω_i. The coefficients PE(k, ·) are the encoding of the offset itself. Largest gap between "
        f"the two sides (float64): **{gap:.1e}**."
    )


def fit_section(c: Controls, ctx: Context) -> None:
    st.header("One map for every position: a least-squares fit")
    d_model = c.d_model
    k_max = bound(st.slider, "Largest offset to fit", 1, 128, 64, key="lin_k_max")
    ks = tuple(pe.offset_ladder(k_max))
    n_fit = 2 * d_model + k_max  # twice as many pairs as dimensions, whatever the offset
    series = {
        f"sinusoids ({c.precision})": sinusoid_fit(d_model, c.base, c.layout, c.precision, n_fit, ks),
        "random table": random_fit(d_model, n_fit, ks),
    }
    notes = []
    guarded(lambda: notes.append(add_model(ctx, ks, series)))  # a failing model leaves the sinusoids' fit standing
    note = notes[0] if notes else ""
    fit = shared(
        "lin-fit",
        # the loaded model's own curve is named by its card, which two folders may share: keyed by the model
        (d_model, c.base, c.layout, c.precision, k_max, tuple(series), ctx.model if ctx.ready else None),
        lambda: pp.residual_chart(
            ks,
            series,
            "Best linear map from PE(pos) to PE(pos + k): what it cannot explain",
            "offset k",
            "relative residual ‖X·Mᵀ − Y‖ / ‖Y‖",
        ),
    )
    name = f"{c.sinusoids}-{c.precision}-kmax{k_max}" + (f"-{ctx.file_stem}" if ctx.ready else "") + "-fit"
    st.plotly_chart(room(fit), width="stretch", config=export_config(name, "png"))
    st.caption(
        f"For each k, one matrix fitted by least squares over all pairs (pos, pos + k) with pos < N − {max(ks)} "
        f"(N = {n_fit} positions for the synthetic tables: twice d_model pairs, since with fewer pairs than "
        "dimensions any table fits exactly). Sinusoids leave only rounding: one M_k serves every position. "
        "A random table of the same size leaves most of itself unexplained; a learned table lies in between, "
        "depending on how smooth training made it."
    )
    if note:
        st.info(note)


def add_model(ctx: Context, ks: tuple[int, ...], series: dict) -> str:
    """Add the loaded model's fit residual to ``series``; the note under the chart ("" for none)."""
    if not ctx.ready:
        return "Choose a model in the sidebar to add its positions."
    try:
        kind, residual = model_fit(ctx.model, ctx.device, ks, checkpoint_stamp(ctx.model))
    except InputError as e:  # a position table too short for these offsets
        return f"{escape_markdown(ctx.label)}: {e}"
    if kind == "none":
        return f"{escape_markdown(ctx.label)} has no positional encoding, so it has no table to fit."
    if kind == "rotary":
        return f"{escape_markdown(ctx.label)} uses rotary positions: no table to fit; its rotation is the last section."
    if residual is not None:
        series[f"{html.escape(ctx.label, quote=False)} ({kind})"] = residual  # a legend: plotly reads HTML
    return ""


def breakdown_figure(c: Controls):
    sweep = pe.linearity_by_start(c.k, c.d_model, c.base, c.layout, n=64, starts=STARTS)
    series = {p: sweep.loc[sweep["precision"] == p, "max_residual"].to_numpy() for p in pe.PRECISIONS}
    labels = [f"{s:,}" for s in STARTS]  # a category axis: position 0 has no place on a log axis
    return pp.residual_chart(
        labels,
        series,
        f"Largest residual for k = {c.k} over 64 positions",
        "first position",
        "largest error",
        categorical_x=True,
    )


def breakdown_section(c: Controls) -> None:
    st.header("When does linearity break?")
    st.plotly_chart(
        room(shared("lin-breakdown", (c.k, c.d_model, c.base, c.layout), lambda: breakdown_figure(c))),
        width="stretch",
        config=export_config(f"{c.sinusoids}-k{c.k}-breakdown", "png"),
    )
    st.caption(
        "Never, mathematically, for any base, d_model or k. In float64 the error grows only with the size of "
        "the angles pos·ω. A float32 table built from float64 angles (as this project's model does) stays at "
        "float32 rounding at any position; float32 angles lose about pos × 6e-8 radians, so by position "
        "100,000 the shift is visibly wrong and by 10,000,000 it is noise."
    )


def rotary_section(ctx: Context) -> None:
    """RoPE on the loaded model: a score depends on the offset alone (shifted, it changes by rounding only)."""
    st.header("Rotary positions: the rotation inside attention")
    st.markdown(
        "RoPE (Su et al., 2021; Llama, Qwen2, SmolLM) takes this section's rotation literally: it adds no "
        "table, but turns each query and key by its own position's angles, pair of dimensions by pair. "
        "Rotations compose, so q_i R(i) · k_j R(j) = q_i · k_j R(j − i): the score of a pair depends on the "
        "offset j − i alone, wherever the pair stands."
    )
    if not ctx.ready or ctx.bundle.config.pos_encoding != "rotary":
        st.info(
            "This part needs a model with rotary positions: choose the shipped `induction-long` in the sidebar, "
            "or open a Llama-family or Qwen2 folder or hub id (for example HuggingFaceTB/SmolLM2-135M)."
        )
        return
    cfg = ctx.bundle.config
    c = st.columns(2)
    clamp_state("lin_rope_layer", range(1, cfg.n_dec_layers + 1))
    layer = bound(c[0].selectbox, "Layer", range(1, cfg.n_dec_layers + 1), key="lin_rope_layer")
    max_offset = bound(c[1].slider, "Largest offset", 8, 256, 64, key="lin_rope_offset")
    shifts, offsets = ctx.on_text("rotary", layer - 1, max_offset)
    worst = shifts.groupby("shift")[["largest_change", "relative"]].max().reset_index()
    data_table(worst.style.format({"largest_change": "{:.2e}", "relative": "{:.2e}"}), hide_index=True)
    st.caption(
        f"The loaded model's own queries and keys of layer {layer}, before the rotation, rotated again with both "
        "positions moved by c: the largest change of any pair's score, over every head (and relative to the "
        "largest score). Rounding only: float32 keeps about 7 digits."
    )
    fig = shared(
        "lin-rope-offset",
        (*ctx.key, layer, max_offset),
        lambda: pp.score_by_offset_chart(offsets, f"Layer {layer}: one query/key pair at every offset"),
    )
    name = f"{ctx.file_stem}-decoder-L{layer}-rope-offsets{max_offset}"
    st.plotly_chart(room(fig), width="stretch", config=export_config(name, "png"))
    st.caption(
        "The prompt's last query and its first word's key, each head's score as the query stands 0 to "
        f"{max_offset} positions after the key. The curve is the head's positional preference for that pair of "
        "contents: slow wiggles are its low frequencies, the fast ripple its high ones."
    )


def kinds_section(ctx: Context) -> None:
    """Sinusoidal, learned and rotary positions on the same two measurements."""
    st.header("Three kinds of positions, measured alike")
    table = ctx.on_text("position_kinds") if ctx.ready else rotary_kinds_without_model()
    shown = table.rename(
        columns={
            "fit_residual": f"PE(pos + {FIT_OFFSET}) from PE(pos): best linear map's residual",
            "shift_change": "every position moved: largest relative change of a first-layer score",
        }
    )
    numbers = {column: "{:.2e}" for column in shown.columns if column != "kind"}
    data_table(shown.style.format(numbers, na_rep="—"), hide_index=True, width="stretch")
    st.caption(
        "The sinusoids (the paper's table) and RoPE's angles are exactly a rotation of themselves: the fit leaves "
        "rounding. A learned table (the loaded model's, when it has one) is as linear as training made it, fitted "
        f"over up to twice its width in positions (a table with no more than its width and {FIT_OFFSET} has none to "
        "spare: any would fit, so it shows —). The "
        "second column runs the loaded model only, for its own kind: with positions added to the embeddings "
        "(sinusoidal or learned), moving every position changes the scores, since content and position mix; "
        "with rotary positions it changes nothing but rounding. Loading GPT-2, `induction` and `induction-long` "
        "(or a Llama model) in turn fills every row."
    )


def rotary_kinds_without_model():
    return shared("lin-kinds", (), lambda: rotary.kinds_table())


def body(ctx: Context) -> None:
    """The controls, then M_k, the angle-addition form, the fits and where linearity breaks."""
    c = controls()
    dtype, angle_dtype = pe.PRECISIONS[c.precision]
    table = shared(
        "lin-table",
        c.key,
        lambda: pe.encoding_matrix(c.n, c.d_model, c.base, c.layout, c.start, dtype, angle_dtype),
    )
    M = shared(
        "lin-m",
        (c.k, c.d_model, c.base, c.layout),
        lambda: pe.rotation_matrix(c.k, c.d_model, c.base, c.layout),
    )
    rotation_section(c, M, table)
    angle_section(c)
    fit_section(c, ctx)
    breakdown_section(c)
    guarded(lambda: rotary_section(ctx))
    guarded(lambda: kinds_section(ctx))


frame(body, intro=INTRO, prose=True, needs_model=False)
