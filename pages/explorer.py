"""Attention explorer: one head, all heads, lines, aggregates, head statistics and the Q-K embedding."""

import numpy as np
import streamlit as st

from attnviz import analysis, qk
from attnviz.app import (
    bound,
    clamp_state,
    clearest_head,
    computed,
    domain_notice,
    download_buttons,
    footer,
    shared,
    show_error,
    sidebar,
    truncation_notice,
)
from attnviz.app.present import intro, page_config, picture_area, room
from attnviz.app.views import (
    EXACT_MAX,
    layer_and_head,
    one_head,
    one_head_scores,
    row_labels,
    words_and_contrast,
    zoom,
)
from attnviz.figures.attention import lines_view
from attnviz.figures.common import export_config
from attnviz.figures.embedding import COLOUR_BY, qk_scatter
from attnviz.figures.images import head_grid
from attnviz.kinds import KINDS, TITLES, allowed

page_config("attention explorer")
choices = sidebar()
st.title("Attention explorer")
intro(
    "Rows are queries, columns are keys: row i shows how the token at position i mixes the values "
    "of the tokens it attends to, and sums to 1. Cross-attention has target rows and source columns. A decoder "
    'row is named by its input and the token it writes: "a → b" reads a and writes b, and it is b\'s '
    "counterpart that it looks for in the source."
)

LONG_LINES = 1000  # beyond EXACT_MAX tokens, the lines view draws at most this many (one trace each: slow to draw)
VIEWS = {
    "one": "One head",
    "grid": "All heads (model view)",
    "lines": "Lines",
    "aggregate": "Aggregate",
    "stats": "Head statistics",
    "qk": "Q-K embedding",
}


def open_one_head() -> None:
    st.session_state["view"] = "one"


def open_head_from_grid() -> None:
    """Clicking a head in the grid opens it large (runs before the rerun, like the table's click)."""
    event = st.session_state.get("_grid_chart")
    points = event.selection.points if event is not None else []
    if points and points[0].get("customdata"):
        st.session_state["layer"], st.session_state["head"] = (int(v) for v in points[0]["customdata"][:2])
        st.session_state["view"] = "one"


def select_head_from_table() -> None:
    """Clicking a row of the statistics table selects that layer and head (runs before the rerun)."""
    event = st.session_state.get("_stats_table")
    rows = event.selection.rows if event is not None else []
    table = st.session_state.get("stats_rows")
    if rows and table is not None:
        st.session_state["layer"], st.session_state["head"] = table[rows[0]]
        st.session_state["view"] = "one"


def aggregate(maps: np.ndarray, how: str, layer: int) -> np.ndarray:
    """The (Q, K) map of ``layer`` (from 1) combined over heads: mean, max, or attention rollout."""
    if how == "mean":
        return analysis.head_mean(maps)[layer - 1]
    if how == "max":
        return analysis.head_max(maps)[layer - 1]
    return analysis.attention_rollout(maps)[layer - 1].astype(np.float32)


def main() -> None:
    if choices is None:
        return
    picture = picture_area()  # under the title in presenter mode, else after the controls
    c1, c2 = st.columns([1, 3])
    words, contrast = words_and_contrast(c1, c2)
    try:
        export = computed("attention", choices.model, choices.device, choices.src, choices.tgt, words)
    except Exception as e:  # noqa: BLE001 - the user sees a message, never a traceback
        show_error(e)
        return
    truncation_notice(export)
    domain_notice(choices)

    kinds = [k for k in KINDS if getattr(export, k) is not None]
    clamp_state("kind", kinds)
    default = kinds.index("cross") if "cross" in kinds else 0  # where the decoder looks, when there is one
    captions = [TITLES[k] for k in kinds]
    kind = bound(st.radio, "Attention", kinds, index=default, captions=captions, horizontal=True, key="kind")
    maps = getattr(export, kind)  # (L, H, Q, K)
    L, H, Q, K = maps.shape
    source = (choices.model, choices.device, choices.src, choices.tgt)

    def maps_now() -> np.ndarray:
        """The maps again, from the cache (or computed): a download's closure holds these strings, not the
        maps, so that a closed tab, which Streamlit keeps for reconnection, holds no megabytes."""
        return getattr(computed("attention", *source, words), kind)

    q_tokens, k_tokens = export.tokens(kind)  # the tables' tokens; the figures name decoder rows by what they write
    q_labels = row_labels(export, kind)
    mask = allowed(kind, Q, K)

    c1, c2, c3 = st.columns([1, 1, 2])
    view = bound(c3.selectbox, "View", list(VIEWS), format_func=VIEWS.get, key="view")
    layer, head = layer_and_head((c1, c2), kind, L, H, clearest_head(choices.model, choices.device))
    stem = f"{choices.model.replace('/', '_')}-{kind}" + ("-words" if words else "")
    shown_map = (choices.model, choices.device, choices.src, choices.tgt, kind, words)  # what the maps depend on
    zoom_map = None  # (key, map, title, row tokens, column tokens, scores?) of a long map the zoom shows exactly

    if view == "one":
        show_scores = bound(
            st.toggle,
            "Scaled scores before the softmax",
            key="scores",
            help="Q·K/√d_k: the logits the softmax turns into weights. Masked entries are grey.",
        )
        title = f"{TITLES[kind]}, layer {layer}, head {head}"
        if show_scores:
            pieces = computed("attention", choices.model, choices.device, choices.src, choices.tgt) if words else export
            if words:
                st.info("Scores are per piece (a word has no single score): the words toggle merges weights only.")
            scores = computed("scores", choices.model, choices.device, choices.src, choices.tgt)[kind]
            matrix = scores[layer - 1, head - 1]
            sq_tokens, sk_tokens = pieces.tokens(kind)
            sq_labels = row_labels(pieces, kind)
            title = f"{title} (scores)"
            fig = one_head_scores((*shown_map, layer, head), matrix, sq_labels, sk_tokens, kind, title)
            if max(matrix.shape) > EXACT_MAX:
                zoom_map = ((*shown_map, layer, head, "scores"), matrix, title, sq_labels, sk_tokens, True)

            def shown():
                scores_now = computed("scores", *source)[kind]
                return analysis.long_form(scores_now, sq_tokens, sk_tokens, layers=[layer], heads=[head]).rename(
                    columns={"weight": "score"}
                )

        else:
            matrix = maps[layer - 1, head - 1]
            fig = one_head((*shown_map, layer, head), matrix, q_labels, k_tokens, kind, contrast, mask, title)
            if max(Q, K) > EXACT_MAX:
                zoom_map = ((*shown_map, layer, head), matrix, title, q_labels, k_tokens, False)
            shown = lambda: analysis.long_form(maps_now(), q_tokens, k_tokens, layers=[layer], heads=[head])  # noqa: E731
        name = f"{stem}-L{layer}H{head}"
    elif view == "grid":
        fig = shared(
            "explorer-grid",
            (*shown_map, layer, head, contrast),
            lambda: head_grid(maps, q_labels, k_tokens, kind, contrast, mask, selected=(layer, head)),
        )
        st.caption(
            "Every layer (rows) and head (columns); the outlined map is the layer and head chosen above. "
            "Click a map to open it at full resolution."
        )
        st.button(f"Open layer {layer}, head {head} large", on_click=open_one_head, key="_open_large")
        shown = lambda: analysis.long_form(maps_now(), q_tokens, k_tokens)  # noqa: E731 - built on click
        name = f"{stem}-all-heads"
    elif view == "lines":
        heads = bound(st.multiselect, "Heads", range(1, H + 1), default=[head], key="lines_heads")
        if not heads:
            st.info("Choose at least one head.")
            return
        fig = shared(
            "explorer-lines",
            (*shown_map, layer, tuple(heads), contrast),
            lambda: lines_view(
                maps[layer - 1, [h - 1 for h in heads]],
                q_labels,
                k_tokens,
                heads,
                kind,
                contrast=contrast,
                max_lines=LONG_LINES if max(Q, K) > EXACT_MAX else 3000,
            ),
        )
        st.caption("Queries on the left, keys on the right; a line's opacity is the weight (under 0.01 not drawn).")
        shown = lambda: analysis.long_form(maps_now(), q_tokens, k_tokens, layers=[layer], heads=heads)  # noqa: E731
        name = f"{stem}-L{layer}-lines"
    elif view == "aggregate":
        options = ["mean", "max"] + (["rollout"] if kind == "encoder" else [])
        clamp_state("aggregate", options)
        how = bound(st.radio, "Aggregate", options, horizontal=True, key="aggregate")
        if how == "mean":
            st.info(
                "**Mean over heads**: the average map of this layer. It hides heads that disagree, and the "
                "model itself does not weight heads equally (W^O mixes them)."
            )
        elif how == "max":
            st.info(
                "**Max over heads**: for each cell, the strongest head. Rows no longer sum to 1: it shows "
                "where *some* head looks, not how the layer mixes."
            )
        else:
            st.info(
                "**Attention rollout** (Abnar & Zuidema, 2020): heads averaged, the residual added as "
                "0.5·I, and layers 1..l multiplied, so row i estimates how much each *input* token flows "
                "into position i after layer l. It assumes linear mixing and ignores values, W^O, the "
                "feed-forward layers and LayerNorm: a rough estimate, not a measurement."
            )
        combined = np.clip(aggregate(maps, how, layer), 0, 1)
        title = f"{TITLES[kind]}, layer {layer}, {how} over heads"
        fig = one_head((*shown_map, layer, how), combined, q_labels, k_tokens, kind, contrast, mask, title)
        if max(Q, K) > EXACT_MAX:
            zoom_map = ((*shown_map, layer, how), combined, title, q_labels, k_tokens, False)
        shown = lambda: analysis.long_form(aggregate(maps_now(), how, layer)[None, None], q_tokens, k_tokens).assign(  # noqa: E731
            layer=layer, head=how
        )
        name = f"{stem}-L{layer}-{how}"
    elif view == "qk":
        show_qk(choices, export, kind, layer, head, words)
        return
    else:
        table = shared("explorer-stats", shown_map, lambda: analysis.head_statistics(maps, q_tokens, k_tokens, kind))
        st.session_state["stats_rows"] = list(zip(table["layer"], table["head"], strict=True))
        st.caption(
            "One row per head; click a row to open that head. **entropy**: how spread a query's weights "
            "are (0 = one key; normalised: 1 = uniform). **mean_distance**: how far queries look, in "
            f"positions ({table.attrs.get('distance_note', '')}). **diagonal / previous / first / end**: "
            "share of weight on the same position, the one before, the first token and the last token."
        )
        st.dataframe(
            table.round(4),
            key="_stats_table",
            on_select=select_head_from_table,
            selection_mode="single-row",
            hide_index=True,
            width="stretch",
        )
        download_buttons(lambda: table, None, None, f"{stem}-head-statistics")
        return

    fmt = st.session_state.get("image_format", "png")
    if view == "grid":
        picture.plotly_chart(
            room(fig),
            width="stretch",
            config=export_config(name, fmt),
            key="_grid_chart",
            on_select=open_head_from_grid,
            selection_mode="points",
        )
    else:
        picture.plotly_chart(room(fig), width="stretch", config=export_config(name, fmt))
    if zoom_map is not None:
        key, matrix, title, rows, columns, scores = zoom_map
        zoom("", key, matrix, rows, columns, kind, contrast, None if scores else mask, title, scores=scores)
    download_buttons(shown, lambda: computed("attention", *source, words), fmt, name)


def show_qk(choices, export, kind: str, layer: int, head: int, words: bool) -> None:
    """The Q-K embedding of the chosen head: its queries and keys in one plane (attnviz.qk)."""
    try:
        vectors = computed("queries_keys", choices.model, choices.device, choices.src, choices.tgt)
    except Exception as e:  # noqa: BLE001 - the user sees a message, never a traceback
        show_error(e)
        return
    pieces = computed("attention", choices.model, choices.device, choices.src, choices.tgt) if words else export
    if words:
        st.info("The Q-K embedding shows pieces: each piece has its own query and key vector, a word has none.")
    q_tokens, k_tokens = pieces.tokens(kind)
    colour_by = bound(
        st.radio, "Colour by", list(COLOUR_BY), format_func=COLOUR_BY.get, horizontal=True, key="qk_colour"
    )
    queries, keys = (v[layer - 1, head - 1] for v in vectors[kind])
    key = (choices.model, choices.device, choices.src, choices.tgt, kind, layer, head)
    embedding = shared("qk-embedding", key, lambda: qk.qk_embedding(queries, keys))
    weights = getattr(pieces, kind)[layer - 1, head - 1]
    agreement = shared(
        "qk-agreement",
        key,
        lambda: qk.picture_agreement(embedding, weights, allowed(kind, *weights.shape)),
    )
    fig = shared(
        "qk-figure",
        (*key, colour_by),
        lambda: qk_scatter(
            embedding,
            row_labels(pieces, kind),
            k_tokens,
            kind,
            colour_by,
            f"{TITLES[kind]}, layer {layer}, head {head}: Q-K embedding",
        ),
    )
    st.caption(
        "Queries and keys of this head in one plane (AttentionViz, Yeh et al. 2023). Before projecting, keys are "
        "moved so that their centroid is the queries' and queries scaled by c, keys by 1/c: **neither changes any "
        "softmax** (a query's scores all shift by one constant; q·k is unchanged). One more coordinate gives every "
        "key the same length, so that in the full space a key nearer a query gets more of its attention, exactly. "
        f"The plane (PCA) keeps {embedding.explained:.0%} of the spread; there, nearness and attention agree with "
        f"a rank correlation of {agreement:.2f} per query on average (1 would be exact)."
    )
    st.plotly_chart(
        room(fig), width="stretch", config=export_config(f"{choices.model.replace('/', '_')}-{kind}-qk", "png")
    )


main()
footer()
