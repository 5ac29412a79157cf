"""Head atlas: every head's habits over many sentences, as a map, a table, and its most and least typical sentences."""

import hashlib
import json
from dataclasses import dataclass

import pandas as pd
import streamlit as st

from attnviz.app import bound, clamp_state, computed_atlas, open_atlas, shared, views
from attnviz.app.frame import Context, frame
from attnviz.app.present import folded, picture_area, room
from attnviz.app.widgets import escape_markdown
from attnviz.atlas import STATISTICS, Atlas, typical_sentences
from attnviz.atlas.corpus import skipped_words, text_lines
from attnviz.figures.atlas import STATISTIC_LABELS, head_map
from attnviz.figures.attention import attention_heatmap
from attnviz.figures.common import export_config
from attnviz.kinds import TITLES, allowed, writing_labels

INTRO = (
    "What each head does over many sentences, not one (Clark et al., 2019; Voita et al., 2019): its statistics "
    "averaged over a corpus, and a map on which heads that attend alike lie close together. For a whole corpus, "
    "run `attnviz atlas --corpus FILE --out DIR` and open the folder here."
)

SOURCES = {"examples": "The model's examples", "pasted": "Sentences you paste", "folder": "An atlas folder"}
MAX_SENTENCES = 200  # what the app computes for a visitor; a corpus goes through `attnviz atlas`
MAX_CHARACTERS = 400  # per pasted line
TYPICAL = 3  # sentences shown as most, and as least, typical


@dataclass(frozen=True)
class Chosen:
    """What the controls chose in an atlas: a kind of attention, a layer and head, and the statistic."""

    atlas: Atlas
    atlas_id: str  # what tells this atlas from another, for shared figures
    heads: pd.DataFrame  # the atlas's heads of this kind
    kind: str
    layer: int
    head: int
    statistic: str

    @property
    def shown(self) -> tuple:
        """What the map and the table depend on."""
        return self.atlas_id, self.kind, self.statistic


def pasted_sentences(ctx: Context) -> list[str] | None:
    if "at_pasted" not in st.session_state:  # start from the model's examples: an atlas at once, to edit
        examples = ctx.bundle.info.get("examples") or []
        st.session_state["at_pasted"] = "\n".join(examples)
    text = bound(
        st.text_area,
        f"One sentence per line (at most {MAX_SENTENCES} lines of {MAX_CHARACTERS} characters)",
        key="at_pasted",
        height=160,
    )
    lines = text_lines(text)  # as `attnviz atlas` splits a file
    if not lines:
        st.info("Paste some sentences, one per line.")
        return None
    kept = [line for line in lines if len(line) <= MAX_CHARACTERS][:MAX_SENTENCES]
    if not kept:  # the atlas would then say its corpus is empty, which the box is not
        st.info(f"Every line is longer than {MAX_CHARACTERS} characters: paste shorter sentences, one per line.")
        return None
    if len(kept) < len(lines):
        st.warning(
            f"Using {len(kept)} of {len(lines)} lines: at most {MAX_SENTENCES}, each at most {MAX_CHARACTERS} "
            "characters. A larger corpus goes through `attnviz atlas`."
        )
    return kept


def compute(ctx: Context, sentences: list[str]) -> Atlas:
    bar = st.progress(0.0, text="Computing the atlas…")

    def progress(done: int, total: int) -> None:
        bar.progress(done / total, text=f"Computing the atlas: {done} of {total} sentences")

    atlas = computed_atlas(ctx.model, ctx.device, tuple(sentences), progress)
    bar.empty()
    return atlas


def select_head_from_table() -> None:
    """Clicking a row of the table selects that head (runs before the rerun)."""
    event = st.session_state.get("_at_table")
    rows = event.selection.rows if event is not None else []
    table = st.session_state.get("at_rows")
    if rows and table is not None:
        st.session_state["at_layer"], st.session_state["at_head"] = table[rows[0]]


def select_head_from_map() -> None:
    event = st.session_state.get("_at_map")
    points = event.selection.points if event is not None else []
    if points and points[0].get("customdata"):
        st.session_state["at_layer"], st.session_state["at_head"] = (int(v) for v in points[0]["customdata"][:2])


def show_typical(ctx: Context, c: Chosen, contrast: str) -> None:
    """The chosen head's most and least typical sentences, with their maps when the sidebar's model made the atlas."""
    most, least = shared(
        "atlas-typical",
        (c.atlas_id, c.kind, c.layer, c.head, c.statistic),
        lambda: typical_sentences(c.atlas.sentences, c.kind, c.layer, c.head, c.statistic, TYPICAL),
    )
    model_matches = ctx.bundle.sha256 == c.atlas.manifest["model"]["checkpoint_sha256"]
    if not model_matches:
        st.info(
            f"This atlas was computed with the model {escape_markdown(repr(c.atlas.manifest['model']['name']))}; "
            "choose that model in the "
            "sidebar to see the maps of these sentences."
        )
    inputs = c.atlas.inputs.set_index("line")
    for title, rows, where in (("Most typical", most, "nearest to"), ("Least typical", least, "farthest from")):
        st.markdown(f"**{title}**: the sentences where its {STATISTIC_LABELS[c.statistic]} is {where} its mean")
        for _, row in rows.iterrows():
            sentence = inputs.loc[row["line"]]
            st.caption(
                f"Line {row['line']}: {escape_markdown(sentence['src'])} — {c.statistic} {row[c.statistic]:.4f} "
                f"({row['deviation']:+.4f} from the mean)"
            )
            if model_matches:
                show_sentence_map(ctx, c, row["line"], sentence, contrast)


def show_sentence_map(ctx: Context, c: Chosen, line, sentence: pd.Series, contrast: str) -> None:
    """The chosen head's map of one sentence of the atlas, computed with the sidebar's model."""
    kind, layer, head = c.kind, c.layer, c.head
    tgt_ids = None if sentence["tgt_ids"] is None else tuple(int(i) for i in sentence["tgt_ids"])
    src_ids = tuple(int(i) for i in sentence["src_ids"])
    matrix = ctx.on_model("head_map", src_ids, tgt_ids, kind, layer, head)
    src_tokens = list(sentence["src_tokens"])
    tgt_tokens = None if tgt_ids is None else list(sentence["tgt_tokens"])
    end = "</s>"
    if kind == "decoder" and tgt_tokens is None:  # a language model: its line is the decoder's input
        tgt_tokens, end = src_tokens, "…"  # the last row writes the token after the line, not in the atlas
    # a decoder row reads one token and writes the next (the last writes the end token)
    q_tokens = src_tokens if kind == "encoder" else writing_labels(tgt_tokens, [*tgt_tokens[1:], end])
    k_tokens = tgt_tokens if kind == "decoder" else src_tokens
    title = f"{TITLES[kind]}, layer {layer}, head {head}, line {line}"
    fig = shared(
        "atlas-sentence",
        (ctx.model, ctx.device, tuple(q_tokens), tuple(k_tokens), kind, layer, head, title, contrast),
        lambda: attention_heatmap(
            matrix, q_tokens, k_tokens, kind, mask=allowed(kind, *matrix.shape), title=title, contrast=contrast
        ),
    )
    name = f"atlas-{kind}-L{layer}H{head}-line{line}"
    st.plotly_chart(room(fig), width="stretch", config=export_config(name, "png"))


def identity(atlas) -> str:
    """What tells one atlas from another (model, corpus, inputs, precision, completeness), for shared figures."""
    manifest = {key: value for key, value in atlas.manifest.items() if key != "runs"}
    return hashlib.sha256(json.dumps(manifest, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def choose(atlas: Atlas) -> Chosen:
    """The atlas's summary, then its controls: kind, statistic, layer and head."""
    manifest = atlas.manifest
    counts = manifest["counts"]
    skipped = sum(counts["skipped"].values())
    st.caption(
        f"Model {escape_markdown(repr(manifest['model']['name']))}, {counts['sentences']} sentences"
        + (f" ({skipped} lines skipped: {escape_markdown(skipped_words(counts['skipped']))})" if skipped else "")
        + f", decoder input: {escape_markdown(manifest['tgt_from'])}, {escape_markdown(manifest['precision'])}."
    )
    kind = views.kind_choice(atlas.kinds, "at_kind", prefer=None)
    heads = atlas.heads[atlas.heads["kind"] == kind]
    layers_here, heads_here = sorted(set(heads["layer"])), sorted(set(heads["head"]))
    clamp_state("at_layer", layers_here)
    clamp_state("at_head", heads_here)
    c1, c2, c3 = st.columns([2, 1, 1])
    statistic = bound(
        c1.selectbox, "Colour and compare by", list(STATISTICS), format_func=STATISTIC_LABELS.get, key="at_stat"
    )
    layer = bound(c2.selectbox, "Layer", layers_here, key="at_layer")
    head = bound(c3.selectbox, "Head", heads_here, key="at_head")
    return Chosen(atlas, identity(atlas), heads, kind, layer, head, statistic)


def show_map(c: Chosen, area) -> None:
    """The heads on a map in ``area``, placed by how alike they attend; a click chooses a head."""

    def build_map():
        points = c.heads.merge(c.atlas.mds, on=["kind", "layer", "head"])
        return head_map(
            points["layer"],
            points["head"],
            points["x"],
            points["y"],
            points[c.statistic],
            c.statistic,
            c.kind,
            selected=(c.layer, c.head),
            positional=points["positional"].fillna(False),
        )

    fig = shared("atlas-map", (*c.shown, c.layer, c.head), build_map)
    area.plotly_chart(
        room(fig),
        width="stretch",
        key="_at_map",
        on_select=select_head_from_map,
        selection_mode="points",
        config=export_config(f"atlas-{c.kind}-map-{c.statistic}", "png"),
    )
    area.caption(
        "Each point is a head; heads close together attend alike (mean Jensen-Shannon divergence between their rows, "
        "placed by MDS). Diamonds are positional heads (Voita et al.: the largest weight on the previous or next "
        "token in at least 90% of rows). Click a point or a table row to choose a head."
    )


def show_table(c: Chosen) -> None:
    """One row per head, sorted by the statistic; a click on a row chooses a head."""
    columns = ["layer", "head", "sentences", *STATISTICS, "positional"]
    table = shared(
        "atlas-table",
        c.shown,
        lambda: (
            c.heads[columns]
            .sort_values(c.statistic, ascending=False, na_position="last")
            .round(4)
            .reset_index(drop=True)
        ),
    )
    st.session_state["at_rows"] = list(zip(table["layer"], table["head"], strict=True))
    folded("Every head's statistics: sort by a column, click a row to choose its head").dataframe(
        table,
        key="_at_table",
        on_select=select_head_from_table,
        selection_mode="single-row",
        hide_index=True,
        width="stretch",
    )
    st.caption(
        f"Means over sentences, sorted by {c.statistic} (click a column header to sort by another). Every column is "
        'described in the manual, on its "Head atlas" page (docs/atlas.md).'
    )


def show_head(ctx: Context, c: Chosen) -> None:
    """The chosen head: its statistic's mean and spread, and its most and least typical sentences."""
    st.subheader(f"Layer {c.layer}, head {c.head}: where it is most and least itself")
    heads = c.heads
    own = heads[(heads["layer"] == c.layer) & (heads["head"] == c.head)]
    if own.empty:
        return
    mean, std = float(own[c.statistic].iloc[0]), float(own[f"{c.statistic}_std"].iloc[0])
    st.markdown(f"{STATISTIC_LABELS[c.statistic]}: mean {mean:.4f}, standard deviation {std:.4f} over sentences.")
    if mean != mean:  # NaN: this kind has no such statistic
        st.info(f"{c.kind} attention has no {c.statistic}: choose another statistic.")
        return
    contrast = views.contrast_choice(st)
    show_typical(ctx, c, contrast)


def open_source(ctx: Context, source: str) -> Atlas | None:
    """The atlas of the chosen source; None (having said what is missing) when there is none yet."""
    if source == "folder":
        typed = bound(
            st.text_input,
            "Atlas folder",
            key="at_folder",
            help="A folder written by `attnviz atlas --out`, under the folders this server lets visitors open.",
        )
        if not typed.strip():
            st.info("Type the name of an atlas folder.")
            return None
        return open_atlas(typed)
    if source == "examples":
        sentences = list(ctx.bundle.info.get("examples") or [])
        if not sentences:
            st.info("This model has no examples: paste some sentences instead.")
            return None
    else:
        sentences = pasted_sentences(ctx)
        if sentences is None:
            return None
    return compute(ctx, sentences)


def body(ctx: Context) -> None:
    picture = picture_area()  # the head map: under the title in presenter mode, the atlas's controls below
    source = bound(st.radio, "Atlas of", list(SOURCES), format_func=SOURCES.get, horizontal=True, key="at_source")
    atlas = open_source(ctx, source)
    if atlas is None:
        return
    chosen = choose(atlas)
    show_map(chosen, picture)
    show_table(chosen)
    show_head(ctx, chosen)


frame(body, intro=INTRO)
