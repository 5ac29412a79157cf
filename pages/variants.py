"""Attention variants: sparse mask patterns, the Synthesizer, and the cost table of section 4."""

import pandas as pd
import streamlit as st

from attnviz.app import bound, clamp_state, keep_in_range, lazy_tabs, number_table, shared
from attnviz.app.cache import computed, forget
from attnviz.app.frame import Context, frame
from attnviz.app.present import data_table, first, room
from attnviz.figures import teaching as tp
from attnviz.figures.attention import attention_heatmap
from attnviz.figures.common import export_config
from attnviz.lessons import variants

INTRO = (
    "Full self-attention compares every position with every other: n² pairs per head and layer. This page "
    "shows the sparse patterns that compute only some pairs, what one of them does to the trained model's "
    "maps and translation, attention weights that are not computed from token pairs at all (the "
    "Synthesizer), and the paper's own comparison of self-attention with recurrent and convolutional layers, "
    "measured on this machine. They show what full attention buys and what it costs as sentences grow."
)


def patterns_tab() -> None:
    st.markdown(
        "Each pattern is a mask over n positions (blue: the pair is computed). **Local** attention keeps the "
        "k − 1 neighbours on each side, **dilated** (atrous) attention every k-th position, and the "
        "**sparse** pattern of Sparse Transformers (Child et al., 2019) both, so that any position reaches "
        "any other in two steps. Ticking *causal* keeps only keys at or before the query, as in a decoder."
    )
    c = st.columns(3)
    n = bound(c[0].slider, "Positions n", 4, 64, 16, key="var_n")
    k = bound(c[1].slider, "Window / stride k", 1, 16, 4, key="var_k")
    causal = bound(c[2].toggle, "Causal", key="var_causal")
    masks = {name: variants.pattern(name, n, k, causal) for name in variants.PATTERNS}
    counts = {name: variants.pair_count(m) for name, m in masks.items()}
    grid = shared(
        "var-patterns", (n, k, causal), lambda: tp.mask_grid({f"{p}: {counts[p]} pairs": m for p, m in masks.items()})
    )
    stem = f"variants-n{n}-k{k}" + ("-causal" if causal else "")
    first("var_pattern").plotly_chart(
        room(grid), width="stretch", key="var_pattern_chart", config=export_config(f"{stem}-patterns", "png")
    )
    st.caption(f"Rows are queries, columns keys; n = {n}, k = {k}. The title gives the pairs each pattern computes.")
    st.table(
        pd.DataFrame(
            {
                "pattern": list(masks),
                "which keys": [variants.PATTERNS[name][0] for name in masks],
                "computed pairs": [counts[name] for name in masks],
                "share of n²": [f"{counts[name] / n**2:.1%}" for name in masks],
                "cost": [variants.PATTERNS[name][1] for name in masks],
            }
        )
    )
    cost = shared("var-cost", (k, causal), lambda: tp.cost_figure(variants.cost_curves(k=k, causal=causal), k))
    cost_name = f"variants-k{k}" + ("-causal" if causal else "") + "-cost"  # over every n: not the chosen one
    st.plotly_chart(room(cost), width="stretch", key="var_cost_chart", config=export_config(cost_name, "png"))
    st.caption(
        "Exact pair counts of each pattern from n = 16 to 1024 on log-log axes: the slope is the exponent. Full "
        "and causal grow as n², local as n·k, dilated as n²/k; sparse as n·k + n²/k, which is n√n when k = √n."
    )


def model_tab(ctx: Context) -> None:
    st.markdown(
        "The trained model never saw these patterns: here one of them is ANDed into every encoder "
        "self-attention layer of the loaded model (the model itself is not changed), and the sentence is "
        "translated again. Masked pairs are grey."
    )
    if not ctx.ready:
        st.info("Choose a model in the sidebar to run this experiment.")
        return
    if ctx.bundle.config.decoder_only:
        st.info(
            "This experiment imposes a pattern on an encoder's self-attention, and a language model has no "
            "encoder (its self-attention is already the causal pattern). Choose en-de or reverse."
        )
        return
    c = st.columns(4)
    name = bound(c[0].selectbox, "Pattern", ["local", "dilated", "sparse", "causal"], key="var_pattern")
    k = bound(c[1].slider, "Window / stride k", 1, 8, 2, key="var_model_k", disabled=name == "causal")
    tokens, _, base, base_text = ctx.on_model("pattern", ctx.choices.src, None, k)
    _, mask, run, text = ctx.on_model("pattern", ctx.choices.src, name, k)
    L, H = base.maps.shape[:2]
    clamp_state("var_layer", range(1, L + 1))
    clamp_state("var_head", range(1, H + 1))
    layer = bound(c[2].selectbox, "Layer", range(1, L + 1), key="var_layer")
    head = bound(c[3].selectbox, "Head", range(1, H + 1), key="var_head")
    S = len(tokens)
    kept = f"The pattern keeps {variants.pair_count(mask)} of {S * S} pairs."
    if base_text is None:
        st.markdown(f"{kept} This model is encoder-only: there is no translation to compare, only the maps.")
    else:
        st.markdown(
            f"**As trained:** {base_text or '(empty)'}  \n"
            f"**With the {name} pattern{'' if name == 'causal' else f', k = {k}'}:** {text or '(empty)'}  \n"
            f"{kept}" + (" The translation is unchanged." if text == base_text else " The translation changed.")
        )
    c = first("var_model").columns(2)
    pattern = name if name == "causal" else f"{name}-k{k}"
    shown = ((c[0], base.maps, "as trained", None, "as-trained"), (c[1], run.maps, f"{name} pattern", mask, pattern))
    for col, maps, title, m, file_part in shown:
        fig = shared(
            "var-map",
            (ctx.model, ctx.device, ctx.choices.src, name if m is not None else None, k, layer, head),
            lambda maps=maps, title=title, m=m: attention_heatmap(
                maps[layer - 1, head - 1],
                tokens,
                tokens,
                "encoder",
                title=f"Layer {layer}, head {head}: {title}",
                mask=m,
            ),
        )
        file_name = f"{ctx.file_stem}-encoder-L{layer}H{head}-{file_part}"
        col.plotly_chart(
            room(fig, 0.5), width="stretch", key=f"var_map_{m is None}", config=export_config(file_name, "png")
        )
    st.caption(
        "Encoder self-attention of the chosen layer and head, rows are queries and columns keys. In layer 1 the "
        "pattern only renormalises the trained weights over the allowed keys; deeper layers also receive "
        "different inputs, so their maps change more."
    )


def synthesizer_tab() -> None:
    st.markdown(
        "Dot-product attention is **token-to-token**: the score of query i for key j depends on both tokens. "
        "The Synthesizer (Tay et al., 2020) drops that: the **dense** Synthesizer predicts the whole row of "
        "scores from token i alone (ReLU(X W1) W2, one column per key *position*), the **random** Synthesizer "
        "uses a fixed matrix learned for the task that never reads the input. All three here use the same "
        "random input X and untrained, random parameters."
    )
    c = st.columns(4)
    n = bound(c[0].slider, "Tokens n", 3, 12, 6, key="var_syn_n")
    d = bound(c[1].slider, "Width d", 2, 32, 8, key="var_syn_d")
    seed = bound(c[2].number_input, "Random seed", 0, 10_000, 0, key="var_syn_seed")
    keep_in_range("var_syn_token", 2, 0, n - 1)
    token = bound(c[3].slider, "Token to change", 0, n - 1, key="var_syn_token")
    demo = variants.synthesizer_demo(n, d, int(seed))
    weights = shared("var-syn-weights", (n, d, int(seed)), lambda: tp.heatmap_row(demo.weights))
    stem = f"synthesizer-n{n}-d{d}-seed{int(seed)}"
    first("var_syn").plotly_chart(
        room(weights), width="stretch", key="var_syn_weights", config=export_config(f"{stem}-weights", "png")
    )
    st.caption("Attention weights of the three methods for the same input: rows are queries, columns keys.")
    changed = variants.token_dependence(demo, token)
    grid = shared(
        "var-syn-changed",
        (n, d, int(seed), token),
        lambda: tp.mask_grid(
            {f"{m}: {int(v.sum())} scores change": v for m, v in changed.items()},
            x_title="key",
            y_title="query",
            legend=("unchanged", "changed"),
        ),
    )
    changed_name = f"{stem}-token{token}-changed"
    st.plotly_chart(room(grid), width="stretch", key="var_syn_changed", config=export_config(changed_name, "png"))
    st.caption(
        f"Which scores change (blue) when token {token} is replaced by another vector: dot-product, its row and its "
        "column (it is a query and a key); dense Synthesizer, its row only; random Synthesizer, nothing."
    )


def complexity_tab() -> None:
    st.markdown(
        "Section 4 compares layer types by the work per layer, the operations that must run one after "
        "another, and the longest path a signal travels between two positions (Table 1). Self-attention is "
        "cheaper than a recurrent layer when n < d, runs in parallel, and connects any two positions directly."
    )
    c = st.columns(4)
    n = bound(c[0].number_input, "Sequence length n", 1, 100_000, 50, key="var_cx_n")
    d = bound(c[1].number_input, "Width d", 1, 10_000, 512, key="var_cx_d")
    k = bound(c[2].number_input, "Kernel width k", 2, 64, 3, key="var_cx_k")
    r = bound(c[3].number_input, "Neighbourhood r", 1, 1024, 4, key="var_cx_r")
    table = variants.complexity_table(int(n), int(d), int(k), int(r))
    first("var_complexity").table(number_table(table, "{:,}", table.columns[4:]))
    st.caption(
        "The symbolic columns are the paper's Table 1; the evaluated columns drop the constants as it does. "
        "Path length of the convolutional layer: dilated convolutions, ⌈log_k(n)⌉ layers."
    )
    c = st.columns([1, 3])
    width = bound(c[0].select_slider, "Width d for timing", [32, 64, 128, 256], value=64, key="var_time_d")
    if c[0].button("Measure again", key="_var_measure"):
        forget("timing")
    df = computed("timing", None, "cpu", width)
    timing = tp.timing_figure(df)  # re-measured: not shared
    config = export_config(f"timing-d{width}", "png")
    c[1].plotly_chart(room(timing, 0.75), width="stretch", key="var_time_chart", config=config)
    c[1].caption(
        f"Median of 5 runs of one layer of width {width} on one sequence, on this machine's CPU "
        f"({df.attrs.get('threads', '?')} threads). The GRU steps through the n positions one after another; "
        "self-attention does all of them at once, so its time grows more slowly until n² work dominates."
    )
    data_table(df.round(3), c[0], hide_index=True)


def body(ctx: Context) -> None:
    """Four tabs; only the model's needs a model."""
    lazy_tabs(
        "var_tab",
        {
            "Mask patterns": patterns_tab,
            "Pattern on the model": lambda: model_tab(ctx),
            "Synthesizer": synthesizer_tab,
            "Complexity (section 4)": complexity_tab,
        },
    )


frame(body, intro=INTRO, prose=True, needs_model=False)
