"""Attention explorer: one head, all heads, lines, aggregates, head statistics and the Q-K embedding."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import streamlit as st

from attnviz import analysis, qk, tiles
from attnviz.app import bound, clamp_state, domain_notice, download_buttons, shared, truncation_notice, viewport, views
from attnviz.app.cache import long_text
from attnviz.app.follow import map_chart
from attnviz.app.frame import Context, frame
from attnviz.app.present import PICTURE_MAX_PX, TICK_PX, picture_area, presenting, room
from attnviz.app.views import (
    EXACT_MAX,
    kind_choice,
    layer_and_head,
    one_head,
    one_head_scores,
    row_labels,
    words_and_contrast,
    zoom,
)
from attnviz.app.widgets import Download, export_download
from attnviz.export import AttentionExport
from attnviz.figures.attention import lines_view
from attnviz.figures.common import export_config
from attnviz.figures.embedding import COLOUR_BY, hover_only, qk_scatter
from attnviz.figures.images import head_grid, pooled_head_grid
from attnviz.kinds import KINDS, TITLES, allowed

T = TypeVar("T")
ROWS_AND_COLUMNS = (
    "Rows are queries, columns are keys: row i shows how the token at position i mixes the values "
    "of the tokens it attends to, and sums to 1. "
)
INTRO = ROWS_AND_COLUMNS + (
    "Cross-attention has target rows and source columns. A decoder "
    'row is named by its input and the token it writes: "a → b" reads a and writes b, and it is b\'s '
    "counterpart that it looks for in the source."
)
LM_INTRO = ROWS_AND_COLUMNS + (
    "A language model's rows never see a later token (its mask is causal). A row is named by its input "
    'and the token it writes: "a → b" reads a and writes b.'
)
ENCODER_INTRO = ROWS_AND_COLUMNS + "An encoder's rows see every token of the text, before and after."


def intro(ctx: Context) -> str:
    """The page's introduction for the model in front of the visitor: translation, language model or encoder."""
    config = ctx.bundle.config
    return LM_INTRO if config.decoder_only else ENCODER_INTRO if config.encoder_only else INTRO


LONG_LINES = 1000  # beyond EXACT_MAX tokens, the lines view draws at most this many, the strongest
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


@dataclass(frozen=True)
class Picked:
    """The maps the controls chose: one kind of one export, a layer and head, and how they are drawn."""

    ctx: Context
    export: AttentionExport
    kind: str
    layer: int
    head: int
    words: bool
    contrast: str

    @property
    def maps(self) -> np.ndarray:
        return getattr(self.export, self.kind)  # (L, H, Q, K)

    @property
    def key(self) -> tuple:
        """What the maps depend on: the figures' cache key."""
        return (*self.ctx.key, self.kind, self.words)

    @property
    def stem(self) -> str:
        return f"{self.ctx.file_stem}-{self.kind}" + ("-words" if self.words else "")

    @property
    def title(self) -> str:
        return f"{TITLES[self.kind]}, layer {self.layer}, head {self.head}"

    def labels(self, export: AttentionExport | None = None) -> tuple[list[str], tuple[str, ...]]:
        """(row labels, column tokens) of the figures: decoder rows are named by what they write."""
        export = export or self.export
        return row_labels(export, self.kind), export.tokens(self.kind)[1]

    def mask(self) -> np.ndarray:
        return allowed(self.kind, *self.maps.shape[-2:])

    def csv(self, layers: list[int] | None = None, heads: list[int] | None = None) -> Download:
        """The CSV of the chosen ``layers`` and ``heads`` (None: all), bounded before it is built, and built
        on a download's click from the cache: its closure holds keys, not the maps, so that a closed tab,
        which Streamlit keeps for reconnection, holds no megabytes."""
        ctx, words, kind = self.ctx, self.words, self.kind
        size = analysis.long_form_csv_size(self.maps.shape, *self.export.tokens(kind), layers, heads)

        def write(out) -> None:
            export = ctx.export(words)
            analysis.long_form_csv(out, getattr(export, kind), *export.tokens(kind), layers, heads)

        return Download(size, write)


@dataclass(frozen=True)
class Drawn:
    """A view's figure, its file name, the CSV of what it shows, and the map the zoom shows exactly."""

    fig: object
    name: str
    table: Download
    zoom: tuple | None = None  # (key, map, title, row labels, column tokens, scores?) of a long map


def body(ctx: Context) -> None:
    if ctx.long:
        long_body(ctx)
        return
    picture = picture_area()  # under the title in presenter mode, else after the controls
    c1, c2 = st.columns([1, 3])
    words, contrast = words_and_contrast(c1, c2)
    export = ctx.export(words)
    truncation_notice(export)
    domain_notice(ctx.choices)
    kinds = [k for k in KINDS if getattr(export, k) is not None]
    kind, view, layer, head = choose(ctx, kinds, lambda k: getattr(export, k).shape[:2])
    picked = Picked(ctx, export, kind, layer, head, words, contrast)
    drawn = DRAW[view](picked)
    if drawn is None:  # the view drew itself
        return
    fmt = st.session_state.get("image_format", "png")
    if view == "grid":
        picture.plotly_chart(
            room(drawn.fig),
            width="stretch",
            config=export_config(drawn.name, fmt),
            key="_grid_chart",
            on_select=open_head_from_grid,
            selection_mode="points",
        )
    elif view in ("one", "aggregate"):  # a click on a cell points at it, for a room's followers
        map_chart(picture, drawn.fig, f"_{view}_map", config=export_config(drawn.name, fmt))
    else:
        picture.plotly_chart(room(drawn.fig), width="stretch", config=export_config(drawn.name, fmt))
    if drawn.zoom is not None:
        key, matrix, title, rows, columns, scores = drawn.zoom
        mask = None if scores else picked.mask()
        zoom("", key, matrix, rows, columns, kind, contrast, mask, title, scores=scores, name=drawn.name, fmt=fmt)
    npz_name = f"{ctx.file_stem}" + ("-words" if words else "") + "-attention"  # every map: no view
    download_buttons(drawn.table, export_download(lambda: ctx.export(words), export), fmt, drawn.name, npz_name)


def choose(ctx: Context, kinds: list[str], layers_heads: Callable[[str], tuple[int, int]]) -> tuple[str, str, int, int]:
    """The kind, view, layer and head pickers: (kind, view, layer, head); ``layers_heads(kind)`` is (L, H)."""
    kind = kind_choice(kinds, "kind")
    L, H = layers_heads(kind)
    c1, c2, c3 = st.columns([1, 1, 2])
    view = bound(c3.selectbox, "View", list(VIEWS), format_func=VIEWS.get, key="view")
    layer, head = layer_and_head((c1, c2), kind, L, H, ctx.clearest_head())
    return kind, view, layer, head


def draw_one(p: Picked) -> Drawn:
    """One head at full size: its weights, or the scaled scores before the softmax."""
    show_scores = bound(
        st.toggle,
        "Scaled scores before the softmax",
        key="scores",
        help="Q·K/√d_k: the logits the softmax turns into weights. Masked entries are grey.",
    )
    name, key = f"{p.stem}-L{p.layer}H{p.head}", (*p.key, p.layer, p.head)
    if not show_scores:
        matrix = p.maps[p.layer - 1, p.head - 1]
        rows, columns = p.labels()
        fig = one_head(key, matrix, rows, columns, p.kind, p.contrast, p.mask(), p.title)
        long = max(matrix.shape) > EXACT_MAX
        table = p.csv(layers=[p.layer], heads=[p.head])
        return Drawn(fig, name, table, (key, matrix, p.title, rows, columns, False) if long else None)
    pieces = p.ctx.export() if p.words else p.export
    if p.words:
        st.info("Scores are per piece (a word has no single score): the words toggle merges weights only.")
    name = f"{p.stem.removesuffix('-words')}-scores-L{p.layer}H{p.head}"  # per piece, whatever the toggle
    scores = p.ctx.on_text("scores")[p.kind]
    matrix = scores[p.layer - 1, p.head - 1]
    rows, columns = p.labels(pieces)
    title = f"{p.title} (scores)"
    fig = one_head_scores(key, matrix, rows, columns, p.kind, title)
    long = max(matrix.shape) > EXACT_MAX
    kind, layer, head, ctx = p.kind, p.layer, p.head, p.ctx
    size = analysis.long_form_csv_size(scores.shape, *pieces.tokens(kind), [layer], [head], "score")

    def write(out) -> None:  # keys only: see Picked.csv
        tokens = ctx.export().tokens(kind)
        analysis.long_form_csv(out, ctx.on_text("scores")[kind], *tokens, [layer], [head], "score")

    table = Download(size, write)
    return Drawn(fig, name, table, ((*key, "scores"), matrix, title, rows, columns, True) if long else None)


def draw_grid(p: Picked) -> Drawn:
    """Every layer and head at once; a click opens one large."""
    rows, columns = p.labels()
    fig = shared(
        "explorer-grid",
        (*p.key, p.layer, p.head, p.contrast),
        lambda: head_grid(p.maps, rows, columns, p.kind, p.contrast, p.mask(), selected=(p.layer, p.head)),
    )
    st.caption(
        "Every layer (rows) and head (columns); the outlined map is the layer and head chosen above. "
        "Click a map to open it at full resolution."
    )
    st.button(f"Open layer {p.layer}, head {p.head} large", on_click=open_one_head, key="_open_large")
    return Drawn(fig, f"{p.stem}-all-heads", p.csv())


def draw_lines(p: Picked) -> Drawn | None:
    """BertViz-style lines from queries to keys for the chosen heads of one layer."""
    H = p.maps.shape[1]
    heads = bound(st.multiselect, "Heads", range(1, H + 1), default=[p.head], key="lines_heads")
    if not heads:
        st.info("Choose at least one head.")
        return None
    rows, columns = p.labels()
    long = max(p.maps.shape[-2:]) > EXACT_MAX
    fig = shared(
        "explorer-lines",
        (*p.key, p.layer, tuple(heads), p.contrast),
        lambda: lines_view(
            p.maps[p.layer - 1, [h - 1 for h in heads]],
            rows,
            columns,
            heads,
            p.kind,
            contrast=p.contrast,
            max_lines=LONG_LINES if long else 3000,
            layer=p.layer,
        ),
    )
    st.caption("Queries on the left, keys on the right; a line's opacity is the weight (under 0.01 not drawn).")
    shown = "-".join(str(h) for h in sorted(heads))  # the heads drawn, in the CSV's order
    return Drawn(fig, f"{p.stem}-L{p.layer}H{shown}-lines", p.csv(layers=[p.layer], heads=heads))


AGGREGATES = {
    "mean": "**Mean over heads**: the average map of this layer. It hides heads that disagree, and the model "
    "itself does not weight heads equally (W^O mixes them).",
    "max": "**Max over heads**: for each cell, the strongest head. Rows no longer sum to 1: it shows where *some* "
    "head looks, not how the layer mixes.",
    "rollout": "**Attention rollout** (Abnar & Zuidema, 2020): heads averaged, the residual added as 0.5·I, and "
    "layers 1..l multiplied, so row i estimates how much each *input* token flows into position i after layer l. "
    "It assumes linear mixing and ignores values, W^O, the feed-forward layers and LayerNorm: a rough estimate, "
    "not a measurement.",
}


def draw_aggregate(p: Picked) -> Drawn:
    """One layer's heads combined: mean, max, or (encoder) attention rollout."""
    options = ["mean", "max"] + (["rollout"] if p.kind == "encoder" else [])
    clamp_state("aggregate", options)
    how = bound(st.radio, "Aggregate", options, horizontal=True, key="aggregate")
    st.info(AGGREGATES[how])
    combined = np.clip(aggregate(p.maps, how, p.layer), 0, 1)
    title = f"{TITLES[p.kind]}, layer {p.layer}, {how} over heads"
    rows, columns = p.labels()
    key = (*p.key, p.layer, how)
    fig = one_head(key, combined, rows, columns, p.kind, p.contrast, p.mask(), title)
    long = max(combined.shape) > EXACT_MAX
    kind, layer, ctx, words = p.kind, p.layer, p.ctx, p.words
    names = ([layer], [how])  # the file's layer and "head": this layer, the aggregate's name
    size = analysis.long_form_csv_size((1, 1, *combined.shape), *p.export.tokens(kind), names=names)

    def write(out) -> None:  # keys only: see Picked.csv
        export = ctx.export(words)
        combined = aggregate(getattr(export, kind), how, layer)[None, None]
        analysis.long_form_csv(out, combined, *export.tokens(kind), names=names)

    table = Download(size, write)
    return Drawn(
        fig, f"{p.stem}-L{p.layer}-{how}", table, (key, combined, title, rows, columns, False) if long else None
    )


def draw_stats(p: Picked) -> None:
    """One row per head: entropy, distance and where the weight goes; a click on a row opens that head."""
    q_tokens, k_tokens = p.export.tokens(p.kind)
    table = shared("explorer-stats", p.key, lambda: analysis.head_statistics(p.maps, q_tokens, k_tokens, p.kind))
    stats_table(table, p.stem, p.key)


def stats_table(table, stem: str, key: tuple) -> None:
    """The head statistics as a table whose row click opens that head, with its caption and download."""
    st.session_state["stats_rows"] = list(zip(table["layer"], table["head"], strict=True))
    st.caption(
        "One row per head; click a row to open that head. **entropy**: how spread a query's weights "
        "are (0 = one key; normalised: 1 = uniform). **mean_distance**: how far queries look, in "
        f"positions ({table.attrs.get('distance_note', '')}). **diagonal / previous / first / end**: "
        "share of weight on the same position, the one before, the first token and the last token. "
        "**bos** (decoder self-attention): the share on position 0, the start token or a language model's "
        "first token; a head that parks most of its weight there uses it as an attention sink. **induction** "
        "(decoder self-attention, on a text that repeats tokens): the share on the token right after the "
        "current token's latest earlier occurrence, where an induction head looks to copy what came next."
    )
    st.dataframe(
        table.round(4),
        key="_stats_table",
        on_select=select_head_from_table,
        selection_mode="single-row",
        hide_index=True,
        width="stretch",
    )
    # one row per head: its CSV is small, made once and kept with the results
    data = shared("explorer-stats-csv", key, lambda: table.to_csv(index=False).encode("utf-8"))
    download_buttons(
        Download(len(data), lambda out: out.write(data)),
        None,
        None,
        f"{stem}-head-statistics",
        holds="One row per head: " + ", ".join(map(str, table.columns)) + ".",
    )


def draw_qk(p: Picked) -> None:
    """The Q-K embedding of the chosen head: its queries and keys in one plane (attnviz.qk)."""
    rotated = rotation_choice(p.ctx)
    vectors = p.ctx.on_text("queries_keys", rotated)
    pieces = p.ctx.export() if p.words else p.export
    if p.words:
        st.info("The Q-K embedding shows pieces: each piece has its own query and key vector, a word has none.")
    kind, layer, head = p.kind, p.layer, p.head
    colour_by = bound(
        st.radio, "Colour by", list(COLOUR_BY), format_func=COLOUR_BY.get, horizontal=True, key="qk_colour"
    )
    queries, keys = (v[layer - 1, head - 1] for v in vectors[kind])
    key = (*p.ctx.key, kind, layer, head, rotated)
    embedding = shared("qk-embedding", key, lambda: qk.qk_embedding(queries, keys))
    weights = getattr(pieces, kind)[layer - 1, head - 1]
    agreement = shared(
        "qk-agreement",
        key,
        lambda: qk.picture_agreement(embedding, weights, allowed(kind, *weights.shape)),
    )
    rows, columns = p.labels(pieces)
    title = f"{p.title}: Q-K embedding"
    # The tokens are placed apart for the layout they are drawn in: a projector's larger text and shorter
    # picture (attnviz.app.present.room), or a phone's.
    layout = {"label_px": TICK_PX, "height": PICTURE_MAX_PX} if presenting() else {}
    layout |= {"narrow": True} if viewport.narrow() else {}
    fig = shared(
        "qk-figure",
        (*key, colour_by, *sorted(layout.items())),
        lambda: qk_scatter(embedding, rows, columns, kind, colour_by, title, **layout),
    )
    st.caption(
        "Queries and keys of this head in one plane (AttentionViz, Yeh et al. 2023). Before projecting, keys are "
        "moved so that their centroid is the queries' and queries scaled by c, keys by 1/c: **neither changes any "
        "softmax** (a query's scores all shift by one constant; q·k is unchanged). One more coordinate gives every "
        "key the same length, so that in the full space a key nearer a query gets more of its attention, exactly. "
        f"The plane (PCA) keeps {embedding.explained:.0%} of the spread; there, nearness and attention agree with "
        f"a rank correlation of {agreement:.2f} per query on average (1 would be exact)."
        + (
            f" {hidden} of the tokens are on hover only: their labels would cover others."
            if (hidden := hover_only(fig))
            else ""
        )
    )
    st.plotly_chart(room(fig), width="stretch", config=export_config(f"{p.stem.removesuffix('-words')}-qk", "png"))


ROTATIONS = {
    "after": "After the rotation: what the scores use",
    "before": "Before the rotation: the content alone",
}


def rotation_choice(ctx: Context) -> bool:
    """For a model with rotary positions, which vectors the Q-K embedding shows; True: the rotated ones."""
    if ctx.bundle.config.pos_encoding != "rotary":
        return True
    which = bound(st.radio, "Vectors", list(ROTATIONS), format_func=ROTATIONS.get, horizontal=True, key="qk_rotation")
    if which == "after":
        st.caption(
            "Rotary positions turn each query and key by its position's angles before the product: these rotated "
            "vectors give the scores exactly, so nearness here is attention, position included."
        )
    else:
        st.caption(
            "The same vectors before the rotation: what each token's content asks for and offers, without its "
            "place. Tokens alike in content sit together wherever they stand; how far apart they stand is left "
            "to the rotation, so nearness here is not the attention the model paid."
        )
    return which == "after"


# ---------------------------------------------------------------------------------------------
# A text whose maps do not fit at once (ATTNVIZ_FULL_MAPS_MB): every head tile by tile (attnviz.tiles)


@dataclass(frozen=True)
class LongPicked:
    """What the controls chose for a long text: one kind, a layer and head, the contrast, the picture area."""

    ctx: Context
    kind: str
    layer: int
    head: int
    contrast: str
    picture: object

    @property
    def key(self) -> tuple:
        return (*self.ctx.key, self.kind, "tiled")

    def layers(self, name: str, part: Callable[[tiles.LayerTiles], T]) -> list[T]:
        """``part`` of every layer's [`attnviz.tiles.LayerTiles`][], with a progress bar while layers are
        fetched. Each part is kept for every session under ``name``: it is small, where a layer's queries
        and keys need not stay for it (the budget may let them go)."""
        L = self.ctx.bundle.config.n_layers_of(self.kind)
        bar = st.progress(0.0, text=f"Every head of {L} layers, one layer at a time…")
        found = []
        for layer in range(1, L + 1):
            found.append(shared(name, (*self.key, layer), lambda n=layer: part(self.ctx.layer_tiles(self.kind, n))))
            bar.progress(layer / L, text=f"Every head of {L} layers, one layer at a time: {layer} done")
        bar.empty()
        return found


def long_body(ctx: Context) -> None:
    """The explorer for a long text: one head, all heads and the head statistics, each tile by tile."""
    picture = picture_area()
    c1, c2 = st.columns([1, 3])
    words, contrast = words_and_contrast(c1, c2)
    st.info(
        long_text(*ctx.key) + " Each head is computed tile by tile from its queries and keys, exactly, and "
        "never the whole of every map: one head at full resolution through its zoom, every head max-pooled, "
        "and the head statistics." + (" Words would need every map: the maps below are over pieces." if words else "")
    )
    domain_notice(ctx.choices)
    cfg = ctx.bundle.config
    kinds = [k for k in KINDS if cfg.n_layers_of(k)]
    kind, view, layer, head = choose(ctx, kinds, lambda k: (cfg.n_layers_of(k), cfg.n_heads))
    if view not in LONG_DRAW:
        shown = ", ".join(VIEWS[v] for v in LONG_DRAW)
        st.info(f"{VIEWS[view]} draws every weight of the maps at once; at this length the explorer shows {shown}.")
        return
    LONG_DRAW[view](LongPicked(ctx, kind, layer, head, contrast, picture))


def long_one(p: LongPicked) -> None:
    layer = p.ctx.layer_tiles(p.kind, p.layer)
    title = f"{TITLES[p.kind]}, layer {p.layer}, head {p.head}"
    rows = row_labels(layer, p.kind)
    h = p.head - 1
    name, fmt = f"{p.ctx.file_stem}-{p.kind}-L{p.layer}H{p.head}", st.session_state.get("image_format", "png")
    views.long_one_head(
        "", (*p.key, p.layer, p.head), layer.heads[h], layer.scans[h], rows, layer.tokens()[1], p.kind, p.contrast,
        title, p.picture, name=name, fmt=fmt,
    )  # fmt: skip


def long_grid(p: LongPicked) -> None:
    def grid() -> object:
        parts = p.layers("long-thumbnails", lambda layer: (layer.thumbnails, layer.blocks, layer.heads[0].shape))
        _, blocks, (Q, K) = parts[0]
        allowed = tiles.allowed_blocks(p.kind == "decoder", (0, Q), (0, K), blocks)
        thumbnails = np.stack([thumbnails for thumbnails, _, _ in parts])
        return pooled_head_grid(thumbnails, allowed, blocks, p.kind, p.contrast, (p.layer, p.head))

    fig = shared("long-grid", (*p.key, p.contrast, p.layer, p.head), grid)
    st.caption(
        "Every layer (rows) and head (columns), each max-pooled from its queries and keys; the outlined map is "
        "the layer and head chosen above. Click a map to open it."
    )
    st.button(f"Open layer {p.layer}, head {p.head} large", on_click=open_one_head, key="_open_large")
    fmt = st.session_state.get("image_format", "png")
    p.picture.plotly_chart(
        room(fig),
        width="stretch",
        config=export_config(f"{p.ctx.file_stem}-{p.kind}-all-heads", fmt),
        key="_grid_chart",
        on_select=open_head_from_grid,
        selection_mode="points",
    )


def long_stats(p: LongPicked) -> None:
    table = shared(
        "long-stats",
        p.key,
        lambda: tiles.statistics_frame(
            [row for rows in p.layers("long-statistics", tiles.LayerTiles.statistics) for row in rows], p.kind
        ),
    )
    stats_table(table, f"{p.ctx.file_stem}-{p.kind}", p.key)


LONG_DRAW: dict[str, Callable[[LongPicked], None]] = {"one": long_one, "grid": long_grid, "stats": long_stats}


DRAW: dict[str, Callable[[Picked], Drawn | None]] = {
    "one": draw_one,
    "grid": draw_grid,
    "lines": draw_lines,
    "aggregate": draw_aggregate,
    "stats": draw_stats,
    "qk": draw_qk,
}

frame(body, intro=intro)
