"""Mechanics: scaled dot-product and multi-head attention step by step (sections 3.2, 3.5 and 5.3)."""

import numpy as np
import pandas as pd
import streamlit as st

from attnviz.app import bound, clamp_state, keep_in_range, lazy_tabs, links, number_table, shared
from attnviz.app.frame import Context, frame
from attnviz.app.present import data_table, first, folded, presenting, room
from attnviz.app.widgets import escape_markdown
from attnviz.figures import teaching as tp
from attnviz.figures.common import export_config
from attnviz.lessons import mechanics

INTRO = (
    "This page computes attention by hand: a three-token example of equation 1 whose every number you "
    "can check on paper, then why the scores are divided by √d_k, what masks do, how multi-head "
    "attention splits the model's width, why the model needs positional encoding, and the learning-rate "
    "schedule it was trained with. Knowing these mechanics is what lets you read an attention map as a "
    "computation rather than as a picture."
)

MATRICES = {  # key suffix: (title, default, row label, column label, rows can be added)
    "X": ("Input X (one row per token)", mechanics.DEFAULT_X, "token", "dim", True),
    "WQ": ("W_Q", mechanics.DEFAULT_W_Q, "dim", "q", False),
    "WK": ("W_K", mechanics.DEFAULT_W_K, "dim", "k", False),
    "WV": ("W_V", mechanics.DEFAULT_W_V, "dim", "v", False),
}
# A link (and a room's view) carries each matrix that is not the example's, as mech_x=1,0,1,0;0,2,0,2;...: rows
# separated by ";", numbers by ",", an empty cell as nan. X has 1 to MOST_ROWS rows (a room's view holds 64 KB);
# each W keeps the example's shape.
MOST_ROWS = 64
PAPER_D_K = 64  # d_k = d_model / h = 512 / 8 in the paper's base model (section 3.2.2)


@st.cache_data(show_spinner="Sampling queries and keys…", max_entries=32)
def scaling(d_ks: tuple[int, ...], n_keys: int, seed: int) -> pd.DataFrame:
    return mechanics.scaling_experiment(d_ks, n_keys=n_keys, n_samples=1000, seed=seed)


def reset_example() -> None:
    for name in MATRICES:
        st.session_state.pop(f"_mech_start_{name}", None)
    let_go_of_edits()


def editor_key(name: str) -> str:
    """The key of matrix ``name``'s editor: ``_mech_X`` and so on, with a number once its edits were let go."""
    generation = st.session_state.get("_mech_generation", 0)
    return f"_mech_{name}_{generation}" if generation else f"_mech_{name}"


def let_go_of_edits() -> None:
    """Drop the edits made in the matrix editors: the next run draws them under new keys. (A browser keeps a data
    editor's edits, and sends them with every rerun, while its key stays: taking the edits out of the session
    undid them for one run only, measured in chromium.)"""
    if any(any((st.session_state.get(editor_key(name)) or {}).values()) for name in MATRICES):
        st.session_state["_mech_generation"] = st.session_state.get("_mech_generation", 0) + 1


def link_key(name: str) -> str:
    """The URL parameter that carries matrix ``name`` of `MATRICES`: mech_x, mech_wq, mech_wk, mech_wv."""
    return f"mech_{name.lower()}"


def matrix_text(matrix: np.ndarray) -> str:
    """``matrix`` as a link writes it: ``1,0,1,0;0,2.5,0,2`` (a whole number without its decimal point)."""
    return ";".join(",".join(str(int(v)) if float(v).is_integer() else repr(float(v)) for v in row) for row in matrix)


def matrix_from_text(name: str, text: str) -> np.ndarray | None:
    """The matrix ``name`` that a link's ``text`` writes (`matrix_text`): numbers, no infinity, in the example's
    shape (X: any number of rows from 1 to MOST_ROWS); None for anything else."""
    _, default, _, _, dynamic = MATRICES[name]
    rows, columns = np.shape(default)
    lines = text.split(";")
    if len(lines) != rows and not (dynamic and len(lines) <= MOST_ROWS):
        return None
    try:
        matrix = np.array([[float(v) for v in line.split(",")] for line in lines])
    except ValueError:  # a word, an empty number, or rows of different lengths
        return None
    if matrix.shape != (len(lines), columns) or np.isinf(matrix).any():
        return None
    return matrix


def matrices_from_link() -> None:
    """On a run that opens the page from a link (a follower's page each time it takes the room's view), the
    worked example starts from the link's matrices, and from the example's where the link has none: edits made
    before (a follower's, while exploring on its own) give way, as every other choice does. A matrix the
    example cannot take is set aside, in one line."""
    opened = (st.session_state.get(links.LINK_STATE) or {}).get("raw")
    if not opened:
        return
    aside = []
    for name, (_, default, *_) in MATRICES.items():
        text = opened.get(link_key(name), "")
        matrix = matrix_from_text(name, text) if text else None
        if text and matrix is None:
            aside.append(f"{link_key(name)}={escape_markdown(repr(text[:40]))}")
        st.session_state[f"_mech_start_{name}"] = np.asarray(default, dtype=float) if matrix is None else matrix
    let_go_of_edits()
    if aside:
        st.caption(f"Set aside from the link (not matrices of numbers this example can take): {', '.join(aside)}.")


def link_matrices(inputs: dict[str, np.ndarray]) -> None:
    """Write the worked example's matrices into the address bar (`link_key`), so that a link and a room's view
    carry them; a matrix that is the example's is left out."""
    for name, matrix in inputs.items():
        default = np.asarray(MATRICES[name][1], dtype=float)
        kept = matrix.shape == default.shape and np.array_equal(matrix, default)
        text = None if kept or not len(matrix) else matrix_text(matrix)
        if text is None:
            st.query_params.pop(link_key(name), None)
        elif st.query_params.get(link_key(name)) != text:
            st.query_params[link_key(name)] = text


def matrix_editor(name: str, container) -> np.ndarray:
    title, default, row_label, col_label, dynamic = MATRICES[name]
    start = st.session_state.get(f"_mech_start_{name}")  # the link's matrix (`matrices_from_link`), if any
    start = np.asarray(default, dtype=float) if start is None else start
    table = pd.DataFrame(start, columns=[f"{col_label} {j}" for j in range(start.shape[1])])
    if not dynamic:
        table.index = [f"{row_label} {i}" for i in range(start.shape[0])]
    container.markdown(f"**{title}**")
    edited = container.data_editor(
        table,
        key=editor_key(name),
        num_rows="dynamic" if dynamic else "fixed",
        hide_index=dynamic or None,
        column_config={col: st.column_config.NumberColumn(width=56) for col in table.columns},
    )
    return edited.apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)


def show_table(title: str, matrix: np.ndarray, rows: str, cols: str, container=st, fmt: str = "{:.4f}") -> None:
    container.markdown(f"**{title}**")
    container.table(number_table(mechanics.labelled(matrix, rows, cols), fmt))


def worked_example_tab() -> None:
    st.markdown(
        "Three input vectors of four dimensions, projected to queries, keys and values of three "
        "dimensions (d_k = d_v = 3). Edit any cell (rows of X can be added or deleted); every table "
        "below is recomputed: **scores = Q Kᵀ / √d_k**, **weights = softmax of each row**, "
        "**output = weights V**."
    )
    shown_inputs = st.container()  # presenter mode: the matrices as the room reads them, the editors folded below
    with folded("Edit the matrices"):
        cols = st.columns([5, 4, 4, 4])
        inputs = {name: matrix_editor(name, col) for name, col in zip(MATRICES, cols, strict=True)}
        st.button("Reset to the example's matrices", on_click=reset_example, key="_mech_reset")
    link_matrices(inputs)
    if presenting():
        for name, col in zip(MATRICES, shown_inputs.columns([5, 4, 4, 4]), strict=True):
            title, _, rows, columns, _ = MATRICES[name]
            show_table(title, inputs[name], rows, columns, col, fmt="{:g}")  # as typed: 1, not 1.0000
    scale = bound(st.toggle, "Divide the scores by √d_k (the paper)", value=True, key="mech_scale")
    shown = mechanics.worked_example(inputs["X"], inputs["WQ"], inputs["WK"], inputs["WV"], scale=scale)
    scaled = mechanics.worked_example(inputs["X"], inputs["WQ"], inputs["WK"], inputs["WV"], scale=True)
    unscaled = mechanics.worked_example(inputs["X"], inputs["WQ"], inputs["WK"], inputs["WV"], scale=False)
    c = st.columns(3)
    show_table("Q = X W_Q", shown.Q, "token", "dim", c[0])
    show_table("K = X W_K", shown.K, "token", "dim", c[1])
    show_table("V = X W_V", shown.V, "token", "dim", c[2])
    divisor = f"√{shown.Q.shape[1]} = {shown.divisor:.4f}" if scale else "1 (no scaling)"
    c = st.columns(3)
    show_table(f"Scores Q Kᵀ / {divisor}", shown.scores, "query", "key", c[0])
    show_table("Weights: softmax of each row", shown.weights, "query", "key", c[1])
    show_table("Output = weights V", shown.output, "query", "dim", c[2])
    st.caption("Rows of the scores and weights are queries, columns are keys; each row of weights sums to 1.")
    scaling_changes(scaled, unscaled)


def scaling_changes(scaled: mechanics.WorkedExample, unscaled: mechanics.WorkedExample) -> None:
    """The worked example with and without the division by √d_k, query by query."""
    st.subheader("What the scaling changes")
    table = mechanics.scaling_comparison(scaled, unscaled)
    biggest = table.loc[table["largest weight change"].idxmax()]
    st.markdown(
        f"Dividing by √d_k = {scaled.divisor:.4f} shrinks every score by the same factor, so each query still "
        "ranks the keys in the same order; but the softmax becomes **less peaked**: the largest weight of "
        f"query {int(biggest['query'])} is {biggest['largest weight, scaled']:.4f} with scaling and "
        f"{biggest['largest weight, unscaled']:.4f} without, and its output row moves by up to "
        f"{biggest['largest output change']:.4f}. With d_k = 3 the effect is mild; with the paper's d_k = 64 "
        "the unscaled softmax is nearly one-hot (next tab)."
    )
    st.table(number_table(table))
    st.caption("Per query: largest weight and entropy with and without scaling, and how far weights and outputs move.")


def scaling_tab() -> None:
    st.markdown(
        "If the components of q and k are independent with mean 0 and variance 1, **q · k has variance d_k** "
        "(footnote 4 of the paper). Large scores push the softmax towards one-hot, where its gradient "
        "diag(p) − p pᵀ is almost zero and learning stalls. Dividing by √d_k brings the variance back to 1."
    )
    c = st.columns(3)
    d_max = bound(c[0].select_slider, "Largest d_k", [16, 64, 256, 1024], value=1024, key="mech_dk_max")
    n_keys = bound(c[1].slider, "Keys per query", 2, 64, 10, key="mech_n_keys")
    seed = bound(c[2].number_input, "Random seed", 0, 10_000, 0, key="mech_seed")
    d_ks = tuple(d for d in (1, 4, 16, 64, 256, 1024) if d <= d_max)
    df = scaling(d_ks, n_keys, int(seed))
    fig = shared("mech-scaling", (d_ks, n_keys, int(seed)), lambda: tp.scaling_figure(df))
    stem = f"scaling-dk{d_max}-keys{n_keys}-seed{int(seed)}"
    first("mech_scaling").plotly_chart(
        room(fig), width="stretch", key="mech_scaling_chart", config=export_config(stem, "png")
    )
    st.caption(
        f"Means over 1000 random queries, each against {n_keys} random keys. Blue: scores divided by √d_k; red: "
        "raw dot products. Without scaling the entropy falls towards 0 and the largest weight towards 1 as d_k "
        "grows, and the softmax gradient vanishes; with scaling all three stay nearly constant."
    )
    scale = bound(st.toggle, "Divide the scores by √d_k (the paper)", value=True, key="mech_dk_scale")
    weights = mechanics.one_query_weights(PAPER_D_K, n_keys, int(seed), scale=scale)
    query_name = f"one-query-dk{PAPER_D_K}-keys{n_keys}-seed{int(seed)}" + ("-scaled" if scale else "-unscaled")
    st.plotly_chart(
        room(tp.query_weights_bars(weights, PAPER_D_K, scale)),
        width="stretch",
        key="mech_dk_query",
        config=export_config(query_name, "png"),
    )
    data_table(df.round(4), hide_index=True)


def masks_tab() -> None:
    st.markdown(
        "A mask says which keys each query may attend to (blue); masked scores are set to −∞ before the "
        "softmax, so their weights are exactly 0 and the rest of the row is renormalised. The **padding "
        "mask** hides the padding that fills a short sentence up to the batch's length; the **subsequent "
        "mask** stops a decoder position from seeing the positions after it (3.2.3)."
    )
    c = st.columns(4)
    n = bound(c[0].slider, "Positions n", 2, 16, 6, key="mech_mask_n")
    keep_in_range("mech_pad_len", 4, 1, n)
    keep_in_range("mech_mask_row", 2, 0, n - 1)
    length = bound(c[1].slider, "Real tokens in the padded sentence", 1, n, key="mech_pad_len")
    row = bound(c[2].slider, "Query row", 0, n - 1, key="mech_mask_row")
    kind = bound(c[3].radio, "Mask applied to the row", ["padding", "subsequent", "both"], key="mech_mask_kind")
    padding = mechanics.padding_mask([length], n)[0]
    subsequent = mechanics.subsequent_mask(n)
    masks = {"padding": padding, "subsequent": subsequent, "both": padding & subsequent}
    titles = {"padding": "padding mask", "subsequent": "subsequent mask", "both": "both: padding and subsequent"}
    grid = shared("mech-masks", (n, length), lambda: tp.mask_grid({titles[name]: m for name, m in masks.items()}))
    stem = f"masks-n{n}-length{length}"
    config = export_config(stem, "png")
    first("mech_mask").plotly_chart(room(grid), width="stretch", key="mech_mask_chart", config=config)
    st.caption(
        f"Rows are queries, columns keys, for a sentence of {length} tokens padded to {n}. Padding is masked "
        "as a key only: a padding query still attends to the real tokens, and its output is never used. "
        "'both' is the decoder's self-attention mask in a padded batch."
    )
    scores = np.random.default_rng(row).standard_normal(n) * 1.5
    table = mechanics.apply_mask_to_row(scores, masks[kind][row])
    c = st.columns([3, 2])
    bars = shared("mech-row", (n, length, row, kind), lambda: tp.masked_row_bars(table, row))
    row_name = f"{stem}-row{row}-{kind}"
    c[0].plotly_chart(room(bars, 0.6), width="stretch", key="mech_row_chart", config=export_config(row_name, "png"))
    c[0].caption(
        f"Query {row} with random scores: grey without the mask, blue after the {kind} mask. Masked keys get "
        "weight 0 and the others grow so that the row still sums to 1."
    )
    c[1].table(number_table(table))


def multihead_tab() -> None:
    st.markdown(
        "Multi-head attention runs h attentions in parallel on **slices** of the model's width: each head "
        "projects d_model down to d_k = d_model / h, attends, and the h results are concatenated and mixed "
        "by W^O (3.2.2). Because the heads are narrow, h heads cost about as much as one full-width head."
    )
    c = st.columns(3)
    n = bound(c[0].slider, "Tokens n", 1, 64, 10, key="mech_n")
    d_model = bound(c[1].select_slider, "d_model", [64, 128, 256, 512, 1024], value=512, key="mech_d_model")
    h = bound(c[2].select_slider, "Heads h", [1, 2, 4, 8, 16], value=8, key="mech_h")
    steps = mechanics.multihead_shapes(n, d_model, h)
    cost = mechanics.narrow_vs_wide_cost(n, d_model, h)
    first("mech_shapes").table(
        pd.DataFrame([(s, str(shape), what) for s, shape, what in steps], columns=["step", "shape", "what"])
    )
    st.caption(f"Shapes for one sentence: d_k = d_v = {d_model} / {h} = {d_model // h}.")
    c = st.columns(2)
    c[0].plotly_chart(
        room(shared("mech-cost", (n, d_model, h), lambda: tp.head_cost_bars(cost)), 0.5),
        width="stretch",
        key="mech_cost_chart",
        config=export_config(f"head-cost-n{n}-dmodel{d_model}-h{h}", "png"),
    )
    c[0].caption(
        "Narrow heads (the paper) against wide heads that each see all d_model dimensions: wide costs h times "
        "the parameters and multiply-adds. Biases left out."
    )
    wide = cost.set_index("attention").T
    c[1].table(number_table(wide, "{:,}", wide.columns))


def permutation_tab(ctx: Context) -> None:
    st.markdown(
        "Self-attention itself has no notion of order: shuffle the input tokens and, without positional "
        "encoding, the encoder's outputs and every attention map are shuffled the same way "
        "(enc(P x) = P enc(x), A(P x) = P A(x) Pᵀ), so the model sees a bag of words. With the positional "
        "encoding added (3.5), the shuffled sentence is a different input. This runs the loaded model, "
        "unchanged, on the sidebar's sentence."
    )
    if not ctx.ready:
        st.info("Choose a model in the sidebar to run this experiment.")
        return
    if ctx.bundle.config.decoder_only:
        st.info(
            "This experiment shuffles an encoder's input, and a language model has no encoder: its causal mask "
            "already tells positions apart (a token sees only those before it). Choose en-de or reverse."
        )
        return
    c = st.columns(4)
    order = bound(c[0].radio, "New order", ["reverse", "shuffle"], horizontal=True, key="mech_perm_order")
    seed = bound(c[1].number_input, "Shuffle seed", 0, 10_000, 0, key="mech_perm_seed", disabled=order != "shuffle")
    tokens, perm, checks = ctx.on_model("permutation", ctx.choices.src, order, int(seed))
    L, H = checks[True].attention.shape[:2]
    clamp_state("mech_perm_layer", range(1, L + 1))
    clamp_state("mech_perm_head", range(1, H + 1))
    layer = bound(c[2].selectbox, "Layer", range(1, L + 1), key="mech_perm_layer")
    head = bound(c[3].selectbox, "Head", range(1, H + 1), key="mech_perm_head")
    if len(tokens) < 2:
        st.warning("The sentence has one token: there is nothing to shuffle. Type a longer sentence.")
    shuffled = [tokens[i] for i in perm]
    st.markdown("**Shuffled order:** " + " ".join(f"`{t}`" for t in shuffled))
    permutation_summary(checks)
    for use_positions in (False, True):
        check = checks[use_positions]
        key = (ctx.model, ctx.device, ctx.choices.src, order, int(seed), layer, head, use_positions)
        fig = shared(
            "mech-permutation",
            key,
            lambda check=check, use_positions=use_positions: tp.permutation_figure(
                check.permuted_attention[layer - 1, head - 1],
                check.expected()[layer - 1, head - 1],
                shuffled,
                f"Positional encoding {'on' if use_positions else 'off'}: encoder layer {layer}, head {head}",
            ),
        )
        picture = first(f"mech_perm_{'on' if use_positions else 'off'}")
        file_name = f"{ctx.file_stem}-encoder-L{layer}H{head}-{order}" + (f"{int(seed)}" if order == "shuffle" else "")
        file_name += "-positions-" + ("on" if use_positions else "off")
        picture.plotly_chart(
            room(fig), width="stretch", key=f"mech_perm_chart_{use_positions}", config=export_config(file_name, "png")
        )
        picture.caption(
            "Left: the map for the shuffled sentence. Middle: the original sentence's map with rows and columns "
            "shuffled. Right: their difference, "
            + ("blank when order does not matter." if not use_positions else "far from 0: the positions changed.")
        )


def permutation_summary(checks: dict[bool, mechanics.PermutationCheck]) -> None:
    """How far the shuffled sentence's outputs and maps are from the shuffled originals, without and with positions."""
    summary = mechanics.permutation_table(checks)
    st.table(number_table(summary, "{:.3g}", summary.columns[1:]))
    holds = checks[False].max_diff < 1e-6
    st.markdown(
        f"Without positions the largest difference is {checks[False].max_diff:.1e} "
        f"({'exact up to float64 rounding' if holds else 'NOT exact: this model is not order-blind'}); "
        f"with positions it is {checks[True].max_diff:.3g}: order matters."
    )


def learning_rate_tab() -> None:
    st.markdown(
        "The paper trains with Adam and a learning rate that rises linearly for warmup_steps and then decays "
        "with the inverse square root of the step (equation 3, 5.3). A larger d_model gets a smaller rate."
    )
    c = st.columns(3)
    d_model = bound(c[0].select_slider, "d_model", [128, 256, 512, 1024], value=512, key="mech_lr_d_model")
    warmup = bound(c[1].slider, "warmup_steps", 100, 10_000, 4000, step=100, key="mech_lr_warmup")
    steps = bound(c[2].slider, "Steps shown", 1000, 100_000, 20_000, step=1000, key="mech_lr_steps")
    df = mechanics.lr_schedule(d_model, warmup, steps)
    peak = df["learning rate"].max()
    first("mech_lr").plotly_chart(
        room(shared("mech-lr", (d_model, warmup, steps), lambda: tp.lr_curve(df, warmup))),
        width="stretch",
        key="mech_lr_chart",
        config=export_config(f"lr-dmodel{d_model}-warmup{warmup}-steps{steps}", "png"),
    )
    where = (
        f"The peak, {peak:.3e} = d_model^-0.5 · warmup_steps^-0.5, is at the end of warm-up, step {warmup}."
        if warmup <= steps
        else f"Warm-up lasts longer than the {steps} steps shown: the rate is still rising ({peak:.3e} at the end)."
    )
    st.caption(f"{where} The paper's base model used d_model = 512 and warmup_steps = 4000.")


def body(ctx: Context) -> None:
    matrices_from_link()  # on any tab: the link's matrices are read as the page opens
    lazy_tabs(
        "mech_tab",
        {
            "Worked example": worked_example_tab,
            "Why √d_k": scaling_tab,
            "Masks": masks_tab,
            "Multi-head": multihead_tab,
            "Permutation": lambda: permutation_tab(ctx),
            "Learning rate": learning_rate_tab,
        },
    )


frame(body, intro=INTRO, prose=True, needs_model=False)
